"""`bertheads tune`: the grid, pruning on the per-epoch dev score, restarts, resume after an
interruption, the best model published at --out, and search-space errors."""

from __future__ import annotations

import json

import pytest

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.inference.report import report
from bertheads.training import joint as multitask
from bertheads.training import tune


@pytest.fixture
def data(write):
    rows = "".join(f"a {w} film\t{y}\n" for w, y in [("fine", 1), ("bad", 0), ("great", 1), ("dull", 0)] * 3)
    return write("train.tsv", "sentence\tlabel\n" + rows)


@pytest.fixture
def scripted(monkeypatch):
    """Each epoch's dev accuracy is set by the trial's learning rate (5e-5 -> 0.5, 3e-5 -> 0.3,
    2e-5 -> 0.2), so which trials the median rule prunes is known; `state["stop_at"]` raises
    KeyboardInterrupt in that trial (counted from 1), as an interrupted search."""
    state = {"lr": None, "trials": 0, "stop_at": None}
    real_train, real_eval = tune.train_tasks, multitask.evaluate_task

    def train_tasks(config, out, model, settings, **kw):
        state["lr"] = settings.lr
        state["trials"] += 1
        if state["trials"] == state["stop_at"]:
            raise KeyboardInterrupt
        return real_train(config, out, model, settings, **kw)

    def evaluate(model, d):
        metrics = real_eval(model, d)
        metrics["accuracy"] = state["lr"] * 1e4
        return metrics

    monkeypatch.setattr(tune, "train_tasks", train_tasks)
    monkeypatch.setattr(multitask, "evaluate_task", evaluate)
    return state


def run(tiny_bert, data, out, **kw):
    return tune.tune("classify", data, data, out, model=tiny_bert,
                     settings=bertheads.TrainSettings(epochs=2, progress=False), **kw)


def test_grid_prunes_and_restarts_and_publishes_the_best(tiny_bert, data, tmp_path, scripted):
    out = tmp_path / "search"
    rows = run(tiny_bert, data, out, search=tune.TuneSettings(restarts=1))
    grid = [r for r in rows if r["phase"] == "grid"]
    assert [(r["params"]["lr"], r["params"]["batch_size"]) for r in grid] == [
        (5e-5, 16), (5e-5, 32), (3e-5, 16), (3e-5, 32), (2e-5, 16), (2e-5, 32)]
    # the first two finish; the rest score below their median after epoch 1 and stop there
    assert [r["state"] for r in grid] == ["complete"] * 2 + ["pruned"] * 4
    assert all(len(r["epoch_scores"]) == 1 for r in grid[2:]) and len(grid[0]["epoch_scores"]) == 2
    restart = [r for r in rows if r["phase"] == "restart"]
    assert len(restart) == 1 and restart[0]["params"] == grid[0]["params"] and restart[0]["seed"] == 43
    assert restart[0]["state"] == "complete"  # restarts are never pruned
    assert [json.loads(x)["number"] for x in (out / "trials.jsonl").read_text().splitlines()] == list(range(7))
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["tune"]["trial"] == 0 and saved["tune"]["params"] == {"lr": 5e-5, "batch_size": 16}
    model = bertheads.load(out)
    assert len(model.predict(["a fine film"])) == 1
    assert not list((out / ".trials").iterdir())  # the other trials' models are gone
    assert "best: trial 0" in tune.summary(rows) and "over 2 seeds" in tune.summary(rows)
    page = report(out, out=tmp_path / "page")  # the search's plot and table in the model's report
    assert "Hyperparameter search" in page.read_text() and (tmp_path / "page" / "tune-trials.png").stat().st_size


def test_resume_continues_an_interrupted_search(tiny_bert, data, tmp_path, scripted):
    out = tmp_path / "search"
    scripted["stop_at"] = 3
    with pytest.raises(KeyboardInterrupt):
        run(tiny_bert, data, out, search=tune.TuneSettings(pruning=False))
    assert (out / "bertheads.json").is_file()  # the best so far is a whole model already
    with pytest.raises(UserError, match="resume=True"):
        run(tiny_bert, data, out, search=tune.TuneSettings(pruning=False))
    scripted["stop_at"] = None
    before = scripted["trials"]
    # where the feature cache lives is not a setting of the search: resuming may move it
    rows = run(tiny_bert, data, out, search=tune.TuneSettings(pruning=False, resume=True),
               cache_dir=str(tmp_path / "moved-cache"))
    assert scripted["trials"] - before == 4  # the interrupted trial again, and the three never started
    assert [r["state"] for r in rows] == ["complete", "complete", "fail"] + ["complete"] * 4
    assert len({(r["params"]["lr"], r["params"]["batch_size"]) for r in rows if r["state"] == "complete"}) == 6
    with pytest.raises(UserError, match="changed: epochs"):
        tune.tune("classify", data, data, out, model=tiny_bert, settings=bertheads.TrainSettings(epochs=3),
                  search=tune.TuneSettings(pruning=False, resume=True))


