"""A fourth task kind, written here and registered at run time, with an input form of its own
(a text and several candidate sentences), goes through train, predict, evaluate, analyze,
export (hf and onnx), the model card, the report, serve and the page with no change outside
this file: the Task interface owns every kind decision, and its form every input decision."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn
from torch.nn import functional as F

import bertheads
from bertheads.base.errors import UserError, where
from bertheads.base.values import non_negative_int
from bertheads.cli.main import main
from bertheads.export.hf import export_hf
from bertheads.inference.report import report
from bertheads.tasks import TASKS, register, unregister
from bertheads.tasks.base import (
    Exporting,
    HeadSettings,
    Judging,
    Modeling,
    Parts,
    Reading,
    Task,
    copy_linear,
    init_linear,
    option,
    softmax,
)
from bertheads.tasks.forms import Extra, Field, InputForm
from bertheads.tasks.parts import set_labels
from bertheads.text.encoding import encode_texts
from bertheads.text.readers import read_jsonl

CHOICES = 4  # the head picks one of up to four candidates
ORDINALS = ["first", "second", "third", "fourth"]


class Candidates(InputForm):
    """A text and up to four candidate sentences: `{"text": ..., "candidates": [...]}`."""

    name = "candidates"
    says = "a text and up to four candidate sentences"
    fields = (Field("texts", str, "text"), Field("candidates", list[str], "candidate"))
    extra = Extra("candidates", "candidates", list[str], "candidate", "Candidates (for longest heads)",
                  "Optional: the candidate sentences", many=True)
    example = {"text": "Which one is longest?", "candidates": ["A short one.", "This one is a little longer."]}

    def from_fields(self, values: Sequence[Sequence]) -> list:
        return [{"text": t, "candidates": list(c)} for t, c in zip(*values)]

    def with_text(self, text: str, extra: Any) -> Any:
        return {"text": text, "candidates": list(extra)}

    def texts(self, value: Any) -> tuple[str, ...]:
        return (value["text"], *value["candidates"])


CANDIDATES = Candidates()


@dataclass
class LongestSpec(HeadSettings):
    max_length: int = 64


@dataclass
class LongestOptions:
    """What predict, evaluate and serve may add for a longest head."""

    min_words: int | None = option(None, "no answer (null) when the longest candidate is shorter",
                                   type=non_negative_int, metavar="N")


@dataclass
class LongestExample:
    text: str
    candidates: list[str]
    line: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def target(self) -> int:
        return int(np.argmax([len(c.split()) for c in self.candidates]))


class LongestHead(nn.Module):
    """BERT's sequence recipe: a pooler over [CLS], then a linear layer, one output per candidate."""

    token_level = False

    def __init__(self, hidden_size: int, settings: HeadSettings) -> None:
        super().__init__()
        self.layers = tuple(settings.layers)
        self.pooler = init_linear(nn.Linear(hidden_size, hidden_size))
        self.dropout = nn.Dropout(settings.dropout)
        self.out = init_linear(nn.Linear(hidden_size, CHOICES))

    def forward(self, hidden, batch):
        return self.out(self.dropout(torch.tanh(self.pooler(hidden[:, 0]))))


class LongestReading(Reading):
    """JSON lines of a text and its candidates; Python dicts of the same."""

    form = CANDIDATES
    formats = ("jsonl",)

    def read(self, path, need_labels=True, fmt=None):
        examples = []
        for line, record in read_jsonl(path):
            if not isinstance(record.get("candidates"), list) or not 1 <= len(record["candidates"]) <= CHOICES:
                raise UserError(f"{where(path, line)}: expected 1 to {CHOICES} \"candidates\"")
            examples.append(LongestExample(str(record["text"]), [str(c) for c in record["candidates"]], line))
        if not examples:
            raise UserError(f"{path}: no inputs")
        return examples

    def from_inputs(self, inputs):
        out = []
        for i, item in enumerate(inputs):
            if not isinstance(item, dict) or not 1 <= len(item.get("candidates") or ()) <= CHOICES:
                raise UserError(f"input {i}: expected {{'text': ..., 'candidates': [1 to {CHOICES} texts]}}")
            out.append(LongestExample(str(item["text"]), [str(c) for c in item["candidates"]]))
        return out


