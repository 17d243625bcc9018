"""A fourth task kind, written here and registered at run time, goes through train, predict,
evaluate, export (hf and onnx), report and serve with no change outside this file: the Task
interface owns every kind decision."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn
from torch.nn import functional as F

import bertheads
from bertheads.base.errors import UserError
from bertheads.base.values import non_negative_int
from bertheads.cli.main import main
from bertheads.export.hf import export_hf
from bertheads.running.report import report
from bertheads.tasks import TASKS, register, unregister
from bertheads.tasks.base import HeadSettings, Task, copy_linear, init_linear, option, softmax
from bertheads.text.encoding import encode_texts
from bertheads.text.readers import read_lines

SENTENCES = 4  # the head picks one of the first four sentences
ORDINALS = ["first", "second", "third", "fourth"]


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.findall(r"[^.!?]+[.!?]?", text) if s.strip()][:SENTENCES]


@dataclass
class LongestSpec(HeadSettings):
    max_length: int = 64


@dataclass
class LongestOptions:
    """What predict, evaluate and serve may change of a longest head."""

    min_words: int | None = option(None, "longest: no answer (null) when the longest sentence is shorter",
                                   type=non_negative_int, metavar="N")


@dataclass
class LongestExample:
    text: str
    line: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def target(self) -> int:
        parts = sentences(self.text)
        return int(np.argmax([len(s.split()) for s in parts])) if parts else 0


class LongestHead(nn.Module):
    """BERT's sequence recipe: a pooler over [CLS], then a linear layer, one output per sentence."""

    token_level = False

    def __init__(self, hidden_size: int, settings: HeadSettings) -> None:
        super().__init__()
        self.layers = tuple(settings.layers)
        self.pooler = init_linear(nn.Linear(hidden_size, hidden_size))
        self.dropout = nn.Dropout(settings.dropout)
        self.out = init_linear(nn.Linear(hidden_size, SENTENCES))

    def forward(self, hidden, batch):
        return self.out(self.dropout(torch.tanh(self.pooler(hidden[:, 0]))))


class LongestTask(Task):
    """Which sentence of a text is the longest (in words): the label comes from the text itself."""

    kind = "longest"
    help = "which of a text's first four sentences is the longest"
    spec_type = LongestSpec
    main_metric = "accuracy"
    options_type = LongestOptions
    hf_auto_class = "AutoModelForSequenceClassification"
    hf_pipeline = "text-classification"

    @classmethod
    def build(cls, spec, encoder, pooler_state=None):
        return cls(spec, LongestHead(encoder.info.hidden_size, spec))

    @classmethod
    def prepare(cls, path, spec, encoder):
        task = cls.build(spec, encoder)
        return task, task.read(path)

    def read(self, path, need_labels=True, fmt=None, **_):
        examples = [LongestExample(line, n) for n, line in read_lines(path) if line.strip()]
        if not examples:
            raise UserError(f"{path}: no texts")
        return examples

    def from_inputs(self, inputs, **_):
        return [LongestExample(str(text)) for text in inputs]

    def encode(self, examples, tokenizer, with_labels=True, path=None):
        features = encode_texts(tokenizer, [e.text for e in examples], None, self.spec.max_length)
        if with_labels:
            for f, e in zip(features, examples):
                f["labels"] = e.target
        return features

    def encode_for_inference(self, examples, tokenizer, with_labels=False):
        return self.encode(examples, tokenizer, with_labels), list(range(len(examples)))

    def collect(self, feature_outputs, owner, examples, features):
        return list(feature_outputs)

    def loss(self, logits, batch):
        return F.cross_entropy(logits, batch["labels"].long())

    def decode(self, outputs, examples, min_words=None, **_):
        preds = []
        for logits, e in zip(outputs, examples):
            parts = sentences(e.text)
            scores = softmax(np.asarray(logits, dtype=np.float64)[: max(len(parts), 1)])
            best = int(scores.argmax())
            sentence = parts[best] if best < len(parts) else ""
            if min_words is not None and len(sentence.split()) < min_words:
                preds.append({"longest": None, "sentence": None})
            else:
                preds.append({"longest": best, "sentence": sentence, "score": round(float(scores[best]), 6)})
        return preds

    def metrics(self, outputs, examples, path=None, **_):
        predicted = [int(np.argmax(o[: max(len(sentences(e.text)), 1)])) for o, e in zip(outputs, examples)]
        return {"accuracy": float(np.mean([p == e.target for p, e in zip(predicted, examples)])),
                "examples": len(examples)}

    # export --to hf: the pooler into BERT's pooler, the linear layer into the classifier
    def hf_labels(self):
        return ORDINALS

    def hf_copy_head(self, model, name):
        copy_linear(model.base_model.pooler.dense, self.head.pooler, f"head {name!r}")
        copy_linear(model.classifier, self.head.out, f"head {name!r}")


