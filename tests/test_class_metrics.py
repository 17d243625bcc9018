"""Per-class and per-label metrics against sklearn, entity type confusion and span errors on
hand-made cases, multi-label threshold tuning, and `--min-score` / `--threshold`."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bertheads
from bertheads.cli.main import main
from bertheads.tasks.classify.metrics import label_metrics, multi_label_metrics, tune_thresholds
from bertheads.tasks.tag.scheme import entity_errors


def test_single_label_per_class_and_confusion_match_sklearn():
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    gold = np.array([0, 0, 1, 1, 2, 2, 2, 0, 1, 2])
    pred = np.array([0, 1, 1, 1, 2, 0, 2, 0, 0, 1])
    names = ["neg", "neu", "pos", "none"]  # a class never seen: zeros, not NaN
    out = label_metrics(pred, gold, 4, names)
    p, r, f, s = precision_recall_fscore_support(gold, pred, labels=[0, 1, 2, 3], zero_division=0)
    for j, name in enumerate(names):
        assert out["per_class"][name] == pytest.approx({"precision": p[j], "recall": r[j], "f1": f[j],
                                                        "support": s[j]})
    assert out["confusion"]["labels"] == names
    assert out["confusion"]["matrix"] == confusion_matrix(gold, pred, labels=[0, 1, 2, 3]).tolist()
    assert out["confusion"]["matrix"][2] == [1, 1, 2, 0]  # gold "pos": once neg, once neu, twice right


def test_multi_label_per_label_match_sklearn():
    from sklearn.metrics import precision_recall_fscore_support

    gold = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=bool)
    pred = np.array([[1, 1, 0], [0, 1, 1], [0, 1, 0], [0, 0, 1]], dtype=bool)
    out = multi_label_metrics(pred, gold, ["a", "b", "c"])
    p, r, f, s = precision_recall_fscore_support(gold, pred, average=None, zero_division=0)
    for j, name in enumerate("abc"):
        assert out["per_label"][name] == pytest.approx({"precision": p[j], "recall": r[j], "f1": f[j],
                                                        "support": s[j]})


def test_summary_metrics_match_sklearn_on_random_cases():
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    rng = np.random.default_rng(1)
    for num_labels, n in [(2, 50), (2, 7), (3, 40), (5, 30)]:
        gold = rng.integers(0, num_labels, n)
        pred = np.where(rng.random(n) < 0.6, gold, rng.integers(0, num_labels, n))
        out = label_metrics(pred, gold, num_labels)
        average = "binary" if num_labels == 2 else "macro"
        labels = None if num_labels == 2 else list(range(num_labels))
        assert out["accuracy"] == pytest.approx(accuracy_score(gold, pred))
        assert out["f1"] == pytest.approx(f1_score(gold, pred, average=average, labels=labels, zero_division=0))
        assert out["mcc"] == pytest.approx(matthews_corrcoef(gold, pred))
        multi_gold, multi_pred = rng.random((n, 4)) < 0.4, rng.random((n, 4)) < 0.4
        multi = multi_label_metrics(multi_pred, multi_gold)
        for average in ("micro", "macro"):
            assert multi[f"{average}_f1"] == pytest.approx(f1_score(multi_gold, multi_pred, average=average,
                                                                   zero_division=0))
    # constant predictions: MCC 0, as sklearn; a class never predicted: F1 0, not NaN
    constant = label_metrics(np.zeros(6, dtype=int), np.array([0, 1, 0, 1, 1, 0]), 2)
    assert constant["mcc"] == 0.0 and constant["f1"] == 0.0 and constant["accuracy"] == 0.5


def test_tuned_thresholds_give_the_best_f1_of_every_cut():
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    gold = rng.random((40, 3)) < 0.4
    probs = np.clip(gold * 0.25 + rng.random((40, 3)) * 0.7, 0, 1)  # positives lean high, overlap
    cuts = tune_thresholds(probs, gold)
    for j in range(3):
        best = max(f1_score(gold[:, j], probs[:, j] >= c, zero_division=0) for c in np.r_[probs[:, j], 1.1])
        assert f1_score(gold[:, j], probs[:, j] >= cuts[j]) == pytest.approx(best)
    # separable scores: the cut falls between the classes
    assert 0.3 < tune_thresholds(np.array([[0.2], [0.3], [0.9], [0.95]]), np.array([[0], [0], [1], [1]]))[0] < 0.9
    # a label never positive on dev keeps 0.5
    assert tune_thresholds(np.array([[0.2], [0.7]]), np.array([[0], [0]]))[0] == 0.5


def test_entity_type_confusion_and_span_errors():
    gold = [["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG", "O", "B-MISC"],
            ["B-LOC", "I-LOC", "I-LOC", "O", "B-PER"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG", "O", "B-ORG", "I-ORG", "O"],  # right; type; boundary; missed
            ["O", "B-PER", "I-PER", "O", "O", ]]  # type and boundary; missed
    pred[1].append("O")
    pred[1][3] = "B-MISC"  # spurious
    out = entity_errors(gold, pred)
    assert out["errors"] == {"correct": 1, "type": 1, "boundary": 1, "type_and_boundary": 1, "missed": 2,
                             "spurious": 1}
    types = out["type_confusion"]["types"]
    assert types == ["LOC", "MISC", "ORG", "PER", "O"]
    m = {(g, p): out["type_confusion"]["matrix"][types.index(g)][types.index(p)] for g in types for p in types}
    assert m[("PER", "PER")] == 1 and m[("ORG", "ORG")] == 1
    assert m[("LOC", "ORG")] == 1 and m[("LOC", "PER")] == 1
    assert m[("MISC", "O")] == 1 and m[("PER", "O")] == 1 and m[("O", "MISC")] == 1
    assert sum(map(sum, out["type_confusion"]["matrix"])) == 7


@pytest.fixture(scope="module")
def sentiment_model(tiny_bert, tmp_path_factory):
    d = tmp_path_factory.mktemp("cm")
    rows = "".join(f"a {w} film\t{y}\n" for w, y in [("fine", 1), ("bad", 0), ("great", 1), ("dull", 0)] * 4)
    (d / "train.tsv").write_text("sentence\tlabel\n" + rows)
    bertheads.train("classify", str(d / "train.tsv"), str(d / "train.tsv"), d / "model", model=tiny_bert,
                    settings=bertheads.TrainSettings(epochs=1, batch_size=8, progress=False))
    return d


def test_evaluate_json_has_per_class_and_min_score_abstains(sentiment_model, capsys):
    d = sentiment_model
    assert main(["evaluate", str(d / "model"), "--data", str(d / "train.tsv"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["per_class"]) == {"0", "1"} and sum(v["support"] for v in out["per_class"].values()) == 16
    assert np.sum(out["confusion"]["matrix"]) == 16
    model = bertheads.load(d / "model")
    named = bertheads.load(d / "model")
    named.task().spec.label_names = ["negative", "positive"]  # as --label-names sets them
    assert set(named.evaluate(str(d / "train.tsv"))["per_class"]) == {"negative", "positive"}
    preds = model.predict(["a fine film", "a dull film"])
    top = max(max(p["scores"].values()) for p in preds)
    abstained = model.predict(["a fine film", "a dull film"], min_score=min(top + 1e-6, 1.0))
    assert [p["label"] for p in abstained] == [None, None]
    assert [p["label"] for p in model.predict(["a fine film"], min_score=0.0)] == [preds[0]["label"]]
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", str(d / "model"), "--input", str(d / "train.tsv"), "--min-score", "1.5"])
    assert exit_info.value.code == 2


def test_thresholds_tuned_after_an_epoch_unless_one_is_fixed():
    from bertheads.tasks.classify.formats import ClassifyExample
    from bertheads.tasks.classify.spec import ClassifySpec
    from bertheads.tasks.classify.task import ClassifyTask

    examples = [ClassifyExample("t", label=labels) for labels in (["a"], ["a", "b"], [], ["b"])]
    logits = [np.array(x, dtype=float) for x in ([-1.0, -3.0], [-0.5, 2.0], [-2.0, -1.0], [-3.0, 1.0])]
    task = ClassifyTask(ClassifySpec(problem="multi_label", labels=["a", "b"]), None)
    out = task.judging.metrics(logits, examples, during_training=True)
    sig = 1 / (1 + np.exp(-np.stack(logits)))
    assert sig[1, 0] > task.spec.thresholds[0] > sig[2, 0]  # "a": positives -1.0 and -0.5 above the cut
    assert out["micro_f1"] == 1.0 and out["thresholds"]["a"] == pytest.approx(task.spec.thresholds[0], abs=1e-4)
    assert task.judging.decode(logits)[0]["labels"] == ["a"]
    fixed = ClassifyTask(ClassifySpec(problem="multi_label", labels=["a", "b"], threshold=0.5), None)
    out = fixed.judging.metrics(logits, examples, during_training=True)
    assert fixed.spec.thresholds is None and out["thresholds"] == {"a": 0.5, "b": 0.5}
    assert out["per_label"]["a"]["recall"] == 0.0  # both "a" scores are below 0.5
