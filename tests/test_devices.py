"""Devices, precisions and runtimes: the machine's facts, what `auto` picks on machines this one
pretends to be, and the one-line refusals of what a machine lacks."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from helpers_machine import pretend

from bertheads.base.errors import UserError
from bertheads.base.machine import Machine, read_cpuinfo, resolve_device, training_precision
from bertheads.cli.main import main
from bertheads.export.modes import candidates

AVX2 = Machine(cpu="AMD EPYC", flags=frozenset({"avx2"}), cores=2, threads=2, capability="AVX2",
               installed=frozenset({"onnxruntime", "openvino"}))
AMX = Machine(cpu="Intel Xeon", flags=frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16",
                                                 "amx_int8"}), cores=2, threads=2, capability="AVX512",
              installed=frozenset({"onnxruntime", "openvino"}))
GPU = Machine(cpu="AMD EPYC", flags=frozenset({"avx2"}), cuda=("NVIDIA H200", "NVIDIA H200"), cuda_bf16=True,
              installed=frozenset({"onnxruntime"}))
OLD_GPU = Machine(cpu="x", cuda=("Tesla T4",), cuda_bf16=False)
MAC = Machine(cpu="Apple M2", mps=True)


def test_cpuinfo_flags_are_read():
    text = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum\nflags\t\t: fpu avx2 amx_bf16 avx512_bf16\n" \
           "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
    name, flags = read_cpuinfo(text)
    assert name == "Intel(R) Xeon(R) Platinum" and {"avx2", "amx_bf16", "avx512_bf16"} <= flags
    m = Machine(cpu=name, flags=flags, cores=2, threads=2)
    assert m.cpu_bf16 and not m.cpu_int8
    assert m.line() == "CPU: Intel(R) Xeon(R) Platinum; flags: avx2 avx512_bf16 amx_bf16; 2 cores, 2 threads"


def test_the_flags_variable_replaces_the_detected_flags(monkeypatch):
    from pathlib import Path

    from bertheads.base.machine import detect

    monkeypatch.setenv("BERTHEADS_CPU_FLAGS", "avx2, avx512_vnni")
    assert detect().flags == {"avx2", "avx512_vnni"} and not detect().cpu_bf16 and detect().cpu_int8
    monkeypatch.delenv("BERTHEADS_CPU_FLAGS")
    real = read_cpuinfo(Path("/proc/cpuinfo").read_text())[1] if Path("/proc/cpuinfo").is_file() else frozenset()
    assert detect().flags == real


@pytest.mark.parametrize("fake, asked, expected", [
    (AVX2, "auto", "cpu"), (GPU, "auto", "cuda:0"), (GPU, "cuda:1", "cuda:1"), (GPU, "cuda", "cuda:0"),
    (MAC, "auto", "mps"), (MAC, "cpu", "cpu"), (GPU, "cpu", "cpu")])
def test_device_auto_takes_a_gpu_when_there_is_one(fake, asked, expected):
    assert resolve_device(asked, fake) == torch.device(expected)


@pytest.mark.parametrize("fake, asked, message", [
    (AVX2, "cuda", "no CUDA device"), (GPU, "cuda:2", "has 2 CUDA device"), (AVX2, "mps", "no MPS"),
    (AVX2, "tpu", "expected one of auto, cpu, cuda")])
def test_an_absent_device_is_one_line(fake, asked, message):
    with pytest.raises(UserError, match=message) as err:
        resolve_device(asked, fake)
    assert "\n" not in str(err.value)


def test_training_precision_auto_and_refusals():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert training_precision("auto", cpu, AVX2)[0] == "fp32"
    assert training_precision("auto", cpu, AMX) == ("bf16", "the CPU has AMX")
    assert training_precision("auto", cuda, GPU)[0] == "bf16"
    assert training_precision("auto", cuda, OLD_GPU)[0] == "fp16"
    assert training_precision("bf16", cpu, AMX)[0] == "bf16"
    with pytest.raises(UserError, match="neither AMX nor AVX512_BF16"):
        training_precision("bf16", cpu, AVX2)
    with pytest.raises(UserError, match="only on CUDA"):
        training_precision("fp16", cpu, AMX)
    with pytest.raises(UserError, match="no bf16"):
        training_precision("bf16", cuda, OLD_GPU)


def test_inference_auto_order_per_machine():
    cpu = torch.device("cpu")
    order = [(r, p) for r, p, _ in candidates("auto", "auto", cpu, AMX)]
    assert order == [("openvino", "int8"), ("openvino", "bf16"), ("onnx", "int8"), ("torch", "bf16"),
                     ("torch", "fp32")]
    # AVX512_BF16 and VNNI without AMX (Zen 4, Cooper Lake): int8 ahead of bf16
    zen4 = Machine(cpu="AMD EPYC", flags=frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}), cores=2,
                   threads=2, installed=frozenset({"onnxruntime", "openvino"}))
    assert [(r, p) for r, p, _ in candidates("auto", "auto", cpu, zen4)] == [
        ("openvino", "int8"), ("onnx", "int8"), ("openvino", "bf16"), ("torch", "bf16"), ("torch", "fp32")]
    # AVX2 only: nothing but today's torch fp32 (never slower, same outputs)
    assert [(r, p) for r, p, _ in candidates("auto", "auto", cpu, AVX2)] == [("torch", "fp32")]
    assert [(r, p) for r, p, _ in candidates("auto", "auto", torch.device("cuda", 0), GPU)] == [
        ("torch", "bf16"), ("torch", "fp32")]
    assert [(r, p) for r, p, _ in candidates("openvino", "auto", cpu, AVX2)] == [("openvino", "fp32")]
    assert [(r, p) for r, p, _ in candidates("auto", "int8", cpu, AVX2)] == [("onnx", "int8")]


@pytest.mark.parametrize("runtime, precision, fake, message", [
    ("torch", "int8", AVX2, "needs runtime='onnx' or openvino"),
    ("openvino", "bf16", AVX2, "neither AMX nor AVX512_BF16"),
    ("torch", "bf16", AVX2, "neither AMX nor AVX512_BF16"),
    ("torch", "fp16", AMX, "only on a CUDA device"),
    ("onnx", "bf16", AMX, "fp32 and int8"),
    ("openvino", "fp32", GPU, "needs the openvino package"),
])
def test_a_mode_the_machine_lacks_is_one_line(runtime, precision, fake, message):
    with pytest.raises(UserError, match=message) as err:
        candidates(runtime, precision, torch.device("cpu"), fake)
    assert "\n" not in str(err.value)


def test_env_prints_the_machine_and_what_auto_picks(capsys):
    with pretend(AMX):
        assert main(["env", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["machine"]["flags"] == ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"]
    assert facts["training"] == {"device": "cpu", "precision": "bf16", "why": "the CPU has AMX",
                                 "recipe": "fixed"}  # (the suite's $BERTHEADS_RECIPE)
    assert facts["inference"]["tried_in_order"][0]["runtime"] == "openvino"
    assert "torch" in facts["runtimes"]
    with pretend(AVX2):
        assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CPU: AMD EPYC; flags: avx2; 2 cores, 2 threads")
    assert "train --device auto --precision auto: cpu, fp32" in out and "torch fp32: this CPU has no bf16" in out


def sentiment_file(write) -> str:
    good, bad = ["great", "lovely", "superb"], ["awful", "dull", "boring"]
    rows = [f"a {good[i % 3]} film {i}\t1\n" for i in range(12)] + [f"an {bad[i % 3]} film {i}\t0\n" for i in range(12)]
    return write("train.tsv", "sentence\tlabel\n" + "".join(rows))


def test_bf16_training_autocasts_with_fp32_master_weights(tiny_bert, write, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import bertheads
    from bertheads.training import loop

    seen = []
    real = loop.float_outputs
    monkeypatch.setattr(loop, "float_outputs", lambda out: (seen.append(out.dtype), real(out))[1])
    path = sentiment_file(write)
    with pretend(AMX):  # torch runs bf16 autocast on any CPU (slowly): correct, if not fast, here
        bertheads.train("classify", path, path, tmp_path / "m", model=tiny_bert, epochs=1, batch_size=8, lr=1e-3,
                        progress=False, precision="auto")
    assert seen and set(seen) == {torch.bfloat16}  # the head's outputs came out of autocast
    weights = load_file(str(tmp_path / "m" / "encoder" / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.float32}  # fp32 master weights saved
    assert "precision: bf16" in (tmp_path / "m" / "config.yaml").read_text()
    seen.clear()
    with pretend(AVX2):
        bertheads.train("classify", path, None, tmp_path / "n", model=tiny_bert, epochs=1, batch_size=8,
                        progress=False)
    assert set(seen) == {torch.float32}


def test_resume_tells_the_precision_auto_gave_apart():
    from bertheads.training.resolve import run_precision
    from bertheads.training.settings import TrainSettings

    with pretend(AMX):
        amx = run_precision(TrainSettings())
    with pretend(AVX2):
        avx2 = run_precision(TrainSettings())
    assert (amx, avx2) == ("bf16", "fp32")  # the checkpoint's identity holds these


def test_train_bf16_on_a_cpu_without_it_is_one_line(tiny_bert, write, tmp_path, capsys):
    path = sentiment_file(write)
    with pretend(AVX2):
        code = main(["train", "classify", "--train", path, "--out", str(tmp_path / "m"), "--model", tiny_bert,
                     "--precision", "bf16", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "neither AMX nor AVX512_BF16" in err and len(err.splitlines()) == 1
    with pretend(AVX2):
        code = main(["train", "classify", "--train", path, "--out", str(tmp_path / "m"), "--model", tiny_bert,
                     "--device", "cuda", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "no CUDA device" in err and len(err.splitlines()) == 1


@pytest.fixture(scope="module")
def trained_dir(tiny_bert, tmp_path_factory):
    """A tiny classify model trained with a dev file (the gate's data), exported with int8 graphs."""
    import bertheads
    from bertheads.export.gate import export_checked

    d = tmp_path_factory.mktemp("gate")
    good, bad = ["great", "lovely", "superb"], ["awful", "dull", "boring"]
    rows = [f"a {good[i % 3]} film {i}\t1\n" for i in range(16)] + [f"an {bad[i % 3]} film {i}\t0\n" for i in range(16)]
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(rows))
    dev = [f"a {good[i % 3]} film {i}\t1\n" for i in range(120)] + [f"an {bad[i % 3]} film {i}\t0\n" for i in range(120)]
    (d / "dev.tsv").write_text("sentence\tlabel\n" + "".join(dev))  # enough inputs for the gate to judge by
    with pretend(AVX2):
        bertheads.train("classify", str(d / "train.tsv"), str(d / "dev.tsv"), d / "model", model=tiny_bert,
                        epochs=6, batch_size=8, lr=5e-3, progress=False)
        # the dev file shipped inside the folder: the one place a recorded dev file is read from
        shutil.move(d / "dev.tsv", d / "model" / "dev.tsv")
        manifest = d / "model" / "bertheads.json"
        data = json.loads(manifest.read_text())
        data["settings"]["dev"] = "dev.tsv"
        manifest.write_text(json.dumps(data))
        export_checked(d / "model", quantize_to="int8")
    return d / "model"


