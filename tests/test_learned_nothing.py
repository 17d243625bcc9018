"""A head that learned nothing is said loudly: after training (stderr, metrics.json, the model
card), by `evaluate`, and on the report page; each kind says how it shows."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bertheads.cli.main import main


def test_a_degenerate_run_is_loud_everywhere(tiny_bert, write, tmp_path, capsys):
    """Every training and dev input is the same text: whatever the model learns, it gives one
    label for all of them."""
    train = write("train.tsv", "sentence\tlabel\n" + "a film\tgood\n" * 18 + "a film\tbad\n" * 6)
    dev = write("dev.tsv", "sentence\tlabel\n" + "a film\tgood\n" * 9 + "a film\tbad\n" * 3)
    out = tmp_path / "m"
    assert main(["train", "classify", "--train", train, "--dev", dev, "--out", str(out), "--model", tiny_bert,
                 "--epochs", "1", "--no-progress"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "learned nothing" in x)
    assert "head 'classify' learned nothing: it predicts" in line and "for every input (MCC 0.00)" in line
    assert "--mode features" in line  # what to try
    saved = json.loads((out / "metrics.json").read_text())
    assert "for every input" in saved["learned_nothing"]["classify"]
    assert "**Warning: `classify` learned nothing**" in (out / "README.md").read_text()
    assert main(["evaluate", str(out), "--data", dev, "--json"]) == 0
    result, err = capsys.readouterr()
    assert "for every input" in json.loads(result)["learned_nothing"] and "learned nothing" in err


def test_a_model_that_learned_says_nothing_of_the_kind():
    from bertheads.tasks.classify.judging import ClassifyJudging

    judging = ClassifyJudging(SimpleNamespace(spec=SimpleNamespace(problem="single_label")))
    fine = {"examples": 40, "mcc": 0.6, "confusion": {"labels": ["0", "1"], "matrix": [[16, 4], [4, 16]]}}
    assert judging.learned_nothing(fine) is None
    chance = {"examples": 40, "mcc": 0.0, "confusion": {"labels": ["0", "1"], "matrix": [[10, 10], [10, 10]]}}
    assert "no better than chance (MCC 0.00)" in judging.learned_nothing(chance)
    one_gold = {"examples": 40, "mcc": 0.0, "confusion": {"labels": ["0", "1"], "matrix": [[0, 0], [0, 40]]}}
    assert judging.learned_nothing(one_gold) is None  # nothing to tell apart
    judging.spec.problem = "regression"
    assert "Pearson r 0.01" in judging.learned_nothing({"pearson": 0.01})
    assert judging.learned_nothing({"pearson": float("nan")})  # constant predictions


def test_a_model_below_chance_or_under_the_majority_class_is_flagged():
    """|MCC| below 0.05 was the only test: a run at accuracy 0.464 under the majority class's 0.509,
    MCC -0.08, went without a word."""
    from bertheads.tasks.classify.judging import ClassifyJudging

    judging = ClassifyJudging(SimpleNamespace(spec=SimpleNamespace(problem="single_label")))
    # 444 dev inputs, 226 of them 'positive' (0.509); 206 right (0.464)
    worse = {"examples": 444, "mcc": -0.08,
             "confusion": {"labels": ["negative", "positive"], "matrix": [[100, 118], [120, 106]]}}
    assert judging.learned_nothing(worse) == \
        "it does worse than always answering 'positive' (accuracy 0.464 against 0.509, MCC -0.08)"
    # balanced classes: below chance by its MCC alone
    negative = {"examples": 40, "mcc": -0.2, "confusion": {"labels": ["0", "1"], "matrix": [[8, 12], [12, 8]]}}
    assert judging.learned_nothing(negative) == "it does worse than always answering '0' (accuracy 0.400 against " \
        "0.500, MCC -0.20)"
    flipped = {"examples": 40, "mcc": -0.06, "confusion": {"labels": ["0", "1"], "matrix": [[10, 10], [10, 10]]}}
    assert judging.learned_nothing(flipped) == "its predictions are worse than chance (MCC -0.06)"
    # imbalanced, and a real MCC: accuracy traded for the rare class is not "nothing"
    rare = {"examples": 100, "mcc": 0.35, "confusion": {"labels": ["a", "b"], "matrix": [[78, 12], [3, 7]]}}
    assert judging.learned_nothing(rare) is None
    # under the majority class with a weak MCC
    weak = {"examples": 100, "mcc": 0.06, "confusion": {"labels": ["a", "b"], "matrix": [[70, 20], [8, 2]]}}
    assert "worse than always answering 'a' (accuracy 0.720 against 0.900" in judging.learned_nothing(weak)


def test_tag_and_qa_say_what_they_never_find():
    from bertheads.tasks.qa.judging import QAJudging
    from bertheads.tasks.tag.judging import TagJudging

    tag = TagJudging(None)
    per_type = {"LOC": {"recall": 0.8, "support": 20}, "MISC": {"recall": 0.0, "support": 9},
                "ORG": {"recall": 0.0, "support": 2}}  # two ORG entities are too few to judge by
    assert tag.learned_nothing({"f1": 0.5, "per_type": per_type}) == \
        "it never finds MISC entities (recall 0 on 9 MISC)"
    none = {t: {**m, "recall": 0.0} for t, m in per_type.items()}
    assert "none of the entities" in tag.learned_nothing({"f1": 0.0, "per_type": none})
    qa = QAJudging(None)
    abstains = {"f1": 50.0, "HasAns_f1": 0.0, "HasAns_total": 40, "NoAns_f1": 100.0, "examples": 80}
    assert "none of the 40 questions that have an answer" in qa.learned_nothing(abstains)
    assert qa.learned_nothing({"f1": 35.0, "examples": 80}) is None
