"""A runtime is one registered `Runtime`: a fake one, written in this file and registered for a
test, is tried by `auto`, taken by `--runtime NAME` and `runtime=NAME`, listed by `env`; an
unknown runtime name is one line naming the closest one."""

from __future__ import annotations

import json

import pytest
import torch
from helpers_machine import pretend

import bertheads
from bertheads.base.errors import UserError
from bertheads.base.machine import Machine, runtimes
from bertheads.base.runtimes import RUNTIMES, Offer, Runtime, register, unregister
from bertheads.cli.main import main
from bertheads.export.modes import candidates, check_mode
from bertheads.export.torch_runtime import open_torch

AVX2 = Machine(cpu="AMD EPYC", flags=frozenset({"avx2"}), cores=2, threads=2, installed=frozenset({"onnxruntime"}))
AMX = Machine(cpu="Intel Xeon", flags=frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16",
                                                 "amx_int8"}), cores=2, threads=2,
              installed=frozenset({"onnxruntime", "openvino"}))
CPU = torch.device("cpu")


@pytest.fixture
def fake():
    """A runtime that runs fp32 on the CPU (the torch model underneath), offered to `auto` ahead
    of every other; the directories it opened."""
    opened = []

    def open_fake(directory, mode, verify, reference=None):
        opened.append(directory)
        return open_torch(directory, mode, verify, reference)

    runtime = register(Runtime("fake", precisions=("fp32",), devices=("cpu",), open=open_fake,
                               offers=lambda device, m: [Offer("fp32", 0, "the fake's kernels")] if device.type == "cpu"
                               else [], about=lambda: {"version": "0"}))
    yield runtime, opened
    unregister("fake")
    assert "fake" not in RUNTIMES


def test_auto_considers_a_registered_runtime(fake):
    assert candidates("auto", "auto", CPU, AVX2)[0] == ("fake", "fp32", "the fake's kernels")
    assert [(r, p) for r, p, _ in candidates("auto", "auto", CPU, AMX)] == [
        ("fake", "fp32"), ("openvino", "int8"), ("openvino", "bf16"), ("onnx", "int8"), ("torch", "bf16"),
        ("torch", "fp32")]
    assert candidates("fake", "auto", CPU, AVX2) == [("fake", "fp32", "the fake's kernels")]
    assert [r for r, _, _ in candidates("auto", "auto", torch.device("cuda", 0), AVX2)] == ["torch", "torch"]
    assert runtimes()["fake"] == {"version": "0"}


def test_what_a_runtime_does_not_run_is_one_line(fake):
    for precision, device, message in [("int8", CPU, "runtime='fake' runs fp32, not precision='int8'"),
                                       ("fp32", torch.device("cuda", 0), "runtime='fake': runs on cpu, not cuda:0")]:
        with pytest.raises(UserError) as err:
            check_mode("fake", precision, device, AVX2)
        assert str(err.value) == message


def test_a_runtime_name_is_registered_once(fake):
    with pytest.raises(ValueError, match="registered already"):
        register(Runtime("fake", precisions=("fp32",), devices=("cpu",), open=print, offers=lambda d, m: []))


@pytest.fixture(scope="module")
def model_dir(tiny_bert, tmp_path_factory):
    d = tmp_path_factory.mktemp("fake-runtime")
    (d / "t.tsv").write_text("sentence\tlabel\n" + "".join(f"a fine film {i}\t{i % 2}\n" for i in range(8)))
    bertheads.train("classify", str(d / "t.tsv"), out=d / "m", model=tiny_bert, epochs=1, progress=False)
    return d / "m"


def test_the_runtime_flag_and_keyword_take_a_registered_runtime(fake, model_dir, write, capsys):
    _, opened = fake
    texts = write("in.txt", "a fine film\nan awful film\n")
    assert main(["predict", str(model_dir), "--input", texts, "--runtime", "torch", "-q"]) == 0
    by_torch = capsys.readouterr().out
    assert opened == []
    assert main(["predict", str(model_dir), "--input", texts, "--runtime", "fake", "-q"]) == 0
    assert capsys.readouterr().out == by_torch and opened == [model_dir]
    model = bertheads.load(model_dir, runtime="fake", verbose=False)
    assert (model.mode.runtime, model.mode.precision) == ("fake", "fp32")
    model = bertheads.load(model_dir, verbose=False)  # auto: the fake is tried first, and fp32 needs no gate
    assert model.mode.runtime == "fake" and model.mode.why == "the fake's kernels"


def test_env_shows_a_registered_runtime_first_in_autos_order(fake, capsys):
    with pretend(AVX2):
        assert main(["env", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["inference"]["tried_in_order"][0] == {"runtime": "fake", "precision": "fp32",
                                                      "why": "the fake's kernels"}
    assert facts["runtimes"]["fake"] == {"version": "0"}


def test_an_unknown_runtime_is_one_line_naming_the_closest(fake, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["predict", "m", "--runtime", "fak"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert "argument --runtime: unknown runtime 'fak' (did you mean 'fake'?)" in err[0]
    with pytest.raises(UserError) as error:
        bertheads.load("m", runtime="onx")
    assert "unknown runtime 'onx' (did you mean 'onnx'?)" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(UserError, match=r"unknown runtime 'tourch' \(did you mean 'torch'\?\)"):
        candidates("tourch", "auto", CPU, AVX2)


def test_without_the_fake_auto_is_as_before():
    assert "fake" not in RUNTIMES
    assert [(r, p) for r, p, _ in candidates("auto", "auto", CPU, AMX)] == [
        ("openvino", "int8"), ("openvino", "bf16"), ("onnx", "int8"), ("torch", "bf16"), ("torch", "fp32")]
