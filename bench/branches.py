"""Branches (`--tune-layers N`) against full fine-tuning: SST-2's first `--rows` training rows,
one epoch, batch 32, fp32, dev accuracy on all of SST-2 dev (872), in one run:

- `trainer`: transformers' Trainer fine-tuning every layer (bench/gpu_sides.py `trainer_classify`:
  lr 5e-5, warm-up 0.1, weight decay 0.01, max length 128);
- `finetune` (with `--finetune`): bertheads fine-tuning (`mode="finetune"`, lr 5e-5);
- `N=k`: bertheads with `tune_layers=k` (the head's own top k layers on the frozen checkpoint's
  states, cached at the split layer first; lr 1e-4, the branch default); `N=0` is features mode
  on the last layer; `N=all` tunes every layer but the embeddings;
- `N=2 warm`: `N=2` again with its cache entry there: what a later epoch (or a tune trial, an
  audit fold) costs once the trunk's states are cached.

Seconds: the `bertheads.train` call (loading, reading, caching, the epoch, the dev evaluation)
or, for the Trainer, loading, tokenising and `Trainer.train`. One JSON line per arm goes to
`--out` (bench/out/branches.jsonl); `--table` prints the Markdown table of a results file.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/branches.py            # every arm, then the table
    PYTHONPATH=src python bench/branches.py --table
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

DATA = Path("/work/shared/data/sst2")
OUT = Path(__file__).resolve().parent / "out"


def rows(path: Path, limit: int | None = None) -> tuple[list[str], list[int]]:
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    lines = lines[:limit] if limit else lines
    texts, labels = zip(*(line.rsplit("\t", 1) for line in lines))
    return list(texts), [int(x) for x in labels]


def ours(args, train: Path, cache: Path, **given) -> dict:
    import bertheads

    start = time.perf_counter()
    model = bertheads.train("classify", str(train), str(DATA / "dev.tsv"), None, model=args.model, seed=args.seed,
                            epochs=1, batch_size=32, precision="fp32", recipe="fixed", progress=False,
                            verbose=False, cache_dir=str(cache), **given)
    seconds = time.perf_counter() - start
    dev = model.metrics["dev"]
    return {"accuracy": dev["accuracy"], "seconds": seconds, "chosen": model.metrics.get("chosen")}


def trainer(args, train: Path, work: Path) -> dict:
    from gpu_sides import trainer_classify

    texts, gold = rows(train)
    dev = rows(DATA / "dev.tsv")
    start = time.perf_counter()
    record, predicted = trainer_classify(SimpleNamespace(model=args.model, batch_size=32, lr=5e-5), "cpu", work,
                                         (texts, gold), dev, 2, epochs=1, seed=args.seed, bf16=False)
    seconds = time.perf_counter() - start - record["predict_seconds"]
    accuracy = sum(int(p == g) for p, g in zip(predicted, dev[1])) / len(dev[1])
    return {"accuracy": accuracy, "seconds": seconds, "train_loop_seconds": record["train_seconds"]}


def arms(args) -> list[tuple[str, dict]]:
    out = [("trainer", {})] + ([("finetune", {"mode": "finetune"})] if args.finetune else [])
    for n in args.tune.split(","):
        out.append((f"N={n}", {"tune_layers": n}))
        if n == "2":
            out.append(("N=2 warm", {"tune_layers": "2", "warm": True}))
    return out


def run(args) -> None:
    from bertheads.encoder.pretrained import Encoder

    layers = Encoder.load(args.model, lazy=True).info.num_layers
    work = OUT / "branches"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    train = work / "train.tsv"
    lines = (DATA / "train.tsv").read_text(encoding="utf-8").splitlines()
    train.write_text("\n".join(lines[: args.rows + 1]) + "\n", encoding="utf-8")
    cache = work / "cache"
    for name, given in arms(args):
        given = dict(given)
        warm = given.pop("warm", False)
        if "tune_layers" in given:
            n = given["tune_layers"]
            given["tune_layers"] = layers if n == "all" else int(n)
            if not warm:
                shutil.rmtree(cache, ignore_errors=True)  # each arm builds its own entry (timed)
        record = trainer(args, train, work) if name == "trainer" else ours(args, train, cache, **given)
        record = {"arm": name, "rows": args.rows, "seed": args.seed, "model": args.model, **record}
        print(json.dumps(record), flush=True)
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def table(path: Path) -> str:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    peer = next((r for r in records if r["arm"] == "trainer"), None)
    lines = ["| arm | dev accuracy | vs Trainer | seconds | x Trainer's time |", "|---|---|---|---|---|"]
    for r in records:
        gap = f"{100 * (r['accuracy'] - peer['accuracy']):+.1f}" if peer else ""
        ratio = f"{r['seconds'] / peer['seconds']:.2f}" if peer else ""
        lines.append(f"| {r['arm']} | {r['accuracy']:.3f} | {gap} | {r['seconds']:.0f} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tune", default="2,1,3,0,all", help="the N values, comma-separated, in run order")
    parser.add_argument("--finetune", action="store_true", help="also bertheads' own fine-tuning")
    parser.add_argument("--out", type=Path, default=OUT / "branches.jsonl")
    parser.add_argument("--table", action="store_true", help="print the table of --out and stop")
    args = parser.parse_args()
    if not args.table:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        run(args)
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