TEXTS = ["Short one. This second sentence is clearly the longest of them all. End.",
         "A very long opening sentence with many words in it. Tiny. Also small.",
         "Hi. Yo. The third sentence here has the most words by far. Ok.",
         "One. Two. Three. And the fourth sentence is the longest one here."]


@pytest.fixture(scope="module")
def longest_kind():
    register(LongestTask)
    yield LongestTask
    unregister(LongestTask.kind)
    assert "longest" not in TASKS and "min_words" not in bertheads.tasks.inference_options("predict")


@pytest.fixture(scope="module")
def longest_model(longest_kind, tiny_bert, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("longest")
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    out = tmp_path / "model"
    model = bertheads.train("longest", str(data), str(data), out, model=tiny_bert,
                            settings=bertheads.TrainSettings(epochs=1, batch_size=4, progress=False))
    return model, out, data


def test_train_predict_evaluate(longest_model, capsys):
    model, out, data = longest_model
    assert model.heads == {"longest": "longest"}
    preds = model.predict(TEXTS[:2])
    assert [set(p) for p in preds] == [{"longest", "sentence", "score"}] * 2
    assert model.predict(TEXTS[:1], min_words=100) == [{"longest": None, "sentence": None}]
    metrics = model.evaluate(str(data))
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["examples"] == 12 and "loss" in metrics
    streamed = list(model.predict_iter(str(data)))
    assert len(streamed) == 12
    # the CLI's predict flags come from the kind's options
    assert main(["predict", str(out), "--input", str(data), "--min-words", "100"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [{"longest": None, "sentence": None}] * 12
    assert main(["evaluate", str(out), "--data", str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["examples"] == 12


def test_unknown_options_are_one_line_user_errors(longest_model):
    model = longest_model[0]
    with pytest.raises(UserError, match=r"^unknown option 'min_wrds' \(did you mean 'min_words'\?\)$"):
        model.predict(TEXTS[:1], min_wrds=3)
    with pytest.raises(UserError, match=r"^--threshold is for classify heads, not longest$"):
        model.predict(TEXTS[:1], threshold=0.5)
    with pytest.raises(UserError, match=r"^--min-words -1: "):
        model.predict(TEXTS[:1], min_words=-1)


def test_export_hf_and_onnx(longest_model, tmp_path):
    from transformers import AutoModelForSequenceClassification

    model, out, _ = longest_model
    info = export_hf(out, tmp_path / "hf")
    assert info["class"] == "BertForSequenceClassification" and info["pipeline"] == "text-classification"
    assert "pipeline_options" not in info
    hf = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf"))
    assert hf.config.id2label == dict(enumerate(ORDINALS))
    pytest.importorskip("onnxruntime")
    assert main(["export", str(out), "--to", "onnx"]) == 0
    onnx_model = bertheads.load(out, runtime="onnx")
    ours, theirs = model.predict(TEXTS), onnx_model.predict(TEXTS)
    assert [p["longest"] for p in ours] == [p["longest"] for p in theirs]
    assert np.allclose([p["score"] for p in ours], [p["score"] for p in theirs], atol=1e-3)


def test_report_has_a_generic_section(longest_model, tmp_path):
    _, out, data = longest_model
    page = report(out, str(data), tmp_path / "page")
    text = page.read_text(encoding="utf-8")
    assert "longest head" in text and "no figures for longest heads" in text and "accuracy" in text


def test_serve(longest_model):
    from bertheads.serve.app import create_app

    model = longest_model[0]
    with TestClient(create_app(model), base_url="http://localhost") as client:
        heads = client.get("/heads").json()["heads"]
        assert heads == [{"name": "longest", "kind": "longest", "inputs": "text", "shows": "json"}]
        got = client.post("/predict/longest", json={"texts": TEXTS[:2]}).json()["results"]
        assert got == json.loads(json.dumps(model.predict(TEXTS[:2])))
        analyzed = client.post("/analyze", json={"texts": TEXTS[:1]}).json()["results"]
        assert analyzed[0]["longest"] == got[0]
        page = client.get("/").text
        assert "DRAWINGS" in page


def test_serve_options_are_fixed_per_head(longest_model):
    model = longest_model[0]
    model.set_options(min_words=100)
    try:
        assert model.predict(TEXTS[:1]) == [{"longest": None, "sentence": None}]
        assert model.predict(TEXTS[:1], min_words=0)[0]["longest"] is not None  # a call's own option wins
        with pytest.raises(UserError, match="--null-threshold is for qa heads"):
            model.set_options(null_threshold=1.0)
    finally:
        model.task().fixed_options.clear()


def test_register_refuses_a_second_class_of_a_kind(longest_kind):
    assert TASKS["longest"] is LongestTask
    with pytest.raises(ValueError, match="registered already"):
        register(type("Other", (LongestTask,), {}))


def test_cli_flags_come_from_the_kinds(longest_kind):
    from bertheads.cli.commands import given_options
    from bertheads.cli.parser import build_parser

    parser = build_parser()
    args = parser.parse_args(["serve", "m", "--min-words", "3", "--threshold", "0.3", "--no-paragraph-windows"])
    assert given_options(args, "serve") == {"min_words": 3, "threshold": 0.3, "paragraph_windows": False}
    args = parser.parse_args(["predict", "m", "--question", "q", "--context", "c"])
    assert given_options(args, "predict") == {"question": "q", "context": "c"}
    assert given_options(parser.parse_args(["evaluate", "m", "--data", "d"]), "evaluate") == {}
    with pytest.raises(SystemExit):
        parser.parse_args(["evaluate", "m", "--data", "d", "--question", "q"])  # predict's only


def test_set_options_on_several_heads_goes_to_the_heads_that_take_each():
    from types import SimpleNamespace

    from bertheads.tasks.classify.task import ClassifySpec, ClassifyTask
    from bertheads.tasks.qa.task import QASpec, QATask

    sentiment, qa = ClassifyTask(ClassifySpec(), None), QATask(QASpec(window_choice="relative"), None)
    model = bertheads.Model(SimpleNamespace(tasks={"sentiment": sentiment, "qa": qa}))
    model.set_options(threshold=0.3, window_choice="raw", long_input="windows")
    assert sentiment.fixed_options == {"threshold": 0.3} and sentiment.spec.long_input == "windows"
    assert qa.fixed_options == {} and qa.spec.window_choice == "raw"
    with qa.using_options({"window_choice": "context"}) as call:
        assert call == {} and qa.spec.window_choice == "context"
    assert qa.spec.window_choice == "raw"  # a call's override lasts for the call
    with pytest.raises(UserError, match="unknown option 'treshold'"):
        model.set_options(treshold=0.3)
    model.set_options(head="qa", null_threshold=2.0)
    assert qa.fixed_options == {"null_threshold": 2.0}
