"""Settings left to bertheads follow the training data's size (each kind's recipe table): the
choice said in one line and saved in config.yaml, what the user gives wins, and without --dev a
held-out slice of the training data chooses the kept epoch."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from bertheads.cli.main import main
from bertheads.tasks import TASKS
from bertheads.tasks.recipes import holdout_size, recipe_for


def test_each_kind_s_table_chooses_by_the_number_of_examples():
    table = TASKS["classify"].parts.modeling.recipes
    few, some, many = recipe_for(table, 32), recipe_for(table, 2000), recipe_for(table, 60000)
    assert (few.mode, few.batch_size, few.pairs_each) == ("contrastive", 8, 0)  # a few hundred or fewer: SetFit's recipe
    assert (recipe_for(table, 800).mode, recipe_for(table, 800).pairs_each) == ("contrastive", 40)  # more pairs
    assert (some.mode, some.batch_size) == ("finetune", 8)
    assert (many.mode, many.batch_size, many.epochs_for(60000, 32)) == ("finetune", 32, 3)  # as before
    # a step budget, not a fixed epoch count: fewer examples, more epochs, within the row's bounds
    assert few.epochs_for(32, 8) > few.epochs_for(200, 8) >= few.epochs[0]
    assert few.epochs_for(32, 8) == few.epochs[1]
    assert some.epochs_for(400, 8) > some.epochs_for(2000, 8) == 3
    assert recipe_for(table, 32, "fixed") == table[-1]
    qa = TASKS["qa"].parts.modeling.recipes  # qa: batch 8, about 600 steps up to 200 questions and 300 up to 1,000, then 16
    assert (recipe_for(qa, 200).mode, recipe_for(qa, 200).batch_size, recipe_for(qa, 200).epochs_for(200, 8)) == \
        ("finetune", 8, 24)
    assert recipe_for(qa, 201).epochs_for(201, 8) == 12 and recipe_for(qa, 201).batch_size == 8
    assert recipe_for(qa, 1000).epochs_for(1000, 8) == 3 and recipe_for(qa, 1001).batch_size == 16
    assert recipe_for(qa, 88000).epochs_for(88000, 16) == 3 == recipe_for(qa, 50, "fixed").epochs_for(50, 16)
    tag = TASKS["tag"].parts.modeling.recipes  # tagging: about 600 steps, batch 8 up to 1,000 sentences, then 32
    assert (recipe_for(tag, 50).mode, recipe_for(tag, 50).batch_size, recipe_for(tag, 50).epochs_for(50, 8)) == \
        ("finetune", 8, 40)
    assert recipe_for(tag, 1000).epochs_for(1000, 8) == 5 and recipe_for(tag, 2000).epochs_for(2000, 32) == 10
    assert recipe_for(tag, 6400).epochs_for(6400, 32) == 3 == recipe_for(tag, 14000).epochs_for(14000, 32)
    assert [holdout_size(n, 0.1) for n in (19, 20, 40, 200, 10**6)] == [0, 4, 4, 20, 2000]
    assert holdout_size(200, 0.0) == 0


def test_contrastive_pairs_grow_with_the_examples_where_the_table_says_so():
    """Up to 200 examples the default count of pairs; from 201 to 1,000, 40 an example (never
    fewer than the default), and none for a run the recipe does not tune on pairs."""
    from bertheads.training.resolve import recipe_pairs
    from bertheads.training.settings import MOST_PAIRS

    table = TASKS["classify"].parts.modeling.recipes
    assert recipe_pairs(recipe_for(table, 200), "contrastive", 200) is None
    assert recipe_pairs(recipe_for(table, 800), "contrastive", 800) == 32_000
    assert recipe_pairs(recipe_for(table, 201), "contrastive", 201) == 8_040
    assert recipe_pairs(replace(recipe_for(table, 800), pairs_each=10), "contrastive", 300) == MOST_PAIRS  # not fewer
    assert recipe_pairs(recipe_for(table, 800), "finetune", 800) is None
    assert recipe_pairs(recipe_for(table, 1001), "contrastive", 1001) is None
    # the run's settings take the count and its line says it; a count the user gives wins
    from types import SimpleNamespace

    from bertheads.tasks.classify.spec import ClassifySpec
    from bertheads.training.provenance import chosen_line
    from bertheads.training.resolve import settle_run
    from bertheads.training.settings import TrainSettings

    task = TASKS["classify"](ClassifySpec(problem="single_label"), None)
    data = [SimpleNamespace(train_features=[{}] * 800, examples=800, task=task, held_out=0, dev_path="dev.tsv")]
    run = settle_run(TrainSettings(), data, how="auto")
    assert (run.mode, run.settings.pairs) == ("contrastive", 32_000)
    assert "32,000 pairs (40 an example), batch 8" in chosen_line(run, data)
    run = settle_run(TrainSettings(pairs=900), data, how="auto")
    assert run.settings.pairs == 900 and "pairs" not in chosen_line(run, data).split("),", 1)[1]


def test_text_pairs_and_regression_fine_tune_where_the_table_says_contrastive():
    """Contrastive mode pairs single labelled texts: a small set of text pairs (MRPC) or of scores
    takes the row's batch size and step budget with fine-tuning instead of failing."""
    from torch import nn

    from bertheads.tasks.classify.spec import ClassifySpec

    def task(**spec):
        return TASKS["classify"](ClassifySpec(**spec), nn.Identity())

    row = recipe_for(TASKS["classify"].parts.modeling.recipes, 100)
    assert task(problem="single_label").modeling.recipe(100) == row and row.mode == "contrastive"
    for spec in ({"problem": "single_label", "pair": True}, {"problem": "regression"}):
        assert task(**spec).modeling.recipe(100) == replace(row, mode="finetune")
        assert task(**spec).modeling.recipe(100, "fixed") == TASKS["classify"].parts.modeling.recipes[-1]
    assert TASKS["tag"](None, nn.Identity()).modeling.recipe(50) == recipe_for(TASKS["tag"].parts.modeling.recipes, 50)


