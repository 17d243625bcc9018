"""Label names in the transformers export."""

from __future__ import annotations

from pathlib import Path

import pytest

import bertheads
from bertheads.export.hf import export_hf

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