class LongestModeling(Modeling):
    """The text and its candidates packed as a pair; cross-entropy over the candidates."""

    def encode(self, examples, tokenizer, with_labels=True, path=None):
        features = encode_texts(tokenizer, [e.text for e in examples], [" | ".join(e.candidates) for e in examples],
                                self.spec.max_length)
        if with_labels:
            for f, e in zip(features, examples):
                f["labels"] = e.target
        return features

    def encode_for_inference(self, examples, tokenizer, with_labels=False):
        return self.encode(examples, tokenizer, with_labels), list(range(len(examples)))

    def encoder_cost(self, counts):
        return ("longest",), min(sum(counts) + len(counts) + 1, int(self.spec.max_length))

    def loss(self, logits, batch):
        return F.cross_entropy(logits, batch["labels"].long())


class LongestJudging(Judging):
    """The best candidate and its score; accuracy."""

    main_metric = "accuracy"

    def collect(self, feature_outputs, owner, examples, features):
        return list(feature_outputs)

    def decode(self, outputs, examples):
        min_words = self.task.options.values.min_words
        preds = []
        for logits, e in zip(outputs, examples):
            scores = softmax(np.asarray(logits, dtype=np.float64)[: len(e.candidates)])
            best = int(scores.argmax())
            if min_words is not None and len(e.candidates[best].split()) < min_words:
                preds.append({"longest": None, "sentence": None})
            else:
                preds.append({"longest": best, "sentence": e.candidates[best], "score": round(float(scores[best]), 6)})
        return preds

    def metrics(self, outputs, examples, path=None, during_training=False):
        predicted = [int(np.argmax(o[: len(e.candidates)])) for o, e in zip(outputs, examples)]
        return {"accuracy": float(np.mean([p == e.target for p, e in zip(predicted, examples)])),
                "examples": len(examples)}


class LongestExporting(Exporting):
    """export --to hf: the pooler into BERT's pooler, the linear layer into the classifier."""

    hf_auto_class = "AutoModelForSequenceClassification"
    hf_pipeline = "text-classification"

    def configure(self, config):
        set_labels(config, ORDINALS)

    def copy_head(self, model, name):
        copy_linear(model.base_model.pooler.dense, self.task.head.pooler, f"head {name!r}")
        copy_linear(model.classifier, self.task.head.out, f"head {name!r}")


class LongestTask(Task):
    """Which candidate sentence is the longest (in words): the label comes from the input itself."""

    kind = "longest"
    help = "which of up to four candidate sentences is the longest"
    spec_type = LongestSpec
    parts = Parts(reading=LongestReading, modeling=LongestModeling, judging=LongestJudging,
                  exporting=LongestExporting, options=LongestOptions)

    @classmethod
    def build(cls, spec, encoder, pooler_state=None):
        return cls(spec, LongestHead(encoder.info.hidden_size, spec))

    @classmethod
    def prepare(cls, path, spec, encoder):
        return cls(spec, None).reading.read(path)  # (the head is built once the run's mode is settled)


RECORDS = [{"text": "Which is longest?", "candidates": ["Short one.", "This second sentence is clearly the longest."]},
           {"text": "Pick one.", "candidates": ["A very long opening sentence with many words.", "Tiny.", "Small."]},
           {"text": "And here?", "candidates": ["Hi.", "Yo.", "The third sentence here has the most words by far."]},
           {"text": "Last.", "candidates": ["One.", "Two.", "Three.", "And the fourth sentence is the longest one."]}]
INPUTS = [dict(r) for r in RECORDS]


@pytest.fixture(scope="module")
def longest_kind():
    register(LongestTask)
    yield LongestTask
    unregister(LongestTask.kind)
    assert "longest" not in TASKS and "min_words" not in bertheads.tasks.inference_options("predict")


