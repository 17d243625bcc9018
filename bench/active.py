"""Learning curves of `bertheads select`'s strategies in features mode: start from 100 random
labelled inputs of a pool, then 5 rounds of +100 chosen by each strategy (margin, entropy,
diverse, random), 3 seeds; the dev metric after each round. Tasks (`--task`): `sst2` (the
first N SST-2 training sentences, dev accuracy), `conll` (the first N CoNLL-2003 training
sentences, entity F1 on the dev set) and `skewed` (SST-2 training sentences with the positive
class cut to 10%, in the pool and in a dev set of 2,000 later training sentences; the positive
class's F1, and how many positives each strategy labelled). The pool and the dev set go through the encoder once (the features cache); each round
trains a fresh head on the labelled rows' cached states with `training.loop.fit` and scores the
pool with the same functions `select` uses (`inference/select.py`: the uncertainty of the
kind's `Judging.uncertainty`, `choose`, the k-means of `diverse` on the cached mean vectors).

    python bench/active.py --task sst2 --pool 4000 --seeds 0,1,2
    python bench/active.py --task conll --pool 2000 --seeds 0,1,2
    python bench/active.py --task skewed --pool 4000 --seeds 0,1,2

`select`'s strategies follow its cold-start rule as `select` does (a round at random while the
head was trained on fewer than `--cold-start` of some class, counted as training saves them;
a curve point's `cold` says so); `--cold-start 0` turns it off.

Probes beside `select`'s strategies (the bench's own, not `select`'s): `mixedNN` (NN% of each
round at random, the rest by margin), `badge` (k-means++ seeding on each input's gradient
embedding, (probabilities - its argmax's one-hot) x its mean vector; Ash et al. 2020), and
`--class-weights balanced` (the head's loss weighted by the pool's label counts).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import numpy as np
from common import DATA, OUT, cpu_line
from tag import read_conll, write_conll

# task -> (kind, metric, learning rate)
TASKS = {"sst2": ("classify", "accuracy", 5e-3), "conll": ("tag", "f1", 5e-3), "skewed": ("classify", "f1", 5e-3)}


def task_files(task: str, pool: int, folder) -> tuple:
    """(pool file, dev file) of a task, the pool written into `folder`."""
    if task == "conll":
        path = folder / f"conll-pool-{pool}.txt"
        write_conll(path, read_conll(DATA / "conll2003" / "train.txt", pool))
        return path, DATA / "conll2003" / "dev.txt"
    lines = (DATA / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    if task == "skewed":  # the positive class cut to 10%, in the pool and in a dev set from later rows
        def skewed(rows: list[str], size: int, name: str):
            negatives = [r for r in rows if r.endswith("\t0")][: size - size // 10]
            positives = [r for r in rows if r.endswith("\t1")][: size // 10]
            chosen = set(negatives) | set(positives)
            path = folder / name
            path.write_text("\n".join([lines[0], *[r for r in rows if r in chosen]]) + "\n", encoding="utf-8")
            return path

        return skewed(lines[1:30001], pool, f"skewed-pool-{pool}.tsv"), skewed(lines[30001:], 2000, "skewed-dev.tsv")
    else:
        path = folder / f"pool-{pool}.tsv"
        path.write_text("\n".join(lines[: pool + 1]) + "\n", encoding="utf-8")
    return path, DATA / "sst2" / "dev.tsv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="sst2", choices=sorted(TASKS))
    parser.add_argument("--pool", type=int, default=4000)
    parser.add_argument("--start", type=int, default=100)
    parser.add_argument("--step", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--strategies", default="random,margin,entropy,diverse")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, help="the head's learning rate (default: the task's)")
    parser.add_argument("--class-weights", choices=["none", "balanced"], help="classify: the head's loss weights")
    parser.add_argument("--cold-start", type=int, help="select's cold-start rule: a round is picked at random while "
                                                       "the head was trained on fewer than this many of some class "
                                                       "(default: select's; 0: never)")
    parser.add_argument("--out", default=str(OUT / "active" / "results.jsonl"))
    args = parser.parse_args()

    import torch

    from bertheads.compute.batching import INFERENCE_BATCH
    from bertheads.compute.runner import run_heads
    from bertheads.encoder.pretrained import Encoder
    from bertheads.inference.select import (
        STRATEGIES,
        SelectSettings,
        choose,
        entropy_scores,
        margin_scores,
        settled_strategy,
    )
    from bertheads.model import BertHeads
    from bertheads.store.features_cache import CachedDev
    from bertheads.training.audit import FoldCache
    from bertheads.training.config import single_task
    from bertheads.training.features import CachedHead, attach_cache
    from bertheads.training.joint import read_task, task_settings
    from bertheads.training.loop import TaskData, TrainSettings, evaluate_task, fit

    folder = OUT / "active"
    folder.mkdir(parents=True, exist_ok=True)
    kind, metric, lr = TASKS[args.task]
    pool_file, dev_file = task_files(args.task, args.pool, folder)
    config = single_task(kind, str(pool_file), str(dev_file), {"mode": "features",
                                                                     "cache_dir": str(OUT / "audit" / "cache"),
                                                                     **({"class_weights": args.class_weights}
                                                                        if args.class_weights else {})})
    t = config.tasks[0]
    options = task_settings(t, {}, config.options)
    encoder = Encoder.load("default", lazy=True)
    task, examples = read_task(kind, t.train, encoder, options)
    features, owner = task.modeling.encode_for_inference(examples, encoder.tokenizer, with_labels=True)
    assert owner == list(range(len(examples))), "one feature per input (a longer one would need its windows merged)"
    dev = task.reading.read(str(dev_file), need_labels=True)
    whole = TaskData(t.name, task, features, dev, str(dev_file))
    started = time.perf_counter()
    attach_cache(BertHeads(encoder, {t.name: task}), [whole], options, "default", t.train, progress=False)
    cache_seconds = time.perf_counter() - started
    # each input's vector for diverse: the mean of its tokens in the last layer read
    cached = whole.cached
    if cached.pooled:
        vectors_all = np.asarray(cached.states[:, -1, :], dtype=np.float64)  # [pool, hidden]
    else:
        vectors_all = np.stack([np.asarray(cached.states[cached.offsets[i]:cached.offsets[i + 1], -1, :],
                                           dtype=np.float64).mean(0) for i in range(len(features))])
    # a classify pool's rarest class, to count how many of it each strategy labels
    targets = [f.get("labels") for f in features]
    rare = None
    if kind == "classify":
        counts = {c: targets.count(c) for c in set(targets)}
        rare = min(counts, key=counts.get)
    settings = TrainSettings(epochs=args.epochs, lr=args.lr or lr, batch_size=16, keep="last", progress=False)

    def train_round(labelled: list[int], seed: int):
        fold_task = copy.deepcopy(task)
        net = BertHeads(encoder, {t.name: fold_task})
        # no dev set while training (the last epoch is kept), one evaluation after it
        data = TaskData(t.name, fold_task, [features[i] for i in labelled],
                        cached=FoldCache(whole.cached, labelled, features))
        fold_task.spec.trained_counts = fold_task.scoring.class_counts([examples[i] for i in labelled])  # (as training saves)
        torch.manual_seed(seed)
        fit(net, [data], TrainSettings(**{**settings.__dict__, "seed": seed}), None, evaluate_task)
        data.dev_examples, data.dev_path, data.dev_cached = dev, str(dev_file), whole.dev_cached
        accuracy = evaluate_task(net, data)[metric]
        return net, fold_task, accuracy

    def pool_units(net, fold_task, rows: list[int]):
        view = CachedDev([features[i] for i in rows], list(range(len(rows))), FoldCache(whole.cached, rows, features))
        runner = CachedHead(t.name, fold_task, net.heads[t.name], view, torch.device("cpu"))
        raw = run_heads(runner, view.features, [t.name], INFERENCE_BATCH)[t.name]
        return fold_task.scoring.uncertainty(fold_task.judging.collect(raw, view.owner, [examples[i] for i in rows], view.features))

    cold = SelectSettings().cold_start if args.cold_start is None else args.cold_start
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        start = np.random.default_rng(seed).permutation(len(examples))[: args.start].tolist()
        for strategy in args.strategies.split(","):
            labelled = list(start)
            curve = []
            began = time.perf_counter()
            for round_ in range(args.rounds + 1):
                net, fold_task, accuracy = train_round(labelled, seed)
                curve.append({"labels": len(labelled), "accuracy": round(float(accuracy), 4),
                              **({"rare": sum(targets[i] == rare for i in labelled)} if rare is not None else {})})
                if round_ == args.rounds:
                    break
                taken = set(labelled)
                rest = [i for i in range(len(examples)) if i not in taken]
                units = pool_units(net, fold_task, rest)
                scores = entropy_scores(units) if strategy == "entropy" else margin_scores(units)
                used = strategy
                if strategy in STRATEGIES:  # select's own: its cold-start rule as well
                    used, scarce = settled_strategy(fold_task, SelectSettings(strategy=strategy, cold_start=cold))
                    curve[-1]["cold"] = bool(scarce)
                if used != strategy:
                    picked = choose(scores, args.step, used, seed + round_)
                elif strategy == "badge":
                    picked = badge_picks(units, vectors_all[np.asarray(rest)], args.step, seed + round_)
                elif strategy.startswith("mixed"):
                    picked = mixed_picks(scores, args.step, int(strategy[5:] or 50) / 100, seed + round_)
                else:
                    picked = choose(scores, args.step, strategy, seed + round_,
                                    lambda idx, rest=rest: vectors_all[np.asarray(rest)[idx]])
                labelled += [rest[i] for i in picked]
            row = {"seed": seed, "strategy": strategy, "curve": curve, "seconds": round(time.perf_counter() - began, 1)}
            results.append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "a", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps({**r, "task": args.task, "metric": metric, "pool": args.pool, "cold_start": cold,
                                "machine": cpu_line()}) + "\n")
    print(f"\n{cpu_line()}\ntask={args.task} ({metric}), pool={args.pool} ({pool_file.name}), dev={dev_file.name} ({len(dev)}), "
          f"features cache built/read in {cache_seconds:.1f} s\n")
    sizes = [c["labels"] for c in results[0]["curve"]]
    print("| strategy | " + " | ".join(str(s) for s in sizes) + " | gain at " + str(sizes[-1])
          + " vs random, mean [95% t-interval over the seeds] |")
    print("|---|" + "---|" * (len(sizes) + 1))
    randoms = {r["seed"]: r for r in results if r["strategy"] == "random"}
    for strategy in args.strategies.split(","):
        mine = [r for r in results if r["strategy"] == strategy]
        cells = [f"{statistics.median(r['curve'][j]['accuracy'] for r in mine):.3f}" for j in range(len(sizes))]
        gains = [r["curve"][-1]["accuracy"] - randoms[r["seed"]]["curve"][-1]["accuracy"] for r in mine
                 if r["seed"] in randoms]
        gain = (f"{statistics.mean(gains):+.3f} [{interval(gains)}] (seeds: {', '.join(f'{g:+.3f}' for g in gains)})"
                if gains else "-")
        print(f"| {strategy} | " + " | ".join(cells) + f" | {gain} |")
    print("\neach strategy minus random, same seed: mean over the seeds (seeds below random)\n")
    print("| strategy | " + " | ".join(str(s) for s in sizes[1:]) + " |")
    print("|---|" + "---|" * (len(sizes) - 1))
    for strategy in args.strategies.split(","):
        mine = [r for r in results if r["strategy"] == strategy and r["seed"] in randoms]
        if strategy == "random" or not mine:
            continue
        cells = []
        for j in range(1, len(sizes)):
            gaps = [r["curve"][j]["accuracy"] - randoms[r["seed"]]["curve"][j]["accuracy"] for r in mine]
            cells.append(f"{statistics.mean(gaps):+.3f} ({sum(g < 0 for g in gaps)} of {len(gaps)})")
        print(f"| {strategy} | " + " | ".join(cells) + " |")
    if rare is not None:
        print(f"\nrows of the rarest class ({rare}) labelled, median of the seeds:\n")
        print("| strategy | " + " | ".join(str(s) for s in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for strategy in args.strategies.split(","):
            mine = [r for r in results if r["strategy"] == strategy]
            print(f"| {strategy} | " + " | ".join(str(statistics.median(r["curve"][j]["rare"] for r in mine))
                                                 for j in range(len(sizes))) + " |")


def badge_picks(units, vectors: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Probe: k-means++ seeding on each input's gradient embedding, (probabilities - its
    argmax's one-hot) x its vector (BADGE, Ash et al. 2020)."""
    probs = np.stack([np.asarray(u, dtype=np.float64).reshape(-1) for u in units])
    probs[np.arange(len(probs)), probs.argmax(1)] -= 1.0
    g = (probs[:, :, None] * vectors[:, None, :]).reshape(len(probs), -1)
    rng = np.random.default_rng(seed)
    chosen = [int(np.argmax((g ** 2).sum(1)))]
    d2 = ((g - g[chosen[0]]) ** 2).sum(1)
    while len(chosen) < k:
        nxt = int(rng.choice(len(g), p=d2 / d2.sum())) if d2.sum() > 0 else int(rng.integers(len(g)))
        chosen.append(nxt)
        d2 = np.minimum(d2, ((g - g[nxt]) ** 2).sum(1))
    return np.asarray(chosen)


def mixed_picks(scores: np.ndarray, k: int, share: float, seed: int) -> np.ndarray:
    """Probe: `share` of the k at random (`select`'s `choose`), the rest by margin."""
    from bertheads.inference.select import choose

    at_random = choose(scores, int(round(k * share)), "random", seed)
    rest = scores.copy()
    rest[at_random] = -np.inf
    return np.concatenate([at_random, choose(rest, k - len(at_random), "margin", 0)])


def interval(values: list[float]) -> str:
    """The 95% Student t-interval of the mean of `values` (one value: no interval)."""
    if len(values) < 2:
        return "one seed"
    from scipy.stats import t

    half = t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    mean = statistics.mean(values)
    return f"{mean - half:+.3f}, {mean + half:+.3f}"


if __name__ == "__main__":
    main()
