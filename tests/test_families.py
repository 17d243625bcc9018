"""Every encoder family with every task kind: tiny random checkpoints (BERT, RoBERTa, XLM-R,
DeBERTa-v2, ELECTRA, DistilBERT, ModernBERT, MPNet), each with a tokenizer of its family's kind trained
here, through training, predict, evaluate, features mode, the transformers export (the pipeline
gives our outputs), the ONNX export (ONNX Runtime gives torch's) and the [CLS]-only last layer.
What each cell should be is `families_matrix.MATRIX`, which docs/families.md shows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from families_matrix import FAMILIES, MATRIX, checkpoint, render, tiny_checkpoint
from safetensors.torch import load_file, save_file

import bertheads
from bertheads.compute.runner import run_heads
from bertheads.encoder.pretrained import Encoder
from bertheads.export.hf import export_hf
from bertheads.export.onnx import export_onnx
from bertheads.tasks import TASKS
from bertheads.tasks.families import FAMILIES as HEAD_FAMILIES
from bertheads.tasks.families import family_of_config, settle_family, start_weights

TEXTS = ["The Eiffel Tower stands in Paris.", "a warm , funny film", "bad film"]
QUESTIONS = [("What is the capital?", "The old town has many bridges. The capital is Rome. Rivers run through it.")]
SETTINGS = dict(epochs=1, batch_size=4, lr=1e-3, progress=False)


def write_data(root: Path) -> dict[str, Path]:
    """Tiny training files of the three kinds."""
    root.mkdir(parents=True, exist_ok=True)
    classify = root / "classify.tsv"
    classify.write_text("sentence\tlabel\n" + "good film\tpositive\nbad film\tnegative\n"
                        "a warm , funny film\tpositive\nwhat a bore\tnegative\n" * 2)
    tag = root / "tag.txt"
    sentences = [[("Angela", "B-PER"), ("Merkel", "I-PER"), ("visited", "O"), ("Paris", "B-LOC"), (".", "O")],
                 [("Fiat", "B-ORG"), ("is", "O"), ("in", "O"), ("Turin", "B-LOC"), (".", "O")]] * 3
    tag.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in s) for s in sentences) + "\n")
    paragraphs = []
    for i, city in enumerate(["Rome", "Paris", "Berlin", "Turin"] * 2):
        context = f"The old town has many bridges. The capital is {city}. Rivers run through it."
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": "What is the capital?",
                                                       "answers": [{"text": city, "answer_start": context.index(city)}]}]})
    qa = root / "qa.json"
    qa.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    config = root / "multi.yaml"
    config.write_text(f"tasks:\n  sentiment: {{kind: classify, train: {classify}, dev: {classify}}}\n"
                      f"  ner: {{kind: tag, train: {tag}, dev: {tag}}}\n"
                      f"  qa: {{kind: qa, train: {qa}, dev: {qa}, max_length: 64, stride: 16, max_question_length: 16}}\n"
                      f"max_length: 48\n")
    return {"classify": classify, "tag": tag, "qa": qa, "config": config}


HEADS = {"classify": "sentiment", "tag": "ner", "qa": "qa"}
INPUTS = {"sentiment": TEXTS, "ner": TEXTS, "qa": QUESTIONS}


def raw(model, head: str, inputs: list) -> tuple[list, list]:
    task = model.task(head)
    features, _ = task.modeling.encode_for_inference(task.reading.from_inputs(inputs), model.net.encoder.tokenizer)
    return features, run_heads(model.net, features, [head])[head]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_run(request, tmp_path_factory):
    """One family's checkpoint, its data and a model of three heads trained jointly for one epoch."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    data = write_data(root / "data")
    source = checkpoint(family, root / "checkpoint")
    model = bertheads.train_multi(str(data["config"]), root / "model", model=source,
                                  settings=bertheads.TrainSettings(**SETTINGS))
    return family, source, data, root, model


