"""`bertheads export --to onnx|hf` and the ONNX Runtime path: parity with torch, int8, the
transformers export in `pipeline`, and the bad-input cases."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from helpers_machine import pretend
from helpers_multi import save_heads

import bertheads
from bertheads.base.errors import UserError
from bertheads.base.machine import machine
from bertheads.cli.main import main
from bertheads.compute.runner import run_heads
from bertheads.export import onnx as export_onnx
from bertheads.export.hf import export_hf
from bertheads.serve.app import create_app

TEXTS = ["Angela Merkel visited Paris last week.", "A warm, funny and wonderfully acted film.",
         "Fiat is based in Turin , Italy .", "word " * 150 + "Berlin is large."]  # the last one needs windows
PASSAGE = "The Eiffel Tower was finished in 1889 and stands in Paris. " * 6
QUESTIONS = [{"question": "Where is the tower?", "context": PASSAGE}, ("When was it finished?", "It was finished in 1889.")]
TAGS = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
HEADS = {"sentiment": ("classify", 1, {"labels": ["negative", "positive"]}),
         "nli": ("classify", 2, {"labels": [0, 1, 2], "pair": True, "tune_layers": 2}),  # branches: from layer 0
         "ner": ("tag", 3, {"tags": TAGS, "max_length": 32, "stride": 8, "tune_layers": 1}),  # and from layer 1
         "qa": ("qa", 4, {"max_length": 64, "stride": 16})}


@pytest.fixture(scope="module")
def model_dir(tiny_bert, tmp_path_factory):
    """Four heads on the tiny BERT, two of them with a branch (their own top layers), exported
    once to ONNX in fp32 and int8."""
    out = save_heads(tiny_bert, tmp_path_factory.mktemp("export") / "model", HEADS)
    export_onnx.export_onnx(out, quantize_to="int8", openvino=False)
    return out


@pytest.fixture(scope="module")
def models(model_dir):
    return {"torch": bertheads.load(model_dir), "fp32": bertheads.load(model_dir, runtime="onnx"),
            "int8": bertheads.load(model_dir, runtime="onnx", precision="int8")}


def raw_outputs(model, head: str, inputs: list) -> tuple[list, list]:
    task = model.task(head)
    examples = task.reading.from_inputs(inputs)
    features, _ = task.modeling.encode_for_inference(examples, model.net.encoder.tokenizer)
    return features, run_heads(model.net, features, [head])[head]


CASES = [("sentiment", TEXTS), ("nli", [(t, "It was in Paris.") for t in TEXTS]), ("ner", TEXTS), ("qa", QUESTIONS)]


@pytest.mark.parametrize("head,inputs", CASES)
def test_onnx_fp32_matches_torch(models, head, inputs):
    features, ours = raw_outputs(models["torch"], head, inputs)
    _, theirs = raw_outputs(models["fp32"], head, inputs)
    assert len(theirs) == len(ours) == len(features)
    for a, b, f in zip(ours, theirs, features):
        assert a.shape == b.shape
        if a.ndim == 2:
            assert len(a) == len(f["input_ids"])  # token rows trimmed to the input
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)
    assert models["fp32"].predict(inputs, head=head) == models["torch"].predict(inputs, head=head)


@pytest.mark.parametrize("head,inputs", CASES)
def test_onnx_gives_the_calibrated_scores_of_torch(models, head, inputs):
    """The temperature is applied to any runtime's outputs: ONNX Runtime's scores are torch's."""
    for model in (models["torch"], models["fp32"]):
        model.task(head).spec.temperature = 1.7
    try:
        calibrated = models["torch"].predict(inputs, head=head)
        assert models["fp32"].predict(inputs, head=head) == calibrated
        assert models["torch"].predict(inputs, head=head, calibrate=False) != calibrated
    finally:
        for model in (models["torch"], models["fp32"]):
            model.task(head).spec.temperature = None


def test_onnx_analyze_and_windows(models):
    """Long inputs cut into windows and the one-pass analyze give torch's answers."""
    assert models["fp32"].analyze(TEXTS) == models["torch"].analyze(TEXTS)
    features, _ = raw_outputs(models["torch"], "ner", TEXTS[-1:])
    assert len(features) > 1