def test_auto_on_avx2_is_todays_torch_fp32(trained_dir):
    import bertheads

    with pretend(AVX2):
        auto = bertheads.load(trained_dir)
        fp32 = bertheads.load(trained_dir, runtime="torch", precision="fp32")
    assert (auto.mode.runtime, auto.mode.precision, auto.mode.device.type) == ("torch", "fp32", "cpu")
    assert auto.net.inference_dtype is None
    texts = ["a great film", "an awful film", "superb"]
    assert auto.predict(texts) == fp32.predict(texts)


def test_export_writes_qdq_and_gates_the_int8_modes(trained_dir):
    from bertheads.export import gate

    meta = json.loads((trained_dir / "onnx" / "export.json").read_text())
    assert set(meta["graphs"]) == {"fp32", "int8", "qdq", "openvino"} and meta["graphs"]["qdq"]["quantization"]["quantized_ops"]
    import onnx

    graph = onnx.load(str(trained_dir / "onnx" / "model.qdq.onnx")).graph
    made_by = {out: n.op_type for n in graph.node for out in n.output}
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    after_gelu = [n for n in matmuls if made_by.get(n.input[0]) in ("BiasGelu", "Gelu", "FastGelu")]
    int8_input = [n for n in matmuls if made_by.get(n.input[0]) == "DequantizeLinear"]
    # the feed-forward output products read fp32 (one per layer); the other encoder products read int8
    assert len(after_gelu) == 2 and meta["graphs"]["qdq"]["quantization"]["kept_fp32_after_activation"] == 2
    assert len(int8_input) >= 4 and not set(map(id, after_gelu)) & set(map(id, int8_input))
    with pretend(AVX2):  # the machine the fixture exported on
        records = gate.read_records(trained_dir)
    assert set(records) == {"onnx/int8", "openvino/int8"}  # no bf16 record: this machine (AVX2) has no bf16
    for record in records.values():
        head = record["heads"]["classify"]
        assert head["examples"] == 240 and head["metric"] == "accuracy" and 0 <= head["label_agreement"] <= 1
        assert record["passed"] == (head["change_points"] >= -0.5 and head["label_agreement"] >= 0.97)
        assert record["inputs_per_s"] > 0 and record["fp32_inputs_per_s"] > 0


