"""Little data: SST-2 at a few dozen to a few thousand training rows, bertheads' old defaults
(batch 32, 3 epochs), its defaults now (the recipe `training/budget.py` picks for the data's
size) and other recipes against the Hugging Face Trainer at its defaults, in the same run.

Each seed draws its own random sample of N rows from SST-2's training file (the same sample for
every arm) and seeds the run with it; accuracy is on the whole SST-2 dev set (872 sentences),
which bertheads also uses to choose its kept epoch (`--dev`, as a user with a dev file would).
One JSON line per (arm, size, seed) is appended to `--results`; a line already there is not run
again, so a stopped run continues where it stopped. `--table` prints the Markdown table of mean,
spread (standard deviation over seeds) and training seconds.

```
python bench/small_data.py --sizes 32,64,200,800,2000 --seeds 0,1,2 --arms old,new,trainer
python bench/small_data.py --table
```
Arms: `old` (batch 32, 3 epochs, fine-tuning, kept on dev: bertheads before the adaptive
recipe), `new` (bertheads with no training setting given), `trainer` (transformers' Trainer at
its defaults: batch 8, 3 epochs, lr 5e-5, no warm-up, the last epoch), and the recipes that
decided the rule: `ft8` (batch 8, a step budget), `feat` (`--mode features`, batch 8, the same
budget), `feat32` (`--mode features` at the old defaults), `contrastive` (`--mode contrastive`:
the encoder tuned on pairs as SetFit does, then the head as `feat` trains it), and the peer
`setfit` (the `setfit` package at its defaults on the same checkpoint: oversampled pairs, batch
16, one epoch, a logistic regression head; install it with `pip install -e .[peers]`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, OUT, cpu_line  # noqa: E402

RESULTS = OUT / "small_data.jsonl"


def sample(rows: list[dict], n: int, seed: int) -> list[dict]:
    """N training rows drawn at random (seed 0: the first N, as a user's first labels would be)."""
    if seed == 0:
        return rows[:n]
    return random.Random(seed).sample(rows, n)


def read_tsv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def write_tsv(rows: list[dict], path: Path) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, ["sentence", "label"], delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\")
        w.writeheader()
        w.writerows({"sentence": r["sentence"], "label": r["label"]} for r in rows)


def budget_epochs(n: int, batch: int, steps: int = 300, most: int = 20) -> int:
    """Epochs for about `steps` optimizer steps, at least 3 and at most `most`."""
    return max(3, min(most, math.ceil(steps / math.ceil(n / batch))))


def ours(arm: str, train: Path, dev: Path, n: int, seed: int, cache: Path) -> dict:
    import bertheads

    options: dict = {"seed": seed, "progress": False, "verbose": False}
    if arm == "old":
        options.update(batch_size=32, epochs=3, mode="finetune")
    elif arm == "ft8":
        options.update(batch_size=8, epochs=budget_epochs(n, 8), mode="finetune")
    elif arm == "feat":
        options.update(batch_size=8, epochs=budget_epochs(n, 8), mode="features", cache_dir=str(cache))
    elif arm == "feat32":
        options.update(batch_size=32, epochs=3, mode="features", cache_dir=str(cache))
    elif arm == "contrastive":
        options.update(batch_size=8, epochs=budget_epochs(n, 8), mode="contrastive")
    elif arm != "new":
        raise SystemExit(f"unknown arm {arm!r}")
    start = time.perf_counter()
    model = bertheads.train("classify", str(train), str(dev), None, **options)
    seconds = time.perf_counter() - start
    m = model.metrics
    return {"accuracy": m["dev"]["accuracy"], "mcc": m["dev"].get("mcc"), "seconds": seconds,
            "kept_epoch": m.get("best_epoch"), "learned_nothing": bool(m.get("learned_nothing")),
            "chosen": m.get("chosen"), **({"pairs": m["contrastive"]["pair_count"],
                                           "pair_seconds": m["contrastive"]["seconds"]} if m.get("contrastive") else {})}


def setfit_peer(train_rows: list[dict], dev_rows: list[dict], seed: int, work: Path) -> dict:
    """The `setfit` package at its defaults on the default checkpoint (a sentence-transformers
    model): contrastive pairs by oversampling, batch 16, one epoch, lr 2e-5; a logistic
    regression head on the tuned embeddings."""
    import transformers
    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments
    from setfit import logging as setfit_logging

    from bertheads.encoder.pretrained import default_model_path

    transformers.logging.set_verbosity_error()
    setfit_logging.set_verbosity_error()
    data = Dataset.from_dict({"text": [r["sentence"] for r in train_rows],
                              "label": [int(r["label"]) for r in train_rows]})
    start = time.perf_counter()
    model = SetFitModel.from_pretrained(default_model_path())
    args = TrainingArguments(batch_size=16, num_epochs=1, seed=seed, show_progress_bar=False, report_to="none",
                             output_dir=str(work / "setfit"))
    Trainer(model=model, args=args, train_dataset=data).train()
    seconds = time.perf_counter() - start
    predictions = [int(p) for p in model.predict([r["sentence"] for r in dev_rows])]
    gold = [int(r["label"]) for r in dev_rows]
    return {"accuracy": sum(p == g for p, g in zip(predictions, gold)) / len(gold), "seconds": seconds,
            "one_class": len(set(predictions)) == 1}


def trainer(train_rows: list[dict], dev_rows: list[dict], seed: int, work: Path) -> dict:
    """transformers' Trainer at its defaults on the default checkpoint (batch 8, 3 epochs)."""
    import numpy as np
    import torch
    import transformers
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from bertheads.encoder.pretrained import default_model_path

    transformers.logging.set_verbosity_error()
    source = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(source)

    def encoded(rows):
        enc = tokenizer([r["sentence"] for r in rows], truncation=True)
        return [{**{k: enc[k][i] for k in enc}, "labels": int(r["label"])} for i, r in enumerate(rows)]

    start = time.perf_counter()
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=2)
    args = TrainingArguments(output_dir=str(work / "trainer"), seed=seed, use_cpu=True, report_to="none",
                             save_strategy="no", logging_strategy="no", disable_tqdm=True)
    t = Trainer(model=model, args=args, train_dataset=encoded(train_rows),
                data_collator=DataCollatorWithPadding(tokenizer))
    t.train()
    seconds = time.perf_counter() - start
    predictions = t.predict(encoded(dev_rows)).predictions.argmax(-1)
    gold = np.array([int(r["label"]) for r in dev_rows])
    return {"accuracy": float((predictions == gold).mean()), "seconds": seconds,
            "one_class": bool(len(set(predictions.tolist())) == 1)}