def test_int8_close_to_fp32_on_labelled_set(models, write):
    """On a small labelled set the int8 graph gives nearly the fp32 scores and the same metrics."""
    rows = [f"{t}\t{'positive' if i % 2 else 'negative'}" for i, t in enumerate(TEXTS * 4)]
    path = write("dev.tsv", "sentence\tlabel\n" + "\n".join(rows) + "\n")
    fp32 = models["fp32"].predict_file(path, head="sentiment")[1]
    int8 = models["int8"].predict_file(path, head="sentiment")[1]
    worst = max(abs(a["scores"][k] - b["scores"][k]) for a, b in zip(fp32, int8) for k in a["scores"])
    assert 0 < worst < 0.02  # quantized (not identical), yet close
    _, ours = raw_outputs(models["torch"], "qa", QUESTIONS)
    _, theirs = raw_outputs(models["int8"], "qa", QUESTIONS)
    assert max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs)) < 0.05
    plain = {k: v for k, v in models["fp32"].evaluate(path, head="sentiment").items() if isinstance(v, (int, float))}
    got = models["int8"].evaluate(path, head="sentiment")
    assert {k: got[k] for k in plain} == pytest.approx(plain, abs=1 / len(rows) + 1e-9)


def test_export_meta_and_int8_settings(model_dir):
    meta = json.loads((model_dir / "onnx" / "export.json").read_text())
    fused = meta["graphs"]["fp32"]["fusions"]["ops"]
    layers = 2 + 2 + 1  # the trunk once, then the branches' own top layers (not a whole encoder per head)
    assert fused["Attention"] == layers and fused["SkipLayerNormalization"] >= layers and fused["BiasGelu"] == layers
    settings = meta["graphs"]["int8"]["quantization"]
    assert settings["per_channel"] and settings["weight_type"] == "QInt8"
    assert settings["reduce_range"] is machine().int8_pairs_saturate  # 7-bit weights only where pairs overflow
    import onnx

    graph = onnx.load(str(model_dir / "onnx" / "model.onnx")).graph
    assert [tuple(i.dims) for i in graph.initializer].count((30522, 32)) == 1  # the word embeddings once
    heads = export_onnx.head_nodes(model_dir / "onnx" / "model.onnx")
    assert len(heads) >= 6 and settings["heads_kept_fp32"] == len(heads)  # Gemm; MatMul and Add
    int8_nodes = {n.name: n.op_type for n in onnx.load(str(model_dir / "onnx" / "model.int8.onnx")).graph.node}
    assert all((int8_nodes.get(name) or int8_nodes.get(f"{name}_MatMul")) in ("Gemm", "MatMul", "Add")
               for name in heads)  # left in fp32
    assert meta["graphs"]["fp32"]["max_abs_diff_vs_torch"] < 1e-4
    counts = export_onnx.op_counts(model_dir / "onnx" / "model.int8.onnx")
    # every encoder linear in int8, the branches' as the trunk's: attention, its output, the feed-forward's two
    assert counts.get("MatMulInteger") == 3 * layers and counts.get("QAttention") == layers
    assert not counts.get("Attention") and not counts.get("Concat", 0) > export_onnx.op_counts(
        model_dir / "onnx" / "model.onnx").get("Concat", 0)
    assert not counts.get("FastGelu")
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_dir / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [o.name for o in sess.get_outputs()] == list(HEADS)
    shape = sess.get_inputs()[0].shape
    assert all(isinstance(d, str) for d in shape)  # dynamic batch and sequence axes