@pytest.fixture
def sentences(write):
    words = ["a good film", "great acting", "a bad plot", "an awful film", "a fine story", "a dull film"]
    return write("train.tsv", "sentence\tlabel\n" + "".join(
        f"{words[i % 6]} {i}\t{'pos' if i % 6 in (0, 1, 4) else 'neg'}\n" for i in range(40)))


def test_little_data_without_dev_trains_contrastive_and_chooses_on_a_held_out_slice(tiny_bert, sentences, tmp_path,
                                                                                    capsys, monkeypatch):
    monkeypatch.setenv("BERTHEADS_RECIPE", "auto")
    out = tmp_path / "m"
    assert main(["train", "classify", "--train", sentences, "--out", str(out), "--model", tiny_bert,
                 "--epochs", "2", "--pairs", "32", "--no-progress"]) == 0  # (few pairs: a quick test)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "training examples:" in x]
    assert len(lines) == 1  # said once
    line = lines[0].removeprefix("bertheads: ")
    assert line == ("40 training examples: --mode contrastive (the encoder tuned on pairs of training texts, "
                    "SetFit's recipe; then the head alone on it), batch 8, up to 2 epochs (given), keeping the best "
                    "on 4 held-out training examples (no --dev; --holdout 0 for none)")
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert (config["mode"], config["batch_size"], config["epochs"]) == ("contrastive", 8, 2)
    assert (config["holdout"], config["recipe"], config["chosen"], config["pairs"]) == (0.1, "auto", line, 32)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dev"]["examples"] == 4 and all(h["dev"] for h in metrics["history"])  # chosen on the slice
    # the saved config trains the same way again: what it records is given now
    assert main(["train", "--config", str(out / "config.yaml"), "--out", str(tmp_path / "again"), "--no-progress",
                 "-q"]) == 0
    again = yaml.safe_load((tmp_path / "again" / "config.yaml").read_text())
    assert {k: again[k] for k in ("mode", "batch_size", "epochs", "holdout")} == \
        {k: config[k] for k in ("mode", "batch_size", "epochs", "holdout")}


