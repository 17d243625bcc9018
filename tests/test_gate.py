"""The gate a lower precision passes before `auto` uses it: its evidence floor, its one-sided
metric and agreement floor, where its verdicts are kept (never in a model folder a reading
command opened), and `--runtime onnx` on every kind of CPU."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_machine import pretend

from bertheads.base.machine import Machine
from bertheads.cli.main import main

INSTALLED = frozenset({"onnxruntime", "openvino"})
AVX2 = Machine(cpu="AMD EPYC", flags=frozenset({"avx2"}), cores=2, threads=2, installed=INSTALLED)
ZEN4 = Machine(cpu="AMD EPYC", flags=frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}), cores=2,
               threads=2, installed=INSTALLED)
AMX = Machine(cpu="Intel Xeon", flags=frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16",
                                                 "amx_int8"}), cores=2, threads=2, installed=INSTALLED)
TORCH_ONLY_AMX = Machine(**{**AMX.__dict__, "installed": frozenset()})
GOOD, BAD = ["great", "lovely", "superb"], ["awful", "dull", "boring"]


def sentiment(n: int) -> str:
    rows = [f"a {GOOD[i % 3]} film {i}\t1\n" for i in range(n // 2)]
    rows += [f"an {BAD[i % 3]} film {i}\t0\n" for i in range(n - n // 2)]
    return "sentence\tlabel\n" + "".join(rows)


@pytest.fixture(scope="module")
def trained(tiny_bert, tmp_path_factory):
    """A tiny classify model trained (as on an AMX machine) with a 240-input dev file, and an
    fp32 ONNX export of it (no int8 graph)."""
    import bertheads
    from bertheads.export.onnx import export_onnx

    d = tmp_path_factory.mktemp("gate")
    (d / "train.tsv").write_text(sentiment(32))
    (d / "dev.tsv").write_text(sentiment(240))
    (d / "tiny-dev.tsv").write_text(sentiment(6))
    with pretend(TORCH_ONLY_AMX):
        bertheads.train("classify", str(d / "train.tsv"), str(d / "dev.tsv"), d / "model", model=tiny_bert,
                        epochs=6, batch_size=8, lr=5e-3, progress=False, precision="fp32")
    export_onnx(d / "model", openvino=False)
    return d


def copy(model: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(model, target)
    return target


def digest(folder: Path) -> str:
    """Every file's path and bytes under `folder`."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def test_the_verdict_is_one_sided_with_floors():
    from bertheads.export.gate import problems

    def head(change: float, agreement: float, examples: int = 500) -> dict:
        return {"h": {"examples": examples, "metric": "f1", "change_points": change, "label_agreement": agreement}}

    assert problems("int8", head(+0.51, 0.98)) == []  # a gain never refuses
    assert problems("int8", head(-0.49, 0.98)) == []
    assert "falls 0.60 points" in problems("int8", head(-0.6, 0.99))[0]
    assert "90.2% same predictions" in problems("int8", head(+0.5, 0.902))[0]  # agreement is the steadier signal
    assert problems("bf16", head(0.0, 0.985)) and not problems("int8", head(0.0, 0.985))  # floors per precision
    assert "fewer than 200" in problems("bf16", head(0.0, 1.0, examples=2))[0]


def test_train_ends_with_the_gate_in_the_model_folder(trained):
    """Training is a command whose work includes the verdicts: they go into the folder it wrote."""
    from bertheads.export import gate

    saved = json.loads((trained / "model" / "gate.json").read_text())
    with pretend(TORCH_ONLY_AMX):
        assert list(saved["machines"]) == [gate.here()]
        record = gate.read_records(trained / "model")["torch/bf16"]
    assert record["heads"]["classify"]["examples"] == 240 and record["inputs_per_s"] > 0
    with pretend(AVX2):  # another machine: its own verdicts, none yet
        assert gate.read_records(trained / "model") == {}


def test_too_few_inputs_keep_fp32_and_say_how_to_give_more(trained, tmp_path, monkeypatch, capsys):
    from bertheads.export import gate

    target = copy(trained / "model", tmp_path)
    (target / "gate.json").unlink()
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    inputs = tmp_path / "in.txt"
    inputs.write_text("a great film\n")
    with pretend(TORCH_ONLY_AMX):
        code = main(["predict", str(target), "--input", str(inputs), "--gate-data", str(trained / "tiny-dev.tsv")])
        out, err = capsys.readouterr()
        assert code == 0 and json.loads(out)["label"] == 1
        assert "torch bf16 not used" in err and "3 labelled inputs" not in err and "6 labelled inputs" in err
        assert "at least 200" in err and "--gate-data gives more" in err
        assert gate.read_records(target) == {}  # nothing judged on six inputs
        code = main(["predict", str(target), "--input", str(inputs), "--gate-data", str(trained / "dev.tsv")])
        assert code == 0 and "checking torch bf16 against fp32" in capsys.readouterr().err
        assert gate.read_records(target)["torch/bf16"]["heads"]["classify"]["examples"] == 240


