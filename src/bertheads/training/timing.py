"""How long a run's long stages (the contrastive pairs, caching the encoder's states, the
epochs) will take on this machine, from a short timed warm-up: a batch of the training texts
through the encoder, forwards alone and forwards and backwards, extrapolated to each stage's
texts. Said in a line after the chosen one when they take over a minute, with the recipe's
faster modes and what they cost in quality where measured (`Recipe.fallbacks`); with
`--time-budget`, the best of those modes whose estimate fits is the run's."""

from __future__ import annotations

import logging
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from bertheads.base.errors import UserError
from bertheads.base.machine import DTYPES, resolve_device, training_precision
from bertheads.base.schema import said
from bertheads.base.values import said_seconds
from bertheads.compute.runner import run_heads
from bertheads.compute.states import EncoderStates
from bertheads.encoder.layers import normalise_layers
from bertheads.text.encoding import encoder_batch
from bertheads.training.contrastive import make_pairs
from bertheads.training.resolve import SettledRun, settle_run
from bertheads.training.settings import MOST_PAIRS, TrainSettings

log = logging.getLogger("bertheads")

WARM_TEXTS = 16  # training texts in the timed batch
TIMED_PASSES = 3  # ... timed this often (the median: a shared machine's load moves)
SAY_OVER = 60.0  # the estimate is said when the stages take longer than this many seconds
# a text forwards and backwards costs at most this many times its inference pass (a first guess from
# the inference pass alone: under it a run is clearly short, and the training passes are not timed;
# measured 12 to 18 on a loaded 2-core CPU in bf16, 3 to 4 where a step is as efficient as inference)
TRAIN_OVER_FORWARD = 25


@dataclass(frozen=True)
class Rates:
    """Seconds per text on this machine: through the encoder with no gradients (caching, dev
    evaluation) and forwards and backwards (a fine-tuning or pair step)."""

    forward: float
    train: float


@dataclass(frozen=True)
class Option:
    """A mode the run could take: its settled run, its stages' estimated seconds and how much
    lower in quality than the recipe's own mode it measured (`points`, `measured`)."""

    run: SettledRun
    stages: dict[str, float]
    points: float = 0.0
    measured: str = ""

    @property
    def seconds(self) -> float:
        return sum(self.stages.values())


def measure(encoder, data: list, settings: TrainSettings, forward: float | None = None) -> Rates:
    """Time a batch of the first training texts of the largest task through `encoder` in the
    precision and way each takes: forwards as caching and evaluation run (`inference_seconds`),
    forwards and backwards in the run's precision as a step does, once to warm up, then
    `TIMED_PASSES` times (the median; no step taken, no random numbers drawn, every gradient
    cleared after). `forward`: the inference rate, already timed."""
    largest = max(data, key=lambda d: len(d.train_features))
    features = largest.train_features[:WARM_TEXTS]
    device = resolve_device(settings.device)
    precision = training_precision(settings.precision, device)[0]
    autocast = DTYPES.get(precision) if precision in ("bf16", "fp16") else None
    encoder.to(device)
    batch = encoder_batch(features, encoder.tokenizer.pad_token_id or 0, device)
    inputs = (batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    was_training = encoder.training
    encoder.eval()  # (no dropout: the same work, no random numbers drawn)

    def passes() -> float:
        """The median seconds of `TIMED_PASSES` passes, after one untimed (its set-up paid)."""
        seconds = []
        for _ in range(TIMED_PASSES + 1):
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=autocast) if autocast else nullcontext():
                states = encoder(*inputs)
            states.float().square().mean().backward()
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds[1:])

    try:
        forward = forward or inference_seconds(encoder, data, device)
        params = list(encoder.parameters())
        wanted = [p.requires_grad for p in params]
        try:
            encoder.requires_grad_(True)
            train = passes()
        finally:
            for p, w in zip(params, wanted):
                p.grad = None
                p.requires_grad_(w)
    finally:
        encoder.train(was_training)
    return Rates(forward, train / len(features))