def test_cli_predict_evaluate_onnx(model_dir, write, capsys):
    path = write("in.txt", "\n".join(TEXTS[:3]) + "\n")
    outputs = {}
    for runtime, precision in (("torch", "fp32"), ("onnx", "fp32"), ("onnx", "int8")):
        assert main(["predict", str(model_dir), "--head", "ner", "--input", path, "--runtime", runtime,
                     "--precision", precision]) == 0
        outputs[runtime, precision] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert outputs["onnx", "fp32"] == outputs["torch", "fp32"]
    int8 = outputs["onnx", "int8"]  # quantized: near-tied tags may differ from fp32, the form may not
    assert [sorted(x) for x in int8] == [["entities"]] * 3 and any(x["entities"] for x in int8)
    for line, x in zip(TEXTS[:3], int8):
        assert all(line[e["start"] : e["end"]] == e["text"] and e["type"] in ("LOC", "PER") and 0 < e["score"] <= 1
                   for e in x["entities"]), x
    dev = write("dev.tsv", "sentence\tlabel\n" + "".join(f"{t}\tpositive\n" for t in TEXTS))
    assert main(["evaluate", str(model_dir), "--head", "sentiment", "--data", dev, "--json", "--runtime", "onnx"]) == 0
    onnx_metrics = json.loads(capsys.readouterr().out)
    assert main(["evaluate", str(model_dir), "--head", "sentiment", "--data", dev, "--json"]) == 0
    torch_metrics = json.loads(capsys.readouterr().out)
    assert "loss" not in onnx_metrics and "loss" in torch_metrics  # the ONNX graph gives outputs only
    # each result says what it ran in
    assert (onnx_metrics.pop("mode"), torch_metrics.pop("mode")) == ("onnx fp32 on cpu", "torch fp32 on cpu")
    assert onnx_metrics == {k: v for k, v in torch_metrics.items() if k != "loss"}


def test_serve_onnx_runtime(models):
    with TestClient(create_app(models["fp32"]), base_url="http://localhost") as client:
        got = client.post("/analyze", json={"texts": TEXTS[:2]}).json()["results"]
    assert got == json.loads(json.dumps(models["torch"].analyze(TEXTS[:2])))


def test_cls_only_model_runs_last_layer_for_cls(tiny_bert, tmp_path):
    """Like torch, a graph whose heads all read [CLS] computes the last layer for [CLS] alone."""
    model_dir = save_heads(tiny_bert, tmp_path / "model", {"sentiment": HEADS["sentiment"]})
    meta = export_onnx.export_onnx(model_dir, openvino=False)
    assert meta["graphs"]["fp32"]["fusions"]["ops"]["Attention"] == 1  # the other layer is not a full one
    ours, theirs = bertheads.load(model_dir), bertheads.load(model_dir, runtime="onnx")
    _, a = raw_outputs(ours, "sentiment", TEXTS)
    _, b = raw_outputs(theirs, "sentiment", TEXTS)
    np.testing.assert_allclose(np.stack(b), np.stack(a), atol=1e-4, rtol=0)


