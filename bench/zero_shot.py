"""Starting from zero labels: a classify head from label descriptions alone (0 rows), and heads
trained on 8 to 200 rows that start from those descriptions (`desc`) or without them (`plain`),
on the default checkpoint, scored on a whole test split.

Sets (`--set`): `sst2` (GLUE SST-2 from $BERTHEADS_DATA, its dev split of 872 as the test split),
`goemotions-ekman` (multi-label: 7 emotion groups; its dev split as the dev file, which picks the
kept epoch and the per-label thresholds, and micro-F1 on its test split's first 2,000 rows) and `trec` (TREC-10 question types, 6 coarse classes, 5,452 / 500, from a public repository:
bench/public_sets.py --setup writes it to $BERTHEADS_PUBLIC_SETS, default
/work/cache/public-sets; only its path is read here). `DESCRIPTIONS` holds each set's label
descriptions (a sentence like the label's texts, written once, not tuned on the test split).

Each seed draws its own N training rows: one of each class first (so that 8 TREC rows know every
class the test split holds: bertheads refuses a dev file with a label its training lacks), then
the rest at random, seed by seed, the same rows for both arms. `--mode auto` trains with
bertheads' defaults (the recipe for the data's size: contrastive mode up to 200 rows); `--mode
features` the head alone on the frozen encoder (seconds). The test split is the dev file, so the
kept epoch is chosen on it, as in bench/small_data.py, for both arms alike.

One JSON line per (set, mode, size, seed, arm) in bench/out/zero_shot.jsonl; a line already there
is not run again. Runs go one at a time in this process.

```
python bench/zero_shot.py --set sst2,trec --sizes 0,8,32,64,200 --seeds 0,1,2,3,4 --mode features
python bench/zero_shot.py --set sst2 --sizes 8,32 --seeds 0,1 --mode auto --threads 2
python bench/zero_shot.py --set goemotions-ekman --sizes 0,8,32,64,200 --seeds 0,1,2 --mode features
python bench/zero_shot.py --table
```
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, cpu_line  # noqa: E402
from public_sets import path as public_path  # noqa: E402
from zero_shot_multilabel import DESCRIPTIONS as MULTI_LABEL_DESCRIPTIONS  # noqa: E402

MULTI_LABEL = {"goemotions-ekman"}  # its dev split chooses (epoch, thresholds), its test split scores
TEST_ROWS = 2000  # a multi-label set's test rows scored (its first ones)


def files(name: str) -> tuple:
    """A set's training, dev and test files (bench/public_sets.py says where each is); the
    single-label sets' dev file is their test file."""
    test = public_path(name, "test")
    return public_path(name, "train"), public_path(name, "dev") if name in MULTI_LABEL else test, test
DESCRIPTIONS = {
    "sst2": {"0": "I hated this film, it was terrible", "1": "I loved this film, it was wonderful"},
    "trec": {"ABBR": "What does the abbreviation NASA stand for?",
             "DESC": "Why is the sky blue, and how does a rainbow form?",
             "ENTY": "What kind of animal is a whale, and what is the name of that color?",
             "HUM": "Who was the first president of the United States?",
             "LOC": "Where is the tallest mountain in the world, in which country or city?",
             "NUM": "How many people live in Tokyo, and in what year was it founded?"},
    "goemotions-ekman": MULTI_LABEL_DESCRIPTIONS[("goemotions-ekman", "like")],
}
RESULTS = OUT / "zero_shot.jsonl"


def read_rows(path: Path) -> tuple[str, list[tuple]]:
    """The text column's name and (text, label) rows (a multi-label set's label: a tuple of names)."""
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return "text", [(r["text"], tuple(r["label"])) for r in rows]
    lines = path.read_text(encoding="utf-8").split("\n")
    header = lines[0].split("\t")
    return header[0], [tuple(line.rstrip("\n").split("\t")[:2]) for line in lines[1:] if line.strip()]


def sample(rows: list, n: int, seed: int) -> list:
    """One row of each class (in a seeded order), then the rest at random."""
    rng = random.Random(seed)
    order = list(range(len(rows)))
    rng.shuffle(order)
    first = {}
    for i in order:
        for label in rows[i][1] if isinstance(rows[i][1], tuple) else [rows[i][1]]:
            first.setdefault(label, i)
    first = dict.fromkeys(first.values())  # (a row may be the first of two labels)
    chosen = list(first)[:n]
    taken = set(chosen)
    chosen += [i for i in order if i not in taken][:n - len(chosen)]
    return [rows[i] for i in chosen]


