"""The pooling a sequence head reads: the checkpoint's declared sentence-transformers pooling in
features mode (mean of the tokens the mask keeps), `--pooling` overriding it, [CLS] when
fine-tuning and for heads saved before the setting; the features cache, saving, the ONNX graph
and the transformers export agree with it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_multi import save_heads

import bertheads
from bertheads.cli import main as cli
from bertheads.encoder.layers import cached_positions, pool_tokens
from bertheads.encoder.pretrained import Encoder, declared_pooling
from bertheads.store.features_cache import cache_key

QUICK = bertheads.TrainSettings(epochs=1, batch_size=8, lr=5e-3, progress=False)
TEXTS = ["a good fun film", "an awful dull bore that goes on and on and on", "fine"]


def pooling_dir(source: str, target: Path, **modes: bool) -> str:
    """A copy of checkpoint `source` declaring a sentence-transformers pooling (`modes`: the
    `pooling_mode_*_tokens` flags set, e.g. mean_tokens=True)."""
    shutil.copytree(source, target)
    (target / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (target / "1_Pooling").mkdir()
    config = {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
              "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
    config.update({f"pooling_mode_{k}": v for k, v in modes.items()})
    (target / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return str(target)


@pytest.fixture(scope="module")
def mean_bert(tiny_bert, tmp_path_factory) -> str:
    """The tiny BERT, declaring mean pooling as all-MiniLM-L6-v2 does."""
    return pooling_dir(tiny_bert, tmp_path_factory.mktemp("mean") / "ckpt", mean_tokens=True)


def sentiment(tmp_path: Path, n: int = 12) -> str:
    rows = "".join(f"a good fun film number {i}\t1\nan awful dull bore {i} times over and over\t0\n" for i in range(n))
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\n" + rows, encoding="utf-8")
    return str(path)


def head_inputs(model, texts: list[str]) -> torch.Tensor:
    """What the classify head's dense layer reads for each of `texts`, each predicted alone."""
    seen: list[torch.Tensor] = []
    handle = model.net.heads["classify"].pooler.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    try:
        for text in texts:
            model.predict([text])
    finally:
        handle.remove()
    return torch.cat(seen)


def batch_inputs(model, texts: list[str]) -> torch.Tensor:
    """The same for `texts` padded into one batch (rows in `texts`' order)."""
    seen: list[torch.Tensor] = []
    handle = model.net.heads["classify"].pooler.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    enc = model.net.encoder.tokenizer(texts, padding=True, return_tensors="pt")
    try:
        with torch.inference_mode():
            model.net.eval()(dict(enc), ["classify"])
    finally:
        handle.remove()
    return seen[0]