@pytest.mark.parametrize("fake", [AVX2, ZEN4, AMX], ids=["avx2", "avx512_bf16+vnni", "amx"])
def test_runtime_onnx_without_an_int8_graph_runs_fp32_on_every_cpu(trained, tmp_path, monkeypatch, capsys, fake):
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    inputs = tmp_path / "in.txt"
    inputs.write_text("a great film\nan awful film\n")
    with pretend(fake):
        code = main(["predict", str(trained / "model"), "--input", str(inputs), "--runtime", "onnx"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [json.loads(line)["label"] for line in out.splitlines()] == [1, 0]
    if fake.cpu_int8:
        assert "auto: onnx fp32" in err


def test_a_failing_command_leaves_the_model_folder_byte_identical(trained, tmp_path, monkeypatch, capsys):
    target = copy(trained / "model", tmp_path)
    (target / "gate.json").unlink()  # a verdict to make: the gate would run first
    before = digest(target)
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "other.tsv"
    data.write_text("sentence\tlabel\na great film\tneutral\n")
    with pretend(TORCH_ONLY_AMX):
        code = main(["evaluate", str(target), "--data", str(data), "--gate-data", str(trained / "dev.tsv")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "label 'neutral' was not seen in training" in err.splitlines()[-1]
    assert digest(target) == before  # the verdict made on the way went to the user's cache
    assert list((tmp_path / "cache" / "gate").glob("*.json"))


def test_reading_commands_run_on_a_read_only_model_folder(trained, tmp_path):
    """predict, then evaluate, in a mount namespace where the model folder is read-only: they run,
    the verdict predict makes goes to the user's cache, and evaluate measures nothing again."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("unshare (user and mount namespaces) is not available here")
    target = copy(trained / "model", tmp_path)
    (target / "gate.json").unlink()
    before = digest(target)
    inputs = tmp_path / "in.txt"
    inputs.write_text("a great film\n")
    env = {**os.environ, "BERTHEADS_CPU_FLAGS": "avx2 avx512f avx512_bf16", "BERTHEADS_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    mount = f"mount --bind -o ro {target} {target} && touch {target}/probe 2>/dev/null && exit 9; "
    # both commands in one process (each would pay the start-up again), a marker line between them
    script = ("import sys; from bertheads.cli.main import main\n"
              f"code = main(['predict', {str(target)!r}, '--input', {str(inputs)!r}, '--runtime', 'torch', "
              f"'--gate-data', {str(trained / 'dev.tsv')!r}])\n"
              "print('=== evaluate', file=sys.stderr, flush=True)\n"
              f"code = code or main(['evaluate', {str(target)!r}, '--data', {str(trained / 'dev.tsv')!r}, '--json', "
              "'--runtime', 'torch'])\n"
              "sys.exit(code)\n")
    (tmp_path / "both.py").write_text(script)
    run = subprocess.run(["unshare", "-rm", "sh", "-c", mount + f"{sys.executable} {tmp_path / 'both.py'}"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    predicted, evaluated = run.stderr.split("=== evaluate")
    assert "checking torch bf16 against fp32" in predicted and "could not write" not in predicted
    assert "checking" not in evaluated  # the read-only folder paid once
    assert list((tmp_path / "cache" / "gate").glob("*.json"))
    assert digest(target) == before


def test_the_gate_command_writes_the_folders_verdicts(trained, tmp_path, monkeypatch, capsys):
    target = copy(trained / "model", tmp_path)
    (target / "gate.json").unlink()
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    with pretend(AVX2):
        assert main(["gate", str(target)]) == 0
    assert "runs no lower precision" in capsys.readouterr().err and not (target / "gate.json").exists()
    with pretend(TORCH_ONLY_AMX):
        assert main(["gate", str(target), "--json", "--gate-data", str(trained / "dev.tsv")]) == 0
    verdicts = json.loads(capsys.readouterr().out)
    assert set(verdicts) == {"torch/bf16"} and verdicts["torch/bf16"]["inputs_per_s"] > 0
    assert (target / "gate.json").is_file() and not (tmp_path / "cache").exists()