# -- bad input -------------------------------------------------------------------------------
def copy_model(model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(model_dir, target)
    return target


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    return code, err


def test_int8_without_int8_graph(model_dir, tmp_path, capsys):
    target = copy_model(model_dir, tmp_path)
    meta_path = target / "onnx" / "export.json"
    meta = json.loads(meta_path.read_text())
    del meta["graphs"]["int8"]
    meta_path.write_text(json.dumps(meta))
    code, err = run_cli(capsys, "predict", target, "--head", "qa", "--question", "q", "--context", "c",
                        "--runtime", "onnx", "--precision", "int8")
    assert code == 2 and "no int8 graph" in err and "--quantize int8" in err and len(err.splitlines()) == 1


def test_int8_weight_range_follows_the_cpu(model_dir, tmp_path, capsys):
    """Full-range int8 weights where the CPU has VNNI; 7 bits where its kernels add pairs of
    products in 16 bits; a full-range graph refused there with one line."""
    avx2 = replace(machine(), flags=frozenset({"avx2"}))  # this machine's runtimes, other CPU flags
    vnni = replace(machine(), flags=frozenset({"avx2", "avx512f", "avx512_vnni"}))
    fp32 = model_dir / "onnx" / "model.onnx"
    for fake, seven_bits in ((avx2, True), (vnni, False)):
        with pretend(fake):
            info = export_onnx.quantize(fp32, tmp_path / f"{fake.cpu_int8}.onnx", export_onnx.Int8Settings())
        assert info["reduce_range"] is seven_bits
    import onnx
    from onnx import numpy_helper

    def largest_int8_weight(path: Path) -> int:
        return max(int(np.abs(numpy_helper.to_array(t).astype(np.int32)).max())
                   for t in onnx.load(str(path)).graph.initializer if t.data_type == onnx.TensorProto.INT8)

    assert largest_int8_weight(tmp_path / "False.onnx") <= 64 < largest_int8_weight(tmp_path / "True.onnx")
    target = copy_model(model_dir, tmp_path)
    meta_path = target / "onnx" / "export.json"
    meta = json.loads(meta_path.read_text())
    meta["graphs"]["int8"]["quantization"]["reduce_range"] = False
    meta_path.write_text(json.dumps(meta))
    with pretend(avx2):
        code, err = run_cli(capsys, "predict", target, "--head", "qa", "--question", "q", "--context", "c",
                            "--runtime", "onnx", "--precision", "int8")
    assert code == 2 and "full 8 bits" in err and "--quantize int8` here" in err and len(err.splitlines()) == 1
    with pretend(vnni):
        assert bertheads.load(target, runtime="onnx", precision="int8").mode.key == "onnx/int8"


def test_missing_export_and_torch_int8(model_dir, tmp_path, capsys):
    target = copy_model(model_dir, tmp_path)
    shutil.rmtree(target / "onnx")
    code, err = run_cli(capsys, "predict", target, "--head", "qa", "--question", "q", "--context", "c",
                        "--runtime", "onnx")
    assert code == 2 and "run `bertheads export" in err and len(err.splitlines()) == 1
    with pytest.raises(UserError, match="^precision='int8' needs runtime='onnx'"):
        bertheads.load(model_dir, runtime="torch", precision="int8")
    # the runtime left to auto: int8 is the ONNX Runtime graph
    assert bertheads.load(model_dir, precision="int8").mode.key == "onnx/int8"


def test_export_that_does_not_match_the_manifest(model_dir, tmp_path, capsys):
    target = copy_model(model_dir, tmp_path)
    manifest = json.loads((target / "bertheads.json").read_text())
    manifest["heads"]["sentiment"]["spec"]["labels"] = ["bad", "good"]
    (target / "bertheads.json").write_text(json.dumps(manifest))
    code, err = run_cli(capsys, "predict", target, "--head", "sentiment", "--runtime", "onnx", "--input", __file__)
    assert code == 2 and "does not match" in err and len(err.splitlines()) == 1


def test_out_that_is_not_an_export(model_dir, tmp_path, capsys):
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    for argv in (["--to", "onnx", "--out", other], ["--to", "hf", "--head", "sentiment", "--out", other]):
        code, err = run_cli(capsys, "export", model_dir, *argv)
        assert code == 2 and "not a bertheads" in err and len(err.splitlines()) == 1
    assert (other / "notes.txt").read_text() == "keep me" and len(list(other.iterdir())) == 1


def test_failed_export_leaves_nothing(model_dir, tmp_path, monkeypatch):
    target = copy_model(model_dir, tmp_path)
    before = sorted(p.name for p in (target / "onnx").iterdir())

    def broken(path, settings):
        Path(path).write_bytes(b"half")
        raise RuntimeError("quantizer failed")

    monkeypatch.setattr(export_onnx, "quantize", lambda src, dst, settings: broken(dst, settings))
    monkeypatch.setattr(export_onnx, "export_graph", lambda net, path: (path.write_bytes(b"x"), list(net.tasks))[1])
    monkeypatch.setattr(export_onnx, "fuse", lambda path: {"ops": {}})
    monkeypatch.setattr(export_onnx, "max_difference", lambda net, path: 0.0)
    with pytest.raises(RuntimeError, match="quantizer failed"):
        export_onnx.export_onnx(target, quantize_to="int8", openvino=False)
    assert sorted(p.name for p in (target / "onnx").iterdir()) == before  # the old export is intact
    assert [p.name for p in target.iterdir() if p.name.startswith(".")] == []  # no temporary left
    import bertheads.export.hf as hf_export

    real = hf_export.to_transformers

    def half_saved(net, name, encoder_dir):
        model = real(net, name, encoder_dir)

        def save_pretrained(path, **_):
            (Path(path) / "config.json").write_text("{}")
            raise RuntimeError("disk full")

        model.save_pretrained = save_pretrained
        return model

    monkeypatch.setattr(hf_export, "to_transformers", half_saved)
    with pytest.raises(RuntimeError, match="disk full"):
        export_hf(target, tmp_path / "hf", head="sentiment")
    assert not (tmp_path / "hf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_heads_without_an_equivalent(tiny_bert, tmp_path, capsys):
    heads = {"mix": ("classify", 1, {"labels": ["a", "b"], "layers": [-1, -2], "combine": "scalar-mix"}),
             "lstm": ("tag", 2, {"tags": TAGS, "head_type": "bilstm", "lstm_size": 8})}
    model_dir = save_heads(tiny_bert, tmp_path / "model", heads)
    code, err = run_cli(capsys, "export", model_dir, "--to", "hf", "--head", "mix", "--out", tmp_path / "a")
    assert code == 2 and "layers -1,-2" in err and "no equivalent" in err and len(err.splitlines()) == 1
    code, err = run_cli(capsys, "export", model_dir, "--to", "hf", "--head", "lstm", "--out", tmp_path / "b")
    assert code == 2 and "BiLSTM" in err and len(err.splitlines()) == 1
    code, err = run_cli(capsys, "export", model_dir, "--to", "onnx")
    assert code == 2 and "BiLSTM" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (model_dir / "onnx").exists()


# -- the transformers export -----------------------------------------------------------------
def test_hf_export_in_pipelines(model_dir, models, tmp_path, capsys):
    from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification, pipeline

    torch_model = models["torch"]
    out = tmp_path / "sentiment"
    assert main(["export", str(model_dir), "--to", "hf", "--head", "sentiment", "--out", str(out)]) == 0
    assert "text-classification" in capsys.readouterr().err
    hf = AutoModelForSequenceClassification.from_pretrained(str(out))
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    got = pipeline("text-classification", model=str(out))(TEXTS)
    ours = torch_model.predict(TEXTS, head="sentiment")
    assert [g["label"] for g in got] == [o["label"] for o in ours]
    assert [g["score"] for g in got] == pytest.approx([max(o["scores"].values()) for o in ours], abs=1e-5)

    out = tmp_path / "nli"
    export_hf(model_dir, out, head="nli")
    pairs = [(t, "It was in Paris.") for t in TEXTS]
    got = pipeline("text-classification", model=str(out))([{"text": a, "text_pair": b} for a, b in pairs])
    assert [g["label"] for g in got] == [str(o["label"]) for o in torch_model.predict(pairs, head="nli")]

    out = tmp_path / "ner"
    export_hf(model_dir, out, head="ner")
    short = TEXTS[:3]  # windows: the pipeline cuts long inputs its own way
    got = pipeline("token-classification", model=str(out), aggregation_strategy="first")(short)
    ours = torch_model.predict(short, head="ner")
    assert [[(e["entity_group"], e["start"], e["end"]) for e in g] for g in got] == \
        [[(e["type"], e["start"], e["end"]) for e in o["entities"]] for o in ours]

    out = tmp_path / "qa"
    export_hf(model_dir, out, head="qa")
    hf = AutoModelForQuestionAnswering.from_pretrained(str(out)).eval()
    features, logits = raw_outputs(torch_model, "qa", QUESTIONS[1:])
    import torch

    with torch.no_grad():
        got = hf(input_ids=torch.tensor([features[0]["input_ids"]]),
                 token_type_ids=torch.tensor([features[0]["token_type_ids"]]))
    np.testing.assert_allclose(got.start_logits[0].numpy(), logits[0][:, 0], atol=1e-5)
    np.testing.assert_allclose(got.end_logits[0].numpy(), logits[0][:, 1], atol=1e-5)


# -- the real checkpoint ---------------------------------------------------------------------
@pytest.mark.nightly  # parity and fusions as the tiny models of every family and test_onnx_fp32_matches_torch check them
def test_onnx_parity_on_default_checkpoint(default_model_dir, tmp_path):
    heads = {"sentiment": HEADS["sentiment"], "ner": ("tag", 3, {"tags": TAGS}), "qa": ("qa", 4, {})}
    model_dir = save_heads(default_model_dir, tmp_path / "model", heads)
    meta = export_onnx.export_onnx(model_dir, openvino=False)
    assert meta["graphs"]["fp32"]["fusions"]["ops"]["Attention"] == 6
    ours, theirs = bertheads.load(model_dir), bertheads.load(model_dir, runtime="onnx")
    for head, inputs in (("sentiment", TEXTS), ("ner", TEXTS), ("qa", QUESTIONS)):
        _, a = raw_outputs(ours, head, inputs)
        _, b = raw_outputs(theirs, head, inputs)
        assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) < 1e-4
        assert theirs.predict(inputs, head=head) == ours.predict(inputs, head=head)
