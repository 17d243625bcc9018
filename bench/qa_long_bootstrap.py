"""Paired bootstrap of the long-passage costs (plain F1 - long-version F1, per question) on the
cached logits of `bench/qa_long.py` runs: their 95% intervals, decoded with paragraph windows,
`relative` and `--paragraph-match W`. By default the runs `qa-long-para` (v1) and `qa-long-sn`
(shared norm) on the versions with line breaks; `--read LABEL DIR WORK` names others (repeatable).
A label ending in `-noseg` is read without topic segments, as `qa_long.py --topic-segments`
names its rows; `--versions` picks the long versions; `--compare A B` adds the paired F1 gain of one read
over another. Run after those runs, e.g.

    python bench/qa_long_bootstrap.py
    python bench/qa_long_bootstrap.py --read v1+para bench/out/qalong/ours-v1 bench/out/qa-long-flat \\
        --read v1+para-noseg bench/out/qalong/ours-v1 bench/out/qa-long-flat \\
        --versions "filler flat,article flat" --paragraph-match 6
"""

import argparse
from pathlib import Path

import numpy as np
import qa_long

import bertheads
from bertheads.encoder.pretrained import Encoder
from bertheads.tasks.qa.formats import read_examples

READS = [("v1+para", "bench/out/qalong/ours-v1", "bench/out/qa-long-para"),
         ("neg1sn+para", "bench/out/qalong/ours-neg1-sn", "bench/out/qa-long-sn")]


def per_question_f1(model, examples, cache: Path) -> np.ndarray:
    task, features, owner, logits = qa_long.window_logits(model, examples, cache)
    _, v1_scores, _ = task.judging.metric_part(task.judging.collect(logits, owner, examples, features), examples)
    return v1_scores[:, 1]  # (exact, F1) per question


def interval(cost: np.ndarray, rng: np.random.Generator, resamples: int) -> tuple[float, float, float]:
    """The mean cost's 95% percentile interval and P(mean cost <= 1) over paired resamples."""
    means = cost[rng.integers(0, len(cost), (resamples, len(cost)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high), float((means <= 1).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--read", nargs=3, action="append", metavar=("LABEL", "DIR", "WORK"),
                        help="a model and the bench/out folder of its qa_long.py run (repeatable)")
    parser.add_argument("--versions", type=lambda t: t.split(","), default=["filler", "article"],
                        help="comma-separated long versions (default: filler,article)")
    parser.add_argument("--compare", nargs=2, action="append", default=[], metavar=("A", "B"),
                        help="also the paired F1 gain of read A over read B on each version (repeatable)")
    parser.add_argument("--paragraph-match", type=float, default=0.0, metavar="W")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=10000)
    args = parser.parse_args()
    path = qa_long.require_data("squad", "eval-split.json")
    every = qa_long.build_versions(path, read_examples(str(path))[:args.limit], Encoder.load("default").tokenizer)
    versions = {v: every[v] for v in ["plain", *args.versions]}
    rng = np.random.default_rng(0)
    read: dict[str, dict[str, np.ndarray]] = {}  # label -> per-question F1 by version
    for label, directory, work in args.read or READS:
        model = bertheads.load(directory)
        model.weights_key = hash(str(Path(directory).resolve()))
        for task in model.net.tasks.values():
            task.spec.paragraph_windows, task.spec.window_choice = True, "relative"
            task.spec.paragraph_match = args.paragraph_match
            task.spec.topic_segments = not label.endswith("-noseg")
        f1 = {v: per_question_f1(model, examples, Path(work) / f"{label}-{v.replace(' ', '-')}.npz")
              for v, examples in versions.items()}
        for version in args.versions:
            cost = 100 * (f1["plain"] - f1[version])
            low, high, p = interval(cost, rng, args.resamples)
            print(f"{label} (paragraph match {args.paragraph_match:g}) {version}: cost {cost.mean():.2f} "
                  f"[{low:.2f}, {high:.2f}], P(cost <= 1) {p:.3f}, questions whose F1 changed {int((cost != 0).sum())}")
        read[label] = f1
    # paired gains: topic segments where a read and its -noseg read were given, and --compare pairs
    pairs = [(label, f"{label}-noseg") for label in read if f"{label}-noseg" in read] + [tuple(c) for c in args.compare]
    for better, other in pairs:
        for version in ["plain", *args.versions]:
            gain = 100 * (read[better][version] - read[other][version])
            if version == "plain" and not gain.any():
                continue
            low, high, _ = interval(gain, rng, args.resamples)
            print(f"{better} against {other} {version}: F1 gain {gain.mean():.2f} "
                  f"[{low:.2f}, {high:.2f}], questions whose F1 changed {int((gain != 0).sum())}")


if __name__ == "__main__":
    main()
