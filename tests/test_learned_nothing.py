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