def live_states(model, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The last layer's states and the attention mask of `texts`, padded together."""
    enc = model.net.encoder.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        states = model.net.encoder(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    return states, enc["attention_mask"]


def hand_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = [states[i, mask[i].bool()].mean(0) for i in range(len(states))]
    return torch.stack(rows)


# -- reading the declaration -----------------------------------------------------------------
def test_declared_pooling_reads_the_sentence_transformers_layout(tiny_bert, default_model_dir, tmp_path, caplog):
    assert declared_pooling(Path(default_model_dir)) == "mean"  # all-MiniLM-L6-v2
    assert declared_pooling(Path(tiny_bert)) is None
    assert declared_pooling(Path(pooling_dir(tiny_bert, tmp_path / "cls", cls_token=True))) == "cls"
    assert declared_pooling(Path(pooling_dir(tiny_bert, tmp_path / "max", max_tokens=True))) == "max"
    # modes bertheads does not compute: nothing declared, said once
    assert declared_pooling(Path(pooling_dir(tiny_bert, tmp_path / "sqrt", mean_sqrt_len_tokens=True))) is None
    assert declared_pooling(Path(pooling_dir(tiny_bert, tmp_path / "two", mean_tokens=True, max_tokens=True))) is None
    assert "pooling_mode_mean_sqrt_len_tokens" in caplog.text and "does not compute" in caplog.text


def test_pool_tokens_leaves_padding_out():
    states = torch.tensor([[[1.0, 2.0], [3.0, -4.0], [100.0, 100.0]],
                           [[5.0, 6.0], [7.0, 8.0], [9.0, -10.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    torch.testing.assert_close(pool_tokens(states, mask, "cls"), torch.tensor([[1.0, 2.0], [5.0, 6.0]]))
    torch.testing.assert_close(pool_tokens(states, mask, "mean"), torch.tensor([[2.0, -1.0], [7.0, 4.0 / 3.0]]))
    torch.testing.assert_close(pool_tokens(states, mask, "max"), torch.tensor([[3.0, 2.0], [9.0, 8.0]]))


# -- features mode: the declared pooling, and --pooling over it ------------------------------
def test_features_mode_pools_by_the_declared_mean(mean_bert, tmp_path):
    train = sentiment(tmp_path)
    cache = tmp_path / "cache"
    model = bertheads.train("classify", train, None, None, model=mean_bert, settings=QUICK, mode="features",
                            cache_dir=str(cache), cache_dtype="float32")
    head = model.net.heads["classify"]
    assert model.task().spec.pooling == "mean" and head.pooling == "mean"
    assert cached_positions(head) == "mean"

    # the cache holds one row per text: the masked mean of its last-layer states
    [entry] = [p for p in (cache / "features").iterdir() if not p.name.startswith(".")]
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["positions"] == "mean" and meta["rows"] == 24
    texts = [line.split("\t")[0] for line in Path(train).read_text().splitlines()[1:4]]
    states, mask = live_states(model, texts)
    cached = torch.from_numpy(np.load(entry / "states.npy")[:3, 0])
    torch.testing.assert_close(cached, hand_mean(states, mask), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(cached, states[:, 0], atol=1e-3)  # not [CLS]

    # predicting, the head reads the same masked mean of the live states (padding left out)
    states, mask = live_states(model, TEXTS)
    assert mask.sum(1).tolist() != [mask.shape[1]] * len(TEXTS)  # padding there to be left out
    torch.testing.assert_close(head_inputs(model, TEXTS), hand_mean(states, mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch_inputs(model, TEXTS), hand_mean(states, mask), atol=1e-5, rtol=1e-5)


def test_pooling_flag_overrides_the_declaration(mean_bert, tmp_path):
    train = sentiment(tmp_path)
    cache = tmp_path / "cache"
    common = dict(model=mean_bert, settings=QUICK, mode="features", cache_dir=str(cache), cache_dtype="float32")
    cls = bertheads.train("classify", train, None, None, pooling="cls", **common)
    assert cls.task().spec.pooling == "cls"
    states, mask = live_states(cls, TEXTS)
    torch.testing.assert_close(head_inputs(cls, TEXTS), states[:, 0], atol=1e-5, rtol=1e-5)
    maxed = bertheads.train("classify", train, None, None, pooling="max", **common)
    assert maxed.task().spec.pooling == "max"
    expected = torch.stack([states[i, mask[i].bool()].max(0).values for i in range(len(TEXTS))])
    torch.testing.assert_close(head_inputs(maxed, TEXTS), expected, atol=1e-5, rtol=1e-5)
    # one entry per pooling: a [CLS] entry is never read for a max head
    positions = sorted(json.loads((p / "meta.json").read_text())["positions"]
                       for p in (cache / "features").iterdir() if not p.name.startswith("."))
    assert positions == ["cls", "max"]


def test_cache_key_and_positions_follow_the_pooling(tiny_bert):
    encoder = Encoder.load(tiny_bert)
    features = [{"input_ids": [101, 2204, 102]}]
    keys = {p: cache_key("enc", features, (2,), p, "float16", False) for p in ("cls", "mean", "max", "tokens")}
    assert len(set(keys.values())) == 4

    class Head(torch.nn.Module):
        token_level = False

        def __init__(self, pooling, layers, mode):
            super().__init__()
            self.pooling, self.layers = pooling, layers
            self.combine = torch.nn.Module()
            self.combine.mode = mode

    assert cached_positions(Head("mean", (-1, -2), "scalar-mix")) == "mean"  # linear: pooled per layer
    assert cached_positions(Head("max", (-1, -2), "concat")) == "max"
    assert cached_positions(Head("max", (-1, -2), "sum")) == "tokens"  # max of a sum is not a sum of maxes
    assert cached_positions(Head("cls", (-1,), "concat")) == "cls"
    assert encoder.declared_pooling() is None


def test_max_over_summed_layers_trains_from_every_token(mean_bert, tmp_path):
    """Where pooling per layer would change the result, the cache keeps every token, and the
    head's dev outputs from the cache equal the live model's."""
    train = sentiment(tmp_path)
    cache = tmp_path / "cache"
    model = bertheads.train("classify", train, train, None, model=mean_bert, settings=QUICK, mode="features",
                            pooling="max", layers="-1,-2", combine="sum", cache_dir=str(cache),
                            cache_dtype="float32")
    [entry] = [p for p in (cache / "features").iterdir() if not p.name.startswith(".")]
    assert json.loads((entry / "meta.json").read_text())["positions"] == "tokens"
    assert model.metrics["dev"]["accuracy"] == model.evaluate(train)["accuracy"]
    assert abs(model.metrics["dev"]["loss"] - model.evaluate(train)["loss"]) < 1e-4


# -- fine-tuning keeps [CLS]; saved models ----------------------------------------------------
def test_fine_tuning_keeps_cls(mean_bert, tmp_path):
    model = bertheads.train("classify", sentiment(tmp_path, 4), None, None, model=mean_bert, settings=QUICK)
    assert model.task().spec.pooling == "cls" and model.net.heads["classify"].pooling == "cls"


def test_saved_model_round_trips_and_old_manifests_read_cls(mean_bert, tmp_path):
    train = sentiment(tmp_path)
    out = tmp_path / "m"
    model = bertheads.train("classify", train, None, str(out), model=mean_bert, settings=QUICK, mode="features",
                            cache_dir=str(tmp_path / "cache"))
    manifest = json.loads((out / "bertheads.json").read_text())
    assert manifest["heads"]["classify"]["spec"]["pooling"] == "mean"
    assert "pooling: auto" in (out / "config.yaml").read_text()  # the setting as given
    loaded = bertheads.load(out)
    assert loaded.net.heads["classify"].pooling == "mean"
    before = [p["scores"] for p in model.predict(TEXTS)]
    assert [p["scores"] for p in loaded.predict(TEXTS)] == before
    states, mask = live_states(loaded, TEXTS)
    torch.testing.assert_close(head_inputs(loaded, TEXTS), hand_mean(states, mask), atol=1e-5, rtol=1e-5)

    # a manifest written before the field: the same weights read [CLS]
    del manifest["heads"]["classify"]["spec"]["pooling"]
    (out / "bertheads.json").write_text(json.dumps(manifest))
    old = bertheads.load(out)
    assert old.task().spec.pooling == "cls" and old.net.heads["classify"].pooling == "cls"
    torch.testing.assert_close(head_inputs(old, TEXTS), states[:, 0], atol=1e-5, rtol=1e-5)
    assert [p["scores"] for p in old.predict(TEXTS)] != before


# -- exports ----------------------------------------------------------------------------------
def test_onnx_graph_pools_like_torch(tiny_bert, tmp_path):
    from bertheads.export import onnx as export_onnx

    heads = {"mean": ("classify", 1, {"labels": ["a", "b"], "pooling": "mean"}),
             "max": ("classify", 2, {"labels": ["a", "b"], "pooling": "max", "pair": True})}
    model_dir = save_heads(tiny_bert, tmp_path / "model", heads)
    export_onnx.export_onnx(model_dir, openvino=False)
    ours, theirs = bertheads.load(model_dir), bertheads.load(model_dir, runtime="onnx")
    assert ours.net.heads["mean"].pooling == "mean"
    texts = [*TEXTS, "word " * 40]
    for head, inputs in (("mean", texts), ("max", [(t, "it was fine") for t in texts])):
        a = np.stack([p[head] for p in raw(ours, head, inputs)])
        b = np.stack([p[head] for p in raw(theirs, head, inputs)])
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)
    cls_dir = save_heads(tiny_bert, tmp_path / "cls", {"mean": ("classify", 1, {"labels": ["a", "b"],
                                                                              "pooling": "cls"})})
    a = np.stack([p["mean"] for p in raw(bertheads.load(cls_dir), "mean", texts)])
    b = np.stack([p["mean"] for p in raw(ours, "mean", texts)])
    assert np.abs(a - b).max() > 1e-3  # same weights, [CLS]: other outputs


def raw(model, head: str, inputs: list) -> list[dict]:
    """Each input's raw head outputs (logits), batched as `predict` batches them."""
    from bertheads.compute.runner import run_heads

    task = model.task(head)
    features, _ = task.modeling.encode_for_inference(task.reading.from_inputs(inputs), model.net.encoder.tokenizer)
    return [{head: o} for o in run_heads(model.net, features, [head])[head]]


def test_hf_export_refuses_a_pooling_the_class_does_not_have(tiny_bert, tmp_path, capsys):
    heads = {"mean": ("classify", 1, {"labels": ["a", "b"], "pooling": "mean"}),
             "cls": ("classify", 2, {"labels": ["a", "b"], "pooling": "cls"})}
    model_dir = save_heads(tiny_bert, tmp_path / "model", heads)
    code = cli.main(["export", str(model_dir), "--to", "hf", "--head", "mean", "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "mean of its tokens" in err and "--to onnx" in err and "no transformers equivalent" in err
    assert not (tmp_path / "a").exists()
    assert cli.main(["export", str(model_dir), "--to", "hf", "--head", "cls", "--out", str(tmp_path / "b")]) == 0


def test_cli_pooling_flag(mean_bert, tmp_path, capsys):
    out = tmp_path / "m"
    assert cli.main(["train", "classify", "--train", sentiment(tmp_path, 4), "--model", mean_bert, "--epochs", "1",
                     "--no-progress", "--mode", "features", "--pooling", "max", "--cache-dir", str(tmp_path / "c"),
                     "--out", str(out)]) == 0
    assert json.loads((out / "bertheads.json").read_text())["heads"]["classify"]["spec"]["pooling"] == "max"
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        cli.main(["train", "classify", "--train", "x.tsv", "--pooling", "first"])
    assert stop.value.code == 2 and "--pooling: invalid choice: 'first'" in capsys.readouterr().err
