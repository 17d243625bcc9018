"""Hyperparameter search over the training flags with Optuna (`bertheads tune KIND`).

By default the BERT paper's grid: learning rate 5e-5, 3e-5, 2e-5 and batch size 16, 32, each
trial trained for up to 4 epochs and scored by its best epoch on dev. `trials=N` samples N
settings from a search space instead (`space`: a YAML file; TPE sampler). `restarts=K` then
trains the best setting again with K other seeds. Trials are pruned on their per-epoch dev
score (median rule; restarts are never pruned).

```
DIR/bertheads.json ...   the best trial's model (published whole: the manifest goes in last)
DIR/trials.jsonl         one line per trial: params, seed, state, score per epoch, best epoch
DIR/study.db             Optuna's storage (sqlite): `resume=True` continues an interrupted search
DIR/tune.json            what was searched (a resumed search must be the same one)
DIR/.trials/NNNN/        a trial's model while it trains (removed unless it becomes the best)
```

A space file maps flag names (as `bertheads train KIND` spells them, with or without the
dashes) to a list of values, or to `{low: A, high: B}` (with `log: true` or `step: S`) for a
number:
```yaml
lr: {low: 1.0e-5, high: 1.0e-3, log: true}
batch_size: [16, 32]
layers: ["-1", "-1,-2,-3,-4"]
combine: [concat, mean]
```
A space of lists alone without `trials` is searched as a grid.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from bertheads.base.bounded import read_yaml
from bertheads.base.errors import UserError, where
from bertheads.base.schema import (
    check_given,
    convert,
    flag_of,
    from_mapping,
    names,
    new_name,
    renamed,
    said,
    setting,
    tagged,
    unknown_name,
)
from bertheads.base.values import non_negative_int, positive_int
from bertheads.saved import bundle
from bertheads.store.atomic import atomic_write_text, swap_into_place
from bertheads.store.guard import check_target
from bertheads.text.readers import read_text
from bertheads.training.config import single_task
from bertheads.training.flags import convert_options, kind_defaults, kind_options
from bertheads.training.joint import train_tasks
from bertheads.training.settings import HeadOptions, TrainSettings

log = logging.getLogger("bertheads")

DEFAULT_GRID = {"lr": [5e-5, 3e-5, 2e-5], "batch_size": [16, 32]}
# the training settings a search varies (the rest of a space is task options)
TRAINING_FLAGS = tagged(TrainSettings, "searched")
# head options a search does not vary: where things are kept, and the cache's precision
NOT_SEARCHED = (*tagged(HeadOptions, "where"), *tagged(HeadOptions, "not-searched"))
MODEL_PARTS = ("encoder", "heads", "metrics.json", "log.jsonl", bundle.CONFIG)
STUDY_NAME = "bertheads-tune"


@dataclass
class TuneSettings:
    """The search (`bertheads tune`'s own flags; its `--resume` is the training flag's)."""

    trials: int | None = setting(None, "sample N settings from --space (TPE) instead of a grid", type=positive_int,
                                 group="search")  # None: the grid (the BERT paper's, or a space of lists)
    space: str | None = setting(None, "YAML search space: flag: [values] or flag: {low, high, log}", group="search")
    restarts: int = setting(0, "train the best setting again with K other seeds", type=non_negative_int,
                            group="search")
    pruning: bool = setting(True, "train every trial to its last epoch", negate=True, group="search")
    resume: bool = setting(False, "continue the interrupted search in --out", cli=False)
    startup_trials: int = setting(2, "trials that finish before any is pruned", type=positive_int, cli=False)


@dataclass
class Dimension:
    """One searched flag: a list of choices, or a numeric range."""

    name: str
    choices: list | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    integer: bool = False

    def suggest(self, trial):
        if self.choices is not None:
            return trial.suggest_categorical(self.name, self.choices)
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log,
                                     step=int(self.step or 1))
        return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)


@dataclass
class Search:
    kind: str
    dimensions: list[Dimension] = field(default_factory=list)

    @property
    def is_grid(self) -> bool:
        return all(d.choices is not None for d in self.dimensions)

    def grid(self) -> list[dict]:
        names = [d.name for d in self.dimensions]
        return [dict(zip(names, values)) for values in itertools.product(*(d.choices for d in self.dimensions))]


# -- the search space --------------------------------------------------------------------
def searchable(kind: str) -> dict:
    """name -> field of what a search may vary for this kind: the kind's own settings, the head
    options and the searched training settings."""
    fields = {**kind_options(kind), **{f.name: f for f in dataclasses.fields(TrainSettings)}}
    return {k: f for k, f in fields.items() if k not in NOT_SEARCHED and f.metadata.get("cli", True)
            and (k in TRAINING_FLAGS or k not in names(TrainSettings))}


def default_search(kind: str) -> Search:
    return Search(kind, [Dimension(name, choices=list(values)) for name, values in DEFAULT_GRID.items()])


def read_space(path: str, kind: str) -> Search:
    """A search space file, every flag and value checked like the command line's; errors name
    the file, line and flag."""
    text = read_text(path)
    data, lines = read_yaml(text, path)
    if not isinstance(data, dict) or not data:
        raise UserError(f"{where(path)}: expected a mapping of flag names to values or ranges")
    allowed = searchable(kind)
    by_flag = {flag_of(f).lstrip("-").replace("-", "_"): name for name, f in allowed.items()}
    renames = renamed(HeadOptions)
    given = {str(key).lstrip("-").replace("-", "_") for key in data}
    dims = []
    for key, value in data.items():

        def fail(message: str, key=key):
            raise UserError(f"{where(path, lines.get((str(key),)))}: {key}: {message}")

        name = new_name(str(key).lstrip("-").replace("-", "_"), renames, given, by_flag, at=path)
        dest = by_flag.get(name, name if name in allowed else None)
        if dest is None:
            fail(unknown_name(name, sorted(by_flag), says=f"not a flag a {kind} search can vary",
                              then=f" (known: {', '.join(sorted(by_flag))})"))
        field_ = allowed[dest]
        if isinstance(value, list):
            if not value:
                fail("expected at least one value")
            choices = [convert(field_, v, fail) for v in value]
            if len(set(map(str, choices))) < len(choices):
                fail("a value is listed twice")
            dims.append(Dimension(dest, choices=choices))
        elif isinstance(value, dict):
            unknown = set(value) - {"low", "high", "log", "step"}
            if unknown or "low" not in value or "high" not in value:
                fail("a range needs low and high (and may have log or step)")
            meta = field_.metadata
            if meta.get("choices") is not None or meta.get("type") in (None, str) or dest == "layers":
                fail("a range needs a numeric flag; list the values instead")
            low, high = convert(field_, value["low"], fail), convert(field_, value["high"], fail)
            if not low < high:
                fail(f"low ({low}) must be below high ({high})")
            log_scale = value.get("log", False)
            if not isinstance(log_scale, bool):
                fail(f"log: expected true or false, got {log_scale!r}")
            step = value.get("step")
            if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0):
                fail(f"step: expected a positive number, got {step!r}")
            if log_scale and step is not None:
                fail("a range takes log or step, not both")
            integer = isinstance(low, int) and isinstance(high, int)
            dims.append(Dimension(dest, low=low, high=high, log=log_scale, step=step, integer=integer))
        else:
            dims.append(Dimension(dest, choices=[convert(field_, value, fail)]))
    return Search(kind, dims)


# -- trials --------------------------------------------------------------------------------
class Pruned(Exception):
    """Raised from the per-epoch hook to end a trial the pruner stops."""


def trial_run(trial, kind: str, train: str, dev: str, trial_dir: Path, model: str, base: TrainSettings,
              options: dict, params: dict, seed: int, limit: int | None, prune: bool) -> dict:
    """Train one setting into `trial_dir`, reporting its best-so-far dev score after each epoch."""
    settings = TrainSettings(**{**base.__dict__, "seed": seed, "keep": "best", "progress": False,
                                "resume": False, "overwrite": True})  # a trial's directory is scratch
    task_opts = dict(options)
    for name, value in params.items():
        if name in TRAINING_FLAGS:
            setattr(settings, name, value)
        else:
            task_opts[name] = value
    scores: list[float] = []

    def on_epoch(epoch: int, record: dict, kept) -> None:
        scores.append(kept.score)
        trial.report(kept.score, epoch)
        if prune and trial.should_prune():
            raise Pruned(f"pruned after epoch {epoch}")

    started = time.perf_counter()
    config = single_task(kind, train, dev, task_opts, limit)
    try:
        _, result = train_tasks(config, trial_dir, model, settings, on_epoch=on_epoch,
                                home=trial_dir.parent.parent)  # (OUT/.trials/NNNN: scratch inside the search's folder)
    finally:
        trial.set_user_attr("epoch_scores", scores)
        trial.set_user_attr("seconds", round(time.perf_counter() - started, 2))
    metric = result["kept"]["by"].split(",")[0].split(" (")[0]
    trial.set_user_attr("best_epoch", result["best_epoch"])
    trial.set_user_attr("metric", metric)
    trial.set_user_attr("dev", {k: v for k, v in result["dev"].items() if isinstance(v, (int, float))})
    return result


def publish(trial_dir: Path, out: Path, note: dict) -> None:
    """Make the trial's model the one at `out`: the old manifest is removed first and the new
    one moved in last, so `out` is never a whole model made of two trials' parts. Repeating it
    after a crash finishes the move (the trial's parts that are left move, then the manifest)."""
    metrics = trial_dir / "metrics.json"
    if metrics.is_file():
        saved = json.loads(metrics.read_text())
        saved["tune"] = note
        atomic_write_text(metrics, json.dumps(saved, indent=2) + "\n")
    (out / bundle.MANIFEST).unlink(missing_ok=True)
    for part in MODEL_PARTS:
        source = trial_dir / part
        if not source.exists():
            continue
        if source.is_dir():
            swap_into_place(source, out / part)
        else:
            os.replace(source, out / part)
    os.replace(trial_dir / bundle.MANIFEST, out / bundle.MANIFEST)
    shutil.rmtree(trial_dir, ignore_errors=True)


def trial_rows(study) -> list[dict]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        rows.append({"number": t.number, "phase": attrs.get("phase"), "state": t.state.name.lower(),
                     "params": t.params, "seed": attrs.get("seed"), "score": t.value,
                     "metric": attrs.get("metric"), "best_epoch": attrs.get("best_epoch"),
                     "epoch_scores": attrs.get("epoch_scores", []), "dev": attrs.get("dev"),
                     "seconds": attrs.get("seconds"), "repeat_of": attrs.get("repeat_of")})
    return rows


def table(rows: list[dict]) -> str:
    """The trials as an aligned text table."""
    names = list(dict.fromkeys(k for r in rows for k in r["params"]))
    head = ["trial", "phase", *names, "seed", "state", "score", "epoch", "seconds"]
    body = []
    for r in rows:
        state = r["state"] if r.get("repeat_of") is None else f"= trial {r['repeat_of']}"
        body.append([str(r["number"]), str(r["phase"] or ""), *(fmt(r["params"].get(n)) for n in names),
                     str(r["seed"]), state, fmt(r["score"]), str(r["best_epoch"] or ""),
                     "" if r["seconds"] is None else f"{r['seconds']:.1f}"])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in [head, *body])


def fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-2 else f"{value:.4f}"
    return str(value)


# -- the search ------------------------------------------------------------------------------
MAX_REPEATS = 30  # a search stops when its sampler draws this many trained settings in a row

# Options that say where things are kept, not what is trained: a resumed search may change them.
WHERE_NOT_WHAT = tagged(HeadOptions, "where")


def prepare_out(out: Path, identity: dict, resume: bool, inputs=()) -> None:
    marker = out / "tune.json"
    check_target(out, (marker.name, bundle.MANIFEST), inputs=inputs, what="a search's folder")
    if resume:
        if not marker.is_file():
            raise UserError(f"{out}: no search to resume (no tune.json); run without {said('resume', True)}")
        saved = json.loads(marker.read_text())
        if saved != identity:
            changed = sorted(k for k in identity if saved.get(k) != identity[k])
            raise UserError(f"{out}: {said('resume', True)} with other settings than the interrupted search "
                            f"(changed: {', '.join(changed)})")
        return
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: exists and is not empty; choose another {said('out')}, or "
                        f"{said('resume', True)} the search there")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, json.dumps(identity, indent=2) + "\n")


def tune(kind: str, train: str, dev: str, out: str | Path, model: str = "default",
         settings: TrainSettings | None = None, search: TuneSettings | None = None, limit: int | None = None,
         **options) -> list[dict]:
    """Search training settings for `kind` on `dev`; the best trial's model is saved at `out`.
    `options`: the task's options and any training setting (over `settings`); unknown names
    are refused with a suggestion. Returns one row per trial (what `trials.jsonl` holds)."""
    search = search or TuneSettings()
    options = check_given(options, kind_options(kind), TrainSettings)
    training = {k: options.pop(k) for k in list(options) if k in names(TrainSettings)}
    options = convert_options(kind, options)
    base = from_mapping(TrainSettings, training, base=settings or TrainSettings(epochs=4))
    if not dev:
        raise UserError(f"tune needs {said('dev')}: trials are compared on it")
    space = read_space(search.space, kind) if search.space else default_search(kind)
    if search.trials is None and not space.is_grid:
        raise UserError(f"{search.space}: a space with ranges needs {said('trials')} (a grid takes lists only)")
    out = Path(out)
    options = {**kind_defaults(kind), **{k: v for k, v in options.items() if v is not None}}
    identity = {"kind": kind, "train": str(Path(train).resolve()), "dev": str(Path(dev).resolve()),
                "model": model, "limit": limit, "space": [d.__dict__ for d in space.dimensions],
                "trials": search.trials, "restarts": search.restarts, "seed": base.seed,
                "epochs": base.epochs, "options": {k: v for k, v in options.items()
                                                          if is_plain(v) and k not in WHERE_NOT_WHAT},
                "training": {k: v for k, v in base.__dict__.items() if k not in tagged(TrainSettings, "not-recorded")}}
    prepare_out(out, json.loads(json.dumps(identity, default=str)), search.resume,
                [train, dev, search.space, *([model] if Path(model).exists() else [])])
    tuner = Tuner(kind, train, dev, out, model, base, options, limit, space, search)
    if search.trials is None:
        tuner.grid()
    else:
        tuner.sample(search.trials)
    if search.restarts:
        tuner.restart(search.restarts)
    write_rows(out, tuner.study)
    return trial_rows(tuner.study)