def test_openvino_fp32_matches_torch_with_its_precision_hint_set(trained_dir):
    import numpy as np

    import bertheads

    ov = bertheads.load(trained_dir, runtime="openvino", precision="fp32")
    assert str(ov.net.compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
    torch_model = bertheads.load(trained_dir, runtime="torch", precision="fp32")
    texts = ["a great film", "an awful film", "lovely " * 40]
    a = [p["scores"] for p in torch_model.predict(texts)]
    b = [p["scores"] for p in ov.predict(texts)]
    assert np.allclose([list(s.values()) for s in a], [list(s.values()) for s in b], atol=1e-4)
    int8 = bertheads.load(trained_dir, runtime="openvino", precision="int8")
    assert len(int8.predict(texts)) == 3 and ov.mode.key == "openvino/fp32"
    assert ov.net.path.name == "model.xml" and int8.net.path.name == "model.qdq.onnx"


def test_openvino_runs_the_ir_converted_from_torch_and_an_older_export_without_it(trained_dir, tmp_path):
    import shutil

    import numpy as np

    import bertheads

    meta = json.loads((trained_dir / "onnx" / "export.json").read_text())
    ir = meta["graphs"]["openvino"]
    assert ir["file"] == "model.xml" and (trained_dir / "onnx" / ir["weights"]).stat().st_size > 0
    assert ir["max_abs_diff_vs_torch"] < 1e-4
    texts = ["a great film", "an awful film", "dull " * 30, "superb"]
    want = [list(p["scores"].values()) for p in bertheads.load(trained_dir, runtime="torch", precision="fp32")
            .predict(texts)]
    old = tmp_path / "model"  # an export made where openvino was not installed: the ONNX graph runs
    shutil.copytree(trained_dir, old)
    del meta["graphs"]["openvino"]
    (old / "onnx" / "export.json").write_text(json.dumps(meta))
    for directory, graph in ((trained_dir, "model.xml"), (old, "model.onnx")):
        ov = bertheads.load(directory, runtime="openvino", precision="fp32")
        assert ov.net.path.name == graph
        assert np.allclose([list(p["scores"].values()) for p in ov.predict(texts)], want, atol=1e-4)
    (trained_dir / "onnx" / "model.bin").rename(tmp_path / "model.bin")
    try:
        with pytest.raises(UserError, match=r"model\.bin: missing; run `bertheads export .* --to onnx`$"):
            bertheads.load(trained_dir, runtime="openvino", precision="fp32")
    finally:
        (tmp_path / "model.bin").rename(trained_dir / "onnx" / "model.bin")


def test_openvino_runs_short_batches_without_attention_snippets_where_that_was_measured(trained_dir):
    import numpy as np

    import bertheads

    short, long = ["a great film", "an awful film"], ["lovely " * 60, "dull " * 70]
    want = {t: list(p["scores"].values()) for t, p in
            zip(short + long, bertheads.load(trained_dir, runtime="torch", precision="fp32").predict(short + long))}
    with pretend(AMX):
        ov = bertheads.load(trained_dir, runtime="openvino", precision="fp32")
    assert ov.net.short_length == 48 and ov.net.short_compiled is None
    for texts, compiled in ((long, "long"), (short, "short")):
        got = ov.predict(texts)
        assert np.allclose([list(p["scores"].values()) for p in got], [want[t] for t in texts], atol=1e-4)
        assert getattr(ov.net.local, compiled, None) is not None
        if compiled == "long":
            assert ov.net.short_compiled is None  # compiled only when a short batch comes
    with pretend(AVX2):  # not measured there: OpenVINO's default for every batch
        plain = bertheads.load(trained_dir, runtime="openvino", precision="fp32")
    plain.predict(short)
    assert plain.net.short_length == 0 and plain.net.short_compiled is None


def test_export_without_the_ir_by_flag_or_when_openvino_cannot_convert(trained_dir, tmp_path, monkeypatch, capsys):
    import shutil

    import openvino

    import bertheads

    flagged, failed = tmp_path / "flagged", tmp_path / "failed"
    for target in (flagged, failed):
        shutil.copytree(trained_dir, target)
        shutil.rmtree(target / "onnx")
    assert main(["export", str(trained_dir), "--to", "hf", "--out", str(tmp_path / "hf"), "--no-openvino"]) == 2
    with pretend(AVX2):
        assert main(["export", str(flagged), "--to", "onnx", "--no-openvino"]) == 0

        def unsupported(*args, **kwargs):
            raise RuntimeError("Model wasn't fully converted.\nmore detail")

        monkeypatch.setattr(openvino, "convert_model", unsupported)
        capsys.readouterr()
        assert main(["export", str(failed), "--to", "onnx"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warned == ["bertheads: warning: OpenVINO IR not written (RuntimeError: Model wasn't fully converted.); "
                      "--runtime openvino reads the ONNX graph"]
    for target in (flagged, failed):
        assert "openvino" not in json.loads((target / "onnx" / "export.json").read_text())["graphs"]
        assert not list((target / "onnx").glob("model.xml")) and not list((target / "onnx").glob("model.bin"))
        assert bertheads.load(target, runtime="openvino", precision="fp32").net.path.name == "model.onnx"


def test_the_gate_refuses_a_broken_mode(trained_dir, tmp_path, monkeypatch, capsys, caplog):
    import shutil

    import bertheads
    from bertheads.export import gate
    from bertheads.model import BertHeads

    target = tmp_path / "model"
    shutil.copytree(trained_dir, target)
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    exported = (target / "gate.json").read_bytes()  # export's verdicts for this (AVX2) machine
    real = BertHeads.run_batch

    def broken(self, features, rows, heads, with_loss=False):  # a bf16 kernel that flips every score
        outputs, losses = real(self, features, rows, heads, with_loss)
        return ({k: -v for k, v in outputs.items()} if self.inference_dtype is not None else outputs), losses

    monkeypatch.setattr(BertHeads, "run_batch", broken)
    with pretend(AMX), pytest.raises(UserError, match="refused by the gate: classify: accuracy falls") as err:
        bertheads.load(target, runtime="torch", precision="bf16")
    assert "\n" not in str(err.value) and "force=True runs it anyway" in str(err.value)
    with pretend(AMX), caplog.at_level(logging.WARNING, logger="bertheads"):  # forced: it runs, with a warning
        forced = bertheads.load(target, runtime="torch", precision="bf16", force=True)
    assert forced.mode.precision == "bf16" and "forced past the gate" in forced.mode.why
    assert any(r.levelno == logging.WARNING and "force=True: running torch bf16, which the gate refused"
               in r.getMessage() for r in caplog.records)
    assert forced.evaluate(str(trained_dir.parent / "train.tsv"))["mode"] == "torch bf16 on cpu"  # says in what
    (tmp_path / "in.txt").write_text("a great film\n")
    asked = ["predict", str(target), "--input", str(tmp_path / "in.txt"), "--runtime", "torch", "--precision", "bf16"]
    capsys.readouterr()
    with pretend(AMX):  # the same from the command line, in its words
        assert main(asked) == 2 and "; --force runs it anyway" in capsys.readouterr().err
        assert main([*asked, "--force"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["label"] is not None and "--force: running torch bf16, which the gate refused" in err
    with pretend(AMX):  # a verdict belongs to the machine that made it
        assert gate.read_records(target)["torch/bf16"]["passed"] is False
    assert "torch/bf16" not in gate.read_records(target)
    with pretend(AMX.__class__(**{**AMX.__dict__, "installed": frozenset()})):  # no exported runtimes
        auto = bertheads.load(target)
    assert (auto.mode.runtime, auto.mode.precision) == ("torch", "fp32")  # the broken bf16 passed over
    assert (target / "gate.json").read_bytes() == exported  # a command that reads the model keeps its verdicts
    assert list((tmp_path / "cache" / "gate").glob("*.json"))  # in the user's cache
    monkeypatch.setattr(BertHeads, "run_batch", paced(real, slow=None))  # fixed, and fp32 made the slower
    shutil.rmtree(tmp_path / "cache")
    with pretend(TORCH_ONLY_AMX):
        fixed = bertheads.load(target)
    assert (fixed.mode.runtime, fixed.mode.precision) == ("torch", "bf16") and "passed the gate" in fixed.mode.why
    assert fixed.net.inference_dtype == torch.bfloat16
    assert next(fixed.net.encoder.parameters()).dtype == torch.bfloat16  # weights cast once, heads fp32
    assert next(fixed.net.heads.parameters()).dtype == torch.float32


TORCH_ONLY_AMX = Machine(**{**AMX.__dict__, "installed": frozenset()})  # AMX, no exported runtimes installed


def paced(run_batch, slow):
    """`BertHeads.run_batch` made slower (a pause a batch) when its inference dtype is `slow`."""
    import time

    def run(self, features, rows, heads, with_loss=False):
        if self.inference_dtype == slow:
            time.sleep(0.05)
        return run_batch(self, features, rows, heads, with_loss)

    return run


@pytest.mark.parametrize("slow, expected", [(torch.bfloat16, "torch/fp32"), (None, "torch/bf16")])
def test_auto_takes_the_mode_measured_fastest_whatever_the_order(trained_dir, tmp_path, monkeypatch, caplog, slow,
                                                                   expected):
    """AMX puts torch bf16 before fp32; the gate's timing on this machine decides."""
    import logging
    import shutil

    import bertheads
    from bertheads.export import gate
    from bertheads.model import BertHeads

    target = tmp_path / "model"
    shutil.copytree(trained_dir, target)
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(BertHeads, "run_batch", paced(BertHeads.run_batch, slow))
    with pretend(TORCH_ONLY_AMX), caplog.at_level(logging.INFO, logger="bertheads"):
        auto = bertheads.load(target)
        record = gate.read_records(target)["torch/bf16"]
    assert auto.mode.key == expected and record["passed"]
    faster, slower = sorted((record["inputs_per_s"], record["fp32_inputs_per_s"]), reverse=True)
    assert faster > 1.5 * slower  # the pause shows in the measured rates
    line = [r.message for r in caplog.records if r.message.startswith("auto:")][-1]
    other = "torch fp32" if expected == "torch/bf16" else "torch bf16"
    assert line.startswith(f"auto: {expected.replace('/', ' ')} on cpu, ") and f"(then {other} " in line
    with pretend(TORCH_ONLY_AMX):  # the verdict and its speeds are kept: the next load measures nothing
        caplog.clear()
        assert bertheads.load(target).mode.key == expected
    assert not [r for r in caplog.records if r.message.startswith("checking")]


def test_predict_on_an_absent_device_is_one_line(trained_dir, capsys):
    with pretend(AVX2):
        code = main(["predict", str(trained_dir), "--device", "cuda:1", "--input", str(trained_dir / "config.yaml")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "no CUDA device" in err and len(err.splitlines()) == 1
    with pretend(AVX2):
        code = main(["evaluate", str(trained_dir), "--data", str(trained_dir / "config.yaml"), "--runtime", "openvino",
                     "--precision", "bf16"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "neither AMX nor AVX512_BF16" in err and len(err.splitlines()) == 1


def test_a_missing_input_is_refused_before_the_gate_runs(trained_dir, tmp_path, capsys, monkeypatch):
    import shutil

    target = tmp_path / "model"
    shutil.copytree(trained_dir, target)
    (target / "gate.json").unlink(missing_ok=True)
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    with pretend(AMX.__class__(**{**AMX.__dict__, "installed": frozenset()})):  # auto would gate torch bf16
        code = main(["evaluate", str(target), "--data", str(tmp_path / "missing.tsv")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.endswith("missing.tsv: no such file") and len(err.splitlines()) == 1
        code = main(["predict", str(target), "--input", str(tmp_path / "missing.txt")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.endswith("missing.txt: no such file") and len(err.splitlines()) == 1
    assert not (target / "gate.json").exists()  # nothing was checked against fp32 for a run that cannot start
    assert not (tmp_path / "cache").exists()


def test_cuda_attention_leaves_cudnn_out_for_the_pass_only():
    from bertheads.encoder.pretrained import attention_kernels

    assert torch.backends.cuda.cudnn_sdp_enabled()
    with attention_kernels(torch.device("cuda")):  # cuDNN plans one kernel per shape: left out
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()  # the caller's setting back after the pass
    with attention_kernels(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()


def test_training_steps_leave_the_loss_on_the_device(tiny_bert, write, tmp_path, monkeypatch):
    import bertheads
    from bertheads.training import loop

    reads, counting = [], []
    real_float, real_epoch = torch.Tensor.__float__, loop.train_epoch

    def counted_float(tensor):
        if counting:
            reads.append(tensor)
        return real_float(tensor)

    def epoch(*args, **kwargs):
        counting.append(True)
        try:
            return real_epoch(*args, **kwargs)
        finally:
            counting.clear()

    monkeypatch.setattr(torch.Tensor, "__float__", counted_float)
    monkeypatch.setattr(loop, "train_epoch", epoch)
    path = sentiment_file(write)  # 24 rows: 6 steps of 4
    bertheads.train("classify", path, None, tmp_path / "m", model=tiny_bert, epochs=1, batch_size=4, progress=False)
    assert len(reads) == 1  # the epoch's running loss, read once at its end (a GPU step never waits for one)
    steps = []
    bertheads.train("classify", path, None, tmp_path / "n", model=tiny_bert, epochs=1, batch_size=4, progress=False,
                    on_step=lambda step, loss: steps.append(loss))
    assert len(steps) == 6 and all(isinstance(v, float) for v in steps)  # a callback asked: it gets floats


def test_to_device_moves_dicts_lists_and_tensors():
    from bertheads.text.encoding import to_device

    cpu = torch.device("cpu")
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "states": [torch.zeros(2, 4), torch.ones(2, 4)]}
    moved = to_device(batch, cpu)
    assert set(moved) == {"input_ids", "states"} and isinstance(moved["states"], list)
    assert torch.equal(moved["states"][1], batch["states"][1]) and moved["input_ids"].device == cpu


def first_pass_slow(run_batch, slow):
    """`BertHeads.run_batch` as a runtime that prepares kernels per batch shape (OpenVINO's way):
    a long pause the first time the `slow` dtype meets a shape, none after; every other dtype a
    short pause each batch."""
    import time

    seen: set = set()

    def run(self, features, rows, heads, with_loss=False):
        if self.inference_dtype == slow:
            shape = (len(features), max(len(f["input_ids"]) for f in features))
            if shape not in seen:
                seen.add(shape)
                time.sleep(0.08)
        else:
            time.sleep(0.02)
        return run_batch(self, features, rows, heads, with_loss)

    return run


def test_the_gate_times_the_second_pass_so_a_mode_that_warms_up_per_shape_still_wins(trained_dir, tmp_path,
                                                                                      monkeypatch):
    """A mode slow on its first pass over the gate's inputs and fast after it (kernels prepared
    per batch shape) is timed at the speed it keeps, and `auto` takes it."""
    import shutil

    import bertheads
    from bertheads.export import gate
    from bertheads.model import BertHeads

    target = tmp_path / "model"
    shutil.copytree(trained_dir, target)
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(BertHeads, "run_batch", first_pass_slow(BertHeads.run_batch, torch.bfloat16))
    with pretend(TORCH_ONLY_AMX):
        auto = bertheads.load(target)
        record = gate.read_records(target)["torch/bf16"]
    assert auto.mode.key == "torch/bf16"  # timed on its first pass it would lose: 0.08 s a batch against 0.02
    assert record["inputs_per_s"] > 1.5 * record["fp32_inputs_per_s"]