def test_train_predict_evaluate(family_run):
    """Training saves the family's own heads; each kind predicts and evaluates."""
    family, _, data, root, model = family_run
    net = model.net
    expected = family_of_config(net.encoder.config).name
    assert expected == HEAD_FAMILIES[{"xlm-roberta": "roberta", "deberta-v2": "deberta"}.get(family, family)].name
    for kind, head in HEADS.items():
        assert MATRIX[family, kind, "train"] == MATRIX[family, kind, "predict"] == "yes"
        assert model.task(head).spec.head_family == expected
        manifest = json.loads((root / "model" / "bertheads.json").read_text())
        assert manifest["heads"][head]["spec"]["head_family"] == expected
    sentiment = model.predict(TEXTS, head="sentiment")
    assert [p["label"] in ("negative", "positive") for p in sentiment] == [True] * 3
    assert all(isinstance(p["entities"], list) for p in model.predict(TEXTS, head="ner"))
    answer = model.predict(QUESTIONS, head="qa")[0]
    assert set(answer) == {"answer", "start", "end", "score", "raw_score"}
    # the answer is the context's span at its offsets ("" at 0 when the head answers nothing)
    assert QUESTIONS[0][1][answer["start"]:answer["end"]] == answer["answer"]
    for kind, head in HEADS.items():
        assert MATRIX[family, kind, "evaluate"] == "yes"
        metrics = model.evaluate(str(data[kind]), head=head)
        assert np.isfinite(metrics[model.task(head).judging.main_metric]) and np.isfinite(metrics["loss"])


def test_features_mode(family_run, tmp_path):
    """Frozen encoder: the heads train on cached states; the model keeps the checkpoint's encoder."""
    family, source, data, _, _ = family_run
    model = bertheads.train_multi(str(data["config"]), tmp_path / "m", model=source, mode="features",
                                  cache_dir=str(tmp_path / "cache"), settings=bertheads.TrainSettings(**SETTINGS))
    for kind, head in HEADS.items():
        assert MATRIX[family, kind, "features mode"] == "yes"
        assert model.predict(INPUTS[head], head=head)
    assert not (tmp_path / "m" / "encoder").exists()  # heads only: the encoder is the checkpoint's


def test_export_hf_pipelines_agree(family_run):
    """`export --to hf` gives the family's own transformers class, and it computes our outputs."""
    from transformers import AutoModelForQuestionAnswering, pipeline

    family, _, _, root, model = family_run
    net = model.net
    for kind, head in HEADS.items():
        assert MATRIX[family, kind, "export hf"] == "yes"
        out = root / f"hf-{head}"
        info = export_hf(root / "model", out, head=head)
        assert info["max_abs_diff"] <= 1e-4
        task = model.task(head)
        if kind == "classify":
            got = pipeline("text-classification", model=str(out), top_k=None)(TEXTS)
            ours = model.predict(TEXTS, head=head)
            for g, o in zip(got, ours):
                assert {x["label"]: x["score"] for x in g} == pytest.approx(o["scores"], abs=1e-4)
        elif kind == "tag":
            tagger = pipeline("token-classification", model=str(out), ignore_labels=[])
            for text in TEXTS:
                enc = net.encoder.tokenizer(text, return_tensors="pt")
                batch = {k: enc[k] for k in ("input_ids", "attention_mask")}
                if "token_type_ids" in enc:
                    batch["token_type_ids"] = enc["token_type_ids"]
                with torch.no_grad():  # the export folds the head's temperature into its last layer
                    probs = torch.softmax(net(batch, [head])[head][0] / task.scoring.temperature(), -1)
                rows = tagger(text)
                assert rows
                for r in rows:
                    assert r["entity"] == task.spec.tags[int(probs[r["index"]].argmax())]
                    assert r["score"] == pytest.approx(float(probs[r["index"]].max()), abs=1e-4)
        else:
            hf = AutoModelForQuestionAnswering.from_pretrained(str(out)).eval()
            features, logits = raw(model, head, QUESTIONS)
            feed = {"input_ids": torch.tensor([features[0]["input_ids"]])}
            if net.encoder.info.uses_token_types:
                feed["token_type_ids"] = torch.tensor([features[0]["token_type_ids"]])
            with torch.no_grad():
                got = hf(**feed)
            np.testing.assert_allclose(got.start_logits[0].numpy(), logits[0][:, 0], atol=1e-4)
            np.testing.assert_allclose(got.end_logits[0].numpy(), logits[0][:, 1], atol=1e-4)