def test_the_run_is_settled_once_and_the_training_file_read_once_when_the_recipe_changes_the_mode(
        tiny_bert, sentences, monkeypatch):
    """The mode is the recipe's (contrastive for 40 examples), chosen after the data is read: the
    file is read and encoded once, the head built after, and the resolver called once."""
    from bertheads.tasks.classify import head as classify_head
    from bertheads.tasks.classify import task as classify_task
    from bertheads.training import joint, loop
    from bertheads.training.config import single_task

    monkeypatch.setenv("BERTHEADS_RECIPE", "auto")
    calls = {"read_file": 0, "encode": 0, "settle_run": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(classify_task, "read_file", counted("read_file", classify_task.read_file))
    monkeypatch.setattr(classify_head.ClassifyModeling, "encode",
                        counted("encode", classify_head.ClassifyModeling.encode))
    for module in (joint, loop):
        monkeypatch.setattr(module, "settle_run", counted("settle_run", module.settle_run))
    settings = loop.TrainSettings(epochs=1, pairs=16, progress=False)
    net, _ = joint.train_tasks(single_task("classify", sentences, None, {}), None, tiny_bert, settings)
    assert net.tasks["classify"].spec.mode == "contrastive"
    assert calls == {"read_file": 1, "encode": 1, "settle_run": 1}


def test_what_the_user_gives_wins_and_holdout_0_keeps_the_last_epoch(tiny_bert, sentences, tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.setenv("BERTHEADS_RECIPE", "auto")
    out = tmp_path / "m"
    assert main(["train", "classify", "--train", sentences, "--out", str(out), "--model", tiny_bert,
                 "--mode", "finetune", "--batch-size", "16", "--epochs", "1", "--holdout", "0",
                 "--no-progress"]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if "training examples:" in x)
    assert line.endswith("40 training examples: fine-tuning (given), batch 16 (given), 1 epoch (given), "
                         "keeping the last (no --dev; --holdout 0)")
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert (config["mode"], config["batch_size"], config["epochs"], config["holdout"]) == ("finetune", 16, 1, 0.0)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["kept"]["by"] == "last epoch (no dev set)" and metrics["dev"] == {}


def test_several_kinds_fine_tune_unless_every_table_agrees(tiny_bert, tmp_path, capsys, monkeypatch):
    """The demo's three small tasks: classify's table alone would take contrastive mode, tag's and
    qa's fine-tune, so the joint run fine-tunes (a tagger on frozen features learned nothing)."""
    import shutil
    from pathlib import Path

    monkeypatch.setenv("BERTHEADS_RECIPE", "auto")
    examples = Path(__file__).resolve().parents[1] / "examples"
    shutil.copytree(examples, tmp_path / "examples", ignore=shutil.ignore_patterns("*.ipynb", "__pycache__"))
    out = tmp_path / "demo"
    assert main(["train", "multi", "--config", str(tmp_path / "examples" / "demo.yaml"), "--out", str(out),
                 "--model", tiny_bert, "--epochs", "1", "--no-progress"]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if "training examples:" in x)
    assert "fine-tuning" in line and "features" not in line and "contrastive" not in line
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert {task.get("mode", config.get("mode")) for task in config["tasks"].values()} == {"finetune"}


def test_the_time_estimate_and_a_budget_that_takes_the_best_mode_that_fits(tiny_bert, sentences, tmp_path, capsys,
                                                                          monkeypatch):
    """The warm-up's rates are given here (1 s a text forwards and backwards, 0.01 s forwards): the
    recipe's contrastive mode (32 pairs: 64 s, caching 0.8 s) is said to take over a minute, with
    features mode and its measured cost; a budget under it takes features mode, one over it keeps
    contrastive, and the chosen line says why."""
    from bertheads.base.values import duration
    from bertheads.training import timing

    monkeypatch.setenv("BERTHEADS_RECIPE", "auto")
    monkeypatch.setattr(timing, "measure", lambda *_: timing.Rates(forward=0.01, train=1.0))
    assert [duration(x) for x in ("90", "90s", "5m", "1.5h")] == [90, 90, 300, 5400]
    args = ["train", "classify", "--train", sentences, "--dev", sentences, "--model", tiny_bert, "--epochs", "1",
            "--pairs", "32", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "m"), "--time-budget", "1m"]) == 0
    lines = [x.removeprefix("bertheads: ") for x in capsys.readouterr().err.splitlines()]
    chosen = next(x for x in lines if "training examples:" in x)
    assert chosen.startswith("40 training examples: --mode features") and chosen.endswith(
        "; --time-budget 1 min: the best that fits (about 1 s here, 3.3 points lower than --mode contrastive on "
        "SST-2 at 200 rows, 5 seeds; --mode contrastive about 1 min 5 s (contrastive tuning 1 min 4 s) would not)")
    assert yaml.safe_load((tmp_path / "m" / "config.yaml").read_text())["mode"] == "features"
    # no budget: the recipe's mode, its estimate and the faster mode with its cost in the line after
    from bertheads.encoder.pretrained import Encoder
    from bertheads.training.flags import kind_defaults
    from bertheads.training.joint import read_data
    from bertheads.training.resolve import settle_run
    from bertheads.training.settings import TrainSettings

    data = [read_data("classify", sentences, sentences, Encoder.load(tiny_bert, lazy=True), kind_defaults("classify"))]
    run = settle_run(TrainSettings(pairs=32, epochs=1), data, how="auto")
    choices = timing.options(run, data, timing.Rates(forward=0.01, train=1.0))
    assert [(o.run.mode, round(o.seconds, 1)) for o in choices] == [("contrastive", 64.8), ("features", 0.8)]
    assert timing.pick(choices, None) is choices[0] and timing.pick(choices, 120) is choices[0]
    assert timing.pick(choices, 60) is choices[1] and timing.pick(choices, 0.1) is choices[1]  # none fits: the fastest
    line = timing.time_line(choices[0], choices)  # (from Python: settings said as keywords)
    assert line.startswith("time on this machine, from a timed warm-up: about 1 min 5 s (contrastive tuning 1 min 4 s); "
                           "faster: mode='features': about 1 s, 3.3 points lower on SST-2 at 200 rows, 5 seeds")
    assert timing.time_line(choices[1], choices) is None  # under a minute: nothing said
