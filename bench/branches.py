"""Branches (`--tune-layers N`) against full fine-tuning, one epoch, batch 32, fp32, in one run,
on one task (`--task`):

- `sst2`: SST-2's first `--rows` training rows (8,000), dev accuracy on all of SST-2 dev (872);
- `conll`: CoNLL-2003's first `--rows` training sentences (all 14,041), entity F1 (seqeval's
  default mode) on all of its dev sentences (3,250);
- `squad`: the first `--rows` questions (4,000) of SQuAD v1.1's `train-split.json`, EM and F1
  on the first 1,000 questions of `eval-split.json` (other articles); windows of 384 tokens,
  stride 128, questions cut to 64 tokens on both sides.

`--dev-rows` takes the first N dev rows (sentences, questions) instead. The arms:

- `trainer`: transformers' Trainer fine-tuning every layer (bench/gpu_sides.py `trainer_classify`,
  `trainer_tag`, `trainer_qa`: lr 5e-5, batch 32, warm-up 0.1, weight decay 0.01, max length 128
  but for squad);
- `finetune` (with `--finetune`): bertheads fine-tuning (`mode="finetune"`, lr 5e-5);
- `N=k`: bertheads with `tune_layers=k` (the head's own top k layers on the frozen checkpoint's
  states, cached at the split layer first; the branch default lr: 1e-4 until 2026-12-06, then 3e-4); `N=0` is features mode
  on the last layer; `N=all` tunes every layer but the embeddings;
- `N=2 warm`: `N=2` again with its cache entry there: what a later epoch (or a tune trial, an
  audit fold) costs once the trunk's states are cached.

Seconds: the `bertheads.train` call (loading, reading, caching, the epoch, the dev evaluation)
or, for the Trainer, loading, tokenising and `Trainer.train`. One JSON line per arm goes to
`--out` (bench/out/branches.jsonl); `--table` prints the Markdown tables of a results file, one
per task and training size (the mean over seeds where a file holds several).

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/branches.py                         # SST-2, every arm
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/branches.py --task conll            # CoNLL-2003, full
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/branches.py --task squad --rows 4000
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/branches.py --task sst2 --seed 7    # another seed
    PYTHONPATH=src python bench/branches.py --table
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

DATA = Path("/work/shared/data")
OUT = Path(__file__).resolve().parent / "out"


# -- the tasks: data, our kind, the Trainer's side and the metric ----------------------------------
def rows(path: Path, limit: int | None = None) -> tuple[list[str], list[int]]:
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    lines = lines[:limit] if limit else lines
    texts, labels = zip(*(line.rsplit("\t", 1) for line in lines))
    return list(texts), [int(x) for x in labels]


def sst2_subset(source: Path, to: Path, limit: int | None) -> int:
    lines = source.read_text(encoding="utf-8").splitlines()
    kept = lines[1:][:limit] if limit else lines[1:]
    to.write_text("\n".join([lines[0], *kept]) + "\n", encoding="utf-8")
    return len(kept)


def conll_subset(source: Path, to: Path, limit: int | None) -> int:
    from tag import read_conll, write_conll

    sentences = read_conll(source, limit)
    write_conll(to, sentences)
    return len(sentences)


def squad_subset(source: Path, to: Path, limit: int | None) -> int:
    """The first `limit` questions of a SQuAD JSON file, in file order, as a SQuAD JSON file."""
    data, left = json.loads(source.read_text(encoding="utf-8")), limit
    articles = []
    for article in data["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            qas = paragraph["qas"][:left] if left is not None else paragraph["qas"]
            if qas:
                paragraphs.append({**paragraph, "qas": qas})
            left = None if left is None else left - len(qas)
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    to.write_text(json.dumps({"version": data.get("version", ""), "data": articles}), encoding="utf-8")
    return sum(len(p["qas"]) for a in articles for p in a["paragraphs"])


def trainer_sst2(args, work: Path, train: Path, dev: Path) -> tuple[dict, dict]:
    from gpu_sides import trainer_classify

    gold = rows(dev)
    record, predicted = trainer_classify(peer_args(args), "cpu", work, rows(train), gold, 2, **peer_hyper(args))
    return record, {"accuracy": sum(int(p == g) for p, g in zip(predicted, gold[1])) / len(gold[1])}


def trainer_conll(args, work: Path, train: Path, dev: Path) -> tuple[dict, dict]:
    from gpu_sides import trainer_tag
    from tag import read_conll

    from bertheads.tasks.tag.scheme import entity_metrics

    gold = read_conll(dev)
    record, predicted = trainer_tag(peer_args(args), "cpu", work, read_conll(train), gold, **peer_hyper(args))
    return record, {"f1": entity_metrics([t for _, t in gold], predicted)["f1"]}


def trainer_squad(args, work: Path, train: Path, dev: Path) -> tuple[dict, dict]:
    from gpu_sides import trainer_qa

    from bertheads.tasks.qa.formats import read_examples
    from bertheads.tasks.qa.metrics import squad_v1_scores

    gold = read_examples(str(dev))
    record, answers = trainer_qa(peer_args(args), "cpu", work, read_examples(str(train), strict=False), gold,
                                 **peer_hyper(args))
    got = squad_v1_scores(answers, gold)
    return record, {"f1": got["f1"], "exact_match": got["exact_match"]}


def peer_args(args) -> SimpleNamespace:
    return SimpleNamespace(model=args.model, batch_size=32, lr=5e-5)


def peer_hyper(args) -> dict:
    return {"epochs": 1, "seed": args.seed, "bf16": False}


@dataclass(frozen=True)
class Task:
    kind: str  # bertheads' task kind
    train: Path
    dev: Path
    suffix: str  # of the subset files
    subset: object  # (source, to, limit) -> how many rows it holds
    trainer: object  # (args, work, train, dev) -> (the Trainer's record, its scores)
    rows: int | None  # training rows by default (None: all)
    dev_rows: int | None
    metrics: tuple[str, ...]  # the first is the main one
    percent: bool  # metrics already in percent (else a share, shown in points x 100)


TASKS = {
    "sst2": Task("classify", DATA / "sst2/train.tsv", DATA / "sst2/dev.tsv", ".tsv", sst2_subset, trainer_sst2,
                 8000, None, ("accuracy",), False),
    "conll": Task("tag", DATA / "conll2003/train.txt", DATA / "conll2003/dev.txt", ".txt", conll_subset,
                  trainer_conll, None, None, ("f1",), False),
    "squad": Task("qa", DATA / "squad/train-split.json", DATA / "squad/eval-split.json", ".json", squad_subset,
                  trainer_squad, 4000, 1000, ("f1", "exact_match"), True),
}


# -- the arms --------------------------------------------------------------------------------------
def ours(args, task: Task, train: Path, dev: Path, cache: Path, **given) -> dict:
    import bertheads

    start = time.perf_counter()
    model = bertheads.train(task.kind, str(train), str(dev), None, model=args.model, seed=args.seed,
                            epochs=1, batch_size=32, precision="fp32", recipe="fixed", progress=False,
                            verbose=False, cache_dir=str(cache), **given)
    seconds = time.perf_counter() - start
    dev_metrics = model.metrics["dev"]
    return {**{m: dev_metrics[m] for m in task.metrics}, "seconds": seconds, "chosen": model.metrics.get("chosen")}


def trainer(args, task: Task, train: Path, dev: Path, work: Path) -> dict:
    start = time.perf_counter()
    record, scores = task.trainer(args, work, train, dev)
    seconds = time.perf_counter() - start - record["predict_seconds"]
    return {**scores, "seconds": seconds, "train_loop_seconds": record["train_seconds"]}


def arms(args) -> list[tuple[str, dict]]:
    out = ([] if args.no_trainer else [("trainer", {})]) + ([("finetune", {"mode": "finetune"})] if args.finetune else [])
    lr = {"lr": args.branch_lr} if args.branch_lr else {}
    tag = f" lr {args.branch_lr:g}" if args.branch_lr else ""
    for n in args.tune.split(","):
        out.append((f"N={n}{tag}", {"tune_layers": n, **lr}))
        if n == "2" and not args.no_warm:
            out.append((f"N=2{tag} warm", {"tune_layers": "2", "warm": True, **lr}))
    return out


def run(args) -> None:
    from bertheads.encoder.pretrained import Encoder

    task = TASKS[args.task]
    layers = Encoder.load(args.model, lazy=True).info.num_layers
    work = OUT / "branches"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    train, dev = work / f"train{task.suffix}", work / f"dev{task.suffix}"
    limit = task.rows if args.rows is None else args.rows or None  # --rows 0: all
    dev_limit = task.dev_rows if args.dev_rows is None else args.dev_rows or None
    n_train, n_dev = task.subset(task.train, train, limit), task.subset(task.dev, dev, dev_limit)
    cache = work / "cache"
    for name, given in arms(args):
        given = dict(given)
        warm = given.pop("warm", False)
        if "tune_layers" in given:
            n = given["tune_layers"]
            given["tune_layers"] = layers if n == "all" else int(n)
            if not warm:
                shutil.rmtree(cache, ignore_errors=True)  # each arm builds its own entry (timed)
        record = (trainer(args, task, train, dev, work) if name == "trainer"
                  else ours(args, task, train, dev, cache, **given))
        record = {"task": args.task, "arm": name, "rows": n_train, "dev_rows": n_dev, "seed": args.seed,
                  "model": args.model, **record}
        print(json.dumps(record), flush=True)
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


LABELS = {"accuracy": "accuracy", "f1": "F1", "exact_match": "EM"}


# -- the table -------------------------------------------------------------------------------------
def table(path: Path) -> str:
    """A table per task and training size: each arm's metrics (the mean over seeds where there
    are several), the gap to the Trainer's in points and the time as a multiple of its."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in records:
        groups.setdefault((r.get("task", "sst2"), r["rows"]), {}).setdefault(r["arm"], []).append(r)
    return "\n\n".join(group_table(name, size, by_arm) for (name, size), by_arm in groups.items())


