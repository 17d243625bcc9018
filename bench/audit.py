"""Finding planted label errors: `bertheads audit` against the peer recipe (cleanlab on 5-fold
logistic regression over mean-pooled embeddings, /work/shared/tools/peers/cleanlab_recipe.py),
in the same run, on the first N SST-2 training sentences with a fraction of labels flipped the
way the peer flips them (numpy RandomState(seed).choice). Also times one features-mode training
run on the same rows (the audit's target: within 2x of it). `--defaults`: the audit at its own
defaults (no epochs, learning rate, layers or merge passed), once per `--readers` (auto: the
kind's audit reader; head: the head `train` trains).

    python bench/audit.py --n 4000 --fraction 0.1 --seeds 0,1,2 --modes features
    python bench/audit.py --n 4000 --fraction 0.1 --seeds 3,4,5 --modes features --defaults --readers auto,head
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from common import DATA, OUT, cpu_line

EPOCHS, LR, LAYERS, COMBINE = 10, 1e-3, "-1,-2,-3,-4", "mean"  # the features-mode folds' settings but with --defaults
PEER = Path(__file__).resolve().parents[2] / "shared" / "tools" / "peers" / "cleanlab_recipe.py"


def noisy_file(n: int, fraction: float, seed: int, folder: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """The first n SST-2 rows with `fraction` of the labels flipped (as the peer does); the file,
    the flipped rows, the true labels."""
    source = DATA / "sst2" / "train.tsv"
    rows = list(csv.DictReader(open(source, encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE))[:n]
    y = np.array([int(r["label"]) for r in rows])
    flip = np.random.RandomState(seed).choice(n, int(n * fraction), replace=False)
    noisy = y.copy()
    noisy[flip] = 1 - noisy[flip]
    path = folder / f"sst2-{n}-{fraction}-{seed}.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"{r['sentence']}\t{v}\n" for r, v in zip(rows, noisy)),
                    encoding="utf-8")
    return path, flip, y


def measures(order: list[int], flagged: set[int], flip: np.ndarray) -> dict:
    k, flips = len(flip), set(flip.tolist())
    return {"precision_at_k": round(len(flips & set(order[:k])) / k, 3),
            "flagged": len(flagged), "precision_flagged": round(len(flips & flagged) / max(len(flagged), 1), 3),
            "recall_flagged": round(len(flips & flagged) / k, 3)}


def ours(path: Path, flip: np.ndarray, y: np.ndarray, mode: str, args, reader: str = "auto") -> dict:
    import bertheads

    options = dict(mode=mode, rows="all", folds=5, seed=args.train_seed, progress=False,
                   cache_dir=str(OUT / "audit" / "cache"), reader=reader)
    if args.defaults:  # (only what the command line gives)
        options.update({k: v for k, v in (("layers", args.layers), ("layer_combine", args.combine),
                                          ("epochs", args.epochs), ("lr", args.lr)) if v})
    elif mode == "features":
        options.update(epochs=args.epochs or EPOCHS, lr=args.lr or LR, batch_size=32, layers=args.layers or LAYERS,
                       layer_combine=args.combine or COMBINE)
    else:
        options.update(epochs=args.finetune_epochs, batch_size=32)
    started = time.perf_counter()
    result = bertheads.audit("classify", str(path), **options)
    seconds = time.perf_counter() - started
    order = [r["row"] for r in result.ranking]
    flagged = {r["row"] for r in result.ranking if r["flagged"]}
    suggested = np.zeros(len(y), dtype=int)
    for r in result.ranking:
        suggested[r["row"]] = int(r["suggested"])
    return {**measures(order, flagged, flip), "oof_acc_vs_true": round(float((suggested == y).mean()), 3),
            "seconds": round(seconds, 1), "reader": result.summary.get("reader")}


def train_once(path: Path, args) -> float:
    """One features-mode training run on the same rows and settings (warm cache; with
    --defaults, `train`'s own)."""
    import bertheads

    options = {} if args.defaults else dict(epochs=args.epochs or EPOCHS, lr=args.lr or LR, batch_size=32,
                                            layers=args.layers or LAYERS, layer_combine=args.combine or COMBINE)
    started = time.perf_counter()
    bertheads.train("classify", str(path), mode="features", progress=False, seed=args.train_seed,
                    cache_dir=str(OUT / "audit" / "cache"), **options)
    return round(time.perf_counter() - started, 1)


def peer(n: int, fraction: float, seed: int) -> dict:
    run = subprocess.run([sys.executable, str(PEER), str(DATA / "sst2" / "train.tsv"), str(n), str(fraction),
                          str(seed)], capture_output=True, text=True, cwd=PEER.parent)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"}
    line = json.loads(run.stdout.strip().splitlines()[-1])
    return {k: line[k] for k in ("precision_at_k", "found", "precision_found", "recall_found", "oof_acc_vs_true",
                                 "embed_s", "cv_cleanlab_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--modes", default="features", help="features, finetune or both (comma-separated)")
    parser.add_argument("--epochs", type=int, help=f"features mode: each fold's epochs (default {EPOCHS}; with "
                                                   "--defaults: the audit's)")
    parser.add_argument("--lr", type=float, help=f"features mode: each fold's learning rate (default {LR:g}; with "
                                                 "--defaults: the audit's)")
    parser.add_argument("--layers", help=f"features mode: the layers the heads read (default {LAYERS}; "
                                         "with --defaults: the audit's)")
    parser.add_argument("--combine", help=f"features mode: how the layers merge (concat, mean, ...; default {COMBINE}; "
                                          "with --defaults: the audit's)")
    parser.add_argument("--defaults", action="store_true", help="the audit at its defaults (mode and folds only)")
    parser.add_argument("--readers", default="auto", help="features mode: auto (the kind's reader), head, or both")
    parser.add_argument("--no-train-timing", action="store_true", help="skip timing one training run")
    parser.add_argument("--finetune-epochs", type=int, default=1)
    parser.add_argument("--train-seed", type=int, default=42)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--out", default=str(OUT / "audit" / "results.jsonl"))
    args = parser.parse_args()
    folder = OUT / "audit"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        path, flip, y = noisy_file(args.n, args.fraction, seed, folder)
        for mode in args.modes.split(","):
            for reader in args.readers.split(",") if mode == "features" else ["auto"]:
                who = f"bertheads audit --mode {mode}" + (f" --reader {reader}" if mode == "features" else "")
                rows.append({"who": who, "seed": seed, **ours(path, flip, y, mode, args, reader)})
                print(json.dumps(rows[-1]), flush=True)
        if "features" in args.modes and seed == int(args.seeds.split(",")[0]) and not args.no_train_timing:
            rows.append({"who": "bertheads train --mode features (one run)", "seed": seed,
                         "seconds": train_once(path, args)})
            print(json.dumps(rows[-1]), flush=True)
        if not args.no_peer:
            rows.append({"who": "peer: cleanlab + 5-fold logistic regression", "seed": seed,
                         **peer(args.n, args.fraction, seed)})
            print(json.dumps(rows[-1]), flush=True)
    report(rows, args.out, {"n": args.n, "fraction": args.fraction}, f"n={args.n} fraction={args.fraction}",
           [("precision at k (median, seeds)", ("precision_at_k",)),
            ("flagged precision", ("precision_flagged", "precision_found")),
            ("flagged recall", ("recall_flagged", "recall_found")), ("oof accuracy", ("oof_acc_vs_true",))])


def report(rows: list[dict], out: str, meta: dict, title: str, columns: list[tuple[str, tuple]]) -> None:
    """Append the rows to `out` (JSON lines, with `meta` and the machine) and print a table of
    each `who`'s medians over the seeds: `columns` are (header, the row keys it may be under)."""
    with open(out, "a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({**r, **meta, "machine": cpu_line()}) + "\n")
    print(f"\n{cpu_line()}\n{title}\n")
    print("| who | " + " | ".join(h for h, _ in columns) + " | seconds |")
    print("|---|" + "---|" * (len(columns) + 1))
    for who in dict.fromkeys(r["who"] for r in rows):
        mine = [r for r in rows if r["who"] == who]
        cells = []
        for _, keys in columns:
            values = [r[k] for r in mine for k in keys if k in r]
            cells.append(f"{statistics.median(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})" if values else "-")
        seconds = [r.get("seconds", r.get("embed_s", 0) + r.get("cv_cleanlab_s", 0)) for r in mine]
        print(f"| {who} | " + " | ".join(cells) + f" | {statistics.median(seconds):.1f} |")

if __name__ == "__main__":
    main()
