"""Paired bootstrap of the long-passage costs (plain F1 - long-version F1, per question) on the
cached logits of the `bench/qa_long.py` runs `qa-long-para` (v1) and `qa-long-sn` (shared
norm), or of the runs given by `--read LABEL DIR WORK`: their 95% intervals, decoded with the
defaults (paragraph windows, `relative`) and `--paragraph-match W`. Run after those:
`python bench/qa_long_bootstrap.py`."""

import argparse
from pathlib import Path

import numpy as np
import qa_long

import bertheads
from bertheads.encoder.pretrained import Encoder
from bertheads.tasks.qa.task import read_examples

READS = [("v1+para", "bench/out/qalong/ours-v1", "bench/out/qa-long-para"),
         ("neg1sn+para", "bench/out/qalong/ours-neg1-sn", "bench/out/qa-long-sn")]


def per_question_f1(model, examples, cache: Path) -> np.ndarray:
    task, features, owner, logits = qa_long.window_logits(model, examples, cache)
    _, v1_scores, _ = task.metric_part(task.collect(logits, owner, examples, features), examples)
    return v1_scores[:, 1]  # (exact, F1) per question


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--read", nargs=3, action="append", metavar=("LABEL", "DIR", "WORK"),
                        help="a model and the bench/out folder of its qa_long.py run (repeatable)")
    parser.add_argument("--paragraph-match", type=float, default=0.0, metavar="W")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=10000)
    args = parser.parse_args()
    path = qa_long.require_data("squad", "eval-split.json")
    versions = qa_long.build_versions(path, read_examples(str(path))[:args.limit], Encoder.load("default").tokenizer)
    rng = np.random.default_rng(0)
    resamples = args.resamples
    for label, directory, work in args.read or READS:
        model = bertheads.load(directory)
        for task in model.net.tasks.values():
            task.spec.paragraph_windows, task.spec.window_choice = True, "relative"
            task.spec.paragraph_match = args.paragraph_match
        f1 = {v: per_question_f1(model, versions[v], Path(work) / f"{label}-{v}.npz") for v in versions}
        for version in ("filler", "article"):
            cost = 100 * (f1["plain"] - f1[version])
            means = cost[rng.integers(0, len(cost), (resamples, len(cost)))].mean(1)
            low, high = np.percentile(means, [2.5, 97.5])
            print(f"{label} (paragraph match {args.paragraph_match:g}) {version}: cost {cost.mean():.2f} [{low:.2f}, {high:.2f}], "
                  f"P(cost <= 1) {(means <= 1).mean():.3f}, questions whose F1 changed {int((cost != 0).sum())}")


if __name__ == "__main__":
    main()
