"""Model cards (README.md) in saved models and exports, and label names in the transformers export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers_multi import save_heads
from huggingface_hub import ModelCard

import bertheads
from bertheads.export.hf import export_hf
from bertheads.export.onnx import export_onnx
from bertheads.saved import bundle, card

POS, NEG = ["good", "great", "fun", "lovely", "superb", "wonderful"], ["awful", "dull", "bore", "bad", "terrible", "boring"]
ROWS = "sentence\tlabel\n" + "".join(f"{POS[i % 6]} {POS[(i + 1) % 6]} film\t1\n{NEG[i % 6]} {NEG[(i + 2) % 6]} film\t0\n"
                                     for i in range(8))
TOPICS = "text,label\n" + "".join(f"the match ended {i} goals,sports\nthe soup was hot {i},food\n" for i in range(6))
NER = "".join(f"{w}\tB-LOC\nis\tO\nnice\tO\n\nPeter\tB-PER\nlikes\tO\n{w}\tB-LOC\n\n"
              for w in ("Paris", "Berlin", "Rome", "Turin"))
TEXTS = ["a great fun film", "an awful dull film", "lovely", "boring and bad"]


@pytest.fixture(scope="module")
def trained(tiny_bert, tmp_path_factory) -> Path:
    """A tiny classify model trained on 0/1 labels named negative, positive."""
    root = tmp_path_factory.mktemp("cards")
    (root / "sentiment-train.tsv").write_text(ROWS)
    (root / "sentiment-dev.tsv").write_text(ROWS)
    out = root / "sentiment"
    bertheads.train("classify", str(root / "sentiment-train.tsv"), str(root / "sentiment-dev.tsv"), out,
                    model=tiny_bert, epochs=1, batch_size=8, progress=False, label_names="negative,positive")
    return out


def front_matter(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    data = yaml.safe_load(text.split("---\n")[1])
    assert ModelCard.load(path).data.to_dict() == data  # huggingface_hub reads the same
    return data


def body(path: Path) -> str:
    return path.read_text(encoding="utf-8").split("---\n", 2)[2]


def test_label_names_survive_the_hf_export(trained, tmp_path):
    from transformers import AutoConfig, pipeline

    out = tmp_path / "hf"
    export_hf(trained, out)
    config = AutoConfig.from_pretrained(str(out))
    assert config.id2label == {0: "negative", 1: "positive"}
    assert config.label2id == {"negative": 0, "positive": 1}
    got = pipeline("text-classification", model=str(out))(TEXTS)
    ours = bertheads.load(trained).predict(TEXTS)
    assert {g["label"] for g in got} <= {"negative", "positive"}
    assert [g["label"] for g in got] == [o["label"] for o in ours]


def test_saved_model_card(trained, tiny_bert):
    readme = trained / "README.md"
    meta = front_matter(readme)
    assert meta["library_name"] == "bertheads"
    assert meta["base_model"] == tiny_bert
    assert meta["pipeline_tag"] == "text-classification"
    assert meta["datasets"] == ["sentiment-train.tsv"]
    assert "accuracy" in meta["metrics"] and "bertheads" in meta["tags"]
    dev = json.loads((trained / "metrics.json").read_text())["dev"]
    results = meta["model-index"][0]["results"]
    values = {m["type"]: m["value"] for r in results for m in r["metrics"]}
    assert values["accuracy"] == dev["accuracy"] and values["loss"] == dev["loss"]
    text = body(readme)
    for section in ("## Model description", "## Heads and labels", "## Training data and settings",
                    "## Evaluation", "## How to use", "## Intended use and limits", "## Versions"):
        assert section in text
    assert "`negative`, `positive`" in text
    assert "sentiment-train.tsv" in text and "sentiment-dev.tsv" in text
    assert f"| accuracy | {dev['accuracy']:.4f} |" in text
    assert "| kept epoch | 1 (by accuracy" in text and "| epochs | 1 |" in text and "| batch size | 8 |" in text
    assert "bertheads.load('sentiment')" in text


def test_hf_export_card(trained, tmp_path):
    out = tmp_path / "sentiment-hf"
    export_hf(trained, out)
    meta = front_matter(out / "README.md")
    assert meta["pipeline_tag"] == "text-classification" and meta["library_name"] == "transformers"
    text = body(out / "README.md")
    assert "pipeline('text-classification', model='sentiment-hf')" in text
    assert "`negative`, `positive`" in text and "sentiment-train.tsv" in text


def test_onnx_export_card(trained):
    meta_json = export_onnx(trained, openvino=False)
    readme = trained / "onnx" / "README.md"
    meta = front_matter(readme)
    assert "onnx" in meta["tags"] and meta["pipeline_tag"] == "text-classification"
    text = body(readme)
    assert "ort.InferenceSession('sentiment/onnx/model.onnx')" in text
    assert "from_pretrained('sentiment/encoder')" in text
    assert "Output `classify`: `[batch, 2]`" in text
    assert meta_json["heads"]["classify"]["outputs"] == 2
    assert bertheads.load(trained, runtime="onnx").predict(TEXTS) == bertheads.load(trained).predict(TEXTS)


def test_multi_head_card_lists_every_head(tiny_bert, tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "sent.tsv").write_text(ROWS)
    (conf / "topic.csv").write_text(TOPICS)
    (conf / "ner.conll").write_text(NER)
    (conf / "multi.yaml").write_text("tasks:\n"
                                     "  sentiment: {kind: classify, train: sent.tsv, dev: sent.tsv}\n"
                                     "  topic: {kind: classify, train: topic.csv, dev: topic.csv}\n"
                                     "  places: {kind: tag, train: ner.conll, dev: ner.conll}\n")
    out = tmp_path / "three"
    bertheads.train_multi(conf / "multi.yaml", out, model=tiny_bert, epochs=1, batch_size=8, progress=False)
    meta = front_matter(out / "README.md")
    assert "pipeline_tag" not in meta  # two kinds: no one tag fits the whole model
    assert {"text-classification", "token-classification", "multi-head"} <= set(meta["tags"])
    assert meta["datasets"] == ["sent.tsv", "topic.csv", "ner.conll"]
    configs = {r["dataset"]["config"] for r in meta["model-index"][0]["results"]}
    assert configs == {"sentiment", "topic", "places"}
    text = body(out / "README.md")
    for heading in ("### `sentiment` (classify)", "### `topic` (classify)", "### `places` (tag)"):
        assert heading in text
    assert "`food`, `sports`" in text and "Tags (5): `O`, `B-LOC`, `I-LOC`, `B-PER`, `I-PER`" in text
    dev = json.loads((out / "metrics.json").read_text())["dev"]
    assert f"| `places` | ner.conll | f1 | {dev['places']['f1']:.4f} |" in text


def test_combined_model_card(tiny_bert, tmp_path):
    a = save_heads(tiny_bert, tmp_path / "a", {"sst": ("classify", 1, {"labels": ["neg", "pos"]})})
    b = save_heads(tiny_bert, tmp_path / "b", {"qa": ("qa", 2, {"max_length": 64, "stride": 16})})
    bertheads.combine([a, b], tmp_path / "ab")
    text = body(tmp_path / "ab" / "README.md")
    assert "### `sst` (classify)" in text and "### `qa`" in text
    assert "Answers are spans of the passage" in text
    assert "`qa` = head `qa` of `b`" in text and "combined from models" in text


def test_a_failing_card_never_costs_the_model(tiny_bert, tmp_path, monkeypatch, caplog):
    def broken(*_args, **_kwargs):
        raise RuntimeError("no card today")

    monkeypatch.setattr(card, "build_card", broken)
    out = save_heads(tiny_bert, tmp_path / "m", {"sst": ("classify", 1, {"labels": ["neg", "pos"]})})
    assert not (out / "README.md").exists() and "no card today" in caplog.text
    assert bundle.load(out).tasks["sst"].spec.labels == ["neg", "pos"]


def test_a_checkpoints_card_is_read_within_bounds(tmp_path):
    """The base checkpoint's card lends its language and license; a card a manifest points at is
    read like a config file (a YAML alias bomb there is refused at once and the card says nothing)."""
    import time

    from bertheads.encoder.pretrained import default_model_path
    from bertheads.saved.card import checkpoint_metadata, front_matter

    own = front_matter(Path(default_model_path()) / "README.md")
    assert own["language"] == "en" and own["license"] == "apache-2.0"
    bomb = tmp_path / "checkpoint"
    bomb.mkdir()
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"] + [
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]" for i in range(8)]
    (bomb / "README.md").write_text("---\n" + "\n".join(levels) + "\n---\n# a card\n", encoding="utf-8")
    started = time.monotonic()
    assert checkpoint_metadata({"encoder": {"path": str(bomb)}}) == {}
    assert time.monotonic() - started < 2