def inference_seconds(encoder, data: list, device) -> float:
    """Seconds per text through the encoder as caching and evaluation run (`run_heads`: fp32,
    batches side by side on a CPU's threads), after one untimed pass, on the first training
    texts of the largest task."""
    encoder.model  # noqa: B018  (a lazy encoder's weights load now)
    encoder.to(device)
    features = max(data, key=lambda d: len(d.train_features)).train_features[:2 * WARM_TEXTS]
    runner = EncoderStates(encoder, normalise_layers((-1,), encoder.info.num_layers), ["mean"], device)
    run_heads(runner, features[: len(features) // 4 or 1], ["mean"], len(features) // 4 or 1)
    start = time.perf_counter()
    run_heads(runner, features, ["mean"], len(features) // 4 or 1)
    return (time.perf_counter() - start) / len(features)


def pair_count(data: list, settings: TrainSettings) -> int:
    """The pairs a contrastive run of these settings tunes on (0 where it cannot pair)."""
    total = 0
    for t, d in enumerate(data):
        try:
            groups = d.task.modeling.pair_labels(d.train_features)
            total += len(make_pairs(groups, settings.seed + t, settings.pairs or MOST_PAIRS))
        except UserError:
            return 0
    return total


def stages(run: SettledRun, data: list, rates: Rates) -> dict[str, float]:
    """Each long stage of `run` and its seconds at `rates`."""
    settings = run.settings
    texts = sum(len(d.train_features) for d in data)
    dev = sum(len(d.dev_examples or ()) for d in data)
    if run.mode == "finetune":
        return {"epochs": settings.epochs * (texts * rates.train + dev * rates.forward)}
    out = {"contrastive tuning": 2 * pair_count(data, settings) * rates.train} if run.mode == "contrastive" else {}
    return {**out, "caching": (texts + dev) * rates.forward}


def options(run: SettledRun, data: list, rates: Rates, continuing: bool = False) -> list[Option]:
    """The run's mode and its recipe's faster ones (not given a mode), in order of quality,
    each settled and estimated; a fallback that cannot train these tasks (a mode the kind
    refuses, or the run's own) is left out."""
    out = [Option(run, stages(run, data, rates))]
    if not run.mode_left or continuing:
        return out
    for fallback in sorted(run.recipe.fallbacks, key=lambda f: f.points):
        if fallback.mode == run.mode or (fallback.mode == "contrastive" and not pair_count(data, run.given)):
            continue
        other = settle_run(run.given, data, fallback.mode, mode_left=True, how=run.settings.recipe)
        out.append(Option(other, stages(other, data, rates), fallback.points, fallback.measured))
    return out


def pick(choices: list[Option], budget: float | None) -> Option:
    """The first (best) option whose estimate fits `budget`; the fastest when none does."""
    if budget is None:
        return choices[0]
    fits = [o for o in choices if o.seconds <= budget]
    return fits[0] if fits else min(choices, key=lambda o: o.seconds)


def stage_text(option: Option) -> str:
    parts = [f"{name} {said_seconds(s)}" for name, s in option.stages.items() if s >= 1]
    return f"about {said_seconds(option.seconds)}" + (f" ({', '.join(parts)})" if parts and len(option.stages) > 1 else "")


def alternative(option: Option) -> str:
    return (f"{said('mode', option.run.mode)}: {stage_text(option)}, {option.points:g} points lower on "
            f"{option.measured}")


def budget_text(chosen: Option, choices: list[Option], budget: float) -> str:
    """What the chosen line adds with a budget: which mode, and why."""
    head = f"{said('time_budget')} {said_seconds(budget)}"
    better = [o for o in choices[: choices.index(chosen)]]
    if chosen is choices[0]:
        return f"{head}: it fits ({stage_text(chosen)} here)"
    if chosen.seconds > budget:
        return f"{head}: no mode fits; the fastest ({stage_text(chosen)} here, {chosen.points:g} points lower on {chosen.measured})"
    slower = ", ".join(f"{said('mode', o.run.mode)} {stage_text(o)}" for o in better)
    return (f"{head}: the best that fits ({stage_text(chosen)} here, {chosen.points:g} points lower than "
            f"{said('mode', choices[0].run.mode)} on {chosen.measured}; {slower} would not)")


def time_line(chosen: Option, choices: list[Option]) -> str | None:
    """The line after the chosen one when its stages take over a minute: the estimate here and
    the faster modes with their measured cost (None: nothing long to say)."""
    if chosen.seconds < SAY_OVER:
        return None
    faster = [alternative(o) for o in choices if o is not chosen and o.points > chosen.points and o.seconds < chosen.seconds]
    return (f"time on this machine, from a timed warm-up: {stage_text(chosen)}"
            + (f"; faster: {'; '.join(faster)} ({said('time_budget')} chooses by time)" if faster else ""))


def plan(run: SettledRun, data: list, encoder, continuing: bool = False,
         rates: Rates | None = None) -> tuple[SettledRun, str | None, str | None]:
    """The run to make under its settings' time budget, what the chosen line adds (with a
    budget) and the time line after it. The warm-up is skipped for a features-mode run without
    a budget (its one long stage, caching, may not run at all: the cache may hold it), and after
    the inference pass alone for a run that is clearly short (`TRAIN_OVER_FORWARD`)."""
    budget = run.given.time_budget
    if budget is None and run.mode == "features":
        return run, None, None
    if rates is None:
        forward = inference_seconds(encoder, data, resolve_device(run.settings.device))
        guess = Rates(forward, TRAIN_OVER_FORWARD * forward)
        if budget is None and sum(stages(run, data, guess).values()) < SAY_OVER:
            return run, None, None  # clearly short: nothing to say, the training passes not timed
        rates = measure(encoder, data, run.settings, forward)
    choices = options(run, data, rates, continuing) if budget is not None or run.mode_left else \
        [Option(run, stages(run, data, rates))]
    chosen = pick(choices, budget)
    if budget is None:
        return run, None, time_line(chosen, choices)
    if not run.mode_left:
        note = f"{said('time_budget')} {said_seconds(budget)}: the {said('mode')} given is kept ({stage_text(chosen)} here)"
        return run, note, None
    return chosen.run, budget_text(chosen, choices, budget), time_line(chosen, choices)