class Tuner:
    """One search's Optuna study (in `OUT/study.db`), its trials and their models."""

    def __init__(self, kind: str, train: str, dev: str, out: Path, model: str, base: TrainSettings, options: dict,
                 limit: int | None, space: Search, search: TuneSettings) -> None:
        import optuna
        from optuna.trial import TrialState

        self.kind, self.train, self.dev, self.out, self.model = kind, train, dev, out, model
        self.base, self.options, self.limit, self.space, self.search = base, options, limit, space, search
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = optuna.storages.RDBStorage(f"sqlite:///{(out / 'study.db').resolve()}")
        pruner = optuna.pruners.MedianPruner(n_startup_trials=search.startup_trials, n_warmup_steps=0) \
            if search.pruning else optuna.pruners.NopPruner()
        self.study = optuna.create_study(study_name=STUDY_NAME, storage=self.storage, direction="maximize",
                                         sampler=optuna.samplers.TPESampler(seed=base.seed), pruner=pruner,
                                         load_if_exists=search.resume)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # left by an interrupted run
        self.scratch = out / ".trials"
        finish_publishing(out, self.scratch, self.study)

    def finished(self) -> dict:
        """(params, seed) -> the first trial that trained them to the end or was pruned."""
        from optuna.trial import TrialState

        first: dict = {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if "repeat_of" not in t.user_attrs:
                first.setdefault(key(t.params, t.user_attrs.get("seed")), t)
        return first

    def run_one(self, trial, phase: str, seed: int, prune: bool) -> bool:
        """Train one trial; False when the sampler drew a setting already trained (its outcome
        is told to the study again, nothing is trained)."""
        from optuna.trial import TrialState

        study, out = self.study, self.out
        trial.set_user_attr("phase", phase)
        trial.set_user_attr("seed", seed)
        params = {d.name: d.suggest(trial) for d in self.space.dimensions}
        earlier = self.finished().get(key(params, seed))
        if earlier is not None:
            trial.set_user_attr("repeat_of", earlier.number)
            if earlier.state == TrialState.COMPLETE:
                study.tell(trial, earlier.value)
            else:
                study.tell(trial, state=TrialState.PRUNED)
            log.info(f"trial {trial.number} ({phase}): drew trial {earlier.number}'s setting again; not trained")
            write_rows(out, study)
            return False
        trial_dir = self.scratch / f"{trial.number:04d}"
        log.info(f"trial {trial.number} ({phase}): "
                 + ", ".join(f"{k}={fmt(v)}" for k, v in {**params, "seed": seed}.items()))
        try:
            result = trial_run(trial, self.kind, self.train, self.dev, trial_dir, self.model, self.base, self.options,
                               params, seed, self.limit, prune)
        except Pruned:
            study.tell(trial, state=TrialState.PRUNED)
            shutil.rmtree(trial_dir, ignore_errors=True)
            write_rows(out, study)
            return True
        except BaseException:
            study.tell(trial, state=TrialState.FAIL)
            shutil.rmtree(trial_dir, ignore_errors=True)
            write_rows(out, study)
            raise
        score = kept_score(result, trial)
        best_before = best_value(study)
        study.tell(trial, score)
        if best_before is None or score > best_before:
            publish(trial_dir, out, {"trial": trial.number, "params": params, "seed": seed, "score": score})
        else:
            shutil.rmtree(trial_dir, ignore_errors=True)
        write_rows(out, study)
        return True

    def grid(self) -> None:
        """Every setting of the grid not trained yet."""
        for params in self.space.grid():
            if key(params, self.base.seed) not in self.finished():
                self.study.enqueue_trial(params)
                self.run_one(self.study.ask(), "grid", self.base.seed, self.search.pruning)

    def sample(self, trials: int) -> None:
        """`trials` settings drawn by the sampler (those already trained are not trained again)."""
        from optuna.trial import TrialState

        searched = sum(1 for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
                       if t.user_attrs.get("phase") == "search" and "repeat_of" not in t.user_attrs)
        repeats = 0  # draws in a row of settings already trained: a small space runs out of new ones
        while searched < trials and repeats < MAX_REPEATS:
            trained = self.run_one(self.study.ask(), "search", self.base.seed, self.search.pruning)
            searched, repeats = searched + trained, 0 if trained else repeats + 1
        if repeats >= MAX_REPEATS:
            log.info(f"the sampler drew only settings already trained {MAX_REPEATS} times in a row; "
                     f"stopping after {searched} trained trials")

    def restart(self, restarts: int) -> None:
        """The best setting trained again with `restarts` other seeds (never pruned)."""
        best = best_trial(self.study, phases=("grid", "search"))
        if best is None:
            raise UserError("no trial finished, so there is no best setting to restart")
        for seed in range(self.base.seed + 1, self.base.seed + 1 + restarts):
            if key(best.params, seed) not in self.finished():
                self.study.enqueue_trial(best.params)
                self.run_one(self.study.ask(), "restart", seed, False)


def finish_publishing(out: Path, scratch: Path, study) -> None:
    """After a crash between publishing steps: finish moving the best trial's model in."""
    if (out / bundle.MANIFEST).is_file() or not scratch.is_dir():
        return
    best = best_trial(study)
    if best is not None and (scratch / f"{best.number:04d}" / bundle.MANIFEST).is_file():
        publish(scratch / f"{best.number:04d}", out, {"trial": best.number, "params": best.params,
                                                      "seed": best.user_attrs.get("seed"), "score": best.value})


def kept_score(result: dict, trial) -> float:
    scores = trial.user_attrs.get("epoch_scores") or []
    return float(max(scores)) if scores else -math.inf


def best_value(study) -> float | None:
    best = best_trial(study)
    return None if best is None else best.value


def best_trial(study, phases: tuple[str, ...] | None = None):
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if phases is None or t.user_attrs.get("phase") in phases]
    return max(done, key=lambda t: t.value) if done else None