def run_one(name: str, mode: str, n: int, seed: int, arm: str, model: str, work: Path) -> dict:
    import bertheads

    train_file, dev_file, test_file = files(name)
    column, rows = read_rows(train_file)
    described = [f"{k}: {v}" for k, v in DESCRIPTIONS[name].items()]
    train = None
    if n and name in MULTI_LABEL:
        train = work / f"{name}-{n}-{seed}.jsonl"
        train.write_text("".join(json.dumps({"text": t, "label": list(lab)}) + "\n" for t, lab in sample(rows, n, seed)))
    elif n:
        train = work / f"{name}-{n}-{seed}.tsv"
        train.write_text(f"{column}\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in sample(rows, n, seed)))
    options = {"label_descriptions": described} if arm == "desc" else {}
    if name in MULTI_LABEL:
        options["problem"] = "multi_label"
    if mode == "features" and n:
        options["mode"] = "features"
    start = time.perf_counter()
    trained = bertheads.train("classify", None if train is None else str(train), str(dev_file), None,
                              model=model, seed=seed, progress=False, verbose=False,
                              cache_dir=str(work / "cache"), **options)
    seconds = time.perf_counter() - start
    dev = trained.metrics["dev"]
    if name in MULTI_LABEL:  # scored on the test split's first rows (the dev split chose epoch and thresholds)
        _, test_rows = read_rows(test_file)
        got = trained.evaluate([{"text": t, "label": list(lab)} for t, lab in test_rows[:TEST_ROWS]])
        return {"set": name, "mode": mode if n else "none", "rows": n, "seed": seed, "arm": arm,
                "accuracy": got["micro_f1"], "macro_f1": got["macro_f1"], "score": "micro_f1",
                "seconds": round(seconds, 1), "kept_epoch": trained.metrics.get("best_epoch"),
                "chosen": trained.metrics.get("chosen"), "load": os.getloadavg()[0]}
    return {"set": name, "mode": mode if n else "none", "rows": n, "seed": seed, "arm": arm,
            "accuracy": dev["accuracy"], "f1": dev.get("f1"), "mcc": dev.get("mcc"), "seconds": round(seconds, 1),
            "kept_epoch": trained.metrics.get("best_epoch"), "chosen": trained.metrics.get("chosen"),
            "load": os.getloadavg()[0]}


def key(r: dict) -> tuple:
    return r["set"], r["mode"], r["rows"], r["seed"], r["arm"]


def table(records: list[dict]) -> str:
    """Mean ± spread over seeds (n seeds; median seconds) per set, mode and rows, arms side by side."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["set"], r["mode"]), {}).setdefault(r["rows"], {}).setdefault(r["arm"], []).append(r)
    out = []
    for (name, mode), sizes in sorted(groups.items()):
        if mode == "none":
            continue
        zero = [r for r in records if r["set"] == name and r["rows"] == 0]
        what = (f"micro-F1 on the first {TEST_ROWS} test rows (macro-F1 in the JSON lines)" if name in MULTI_LABEL
                else "accuracy")
        out.append(f"\n{name}, --mode {mode} at 1+ rows; {what}\n\n| rows | desc (from the descriptions) | plain (without) | "
                   f"desc - plain |\n|---|---|---|---|")
        if zero:
            acc = [r["accuracy"] for r in zero]
            chance = "" if name in MULTI_LABEL else f"(one class in {len(DESCRIPTIONS[name])}: {1 / len(DESCRIPTIONS[name]):.3f})"
            out.append(f"| 0 | {statistics.mean(acc):.3f} (zero-label; {statistics.median(r['seconds'] for r in zero):.0f} s) "
                       f"| {chance} | |")
        for n in sorted(sizes):
            cells, means = [], {}
            for arm in ("desc", "plain"):
                rs = sizes[n].get(arm, [])
                if not rs:
                    cells.append("not run")
                    continue
                acc = [r["accuracy"] for r in rs]
                means[arm] = {r["seed"]: r["accuracy"] for r in rs}
                spread = statistics.stdev(acc) if len(acc) > 1 else 0.0
                cells.append(f"{statistics.mean(acc):.3f} ± {spread:.3f} ({len(acc)}; "
                             f"{statistics.median(r['seconds'] for r in rs):.0f} s)")
            both = sorted(set(means.get("desc", {})) & set(means.get("plain", {})))
            diff = (f"{100 * statistics.mean(means['desc'][s] - means['plain'][s] for s in both):+.1f} points "
                    f"({sum(means['desc'][s] > means['plain'][s] for s in both)}/{len(both)} seeds ahead)"
                    if both else "")
            out.append(f"| {n} | {cells[0]} | {cells[1]} | {diff} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default="sst2", help="sst2, trec, goemotions-ekman (comma-separated)")
    p.add_argument("--sizes", default="0,8,32,64,200")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--arms", default="desc,plain")
    p.add_argument("--mode", default="features", choices=("features", "auto"))
    p.add_argument("--model", default="default")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--budget", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--table", action="store_true")
    args = p.parse_args()
    records = [json.loads(x) for x in RESULTS.read_text().splitlines() if x.strip()] if RESULTS.exists() else []
    if args.table:
        print(cpu_line())
        print(table(records))
        return
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    done = {key(r) for r in records}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="zero-shot-", dir=OUT))
    for name in args.set.split(","):
        for seed in map(int, args.seeds.split(",")):
            for n in map(int, args.sizes.split(",")):
                for arm in args.arms.split(","):
                    if n == 0 and (arm != "desc" or seed != 0):
                        continue  # (zero labels: no rows to draw, one run)
                    wanted = (name, args.mode if n else "none", n, seed, arm)
                    if wanted in done:
                        continue
                    if args.budget and time.perf_counter() - began > args.budget:
                        print("budget spent", flush=True)
                        return
                    record = run_one(name, args.mode, n, seed, arm, args.model, work)
                    with RESULTS.open("a") as f:
                        f.write(json.dumps(record) + "\n")
                    done.add(wanted)
                    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
