"""A classify head from label descriptions: without training rows it predicts the label whose
description is most similar to the text (saved, reloaded and exported to ONNX alike; single- and
multi-label, from Python and a config file); with rows it starts from the same output layer;
bad descriptions are refused in one line. (With the default checkpoint: bench/zero_shot.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_pooling import mean_bert  # noqa: F401  (the tiny BERT declaring mean pooling)

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.encoder.pretrained import Encoder
from bertheads.tasks.classify.descriptions import SHRINK
from bertheads.training.joint import read_task

NIGHTLY = ("test_zero_label_head_in_onnx",)  # (an ONNX export: 20 s)
QUIET = {"progress": False}
DESCRIBED = {"sport": "the team won the football match in the last minute",
             "food": "a bowl of hot noodle soup with ginger and garlic",
             "weather": "heavy rain and strong winds are expected tomorrow"}


def test_zero_label_head_predicts_saves_and_exports(mean_bert, tmp_path):  # noqa: F811
    out = tmp_path / "zs"
    model = bertheads.train("classify", None, out=out, model=mean_bert, verbose=False,
                            label_descriptions=[f"{k}: {v}" for k, v in DESCRIBED.items()])
    texts = list(DESCRIBED.values())
    got = model.predict(texts)
    assert [p["label"] for p in got] == list(DESCRIBED)  # a description's own text is most similar to it
    head = model.net.heads["classify"]
    assert head.cosine and head.pooler is None  # one linear layer over the normalised mean of the tokens
    assert torch.allclose(head.out.weight.norm(dim=-1) * SHRINK, torch.ones(3))  # the normalised description vectors
    again = bertheads.load(out).predict(texts)
    assert again == got
    assert main(["export", str(out), "--to", "hf", "--out", str(tmp_path / "hf"), "-q"]) == 2  # refused in one line


def test_zero_label_head_in_onnx(mean_bert, tmp_path):  # noqa: F811
    out = tmp_path / "zs"
    model = bertheads.train("classify", None, out=out, model=mean_bert, verbose=False, label_descriptions=DESCRIBED)
    texts = list(DESCRIBED.values())
    got = model.predict(texts)
    assert main(["export", str(out), "--to", "onnx", "--no-openvino", "-q"]) == 0
    onnx = bertheads.load(out, runtime="onnx").predict(texts)
    assert [p["label"] for p in onnx] == list(DESCRIBED)
    assert np.allclose([list(p["scores"].values()) for p in onnx], [list(p["scores"].values()) for p in got],
                       atol=1e-4)


def test_zero_label_multi_label_from_a_config(mean_bert, tmp_path, write):  # noqa: F811
    config = write("zs.yaml", "kind: classify\nproblem: multi_label\nlabel_descriptions:\n" +
                   "".join(f"  {k}: {v}\n" for k, v in DESCRIBED.items()))
    out = tmp_path / "ml"
    assert main(["train", "--config", config, "--out", str(out), "--model", mean_bert, "-q"]) == 0
    got = bertheads.load(out).predict(list(DESCRIBED.values()))
    for label, prediction in zip(DESCRIBED, got):
        assert label in prediction["labels"]  # its own description: cosine 1, well past the cut
        assert prediction["scores"][label] == max(prediction["scores"].values())


def test_rows_with_descriptions_start_from_the_zero_label_head(mean_bert, tmp_path, write):  # noqa: F811
    rows = "".join(f"{text} {i}\t{label}\n" for i in range(4) for label, text in DESCRIBED.items())
    train = write("train.tsv", "sentence\tlabel\n" + rows)
    described = [f"{k}: {v}" for k, v in DESCRIBED.items()]
    zero = bertheads.train("classify", None, out=tmp_path / "zero", model=mean_bert, verbose=False,
                           label_descriptions=list(reversed(described)))
    encoder = Encoder.load(mean_bert)
    task, _ = read_task("classify", train, encoder, {"label_descriptions": described, "mode": "features"})
    order = [zero.net.tasks["classify"].spec.labels.index(label) for label in task.spec.labels]  # (sorted here)
    assert task.spec.labels == sorted(DESCRIBED)
    assert torch.equal(task.head.out.weight, zero.net.heads["classify"].out.weight[order])  # the zero-label start
    multi = write("multi.jsonl", "".join(json.dumps({"text": f"{t} {i}", "label": [k, "food"] if i else [k]}) + "\n"
                                         for i in range(2) for k, t in DESCRIBED.items()))
    many, _ = read_task("classify", multi, encoder, {"label_descriptions": described, "mode": "features"})
    assert many.spec.problem == "multi_label" and torch.equal(many.head.out.weight, task.head.out.weight)  # (multi-label too)
    plain, _ = read_task("classify", train, encoder, {"mode": "features"})
    assert plain.head.pooler is not None and task.head.pooler is None  # (the usual head: a dense layer first)
    trained = bertheads.train("classify", train, out=tmp_path / "few", model=mean_bert, verbose=False, epochs=1,
                              lr=1e-9, mode="features", label_descriptions=described, **QUIET)
    before = zero.predict(list(DESCRIBED.values()))
    after = trained.predict(list(DESCRIBED.values()))
    assert [p["label"] for p in after] == [p["label"] for p in before]
    assert np.allclose([[p["scores"][k] for k in DESCRIBED] for p in after],
                       [[p["scores"][k] for k in DESCRIBED] for p in before], atol=1e-4)


@pytest.mark.parametrize("rows, descriptions, message", [
    (False, ["sport: a match", "food soup"], r"label_descriptions=?: no such file, and not 'LABEL: a text"),
    (False, ["sport: a match"], r"one label \('sport'\); describe two or more"),
    (False, ["sport: a match", "sport: a game"], r"label 'sport' is described twice"),
    (True, ["sport: a match", "weather: rain", "news: a report"], r"no description of label 'food'"),
])
def test_bad_descriptions_one_line(mean_bert, write, rows, descriptions, message):  # noqa: F811
    train = write("train.tsv", "sentence\tlabel\n" + "".join(f"t {i}\t{k}\n" for i in range(3) for k in DESCRIBED))
    with pytest.raises(UserError, match=message) as caught:
        bertheads.train("classify", train if rows else None, model=mean_bert, verbose=False,
                        label_descriptions=descriptions, mode="features", **QUIET)
    assert "\n" not in str(caught.value)


def test_a_description_head_s_start_is_epoch_0_and_kept_when_training_only_spoils_it(mean_bert, tmp_path,  # noqa: F811
                                                                                      write):
    labels = list(DESCRIBED)
    wrong = "".join(f"{text} {i}\t{labels[(k + 1) % 3]}\n" for i in range(4) for k, text in enumerate(DESCRIBED.values()))
    train = write("train.tsv", "sentence\tlabel\n" + wrong)  # every row labelled as the next description's label
    dev = write("dev.tsv", "sentence\tlabel\n" + "".join(f"{t}\t{k}\n" for k, t in DESCRIBED.items()))
    described = [f"{k}: {v}" for k, v in DESCRIBED.items()]
    trained = bertheads.train("classify", train, dev, out=tmp_path / "spoilt", model=mean_bert, verbose=False,
                              epochs=2, lr=0.05, mode="features", label_descriptions=described, **QUIET)
    metrics = json.loads((tmp_path / "spoilt" / "metrics.json").read_text())
    history = metrics["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2]
    assert history[0]["dev"]["classify"]["accuracy"] == 1.0  # the descriptions alone: each its own text
    assert history[-1]["dev"]["classify"]["accuracy"] < 1.0  # the wrong rows were learned
    assert metrics["best_epoch"] == 0
    assert [p["label"] for p in trained.predict(list(DESCRIBED.values()))] == labels