# ELECTRA's encoder is BERT's modeling code and XLM-RoBERTa's RoBERTa's: their exports check what the
# BERT and RoBERTa ones check, so `make test` leaves them to `make test-nightly`
# siblings' graphs: ELECTRA's and RoBERTa's attention is BERT's, their position ids RoBERTa's (which
# MPNet's export makes too), XLM-R is RoBERTa's
NIGHTLY = ("test_export_onnx_runtime_agrees[electra]", "test_export_onnx_runtime_agrees[xlm-roberta]",
           "test_export_onnx_runtime_agrees[roberta]")


@pytest.mark.slow  # one dynamo export per family, about 10 s each on 2 cores
def test_export_onnx_runtime_agrees(family_run):
    """One graph of the three heads; ONNX Runtime gives torch's outputs and predictions."""
    family, _, _, root, model = family_run
    export_onnx(root / "model", openvino=False)
    onnx = bertheads.load(root / "model", runtime="onnx")
    for kind, head in HEADS.items():
        assert MATRIX[family, kind, "export onnx"] == "yes"
        _, ours = raw(model, head, INPUTS[head])
        _, theirs = raw(onnx, head, INPUTS[head])
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)
        # the same predictions; a score rounded to 4 places may land on either side of a digit
        assert_same_predictions(onnx.predict(INPUTS[head], head=head), model.predict(INPUTS[head], head=head))