def run(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    folder = DATA / "sst2"
    rows, dev_rows = read_tsv(folder / "train.tsv"), read_tsv(folder / "dev.tsv")
    done = set()
    if args.results.exists():
        for line in args.results.read_text().splitlines():
            r = json.loads(line)
            done.add((r["arm"], r["size"], r["seed"]))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="small_data_") as tmp:
        work = Path(tmp)
        cache = Path(args.cache) if args.cache else work / "cache"
        for seed in args.seeds:
            for n in args.sizes:
                train_rows = sample(rows, n, seed)
                train = work / f"train_{n}_{seed}.tsv"
                write_tsv(train_rows, train)
                for arm in args.arms:
                    if (arm, n, seed) in done:
                        continue
                    print(f"[{time.strftime('%H:%M:%S')}] {arm} n={n} seed={seed}", flush=True)
                    if arm == "trainer":
                        result = trainer(train_rows, dev_rows, seed, work)
                    elif arm == "setfit":
                        result = setfit_peer(train_rows, dev_rows, seed, work)
                    else:
                        result = ours(arm, train, folder / "dev.tsv", n, seed, cache)
                    record = {"arm": arm, "size": n, "seed": seed, **result}
                    print(json.dumps(record), flush=True)
                    with open(args.results, "a") as f:
                        f.write(json.dumps(record) + "\n")


def table(path: Path, arms: list[str] | None = None) -> str:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    arms = arms or list(dict.fromkeys(r["arm"] for r in records))
    sizes = sorted({r["size"] for r in records})
    lines = ["| rows | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|"]
    for n in sizes:
        cells = []
        for arm in arms:
            got = [r for r in records if r["arm"] == arm and r["size"] == n]
            if not got:
                cells.append("")
                continue
            acc = [r["accuracy"] for r in got]
            spread = statistics.stdev(acc) if len(acc) > 1 else 0.0
            secs = statistics.median(r["seconds"] for r in got)
            cells.append(f"{statistics.mean(acc):.3f} ± {spread:.3f} ({len(acc)}; {secs:.0f} s)")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="32,64,200,800,2000")
    p.add_argument("--seeds", default="0")
    p.add_argument("--arms", default="old,new,trainer")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache", default=None, help="features cache folder (default: a temporary one)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--table", action="store_true", help="print the table of --results and stop")
    args = p.parse_args()
    args.arms = args.arms.split(",")
    if args.table:
        print(f"{cpu_line()}\n")
        print(table(args.results, args.arms if "--arms" in sys.argv else None))
        return
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run(args)


if __name__ == "__main__":
    main()