def test_sampler_draws_of_a_trained_setting_are_not_trained_again(tiny_bert, data, tmp_path, write, scripted):
    space = write("space.yaml", "lr: [5.0e-5, 3.0e-5]\n")  # two settings only: the sampler must repeat itself
    rows = run(tiny_bert, data, tmp_path / "search",
               search=tune.TuneSettings(space=space, trials=4, pruning=False, restarts=1))
    assert scripted["trials"] == 3  # the two settings once each, then the restart of the best
    repeats = [r for r in rows if r["repeat_of"] is not None]
    assert len(repeats) == tune.MAX_REPEATS and all(r["seconds"] is None for r in repeats)
    trained = {r["number"]: r for r in rows if r["repeat_of"] is None}
    assert all(r["score"] == trained[r["repeat_of"]]["score"] for r in repeats)  # the earlier outcome, told again
    assert "= trial" in tune.table(rows)
    text = tune.summary(rows)
    assert "over 2 seeds" in text and f"{tune.MAX_REPEATS} draw(s) of a setting already trained" in text


@pytest.mark.parametrize("space, message", [
    ("lr: [1e-5]\nwarmup: [0.1]\n", "space.yaml:2: warmup: not a flag"),
    ("lr: [-1.0e-5]\n", "space.yaml:1: lr: expected a positive number"),
    ("layer_combine: [concat, max]\n", "space.yaml:1: layer_combine: expected one of"),
    ("layer-combine: {low: 1, high: 2}\n", "space.yaml:1: layer-combine: a range needs a numeric flag"),
    ("warmup_ration: [0.1]\n", "warmup_ration: not a flag a classify search can vary (did you mean 'warmup_ratio'?)"),
    ("lr: {low: 1.0e-3, high: 1.0e-5}\n", "space.yaml:1: lr: low (0.001) must be below high"),
    ("lr: {low: 1.0e-5, high: 1.0e-3}\n", "needs --trials"),
    ("seed: [1, 2]\n", "space.yaml:1: seed: not a flag"),
])
def test_bad_space_is_one_line_exit_2(tiny_bert, data, tmp_path, write, capsys, space, message):
    path = write("space.yaml", space)
    code = main(["tune", "classify", "--train", data, "--dev", data, "--out", str(tmp_path / "o"),
                 "--model", tiny_bert, "--space", path, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_space_reads_the_old_combine_spelling_with_a_warning(write, capsys):
    search = tune.read_space(write("s.yaml", "combine: [concat, mean]\n"), "classify")
    assert [(d.name, d.choices) for d in search.dimensions] == [("layer_combine", ["concat", "mean"])]
    assert "'combine' is deprecated; use 'layer_combine'" in capsys.readouterr().err


def test_unknown_keyword_options_are_refused(tiny_bert, data, tmp_path):
    with pytest.raises(UserError, match=r"unknown setting 'max_lenght' \(did you mean 'max_length'\?\)"):
        tune.tune("classify", data, data, tmp_path / "o", model=tiny_bert, max_lenght=8)


def test_space_reads_flag_spellings_and_ranges(tmp_path, write):
    path = write("s.yaml", "--learning-rate: [1]\n")
    with pytest.raises(UserError, match="--learning-rate: not a flag"):
        tune.read_space(path, "tag")
    path = write("s2.yaml", "lr: {low: 1.0e-5, high: 1.0e-3, log: true}\n--batch-size: [8, 16]\nhead: [linear, bilstm]\n"
                            "layers: ['-1', '-1,-2']\n")
    search = tune.read_space(path, "tag")
    assert [d.name for d in search.dimensions] == ["lr", "batch_size", "head_type", "layers"]
    assert search.dimensions[0].log and not search.is_grid


def test_cli_sampler_trials_and_table(tiny_bert, data, tmp_path, write, capsys):
    space = write("space.yaml", "lr: {low: 1.0e-4, high: 1.0e-3, log: true}\nbatch_size: [4, 8]\n")
    out = tmp_path / "o"
    code = main(["tune", "classify", "--train", data, "--dev", data, "--out", str(out), "--model", tiny_bert,
                 "--space", space, "--trials", "2", "--epochs", "1", "--no-progress"])
    text = capsys.readouterr().out
    assert code == 0
    lines = [x for x in text.splitlines() if not x.startswith("epoch ")]  # after each epoch: its dev scores
    assert lines[0].split() == ["trial", "phase", "lr", "batch_size", "seed", "state", "score", "epoch", "seconds"]
    rows = [json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(1e-4 <= r["params"]["lr"] <= 1e-3 for r in rows)
    assert "best: trial" in text and (out / "bertheads.json").is_file()


def test_features_mode_trials_share_one_cache_entry(tiny_bert, data, tmp_path, write):
    space = write("space.yaml", "lr: [1.0e-3, 3.0e-3]\nbatch_size: [8]\n")
    cache = tmp_path / "cache"
    rows = tune.tune("classify", data, data, tmp_path / "o", model=tiny_bert,
                     settings=bertheads.TrainSettings(epochs=1, progress=False),
                     search=tune.TuneSettings(space=space), mode="features", cache_dir=str(cache))
    assert [r["state"] for r in rows] == ["complete", "complete"]
    assert len(list((cache / "features").iterdir())) == 1  # built by the first trial, read by the second