def assert_same_predictions(got, expected) -> None:
    """Equal, floats (rounded scores) within 2e-4."""
    if isinstance(expected, float):
        assert got == pytest.approx(expected, abs=2e-4)
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys()
        for key in expected:
            assert_same_predictions(got[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_same_predictions(a, b)
    else:
        assert got == expected


def test_serve_answers_as_the_python_api(family_run):
    """The HTTP server gives each kind's predictions exactly as `Model.predict` does."""
    from fastapi.testclient import TestClient

    from bertheads.serve.app import ServeSettings, create_app

    family, _, _, _, model = family_run
    for kind in HEADS:
        assert MATRIX[family, kind, "serve"] == "yes"
    with TestClient(create_app(model, ServeSettings(window_ms=2)), base_url="http://localhost") as client:
        heads = {h["name"]: h["kind"] for h in client.get("/heads").json()["heads"]}
        assert heads == {head: kind for kind, head in HEADS.items()}
        for head in ("sentiment", "ner"):
            got = client.post(f"/predict/{head}", json={"texts": TEXTS})
            assert got.status_code == 200 and got.json()["results"] == model.predict(TEXTS, head=head)
        question, context = QUESTIONS[0]
        got = client.post("/predict/qa", json={"questions": [question], "contexts": [context]})
        assert got.status_code == 200 and got.json()["results"] == model.predict(QUESTIONS, head="qa")


def test_first_token_last_layer(family_run):
    """Where the matrix says so, a [CLS] head runs the last layer for [CLS] alone, with the
    full pass's vector; elsewhere the full pass."""
    family, _, _, _, model = family_run
    net = model.net
    head = net.heads["sentiment"]
    fast = MATRIX[family, "classify", "[CLS]-only last layer"] == "yes"
    assert (net.encoder.first_token_ready and getattr(head, "reads_cls", True)) == fast
    for kind in ("tag", "qa"):
        assert MATRIX[family, kind, "[CLS]-only last layer"].startswith("no")
    enc = net.encoder.tokenizer(TEXTS, padding=True, return_tensors="pt")
    args = (enc["input_ids"], enc["attention_mask"], enc.get("token_type_ids"))
    with torch.no_grad():
        full = net.encoder(*args)
        first = net.encoder(*args, first_token_only=True)
    assert first.shape[1] == (1 if net.encoder.first_token_ready else full.shape[1])
    torch.testing.assert_close(first[:, 0], full[:, 0], atol=1e-5, rtol=0)


@pytest.mark.slow  # two dynamo exports
@pytest.mark.parametrize("family", ["distilbert", "deberta-v2"])
def test_first_token_graph(family, tmp_path):
    """The ONNX graph of a [CLS]-only model runs the last layer for [CLS] alone on the families
    whose fast path is new, and ONNX Runtime gives torch's scores."""
    from helpers_multi import save_heads

    source = tiny_checkpoint(family, tmp_path / "checkpoint")
    model_dir = save_heads(source, tmp_path / "model", {"sentiment": ("classify", 1, {"labels": ["a", "b"]})})
    ours, _ = bertheads.load(model_dir), export_onnx(model_dir, openvino=False)
    assert ours.net.encoder.first_token_ready
    theirs = bertheads.load(model_dir, runtime="onnx")
    _, a = raw(ours, "sentiment", TEXTS)
    _, b = raw(theirs, "sentiment", TEXTS)
    np.testing.assert_allclose(np.stack(b), np.stack(a), atol=1e-4, rtol=0)


def test_attention_dropout_setting_reaches_every_familys_attention(family_run):
    """`attention_dropout` sets the dropout each family's attention reads in a training pass
    (two passes differ with it, are equal without it, other dropout off), and None gives the
    checkpoint's own back."""
    family, source, _, _, _ = family_run
    encoder = Encoder.load(source)
    layers = encoder.config.num_hidden_layers if hasattr(encoder.config, "num_hidden_layers") else encoder.config.n_layers
    assert encoder.set_attention_dropout(None) == layers  # one attention module a layer, the checkpoint's value kept
    own = [m._checkpoint_attention_dropout for m in encoder.model.modules() if "_checkpoint_attention_dropout" in m.__dict__]
    for module in encoder.model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    enc = encoder.tokenizer(TEXTS, padding=True, return_tensors="pt")
    args = (enc["input_ids"], enc["attention_mask"], enc.get("token_type_ids"))
    encoder.train()

    def two_passes():
        torch.manual_seed(0)
        first = encoder(*args)
        return first, encoder(*args)

    encoder.set_attention_dropout(0.5)
    a, b = two_passes()
    assert not torch.allclose(a, b)
    encoder.set_attention_dropout(0.0)
    a, b = two_passes()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    encoder.set_attention_dropout(None)
    assert [m._checkpoint_attention_dropout for m in encoder.model.modules()
            if "_checkpoint_attention_dropout" in m.__dict__] == own


def test_families_doc_is_current():
    """docs/families.md is the matrix's table (regenerate: python tests/families_matrix.py > docs/families.md)."""
    path = Path(__file__).resolve().parent.parent / "docs" / "families.md"
    assert path.read_text() == render()


def test_heads_saved_before_families_keep_bert_layout(tmp_path):
    """A manifest without `head_family` (saved before) loads BERT's head on any encoder and
    predicts as saved; on RoBERTa that head still exports to RobertaForSequenceClassification."""
    source = tiny_checkpoint("roberta", tmp_path / "roberta")
    data = write_data(tmp_path / "data")
    model = bertheads.train("classify", str(data["classify"]), None, tmp_path / "m", model=source,
                            head_family="bert", settings=bertheads.TrainSettings(**SETTINGS))
    assert sorted(model.net.heads["classify"].state_dict()) == ["out.bias", "out.weight", "pooler.bias",
                                                                "pooler.weight"]
    before = model.predict(TEXTS)
    path = tmp_path / "m" / "bertheads.json"
    manifest = json.loads(path.read_text())
    del manifest["heads"]["classify"]["spec"]["head_family"]
    path.write_text(json.dumps(manifest))
    again = bertheads.load(tmp_path / "m")
    assert again.task("classify").spec.head_family == "bert" and again.predict(TEXTS) == before
    info = export_hf(tmp_path / "m", tmp_path / "hf")
    assert info["class"] == "RobertaForSequenceClassification" and info["max_abs_diff"] <= 1e-4
    fresh = bertheads.train("classify", str(data["classify"]), None, None, model=source,
                            settings=bertheads.TrainSettings(**SETTINGS))
    assert fresh.task("classify").spec.head_family == "roberta"
    assert fresh.net.heads["classify"].dropout_first and not model.net.heads["classify"].dropout_first


def test_head_starts_from_the_checkpoints_own_weights(tmp_path):
    """ModernBERT's heads start from its masked-LM `head`; DeBERTa's from a `pooler.dense` the
    checkpoint has; RoBERTa's as transformers initialises it (not from its unused pooler)."""
    modern = Encoder.load(tiny_checkpoint("modernbert", tmp_path / "modernbert"))
    mlm = load_file(str(tmp_path / "modernbert" / "model.safetensors"))
    for kind, spec in (("classify", {"labels": [0, 1]}), ("tag", {"tags": ["O", "B-X"]}), ("qa", {})):
        cls = TASKS[kind]
        spec = cls.spec_type(**spec)
        task = cls.build(spec, modern, start_weights(settle_family(spec, modern), modern))
        dense = task.head.pooler if kind == "classify" else task.head.dense
        assert torch.equal(dense.weight, mlm["head.dense.weight"]) and torch.equal(task.head.norm.weight,
                                                                                   mlm["head.norm.weight"])
    deberta_dir = Path(tiny_checkpoint("deberta-v2", tmp_path / "deberta"))
    weights = load_file(str(deberta_dir / "model.safetensors"))
    pooler = {"pooler.dense.weight": torch.randn(32, 32), "pooler.dense.bias": torch.randn(32)}
    save_file({**weights, **pooler}, str(deberta_dir / "model.safetensors"), metadata={"format": "pt"})
    deberta = Encoder.load(str(deberta_dir))
    cls = TASKS["classify"]
    spec = cls.spec_type(labels=[0, 1])
    task = cls.build(spec, deberta, start_weights(settle_family(spec, deberta), deberta))
    assert torch.equal(task.head.pooler.weight, pooler["pooler.dense.weight"])
    roberta = Encoder.load(tiny_checkpoint("roberta", tmp_path / "roberta"))
    spec = cls.spec_type(labels=[0, 1])
    assert roberta.pooler_state is not None and start_weights(settle_family(spec, roberta), roberta) is None


def test_bert_head_is_computed_as_before(tiny_bert):
    """BERT's classify head keeps its weights' names, its start from the pooler and its sum
    (tanh of the pooler over [CLS], then the linear layer), bit for bit."""
    encoder = Encoder.load(tiny_bert).eval()
    cls = TASKS["classify"]
    spec = cls.spec_type(labels=[0, 1])
    torch.manual_seed(3)
    head = cls.build(spec, encoder, start_weights(settle_family(spec, encoder), encoder)).head.eval()
    assert spec.head_family == "bert" and sorted(head.state_dict()) == ["out.bias", "out.weight", "pooler.bias",
                                                                        "pooler.weight"]
    assert torch.equal(head.pooler.weight, encoder.pooler_state["weight"])
    states = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert torch.equal(head(states, {}), head.out(torch.tanh(head.pooler(states[:, 0]))))
    assert head.out.weight.std() < 0.05 and torch.equal(head.out.bias, torch.zeros(2))
