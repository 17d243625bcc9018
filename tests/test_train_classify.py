"""Fine-tuning classify heads end to end on the tiny BERT: learning, saving, loading, the API."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import bertheads
from bertheads.base.errors import UserError
from bertheads.encoder.pretrained import Encoder
from bertheads.saved import bundle

FAST = dict(epochs=8, batch_size=8, lr=3e-3, progress=False)


def sentiment_rows(n=24):
    good = ["great", "wonderful", "superb", "lovely"]
    bad = ["awful", "boring", "terrible", "dreadful"]
    rows = []
    for i in range(n):
        rows.append((f"a {good[i % 4]} movie", 1))
        rows.append((f"a {bad[i % 4]} movie", 0))
    return rows


@pytest.fixture(scope="module")
def trained(tiny_bert, tmp_path_factory):
    d = tmp_path_factory.mktemp("cls")
    data = d / "train.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in sentiment_rows()))
    before = {k: v.clone() for k, v in Encoder.load(tiny_bert).model.state_dict().items()}
    model = bertheads.train("classify", str(data), str(data), d / "model", model=tiny_bert,
                            settings=bertheads.TrainSettings(**FAST))
    return d, model, before


def test_learns_a_separable_task(trained):
    d, model, _ = trained
    metrics = json.loads((d / "model" / "metrics.json").read_text())
    assert metrics["dev"]["accuracy"] == 1.0
    assert set(metrics["dev"]) >= {"accuracy", "f1", "mcc"}
    assert len(metrics["history"]) == 8 and 1 <= metrics["best_epoch"] <= 8
    preds = model.predict(["a superb movie", "a dreadful movie"])
    assert [p["label"] for p in preds] == [1, 0]
    assert set(preds[0]["scores"]) == {"0", "1"} and abs(sum(preds[0]["scores"].values()) - 1) < 1e-4


def test_fine_tuning_updates_every_encoder_parameter(trained):
    _, model, before = trained
    after = model.net.encoder.model.state_dict()
    unchanged = [k for k, v in before.items() if k in after and torch.equal(v, after[k]) and "pooler" not in k
                 and "position_ids" not in k and "token_type" not in k]
    assert unchanged == []


def test_saved_encoder_loads_in_transformers_and_nothing_is_pickled(trained):
    from transformers import AutoModel, AutoTokenizer

    d, model, _ = trained
    enc_dir = d / "model" / "encoder"
    hf = AutoModel.from_pretrained(enc_dir)
    tok = AutoTokenizer.from_pretrained(enc_dir)
    ids = tok("a superb movie", return_tensors="pt")
    with torch.no_grad():
        ours = model.net.encoder(ids["input_ids"], ids["attention_mask"], ids["token_type_ids"])
        theirs = hf(**ids).last_hidden_state
    assert torch.allclose(ours, theirs, atol=1e-5)
    files = {p.suffix for p in (d / "model").rglob("*") if p.is_file()}
    assert not files & {".bin", ".pt", ".pth", ".pkl", ".pickle"}
    manifest = json.loads((d / "model" / "bertheads.json").read_text())
    spec = manifest["heads"]["classify"]["spec"]
    assert manifest["heads"]["classify"]["kind"] == "classify"
    assert spec["labels"] == [0, 1] and spec["max_length"] == 128 and spec["text_column"] == "sentence"


def test_load_gives_identical_predictions_and_order(trained):
    d, model, _ = trained
    texts = ["a lovely movie", ("premise here", "hypothesis"), "a boring movie " * 20, "a great movie"]
    again = bertheads.load(d / "model")
    a, b = model.predict(texts), again.predict(texts)
    assert a == b
    one_by_one = [model.predict([t])[0] for t in texts]
    for x, y in zip(a, one_by_one):  # batched, length-sorted inference restores input order
        assert x["label"] == y["label"]
        assert np.allclose(list(x["scores"].values()), list(y["scores"].values()), atol=1e-4)


def test_evaluate_and_unseen_label(trained, write):
    d, model, _ = trained
    good = write("dev.tsv", "sentence\tlabel\na great movie\t1\na terrible movie\t0\n")
    assert model.evaluate(good)["accuracy"] == 1.0
    bad = write("dev2.tsv", "sentence\tlabel\na great movie\t1\nmeh\t7\n")
    with pytest.raises(UserError, match=r"dev2.tsv:3: label '7' was not seen in training"):
        model.evaluate(bad)


def test_failed_run_keeps_the_saved_model(trained, tiny_bert, write):
    d, _, _ = trained
    out = d / "model"
    stamp = (out / "heads" / "classify.safetensors").read_bytes()
    bad_dev = write("bad.tsv", "sentence\tlabel\nx\t1\ny\tnope\n")
    with pytest.raises(UserError):
        bertheads.train("classify", str(d / "train.tsv"), bad_dev, out, model=tiny_bert,
                        settings=bertheads.TrainSettings(**FAST, overwrite=True))
    assert (out / "heads" / "classify.safetensors").read_bytes() == stamp
    assert not [p for p in d.iterdir() if p.name.startswith(".model.")]  # no temp dirs left


def test_refuses_to_overwrite_a_foreign_directory(tiny_bert, write, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    train = write("t.tsv", "sentence\tlabel\na\t1\nb\t0\n")
    with pytest.raises(UserError, match="not a bertheads model"):
        bertheads.train("classify", train, None, mine, model=tiny_bert, settings=bertheads.TrainSettings(**FAST))
    assert (mine / "notes.txt").read_text() == "keep me"


def test_atomic_save_survives_a_crash_mid_write(trained, monkeypatch):
    d, model, _ = trained
    out = d / "model"
    before = sorted(p.name for p in out.rglob("*"))

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(bundle, "save_file", boom)
    with pytest.raises(RuntimeError):
        bundle.save(model.net, out)
    assert sorted(p.name for p in out.rglob("*")) == before
    assert bertheads.load(out).predict(["a great movie"])[0]["label"] == 1


def test_regression_trains_with_mse_and_reports_pearson_spearman(tiny_bert, write, tmp_path):
    from scipy.stats import pearsonr, spearmanr

    rows = "".join(f"a great film\tit is good\t{4.0 + i % 3 * 0.5}\nan awful film\tit is bad\t{0.5 + i % 2 * 0.25}\n"
                   for i in range(12))
    sts = write("sts.tsv", "sentence1\tsentence2\tscore\n" + rows + "a fine film\tit is ok\t3.0\n")
    m = bertheads.train("classify", sts, sts, tmp_path / "reg", model=tiny_bert,
                        settings=bertheads.TrainSettings(epochs=3, batch_size=8, lr=1e-2, progress=False))
    saved = json.loads(Path(tmp_path / "reg" / "metrics.json").read_text())
    history = [h["train_loss"] for h in saved["history"]]
    assert history[-1] < history[0]  # MSE on the scores goes down
    assert m.task().spec.problem == "regression" and m.task().spec.labels == [] and m.task().spec.trained_counts == {}
    pairs = [(a, b) for a, b, _ in (line.split("\t") for line in Path(sts).read_text().splitlines()[1:])]
    gold = [float(line.split("\t")[2]) for line in Path(sts).read_text().splitlines()[1:]]
    values = [p["value"] for p in m.predict(pairs)]
    dev = saved["dev"]
    assert dev["pearson"] == pytest.approx(pearsonr(values, gold)[0], abs=1e-4)
    assert dev["spearman"] == pytest.approx(spearmanr(values, gold)[0], abs=1e-4)
    assert dev["mse"] == pytest.approx(float(np.mean((np.array(values) - gold) ** 2)), rel=1e-4)


def test_multilabel_uses_sigmoid_and_micro_f1(tiny_bert, write, tmp_path):
    from sklearn.metrics import f1_score

    lines = "".join('{"text": "red and blue", "labels": ["red", "blue"]}\n{"text": "only red", "labels": ["red"]}\n'
                    '{"text": "plain", "labels": []}\n' for _ in range(8))
    ml = write("ml.jsonl", lines)
    m = bertheads.train("classify", ml, ml, tmp_path / "ml", model=tiny_bert,
                        settings=bertheads.TrainSettings(epochs=2, batch_size=8, lr=1e-2, progress=False))
    assert m.task().spec.problem == "multi_label" and m.task().spec.labels == ["blue", "red"]
    assert m.task().spec.trained_counts == {"blue": 8, "red": 16}  # the examples that have each label
    preds = m.predict(["red and blue", "only red", "plain"] * 8)
    raw = m.predict(["red and blue", "only red", "plain"] * 8, calibrate=False)  # the thresholds' scores
    cut = dict(zip(["blue", "red"], m.task().spec.thresholds))  # tuned on dev, saved in the spec
    for p, r in zip(preds, raw):  # independent sigmoids, not a softmax
        assert set(p["scores"]) == {"blue", "red"} and p["labels"] == r["labels"]  # calibration keeps the labels
        assert sorted(p["labels"]) == sorted(k for k, v in r["scores"].items() if v >= cut[k])
    fixed = m.predict(["red and blue", "only red", "plain"], threshold=0.5, calibrate=False)
    for p in fixed:
        assert sorted(p["labels"]) == sorted(k for k, v in p["scores"].items() if v >= 0.5)
    gold = [[1, 1], [0, 1], [0, 0]] * 8
    pred = [[int("blue" in p["labels"]), int("red" in p["labels"])] for p in preds]
    dev = json.loads(Path(tmp_path / "ml" / "metrics.json").read_text())["dev"]
    assert dev["micro_f1"] == pytest.approx(f1_score(gold, pred, average="micro", zero_division=0), abs=1e-6)