@pytest.fixture(scope="module")
def longest_model(longest_kind, tiny_bert, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("longest")
    data = tmp_path / "inputs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS * 3), encoding="utf-8")
    out = tmp_path / "model"
    model = bertheads.train("longest", str(data), str(data), out, model=tiny_bert,
                            settings=bertheads.TrainSettings(epochs=1, batch_size=4, progress=False))
    return model, out, data


def test_train_predict_evaluate(longest_model, capsys):
    model, out, data = longest_model
    assert model.heads == {"longest": "longest"}
    preds = model.predict(INPUTS[:2])
    assert [set(p) for p in preds] == [{"longest", "sentence", "score"}] * 2
    assert preds[1]["sentence"] in RECORDS[1]["candidates"]
    assert model.predict(INPUTS[:1], min_words=100) == [{"longest": None, "sentence": None}]
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


def test_analyze_reads_the_forms_extra_input(longest_model, tmp_path, capsys):
    model, out, _ = longest_model
    texts = [r["text"] for r in RECORDS]
    candidates = [r["candidates"] for r in RECORDS]
    assert model.analyze(texts) == [{}] * 4  # no candidates given: the head does not answer
    both = model.analyze(texts, candidates=candidates)
    assert [r["longest"] for r in both] == model.predict(INPUTS)
    with pytest.raises(UserError, match=r"candidates: expected one per text \(4\), got 1"):
        model.analyze(texts, candidates=candidates[:1])
    with pytest.raises(UserError, match=r"^unknown option or input 'candidate' \(did you mean 'candidates'\?\)$"):
        model.analyze(texts, candidate=candidates)
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps({"id": i, **r}) + "\n" for i, r in enumerate(RECORDS)), encoding="utf-8")
    assert main(["analyze", str(out), "--input", str(records)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [{"id": i, "longest": p} for i, p in enumerate(json.loads(json.dumps(model.predict(INPUTS))))]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "a", "candidates": "not a list"}) + "\n", encoding="utf-8")
    assert main(["analyze", str(out), "--input", str(bad)]) == 2
    assert "bad.jsonl:1: candidates: expected a list of strings" in capsys.readouterr().err


def test_unknown_options_are_one_line_user_errors(longest_model):
    model = longest_model[0]
    with pytest.raises(UserError, match=r"^unknown option 'min_wrds' \(did you mean 'min_words'\?\)$"):
        model.predict(INPUTS[:1], min_wrds=3)
    with pytest.raises(UserError, match=r"^threshold= is for classify heads, not longest$"):
        model.predict(INPUTS[:1], threshold=0.5)
    with pytest.raises(UserError, match=r"^min_words=-1: "):
        model.predict(INPUTS[:1], min_words=-1)


def test_export_hf_and_onnx_and_the_card(longest_model, tmp_path):
    from transformers import AutoModelForSequenceClassification

    model, out, _ = longest_model
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "- Input: a text and up to four candidate sentences" in card
    info = export_hf(out, tmp_path / "hf")
    assert info["class"] == "BertForSequenceClassification" and info["pipeline"] == "text-classification"
    assert "pipeline_options" not in info
    hf = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf"))
    assert hf.config.id2label == dict(enumerate(ORDINALS))
    pytest.importorskip("onnxruntime")
    assert main(["export", str(out), "--to", "onnx"]) == 0
    onnx_model = bertheads.load(out, runtime="onnx")
    ours, theirs = model.predict(INPUTS), onnx_model.predict(INPUTS)
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
        assert heads == [{"name": "longest", "kind": "longest", "inputs": "candidates", "shows": "json",
                          "extra": {"field": "candidates", "key": "candidates", "label": CANDIDATES.extra.label,
                                    "placeholder": CANDIDATES.extra.placeholder, "many": True}}]
        body = {"texts": [r["text"] for r in RECORDS[:2]], "candidates": [r["candidates"] for r in RECORDS[:2]]}
        got = client.post("/predict/longest", json=body).json()["results"]
        assert got == json.loads(json.dumps(model.predict(INPUTS[:2])))
        analyzed = client.post("/analyze", json=body).json()["results"]
        assert [a["longest"] for a in analyzed] == got
        assert client.post("/analyze", json={"texts": body["texts"]}).json()["results"] == [{}, {}]
        answer = client.post("/predict/longest", json={"texts": ["a"]})
        assert answer.status_code == 422 and answer.json()["detail"] == (
            "missing field 'candidates': head 'longest' (longest) reads {\"texts\": [\"...\"], \"candidates\": [[\"...\"]]}")
        answer = client.post("/predict/longest", json={"texts": ["a"], "candidates": [["x", " "]]})
        assert answer.status_code == 422 and answer.json()["detail"] == "candidates[0][1]: empty candidate"
        schema = client.get("/openapi.json").json()["components"]["schemas"]
        assert set(schema["PredictRequest"]["properties"]) == {"texts", "candidates"}
        assert set(schema["AnalyzeRequest"]["properties"]) == {"texts", "candidates"}


