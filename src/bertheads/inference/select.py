"""`bertheads select`: the unlabelled inputs of a pool most worth labelling next. Each input
gets the head's class probabilities (per unit: the input, or each word of a tagger's); the
strategies rank by the least margin between the two best classes, by entropy, or (`diverse`)
cluster the most uncertain inputs' encoder vectors (the mean of the last layer's tokens) with
k-means and take the most uncertain of each cluster. While the head was trained on fewer than
`cold_start` examples of some class (the counts training saved), the pick is a random sample
instead. The chosen inputs are written in the kind's own training format with the label left
empty, each with its `id` and `score`."""

from __future__ import annotations

import heapq
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from bertheads.base.errors import UserError
from bertheads.base.progress import LogLines
from bertheads.base.schema import said, setting
from bertheads.base.values import non_negative_int, positive_int
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.compute.runner import run_heads
from bertheads.compute.states import EncoderStates
from bertheads.encoder.layers import normalise_layers
from bertheads.inference.path import head_outputs
from bertheads.store.atomic import atomic_write_text
from bertheads.store.guard import check_target
from bertheads.text.readers import progress_total, source_name

log = logging.getLogger("bertheads")

STRATEGIES = ("margin", "entropy", "diverse", "random")
CANDIDATES_PER_PICK = 10  # diverse: the clusters are drawn from the k * this most uncertain inputs
SCORE_CHUNK = 4096  # inputs scored at a time (a pool of any size is read once, a chunk at a time)


@dataclass
class SelectSettings:
    """What `bertheads select` picks."""

    k: int = setting(100, "how many inputs to choose", type=positive_int, short="-k")
    strategy: str = setting("margin", "margin: the least gap between the two best classes; entropy: the most "
                                      "spread probabilities; diverse: k-means on the encoder's vectors of the "
                                      "most uncertain inputs, the most uncertain of each cluster; random",
                            choices=STRATEGIES)
    seed: int = setting(0, "random seed (diverse's k-means, random)", type=int)
    cold_start: int = setting(10, "while the head was trained on fewer than this many examples of some class "
                                  "(label, entity type), pick at random instead: the inputs such a head is least "
                                  "sure of are mostly lookalikes of the class it hardly knows; 0: never",
                              type=non_negative_int)


def margin_scores(units: list[np.ndarray]) -> np.ndarray:
    """Per input, 1 - (best - second best probability) of its least sure unit (1: a tie)."""
    out = np.zeros(len(units))
    for i, p in enumerate(units):
        if p.size == 0:
            continue
        top = np.sort(p, axis=-1)[:, ::-1]
        second = top[:, 1] if top.shape[1] > 1 else np.zeros(len(top))
        out[i] = float(np.max(1.0 - (top[:, 0] - second)))
    return out


def entropy_scores(units: list[np.ndarray]) -> np.ndarray:
    """Per input, the entropy of its least sure unit, divided by log(classes) (1: uniform)."""
    out = np.zeros(len(units))
    for i, p in enumerate(units):
        if p.size == 0 or p.shape[-1] < 2:
            continue
        q = np.clip(p, 1e-12, 1.0)
        out[i] = float(np.max(-(q * np.log(q)).sum(-1) / np.log(p.shape[-1])))
    return out


def kmeans(vectors: np.ndarray, clusters: int, seed: int, rounds: int = 20) -> np.ndarray:
    """Each row's cluster: k-means++ start, then Lloyd rounds (cosine: rows are normalised)."""
    rng = np.random.default_rng(seed)
    x = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    centres = [x[rng.integers(len(x))]]
    nearest = np.full(len(x), np.inf)
    for _ in range(1, clusters):
        nearest = np.minimum(nearest, ((x - centres[-1]) ** 2).sum(1))
        total = nearest.sum()
        centres.append(x[rng.choice(len(x), p=nearest / total)] if total > 0 else x[rng.integers(len(x))])
    c = np.stack(centres)
    assign = np.zeros(len(x), dtype=np.int64)
    for _ in range(rounds):
        distance = (x ** 2).sum(1)[:, None] - 2 * x @ c.T + (c ** 2).sum(1)[None]
        new = distance.argmin(1)
        if np.array_equal(new, assign) and _ > 0:
            break
        assign = new
        for j in range(clusters):
            members = x[assign == j]
            if len(members):
                c[j] = members.mean(0)
    return assign


def pooled_vectors(net, task, examples: list, batch_size: int) -> np.ndarray:
    """Per example, the mean of the encoder's last-layer token states (its windows averaged)."""
    encoder = getattr(net, "encoder", None)
    if encoder is None or not hasattr(encoder, "model"):
        raise UserError(f"{said('strategy', 'diverse')}: needs the torch runtime ({said('runtime', 'torch')}), whose encoder "
                        f"gives the vectors")
    features, owner = task.modeling.encode_for_inference(examples, encoder.tokenizer)
    runner = EncoderStates(encoder, normalise_layers((-1,), encoder.info.num_layers), ["mean"])
    rows = run_heads(runner, features, ["mean"], batch_size, progress="select: vectors of the candidates")["mean"]
    out = np.zeros((len(examples), rows[0].shape[-1]), dtype=np.float64)
    counts = np.zeros(len(examples))
    for r, k in zip(rows, owner):
        out[k] += r.reshape(-1)
        counts[k] += 1
    return out / np.maximum(counts, 1)[:, None]


