"""What a score means, kind-independently: a temperature fitted by LBFGS on the negative log
likelihood of rows of logits, the expected calibration error and Brier score of such rows,
cross-fitted halves (the temperature measured on data it was not fitted on) with the ECE that
so many rows show even for a calibrated model (`ece_floor`), and the
risk-coverage table and threshold for a target accuracy over (confidence, correct) pairs.

A row is one decision: its candidates' logits (a softmax over them gives the scores; `-inf`
pads a row shorter than the others) and the index of the right candidate (-1: none of them is
right, as when a question's answer is not among its spans). Each kind says what its rows are
(`Judging.calibration_rows`).

A calibration is kept only on enough evidence (`short_of_evidence`): at least `MIN_DECISIONS`
decisions, `MIN_EACH` of them right and `MIN_EACH` wrong, and only when it does not raise the ECE
measured on the cross-fitted halves; otherwise none is kept and `"none"` says why.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from bertheads.text.readers import source_name

ECE_BINS = 15
COVERAGES = (1.0, 0.9, 0.8, 0.5)
T_RANGE = (0.05, 20.0)  # the temperatures a fit may reach
# The floor of evidence of a fit (docs/calibration.md): below 100 decisions, or 10 wrong ones, the
# temperature fitted to an already calibrated model ranges over 0.5 to 1.5 and a half of the rows
# cannot measure an ECE below about 0.1, so the example sets (16 sentences, 46 words, 4
# questions) get none, and a real dev set (hundreds of decisions) does.
MIN_DECISIONS = 100
MIN_EACH = 10


def probabilities(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Softmax of `logits / temperature` over the last axis (`-inf` entries get 0)."""
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    if not z.size:
        return z
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def fit_temperature(logits: np.ndarray, gold: np.ndarray) -> float | None:
    """The temperature T (LBFGS on log T) minimising the mean NLL of the right candidate under
    softmax(logits / T); when some rows have no right candidate (their candidates are not every
    answer, as a question's spans), the binary cross-entropy of each row's top score against
    whether its top candidate is right, over every row. None when there is nothing to fit: no
    rows, or rows whose top candidates are all right (the fit would run to the sharpest bound,
    every score 1) or all wrong."""
    logits, gold = np.asarray(logits, dtype=np.float64), np.asarray(gold)
    if not len(gold) or logits.ndim != 2 or logits.shape[1] < 2 or not (gold >= 0).any():
        return None
    z = torch.tensor(np.where(np.isfinite(logits), logits, -1e9))
    y = torch.tensor(gold, dtype=torch.long)
    top = z.argmax(-1)
    right = (top == y).double()
    if right.min() == right.max():
        return None
    incomplete = bool((gold < 0).any())
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")
    low, high = math.log(T_RANGE[0]), math.log(T_RANGE[1])

    def closure():
        opt.zero_grad()
        scaled = z / log_t.clamp(low, high).exp()
        if incomplete:
            p_top = torch.softmax(scaled, -1).gather(1, top[:, None])[:, 0].clamp(1e-12, 1 - 1e-12)
            loss = torch.nn.functional.binary_cross_entropy(p_top, right)
        else:
            loss = torch.nn.functional.cross_entropy(scaled, y)
        loss.backward()
        return loss

    opt.step(closure)
    value = float(log_t.detach().clamp(low, high).exp())
    return round(value, 6) if math.isfinite(value) else None