CHROMIUM = os.environ.get("BERTHEADS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM} (make install-test installs it)")
def test_the_page_asks_for_the_forms_extra_input(longest_model):
    """The page builds a box for the candidates from GET /heads and sends them with the text."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    from helpers_serve import running_server

    from bertheads.serve.app import create_app

    model = longest_model[0]
    expected = json.loads(json.dumps(model.predict(INPUTS[3:])))[0]
    with running_server(create_app(model)) as url, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"], timeout=30000)
        try:
            page = browser.new_page()
            page.set_default_timeout(15000)
            page.goto(url + "/")
            page.wait_for_selector("#candidates")
            assert page.inner_text("label[for='candidates']") == CANDIDATES.extra.label
            page.fill("#text", RECORDS[3]["text"])
            page.fill("#candidates", "\n".join(RECORDS[3]["candidates"]))
            page.press("#candidates", "Control+Enter")  # the hint's key works in every box
            shown = page.locator("section[data-head='longest'] pre.json")
            shown.wait_for()
            assert json.loads(shown.inner_text()) == expected
        finally:
            browser.close()


def test_serve_options_are_fixed_per_head(longest_model):
    model = longest_model[0]
    free = model.predict(INPUTS[:1])
    assert free[0]["sentence"] == RECORDS[0]["candidates"][free[0]["longest"]]
    model.set_options(min_words=100)
    try:
        assert model.predict(INPUTS[:1]) == [{"longest": None, "sentence": None}]
        assert model.predict(INPUTS[:1], min_words=0) == free  # a call's own option wins
        with pytest.raises(UserError, match="^null_threshold= is for qa heads"):
            model.set_options(null_threshold=1.0)
    finally:
        model.task().options.values.min_words = None  # (the module's model serves the other tests)


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

    from bertheads.tasks.classify.spec import ClassifySpec
    from bertheads.tasks.classify.task import ClassifyTask
    from bertheads.tasks.qa.spec import QASpec
    from bertheads.tasks.qa.task import QATask

    sentiment, qa = ClassifyTask(ClassifySpec(), None), QATask(QASpec(window_choice="relative"), None)
    model = bertheads.Model(SimpleNamespace(tasks={"sentiment": sentiment, "qa": qa}))
    model.set_options(threshold=0.3, window_choice="raw", long_input="windows")
    # threshold and long_input override the saved head's settings; a call option would be bound
    assert sentiment.options.values.min_score is None and sentiment.spec.threshold == 0.3
    assert sentiment.spec.long_input == "windows" and qa.spec.window_choice == "raw"
    call = qa.options.bind({"window_choice": "context", "predictions_out": "p.json"})
    assert call.spec.window_choice == "context" and call.options.values.predictions_out == "p.json"
    assert call.head is qa.head and call.spec is not qa.spec  # the head shared, the spec a copy
    assert qa.spec.window_choice == "raw" and qa.options.values.predictions_out is None  # nothing of qa changed
    assert call.options.bind(quiet=True).options.values.predictions_out is None  # an option that writes, left out
    assert qa.options.bind({}) is qa
    with pytest.raises(UserError, match="unknown option 'treshold'"):
        model.set_options(treshold=0.3)
    model.set_options(head="sentiment", min_score=0.6)
    assert sentiment.options.values.min_score == 0.6