def choose(scores: np.ndarray, k: int, strategy: str, seed: int, vectors=None) -> np.ndarray:
    """The indices of the k chosen inputs, best first."""
    k = min(k, len(scores))
    if strategy == "random":
        return np.random.default_rng(seed).permutation(len(scores))[:k]
    order = np.argsort(-scores, kind="stable")
    if strategy != "diverse":
        return order[:k]
    candidates = order[:min(len(order), k * CANDIDATES_PER_PICK)]
    assign = kmeans(vectors(candidates), k, seed)
    picked = []
    for j in range(k):
        members = candidates[assign == j]
        if len(members):
            picked.append(members[0])  # (candidates are in score order)
    rest = [i for i in candidates if i not in set(picked)]
    picked += rest[:k - len(picked)]
    return np.asarray(sorted(picked, key=lambda i: -scores[i]), dtype=np.int64)


@dataclass
class Selection:
    """The chosen inputs' records (the kind's training format, label empty, with id and score)."""

    records: list[dict]
    pool: int
    strategy: str  # the one used (random at a cold start)
    cold_start: dict[str, int] = field(default_factory=dict)  # the scarce classes that made it random


def settled_strategy(task, settings: SelectSettings) -> tuple[str, dict[str, int]]:
    """The strategy a pick uses: the one asked for, or random while the head was trained on
    fewer than `settings.cold_start` examples of some class (those classes and their counts)."""
    if settings.strategy == "random" or not settings.cold_start:
        return settings.strategy, {}
    scarce = task.scoring.scarce_classes(settings.cold_start)
    if scarce:
        seen = ", ".join(f"{n} of {name!r}" for name, n in sorted(scarce.items(), key=lambda item: item[1]))
        log.warning(f"the head was trained on {seen}: fewer than {said('cold_start', settings.cold_start)} of a "
                    f"class, so these picks are a random sample, not {settings.strategy} (the inputs such a head is "
                    f"least sure of are mostly lookalikes of that class; {said('cold_start', 0)}: "
                    f"{settings.strategy} all the same)")
        return "random", scarce
    return settings.strategy, {}


def kept_candidates(net, name: str, examples, settings: SelectSettings, keep: int,
                    batch_size: int, total: int | None = None) -> tuple[list[tuple[float, int, object]], int]:
    """Score the pool a chunk at a time and keep only the `keep` best (score, position, example),
    best first, ties to the earlier input: memory holds a chunk and the kept ones, whatever the
    pool's size. `random` keeps those of the highest seeded uniform draws instead (a uniform
    sample), each with its margin score. `total`: the pool's size where known (for the progress lines)."""
    task, rng = net.tasks[name], np.random.default_rng(settings.seed)
    kept: list[tuple] = []  # a min-heap on (key, -position)
    seen = 0
    lines = LogLines(f"select {name}", total, "inputs")  # where no bar is drawn
    for chunk in chunked(examples, SCORE_CHUNK):
        units = task.scoring.uncertainty(head_outputs(net, name, chunk, batch_size))
        scores = entropy_scores(units) if settings.strategy == "entropy" else margin_scores(units)
        keys = rng.random(len(chunk)) if settings.strategy == "random" else scores
        for position, (example, key, score) in enumerate(zip(chunk, keys, scores), seen):
            item = ((float(key), -position), position, example, float(score))
            if len(kept) < keep:
                heapq.heappush(kept, item)
            elif item[0] > kept[0][0]:
                heapq.heapreplace(kept, item)
        seen += len(chunk)
        lines.tick(seen)
    return [(score, position, example) for _, position, example, score in sorted(kept, reverse=True)], seen


def chunked(items, size: int):
    chunk: list = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def select(net, name: str, pool, settings: SelectSettings | None = None, out: str | Path | None = None,
           batch_size: int = INFERENCE_BATCH, fmt: str | None = None) -> Selection:
    """Score every input of `pool` (a file or rows, read a chunk at a time) with head `name` of
    `net`, choose `settings.k` by `settings.strategy`, and write them as JSON lines to `out`
    (atomically)."""
    settings = settings or SelectSettings()
    if out is not None:  # (the callers check it with the model's folders first: `claimed_output`)
        check_target(out, inputs=[pool], flag="out")
    if settings.strategy not in STRATEGIES:
        raise UserError(f"{said('strategy')}: expected one of {', '.join(STRATEGIES)}, got {settings.strategy!r}")
    task = net.tasks[name]
    strategy, scarce = settled_strategy(task, settings)
    settings = replace(settings, strategy=strategy)
    keep = settings.k * (CANDIDATES_PER_PICK if settings.strategy == "diverse" else 1)
    size = progress_total(pool) if task.reading.counts_lines else None  # (a header line counts: about right)
    kept, total = kept_candidates(net, name, task.reading.iter_read(pool, need_labels=False, fmt=fmt), settings, keep,
                                  batch_size, size)
    if not kept:
        raise UserError(f"{source_name(pool) or '<stdin>'}: no inputs in the pool")
    scores = np.array([score for score, _, _ in kept])
    if settings.strategy == "diverse":  # (kept: the most uncertain, in score order)
        picks = choose(scores, settings.k, "diverse", settings.seed,
                       lambda idx: pooled_vectors(net, task, [kept[i][2] for i in idx], batch_size))
    else:
        picks = np.arange(min(settings.k, len(kept)))
    records = []
    for i in picks:
        score, position, e = kept[i]
        given = (getattr(e, "extra", None) or {}).get("id")
        if given is None:  # (an id of 0 is an id: not the line number)
            given = getattr(e, "id", None)
        line = getattr(e, "line", None)
        record = {**task.reading.blank_record(e), "id": given if given is not None else (line if line is not None else position),
                  "score": round(float(score), 6)}
        records.append(record)
    if out is not None:
        atomic_write_text(Path(out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return Selection(records, total, settings.strategy, scarce)