def group_table(name: str, size: int, by_arm: dict[str, list[dict]]) -> str:
    task = TASKS[name]
    seeds = sorted({r["seed"] for runs in by_arm.values() for r in runs})
    scale = 1 if task.percent else 100
    mean = {arm: {k: statistics.mean(r[k] for r in runs) for k in (*task.metrics, "seconds")}
            for arm, runs in by_arm.items()}
    peer = mean.get("trainer")
    dev_rows = next(iter(by_arm.values()))[0].get("dev_rows")
    title = (f"{name}: {size} training rows" + (f", {dev_rows} dev rows" if dev_rows else "")
             + (f", seed {seeds[0]}" if len(seeds) == 1 else f", mean over seeds {', '.join(map(str, seeds))}"))
    main = task.metrics[0]
    head = "| arm | " + " | ".join(f"dev {LABELS[m]}" for m in task.metrics) + " | vs Trainer | seconds | x Trainer's time |"
    lines = [title, "", head, "|---" * (len(task.metrics) + 4) + "|"]
    for arm, m in mean.items():
        shown = " | ".join(f"{m[k]:.2f}" if task.percent else f"{m[k]:.3f}" for k in task.metrics)
        gap = f"{scale * (m[main] - peer[main]):+.1f}" if peer else ""
        ratio = f"{m['seconds'] / peer['seconds']:.2f}" if peer else ""
        runs = f" ({len(by_arm[arm])} seeds)" if len(seeds) > 1 and len(by_arm[arm]) != len(seeds) else ""
        lines.append(f"| {arm}{runs} | {shown} | {gap} | {m['seconds']:.0f} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="sst2")
    parser.add_argument("--model", default="default")
    parser.add_argument("--rows", type=int, default=None,
                        help="the first N training rows: sentences for conll, questions for squad (default: sst2 "
                             "8000, conll all, squad 4000; 0: all)")
    parser.add_argument("--dev-rows", type=int, default=None,
                        help="the first N dev rows (default: all, squad 1000; 0: all)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tune", default="2,1,3,0,all", help="the N values, comma-separated, in run order")
    parser.add_argument("--finetune", action="store_true", help="also bertheads' own fine-tuning")
    parser.add_argument("--no-trainer", action="store_true", help="leave the Trainer out (its row from an earlier run)")
    parser.add_argument("--no-warm", action="store_true", help="leave out the N=2 run on a warm cache")
    parser.add_argument("--branch-lr", type=float, default=None, help="the branches' learning rate (default: theirs)")
    parser.add_argument("--out", type=Path, default=OUT / "branches.jsonl")
    parser.add_argument("--table", action="store_true", help="print the tables of --out and stop")
    args = parser.parse_args()
    if not args.table:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        run(args)
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