def write_rows(out: Path, study) -> None:
    atomic_write_text(out / "trials.jsonl", "".join(json.dumps(r) + "\n" for r in trial_rows(study)))


def key(params: dict, seed) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items())) + (("seed", seed),)


def is_plain(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool, list))


def summary(rows: list[dict]) -> str:
    """The best trial, and the spread of the best setting's seeds."""
    repeats = sum(1 for r in rows if r.get("repeat_of") is not None)
    rows = [r for r in rows if r.get("repeat_of") is None]
    done = [r for r in rows if r["state"] == "complete"]
    if not done:
        return "no trial finished"
    best = max(done, key=lambda r: r["score"])
    lines = [f"best: trial {best['number']} ({', '.join(f'{k}={fmt(v)}' for k, v in best['params'].items())}, "
             f"seed {best['seed']}): {best['metric']} {best['score']:.4f} at epoch {best['best_epoch']}"]
    by_seed: dict = {}
    for r in done:
        if r["params"] == best["params"]:
            by_seed.setdefault(r["seed"], r["score"])
    same = list(by_seed.values())
    if len(same) > 1:
        mean = sum(same) / len(same)
        sd = (sum((x - mean) ** 2 for x in same) / (len(same) - 1)) ** 0.5
        lines.append(f"that setting over {len(same)} seeds: mean {mean:.4f}, sd {sd:.4f}, "
                     f"min {min(same):.4f}, max {max(same):.4f}")
    states = {s: sum(1 for r in rows if r["state"] == s) for s in ("complete", "pruned", "fail")}
    lines.append("trials: " + ", ".join(f"{n} {s}" for s, n in states.items() if n)
                 + (f"; {repeats} draw(s) of a setting already trained, not trained again" if repeats else ""))
    return "\n".join(lines)