def fit_logistic(x: np.ndarray, right: np.ndarray) -> tuple[float, float] | None:
    """Platt scaling: (a, b) (LBFGS) minimising the binary cross-entropy of sigmoid(a x + b)
    against `right`; None when the rows are not both right and wrong (nothing to fit)."""
    x, right = np.asarray(x, dtype=np.float64), np.asarray(right, dtype=np.float64)
    if len(x) < 2 or right.min() == right.max():
        return None
    xs, ys = torch.tensor(np.clip(x, -50.0, 50.0)), torch.tensor(right)
    ab = torch.tensor([1.0, 0.0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([ab], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(ab[0] * xs + ab[1], ys)
        loss.backward()
        return loss

    opt.step(closure)
    a, b = (float(v) for v in ab.detach())
    return (round(a, 6), round(b, 6)) if math.isfinite(a) and math.isfinite(b) else None


def logistic(x: np.ndarray, ab: tuple[float, float]) -> np.ndarray:
    """sigmoid(a x + b) (x clipped to +-50, as `fit_logistic` fits it)."""
    z = ab[0] * np.clip(np.asarray(x, dtype=np.float64), -50.0, 50.0) + ab[1]
    return 1.0 / (1.0 + np.exp(-z))


def confidence_pairs(logits: np.ndarray, gold: np.ndarray, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Each row's top score and whether its top candidate is the right one."""
    p = probabilities(logits, temperature)
    if not len(p):
        return np.zeros(0), np.zeros(0, dtype=bool)
    return p.max(-1), p.argmax(-1) == np.asarray(gold)


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error: the mean over equal-width confidence bins of |accuracy -
    mean confidence|, weighed by the bin's share of the rows."""
    confidence, correct = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float)
    if not len(confidence):
        return float("nan")
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    total = 0.0
    for b in np.unique(which):
        m = which == b
        total += m.sum() * abs(correct[m].mean() - confidence[m].mean())
    return float(total / len(confidence))


def brier(logits: np.ndarray, gold: np.ndarray, temperature: float = 1.0) -> float:
    """Brier score: the mean over rows of the squared distance between the scores and the
    one-hot right answer (all zeros when no candidate is right)."""
    p = probabilities(logits, temperature)
    if not len(p):
        return float("nan")
    gold = np.asarray(gold)
    target = np.zeros_like(p)
    rows = np.flatnonzero(gold >= 0)
    target[rows, gold[rows]] = 1.0
    return float(((p - target) ** 2).sum(-1).mean())


def reliability(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> list[dict]:
    """The reliability diagram's bins: each non-empty bin's range, rows, mean confidence and accuracy."""
    confidence, correct = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float)
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    return [{"low": b / bins, "high": (b + 1) / bins, "count": int((which == b).sum()),
             "confidence": float(confidence[which == b].mean()), "accuracy": float(correct[which == b].mean())}
            for b in np.unique(which)]


def ece_floor(confidence: np.ndarray, rows: int, draws: int = 200, seed: int = 0) -> float:
    """The ECE a perfectly calibrated model shows on `rows` rows with these confidences: each
    draw takes `rows` of them and makes each right with probability its confidence; the mean
    over draws. A measured ECE near it is as good as that many rows can tell."""
    confidence = np.asarray(confidence, dtype=float)
    if not len(confidence) or rows < 1:
        return float("nan")
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(draws):
        conf = rng.choice(confidence, size=rows)
        values.append(ece(conf, rng.random(rows) < conf))
    return float(np.mean(values))


def measured(logits: np.ndarray, gold: np.ndarray, temperature: float = 1.0) -> dict:
    """ECE, Brier, accuracy and mean confidence of rows at a temperature."""
    conf, right = confidence_pairs(logits, gold, temperature)
    return {"ece": round(ece(conf, right), 6), "brier": round(brier(logits, gold, temperature), 6),
            "accuracy": round(float(right.mean()), 6) if len(right) else float("nan"),
            "mean_confidence": round(float(conf.mean()), 6) if len(conf) else float("nan")}


def short_of_evidence(right: np.ndarray, where: str = "these rows") -> str | None:
    """Why decisions that are `right` (or wrong) are too little evidence to fit a calibration on
    (`MIN_DECISIONS` of them, `MIN_EACH` right and `MIN_EACH` wrong); None: enough."""
    right = np.asarray(right, dtype=bool)
    n, hits = len(right), int(right.sum())
    misses = n - hits
    if n < MIN_DECISIONS:
        return f"{n} decision{'' if n == 1 else 's'} on {where}, fewer than the {MIN_DECISIONS} a fit needs"
    for count, what in ((misses, "wrong"), (hits, "right")):
        if not count:
            return f"every one of the {n} decisions on {where} was {'right' if what == 'wrong' else 'wrong'}: " \
                   f"a fit needs {MIN_EACH} {what} ones"
        if count < MIN_EACH:
            return f"only {count} of the {n} decisions on {where} {'was' if count == 1 else 'were'} {what}, " \
                   f"fewer than the {MIN_EACH} a fit needs"
    return None


def cross_fitted(logits: np.ndarray, gold: np.ndarray, seed: int = 0, calibrator=None, where: str = "these rows") -> dict:
    """The calibration measured honestly: the rows split into two random halves, fitted on each
    half and measured on the other; ECE and Brier before and after are the means of the two
    measurements. Also what is fitted on all rows (what is kept). `calibrator` (default: one
    temperature) fits parameters on rows (`fit(logits, gold)`, None: nothing to fit) and
    measures rows with them (`measure(logits, gold, params)`, None: the raw scores).

    Nothing is kept (its fields None, `"none"` saying why) on too little evidence
    (`short_of_evidence`; `where` names the rows in that sentence), when no half could be
    fitted, or when the fit raised the cross-fitted ECE."""
    calibrator = calibrator or Temperature()
    logits, gold = np.asarray(logits, dtype=np.float64), np.asarray(gold)
    nothing = {**calibrator.named(None), "rows": int(len(gold))}
    short = short_of_evidence(calibrator.pairs(logits, gold, None)[1], where)
    if short:
        return {**nothing, "none": short}
    order = np.random.default_rng(seed).permutation(len(gold))
    halves = (order[: len(order) // 2], order[len(order) // 2:])
    before, after, fitted = [], [], []
    for fit_on, test_on in (halves, halves[::-1]):
        params = calibrator.fit(logits[fit_on], gold[fit_on]) if len(test_on) else None
        if params is None:
            continue
        fitted.append(params)
        before.append(calibrator.measure(logits[test_on], gold[test_on], None))
        after.append(calibrator.measure(logits[test_on], gold[test_on], params))
    kept = calibrator.fit(logits, gold) if before else None
    if kept is None:
        return {**nothing, "none": f"nothing could be fitted on {'all of ' if before else 'either half of '}{where}"}
    out: dict = {**calibrator.named(kept), "rows": int(len(gold))}
    calibrated_confidence = calibrator.pairs(logits, gold, kept)[0]

    def mean(items: list[dict], key: str) -> float:
        return round(float(np.mean([i[key] for i in items])), 6)

    out.update({"ece_before": mean(before, "ece"), "ece_after": mean(after, "ece"),
                "brier_before": mean(before, "brier"), "brier_after": mean(after, "brier"),
                "accuracy": mean(before, "accuracy"), "confidence_before": mean(before, "mean_confidence"),
                "confidence_after": mean(after, "mean_confidence"),
                **calibrator.halves(fitted), "measured_on": "cross-fitted halves",
                "ece_floor": round(ece_floor(calibrated_confidence, len(halves[0])), 6)})
    if out["ece_after"] > out["ece_before"]:
        what = f"the fitted calibration ({out['fitted']})" if out.get("fitted") else f"the fitted temperature {kept:.4g}"
        out.update({**nothing, "none": f"{what} raised the cross-fitted ECE on {where} "
                                       f"({out['ece_before']:.3f} -> {out['ece_after']:.3f}): not applied"})
        out.pop("fitted", None)
    return out


class Temperature:
    """The calibrator of `cross_fitted` and `Judging.calibrator` by default: one temperature over
    every row's candidates (a kind may give its own with the same methods)."""

    def fit(self, logits: np.ndarray, gold: np.ndarray) -> float | None:
        return fit_temperature(logits, gold)

    def pairs(self, logits: np.ndarray, gold: np.ndarray, params) -> tuple[np.ndarray, np.ndarray]:
        return confidence_pairs(logits, gold, params or 1.0)

    def measure(self, logits: np.ndarray, gold: np.ndarray, params) -> dict:
        return measured(logits, gold, params or 1.0)

    def named(self, params) -> dict:
        return {"temperature": params}

    def halves(self, fitted: list) -> dict:
        return {"half_temperatures": fitted}

    def keep(self, spec, named: dict) -> None:
        """Keep what was fitted (`named`'s fields; {}: nothing) in the head's spec."""
        spec.temperature = named.get("temperature")

    def in_use(self, task):
        """The params a head's scores use now (`Judging.temperature`: 1 when off)."""
        return task.scoring.temperature()


def fold_into_output_layer(model: torch.nn.Module, out: torch.nn.Linear, temperature: float | None) -> str | None:
    """Divide the weight and bias of `model`'s output layer (the linear layer holding the same
    weights as the head's `out`, copied there by the export) by the temperature, so that its
    logits are divided by it; what was done, in a sentence."""
    if not temperature or temperature == 1.0:
        return None
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
             and m.weight.shape == out.weight.shape and torch.equal(m.weight.detach().cpu(), out.weight.detach().cpu())]
    if len(found) != 1:
        return f"temperature {temperature:g} not folded: the export's output layer was not found"
    name, layer = found[0]
    with torch.no_grad():
        layer.weight.div_(temperature)
        if layer.bias is not None:
            layer.bias.div_(temperature)
    return f"temperature {temperature:g} folded into {name} (its weight and bias divided by it)"


def wilson(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a proportion."""
    if total <= 0:
        return (0.0, 1.0)
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (round(max(0.0, centre - half), 6), round(min(1.0, centre + half), 6))


def risk_coverage(confidence: np.ndarray, correct: np.ndarray, coverages=COVERAGES) -> list[dict]:
    """Accuracy when answering only the most confident share of the rows, for each share; the
    threshold is the lowest confidence answered."""
    confidence, correct = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float)
    order = np.argsort(-confidence, kind="stable")
    out = []
    for share in coverages:
        n = max(1, int(round(share * len(order)))) if len(order) else 0
        top = order[:n]
        out.append({"coverage": share, "answered": int(n),
                    "accuracy": round(float(correct[top].mean()), 6) if n else float("nan"),
                    "threshold": round(float(confidence[top].min()), 6) if n else float("nan")})
    return out


def curve(confidence: np.ndarray, correct: np.ndarray, points: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """The risk-coverage curve: (coverage, accuracy of the answered) at `points` coverages."""
    confidence, correct = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float)
    order = np.argsort(-confidence, kind="stable")
    running = np.cumsum(correct[order]) / np.arange(1, len(order) + 1)
    at = np.unique(np.linspace(1, len(order), min(points, len(order))).astype(int)) if len(order) else np.zeros(0, int)
    return at / max(len(order), 1), running[at - 1] if len(at) else np.zeros(0)


def target_threshold(confidence: np.ndarray, correct: np.ndarray, target: float) -> dict:
    """The lowest confidence threshold at which the answered rows (confidence >= threshold)
    reach accuracy `target`, the share then answered and the accuracy reached, each with its
    95% Wilson interval; `threshold` None when no threshold reaches it."""
    confidence, correct = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float)
    order = np.argsort(-confidence, kind="stable")
    hits = np.cumsum(correct[order])
    counts = np.arange(1, len(order) + 1)
    sorted_conf = confidence[order]
    # a cut may only fall between different confidences: the last of each run of ties
    ends = np.r_[sorted_conf[1:] != sorted_conf[:-1], True] if len(order) else np.zeros(0, bool)
    ok = np.flatnonzero(ends & (hits / np.maximum(counts, 1) >= target))
    out: dict = {"target_accuracy": target, "rows": int(len(order))}
    if not len(ok):
        return {**out, "threshold": None, "coverage": 0.0}
    k = int(ok[-1])
    n, right = int(counts[k]), int(hits[k])
    return {**out, "threshold": round(float(sorted_conf[k]), 6), "coverage": round(n / len(order), 6),
            "coverage_interval": wilson(n, len(order)), "accuracy": round(right / n, 6),
            "accuracy_interval": wilson(right, n), "answered": n}


def summary(confidence: np.ndarray, correct: np.ndarray, target: float | None = None) -> dict:
    """What `evaluate` reports of a head's scores: ECE, the risk-coverage table, and with a
    target accuracy its threshold."""
    out: dict = {"rows": int(len(confidence))}
    if not len(confidence):
        return out
    out["ece"] = round(ece(confidence, correct), 6)
    out["accuracy"] = round(float(np.mean(correct)), 6)
    out["mean_confidence"] = round(float(np.mean(confidence)), 6)
    out["risk_coverage"] = risk_coverage(confidence, correct)
    if target is not None:
        out["target"] = target_threshold(confidence, correct, target)
    return out


def calibrate_head(task, outputs: list, examples: list, path=None) -> dict:
    """Fit `task`'s calibration (its `Judging.calibrator`: one temperature unless the kind says
    otherwise) on labelled outputs and keep it in its spec (None: calibration off, no rows, too
    little evidence or a fit that raised the ECE: `cross_fitted`); ECE and Brier before and
    after, each measured on the half of the rows it was not fitted on, and `"none"`: why there
    is no temperature."""
    calibrator = task.scoring.calibrator()
    if not getattr(task.spec, "calibrate", True):
        calibrator.keep(task.spec, {})
        return {"temperature": None, "none": "calibration off (--no-calibrate)"}
    rows = task.scoring.calibration_rows(outputs, examples, path)
    if rows is None:
        calibrator.keep(task.spec, {})
        return {"temperature": None, "none": task.scoring.no_calibration()}
    shown = source_name(path)  # (a file's name, or the name of rows in memory)
    result = cross_fitted(*rows, calibrator=calibrator, where=Path(shown).name if shown else "the data")
    calibrator.keep(task.spec, result)
    return result


def head_summary(task, parts: list, target: float | None = None, by_metric: list[dict] | None = None) -> dict:
    """What `evaluate` reports of a head's scores on labelled data, from each chunk's
    `Judging.confidence_part`: the temperature in use, then `summary` (or why there is none),
    and `by_metric` (`metric_coverage`) when the kind has it."""
    extra = {"metric_coverage": by_metric} if by_metric else {}
    if not parts or any(p is None for p in parts):
        return {"temperature": None, "none": task.scoring.no_calibration(), **extra}
    used = getattr(task.spec, "temperature", None) if getattr(task.spec, "calibrate", True) else None
    return {"temperature": used, **summary(np.concatenate([p[0] for p in parts]),
                                           np.concatenate([p[1] for p in parts]), target), **extra}


def coverage_part(task, outputs: list, examples: list, part=None, path=None):
    """What `metric_coverage` needs of one labelled chunk: its inputs' confidences
    (`Scoring.input_confidence`) and its `metric_part` (the `part` given, or computed here when
    none is or when the call's options write files of their own, which keeps everything); None
    when the kind has no per-input confidence."""
    confidence = task.scoring.input_confidence(outputs, examples)
    if confidence is None:
        return None
    quiet = task.options.bind(quiet=True)
    if part is None or quiet is not task:
        part = quiet.judging.metric_part(outputs, examples, path)
    return np.asarray(confidence, dtype=float), part


def metric_coverage(task, chunks: list, path=None, coverages=COVERAGES) -> list[dict]:
    """The kind's own metric (`Judging.main_metric`: entity F1, SQuAD F1) over only the most
    confident share of the inputs, for each share: from each chunk's `coverage_part`, the
    answered inputs' rows (`Judging.part_rows`) measured again by `metrics_from_parts`. Empty
    when the kind has no per-input confidence."""
    if not chunks or any(c is None for c in chunks):
        return []
    task = task.options.bind(quiet=True)  # a share's metrics write no files
    flat = np.concatenate([c[0] for c in chunks])
    chunk_of = np.concatenate([np.full(len(c[0]), k, dtype=int) for k, c in enumerate(chunks)])
    position = np.concatenate([np.arange(len(c[0])) for c in chunks])
    order = np.argsort(-flat, kind="stable")
    out = []
    for share in coverages:
        n = max(1, int(round(share * len(order)))) if len(order) else 0
        if not n:
            break
        top = order[:n]
        chosen = [task.judging.part_rows(chunks[k][1], sorted(position[top[chunk_of[top] == k]].tolist()))
                  for k in sorted(set(chunk_of[top].tolist()))]
        value = task.judging.metrics_from_parts(chosen, path).get(task.judging.main_metric)
        out.append({"coverage": share, "answered": int(n), "metric": task.judging.main_metric,
                    "value": None if value is None else round(float(value), 6),
                    "threshold": round(float(flat[top].min()), 6)})
    return out
