"""Little data: each task kind at a few dozen to a few thousand training examples, bertheads'
old defaults, its defaults now (the recipe for the data's size, `tasks/recipes.py`) and the
candidate recipes a kind's table could take, against the Hugging Face Trainer at its defaults
and SetFit, in the same run.

Tasks (`--task`, several comma-separated; each has its own results file in `--out-dir`):

| task | kind | training examples (default sizes) | scored on | metrics |
|---|---|---|---|---|
| sst2 | classify | SST-2 rows (32, 64, 200, 800, 2000) | all of SST-2 dev (872) | accuracy (F1, MCC kept) |
| mrpc | classify (pairs) | MRPC rows (200, 800) | all of MRPC dev (408) | accuracy and F1 (of "paraphrase") |
| conll | tag | CoNLL-2003 sentences (50, 200, 1000) | all of CoNLL-2003 dev (3,250 sentences) | entity F1 (seqeval) |
| squad | qa | SQuAD v1.1 questions of squad/train-split.json (200, 1000) | the first 1,000 questions of squad/eval-split.json (a fixed slice, as bench/gpu.py; other articles than training's) | SQuAD F1 and EM |

Each seed draws its own sample of N examples from the task's training file (seed 0: the first
N, as a user's first labels would be; seed s: N drawn at random with seed s; SQuAD samples
questions, each with its passage; CoNLL samples sentences), written as a file of the task's own
format, the same for every arm; the run is seeded with it. bertheads also chooses its kept
epoch on the dev set (`--dev`, as a user with a dev file would). The metrics come from the code
bertheads scores with (`tasks/classify/metrics.py label_metrics`, `tasks/tag/scheme.py
entity_metrics`, `tasks/qa/metrics.py squad_v1_scores`), for every arm.

Arms (`ARMS`; an arm a task cannot take is skipped, said once with why):
- `new`: bertheads with no training setting given (the kind's recipe table decides).
- `old`: bertheads' fixed defaults (`recipe="fixed"`: fine-tuning, batch 32 (qa 16), 3 epochs,
  the best epoch kept on dev). For tag and qa, whose tables are one fixed row still, it is the
  same run as `new` (so not among their default arms).
- candidate recipes, each tried as the kind's whole table (one `Recipe` row, so the run is what
  that row would give, epochs counted on the kind's training features: qa's windows): `ft8` /
  `ft16` (fine-tuning, batch 8 / 16, epochs for about 300 optimizer steps, 3 to 20), `ft8long`
  (batch 8, about 600 steps, 3 to 40 epochs), `ft32long` (batch 32, about 600 steps, 3 to 20
  epochs), `feat`
  (`--mode features`, batch 8, the same budget), `feat32` (`--mode features`, batch 32, 3
  epochs), `contrastive` (single-text classify: the encoder tuned on pairs of examples as
  SetFit does, then the head as `feat` trains it), `pairs5k` (the same with 5,000 pairs: the
  arm that measured the default cap, which `contrastive` now takes too), `pairs32k` (32,000 pairs: setfit20's
  count at 800 rows).
- `trainer`: transformers' Trainer at its defaults (batch 8, 3 epochs, lr 5e-5, no warm-up, no
  weight decay, fp32, the last epoch) on the same checkpoint, by bench/gpu_sides.py's Trainer
  side of the kind (max length 128; qa: run_qa's windows of 384 tokens, stride 128).
- `setfit`: the `setfit` package at its defaults (oversampled pairs, batch 16, one epoch, a
  logistic-regression head; `pip install -e .[peers]`) on single-text classification up to 200
  rows: it embeds one text per input (no sentence pairs: skipped for MRPC), and its pairs grow
  with the square of the rows (about 320,000 at 800 rows). Not installed: its runs are skipped. `setfit20`: the
  same with `num_iterations=20` (2 x 20 pairs a row: 32,000 at 800 rows; SetFit's count before
  1.0), at any size.

Seconds: the training call, from loading the checkpoint to the trained model (ours:
`bertheads.train`, with its dev evaluations; the Trainer: loading, tokenising, `Trainer.train`;
SetFit: loading, `Trainer.train`); `wall_seconds`: the whole run with scoring.

The runs go seed by seed (every task, size and arm of seed 0, then seed 1, ...), so a stopped
run holds whole seeds first. One JSON line per (arm, size, seed) is appended to the task's
results file (`--out-dir`/small_data.jsonl for sst2, small_data_TASK.jsonl for the others); a
line already there is not run again, so a stopped run continues where it stopped. `--budget S`
starts no run after S seconds (nor one that took longer before than what is left). `--shard
K/N` runs every N-th run from the K-th: N processes share one GPU (a small model at batch 8
leaves most of it idle) and append to the same files; their seconds are then under that
contention (each record says `shards`). A run that fails is said (traceback) and not recorded;
the others go on, and the exit status is 1. `--table` prints each task's Markdown tables: mean
± spread (standard deviation over seeds), the number of seeds, the median training seconds
(`--per-seed`: each seed's arms side by side too).

CoNLL: every sample of seeds 0 to 4 at 50 sentences or more holds all nine tags of the dev file;
a smaller one may lack one, and bertheads refuses a dev file with a tag its training data lacks.

On a CUDA device bertheads trains there by itself (bf16, its `auto` precision), and so do the
Trainer (fp32, its default) and SetFit; on the CPU use small sizes and `--limit-dev`. Commands:

```
python bench/small_data.py --task sst2 --sizes 20 --seeds 0 --arms new,trainer --limit-dev 50 --out-dir /tmp/sd
python bench/small_data.py --task conll --sizes 50 --seeds 0 --arms new,trainer --limit-dev 50 --out-dir /tmp/sd
python bench/small_data.py --task sst2,mrpc,conll,squad --seeds 0,1,2,3,4       # every default size and arm
python bench/small_data.py --task conll,squad --sizes squad=200,1000 --arms squad=new,trainer,ft8 --seeds 0,1
python bench/small_data.py --table --task sst2,mrpc,conll,squad
```
(`--sizes`, `--arms` and `--limit-dev` take a value for every task, or `TASK=VALUE` for one,
repeated. SQuAD's runs are the longest: bertheads evaluates the 1,000 dev questions after every
epoch, up to 20 times at 200 questions; `--limit-dev squad=500` halves that.)

On the lent GPU machine (`PEERS=1 bash bench/gpu_bundle.sh` first: it carries setfit too), with
the data at $BERTHEADS_DATA and the checkpoint at /tmp/model, four processes sharing the GPU
and the results written straight into $OUT, so a call stopped at its limit still returns them
(to continue a run, put the files back into bench/out, carry it, and copy them to $OUT first):
```
RUN='for k in 0 1 2 3; do timeout 440 python3 bench/small_data.py --task conll,squad,mrpc,sst2 \
       --seeds 0,1,2,3,4 --model /tmp/model --out-dir "$OUT" --budget 360 --shard $k/4 --threads 4 \
       >> "$OUT/shards.log" 2>&1 & done; wait; grep -E "FAILED|Error|^skip" "$OUT/shards.log" | sort | uniq -c; \
     python3 bench/small_data.py --table --task conll,squad,mrpc,sst2 --out-dir "$OUT"' bash bench/gpu_device.sh
```
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import DATA, OUT, cpu_line  # noqa: E402
from small_data_tasks import (  # noqa: E402
    TASKS,
    Dev,
    Task,
    classify_rows,
    dev_file,
    qa_examples,
    read_dev,
    read_items,
    sample,
    score,
    write_items,
)

from bertheads.tasks.recipes import Recipe  # noqa: E402

BUDGET = {"steps": 300, "epochs": (3, 20)}  # the candidate recipes' step budget: epochs for ~300 steps, 3 to 20


@dataclass(frozen=True)
class Arm:
    """What an arm trains with: bertheads with `settings` given and, with `recipe`, that row as
    the kind's whole recipe table; or `peer` (a function) instead. `kinds`: the kinds it takes
    (None: all); `pairs`: whether it takes sentence pairs; `up_to`: the largest size it runs."""

    settings: dict = field(default_factory=dict)
    recipe: Recipe | None = None
    peer: str | None = None
    kinds: tuple[str, ...] | None = None
    pairs: bool = True
    up_to: int | None = None
    why: dict = field(default_factory=dict)  # why it takes only what it takes: "kinds", "pairs", "up_to"


CONTRASTIVE = Arm(recipe=Recipe(None, "contrastive", 8, **BUDGET), kinds=("classify",), pairs=False,
                  why={"kinds": "contrastive mode pairs labelled texts", "pairs": "contrastive mode pairs single "
                       "labelled texts: bertheads refuses text pairs"})

ARMS = {
    "new": Arm(),
    "old": Arm(settings={"recipe": "fixed"}),
    "ft8": Arm(recipe=Recipe(None, "finetune", 8, **BUDGET)),
    "ft16": Arm(recipe=Recipe(None, "finetune", 16, **BUDGET)),
    "ft8long": Arm(recipe=Recipe(None, "finetune", 8, steps=600, epochs=(3, 40))),
    "ft32long": Arm(recipe=Recipe(None, "finetune", 32, steps=600, epochs=(3, 20))),
    "feat": Arm(recipe=Recipe(None, "features", 8, **BUDGET)),
    "feat32": Arm(recipe=Recipe(None, "features", 32)),
    "contrastive": CONTRASTIVE,
    "pairs5k": replace(CONTRASTIVE, settings={"pairs": 5000}),
    "pairs32k": replace(CONTRASTIVE, settings={"pairs": 32000}),
    "trainer": Arm(peer="trainer"),
    "setfit": Arm(peer="setfit", kinds=("classify",), pairs=False, up_to=200,
                  why={"kinds": "SetFit classifies texts", "pairs": "SetFit embeds one text per input",
                       "up_to": "SetFit's default pairs grow with the square of the rows: about 320,000 at 800"}),
    "setfit20": Arm(peer="setfit20", kinds=("classify",), pairs=False,
                    why={"kinds": "SetFit classifies texts", "pairs": "SetFit embeds one text per input"}),
}


class Skip(Exception):
    """An arm that cannot run here (its package missing): skipped for the rest of the run."""


# -- the arms ---------------------------------------------------------------------------------------
def synced(device: str) -> float:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    return time.perf_counter()


def ours(task: Task, arm: Arm, args, device: str, train: Path, dev: Dev, seed: int, cache: Path) -> dict:
    """bertheads.train with the arm's settings (and its recipe as the kind's whole table)."""
    import bertheads
    from bertheads.saved.bundle import task_class

    kind = task_class(task.kind)
    table = kind.recipes
    if arm.recipe is not None:
        kind.recipes = (arm.recipe,)
    try:
        start = synced(device)
        model = bertheads.train(task.kind, str(train), str(dev.path), None, model=args.model, seed=seed,
                                progress=False, verbose=False, cache_dir=str(cache), **arm.settings)
        seconds = synced(device) - start
    finally:
        kind.recipes = table
    m = model.metrics
    del model
    wanted = {"classify": ("accuracy", "f1", "mcc"), "tag": ("f1", "precision", "recall"),
              "qa": ("f1", "exact_match")}[task.kind]
    return {**{k: m["dev"].get(k) for k in wanted}, "seconds": seconds, "kept_epoch": m.get("best_epoch"),
            "learned_nothing": bool(m.get("learned_nothing")), "chosen": m.get("chosen"),
            **({"pairs": m["contrastive"]["pair_count"], "pair_seconds": m["contrastive"]["seconds"]}
               if m.get("contrastive") else {})}


def trainer_peer(task: Task, args, device: str, train: Path, dev: Dev, seed: int, work: Path) -> dict:
    """transformers' Trainer at its defaults (batch 8, 3 epochs, lr 5e-5, no warm-up, no weight
    decay, fp32), with bench/gpu_sides.py's Trainer side of the kind."""
    from gpu_sides import trainer_classify, trainer_qa, trainer_tag

    hyper = {"epochs": 3, "warmup": 0.0, "decay": 0.0, "seed": seed, "bf16": False}
    defaults = SimpleNamespace(model=args.model, batch_size=8, lr=5e-5)
    start = synced(device)
    if task.kind == "classify":
        texts, gold, _ = classify_rows(train, dev.labels)
        record, predicted = trainer_classify(defaults, device, work, (texts, gold), (dev.inputs, dev.gold),
                                             len(dev.labels), **hyper)
    elif task.kind == "tag":
        record, predicted = trainer_tag(defaults, device, work, read_items(task, train), dev.inputs, **hyper)
    else:
        record, predicted = trainer_qa(defaults, device, work, qa_examples(train), dev.inputs, **hyper)
    seconds = synced(device) - start - record["predict_seconds"]
    return {**score(task, dev, predicted), "seconds": seconds, "train_loop_seconds": record["train_seconds"],
            **({"train_windows": record["train_windows"]} if "train_windows" in record else {})}


def setfit_peer(task: Task, args, device: str, train: Path, dev: Dev, seed: int, work: Path,
                iterations: int | None = None) -> dict:
    """The `setfit` package at its defaults on the checkpoint (a sentence-transformers model):
    contrastive pairs by oversampling, batch 16, one epoch, lr 2e-5; a logistic regression head
    on the tuned embeddings. With `iterations`, SetFit's `num_iterations` (pairs: 2 x iterations
    x rows, its count before 1.0 and in its paper) instead of oversampling."""
    try:
        import transformers
        from datasets import Dataset
        from setfit import SetFitModel, Trainer, TrainingArguments
        from setfit import logging as setfit_logging
    except Exception as e:  # not installed, or its needs not at versions that import here
        raise Skip(f"setfit does not import here ({type(e).__name__}: {e}): pip install -e .[peers]; on the GPU "
                   "machine PEERS=1 bash bench/gpu_bundle.sh carries it") from e

    from bertheads.encoder.pretrained import resolve_model

    transformers.logging.set_verbosity_error()
    setfit_logging.set_verbosity_error()
    texts, gold, _ = classify_rows(train, dev.labels)
    data = Dataset.from_dict({"text": texts, "label": gold})
    start = synced(device)
    model = SetFitModel.from_pretrained(resolve_model(args.model))
    settings = TrainingArguments(batch_size=16, num_epochs=1, seed=seed, show_progress_bar=False, report_to="none",
                                 output_dir=str(work / "setfit"), num_iterations=iterations)
    Trainer(model=model, args=settings, train_dataset=data).train()
    seconds = synced(device) - start
    predicted = [int(p) for p in model.predict(dev.inputs)]
    return {**score(task, dev, predicted), "seconds": seconds}


PEERS = {"trainer": trainer_peer, "setfit": setfit_peer, "setfit20": partial(setfit_peer, iterations=20)}


def skipped(task_name: str, arm_name: str, n: int) -> str | None:
    """Why `arm_name` does not run on `task_name` at `n` examples (None: it runs)."""
    task, arm = TASKS[task_name], ARMS[arm_name]
    if arm.kinds and task.kind not in arm.kinds:
        return f"it takes {', '.join(arm.kinds)} only ({arm.why.get('kinds', '')})"
    if task.pairs and not arm.pairs:
        return f"it takes no text pairs ({arm.why.get('pairs', '')})"
    if arm.up_to and n > arm.up_to:
        return f"it runs up to {arm.up_to} examples ({arm.why.get('up_to', '')})"
    return None


# -- the run ----------------------------------------------------------------------------------------
def results_path(out_dir: Path, task: str) -> Path:
    return out_dir / ("small_data.jsonl" if task == "sst2" else f"small_data_{task}.jsonl")


def read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def plan(args) -> list[tuple[int, str, int, str]]:
    """(seed, task, size, arm) in the order they run: seed by seed, then task, size and arm; the
    arms a task cannot take are left out, each said once."""
    runs, said = [], {}
    for seed in args.seeds:
        for task in args.tasks:
            for n in args.sizes[task]:
                for arm in args.arms[task]:
                    why = skipped(task, arm, n)
                    if why is None:
                        runs.append((seed, task, n, arm))
                    else:
                        said.setdefault((task, arm, why), set()).add(n)
    for (task, arm, why), sizes in said.items():
        print(f"skip {arm} on {task} ({', '.join(map(str, sorted(sizes)))} {TASKS[task].unit}): {why}", flush=True)
    return runs


def run(args) -> int:
    import torch

    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.threads or device == "cpu":
        torch.set_num_threads(args.threads or 2)
    if device == "cuda":  # the context and the matrix libraries start here, not in the first run's seconds
        x = torch.randn(64, 64, device=device)
        (x @ x).sum().item()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            (x @ x).sum().item()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    paths = {t: args.results or results_path(args.out_dir, t) for t in args.tasks}
    done, took = set(), {}
    for task, path in paths.items():
        for r in read_results(path):
            done.add((task, r["arm"], r["size"], r["seed"]))
            took[task, r["arm"], r["size"]] = max(took.get((task, r["arm"], r["size"]), 0.0),
                                                   r.get("wall_seconds", r["seconds"]))
    runs = [r for r in plan(args) if (r[1], r[3], r[2], r[0]) not in done]
    if args.shard:  # this process's share: every N-th run of the list, from the K-th
        runs = runs[args.shard[0]::args.shard[1]]
    print(f"{len(runs)} runs to go on {device} ({torch.cuda.get_device_name(0) if device == 'cuda' else cpu_line()})"
          + (f", within {args.budget:.0f} s" if args.budget else ""), flush=True)
    failed, unavailable, left = [], set(), 0
    with tempfile.TemporaryDirectory(prefix="small_data_") as tmp:
        work = Path(tmp)
        cache = Path(args.cache) if args.cache else work / "cache"
        devs = {}
        for t in args.tasks:
            (work / t).mkdir()
            devs[t] = read_dev(TASKS[t], dev_file(TASKS[t], args.limit_dev[t][0], work / t))
        pools: dict[str, list] = {}
        for i, (seed, name, n, arm_name) in enumerate(runs):
            task, arm = TASKS[name], ARMS[arm_name]
            spent = time.perf_counter() - started
            if arm_name in unavailable:
                continue
            if args.budget and spent >= args.budget:
                left = len(runs) - i
                print(f"budget of {args.budget:.0f} s spent: {left} runs left (the same command continues them)")
                break
            expected = took.get((name, arm_name, n), 0.0)
            if args.budget and spent + expected > args.budget:
                left += 1
                print(f"skip {arm_name} on {name} at {n} seed {seed}: took {expected:.0f} s before, "
                      f"{args.budget - spent:.0f} s left", flush=True)
                continue
            if name not in pools:
                pools[name] = read_items(task, DATA / task.train)
            suffix = Path(task.train).suffix
            train = write_items(task, sample(pools[name], n, seed), work / name / f"train_{n}_{seed}{suffix}",
                                DATA / task.train)
            print(f"[{time.strftime('%H:%M:%S')}] {name} {arm_name} n={n} seed={seed} ({spent:.0f} s in)", flush=True)
            begun = time.perf_counter()
            try:
                if arm.peer:
                    result = PEERS[arm.peer](task, args, device, train, devs[name], seed, work)
                else:
                    result = ours(task, arm, args, device, train, devs[name], seed, cache)
            except Skip as e:
                print(f"skip {arm_name}: {e}", flush=True)
                unavailable.add(arm_name)
                continue
            except Exception:  # one failed run does not stop the others: said, and not recorded
                traceback.print_exc()
                failed.append((name, arm_name, n, seed))
                continue
            finally:
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
            wall = time.perf_counter() - begun
            took[name, arm_name, n] = max(took.get((name, arm_name, n), 0.0), wall)
            record = {"task": name, "arm": arm_name, "size": n, "seed": seed, **result, "wall_seconds": wall,
                      "dev_examples": len(devs[name].inputs), "shards": args.shard[1] if args.shard else 1,
                      "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}
            print(json.dumps(record), flush=True)
            with open(paths[name], "a") as f:  # one write of one line: shards append to the same file
                f.write(json.dumps(record) + "\n")
    print(f"done in {time.perf_counter() - started:.0f} s" + (f"; {left} runs left" if left else "")
          + (f"; FAILED: {failed}" if failed else ""), flush=True)
    return 1 if failed else 0


# -- the tables -------------------------------------------------------------------------------------
def cell(values: list[float], seconds: list[float], percent: bool) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    digits = ".1f" if percent else ".3f"
    return (f"{statistics.mean(values):{digits}} ± {spread:{digits}} "
            f"({len(values)}; {statistics.median(seconds):.0f} s)")


def arms_of(records: list[dict]) -> list[str]:
    """The arms of `records`, in `ARMS`' order (bertheads' first, then the peers)."""
    order = list(ARMS)
    return sorted({r["arm"] for r in records}, key=lambda a: order.index(a) if a in order else len(order))


def table(records: list[dict], metric: str, arms: list[str] | None = None, percent: bool = False,
          unit: str = "rows") -> str:
    """Sizes down, arms across: mean ± spread (seeds; median training seconds)."""
    records = [r for r in records if r.get(metric) is not None]
    arms = arms or arms_of(records)
    lines = [f"| {unit} | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|"]
    for n in sorted({r["size"] for r in records}):
        cells = []
        for arm in arms:
            got = [r for r in records if r["arm"] == arm and r["size"] == n]
            cells.append(cell([r[metric] for r in got], [r["seconds"] for r in got], percent) if got else "")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_seed(records: list[dict], metric: str, arms: list[str] | None = None, percent: bool = False) -> str:
    """Each (size, seed) with every arm's `metric` side by side (the same examples for every arm)."""
    arms = arms or arms_of(records)
    digits = ".1f" if percent else ".3f"
    lines = ["| size | seed | " + " | ".join(arms) + " |", "|---" * (len(arms) + 2) + "|"]
    for n, seed in sorted({(r["size"], r["seed"]) for r in records}):
        got = {r["arm"]: r.get(metric) for r in records if r["size"] == n and r["seed"] == seed}
        lines.append(f"| {n} | {seed} | " + " | ".join("" if got.get(a) is None else f"{got[a]:{digits}}"
                                                      for a in arms) + " |")
    return "\n".join(lines)


def tables(args) -> None:
    print(f"{cpu_line()}\n")
    for name in args.tasks:
        task, path = TASKS[name], args.results or results_path(args.out_dir, name)
        records = read_results(path)
        if not records:
            print(f"### {name}: no results in {path}\n")
            continue
        arms = args.arms[name] if args.arms_given else None
        devices = sorted({r.get("device", "cpu") for r in records})
        devs = sorted({r.get("dev_examples", 0) for r in records})
        shards = sorted({r.get("shards", 1) for r in records})
        print(f"### {name} ({task.kind}; {path}; on {', '.join(devices)}; dev examples "
              f"{', '.join(str(d or 'all') for d in devs)}; processes sharing the device {shards})\n")
        for metric in task.judging.metrics:
            print(f"{metric}:\n\n{table(records, metric, arms, task.percent, task.unit)}\n")
            if args.per_seed:
                print(f"{per_seed(records, metric, arms, task.percent)}\n")


# -- the command line -------------------------------------------------------------------------------
def per_task(values: list[str] | None, tasks: list[str], default, cast) -> dict[str, list]:
    """`--sizes 20` (every task) or `--sizes conll=50,200` (one task; repeatable) -> {task: values}."""
    got = {t: list(default(t)) for t in tasks}
    for value in values or []:
        name, _, items = value.rpartition("=")
        for t in ([name] if name else tasks):
            if t not in TASKS:
                raise SystemExit(f"unknown task {t!r} in {value!r} (known: {', '.join(TASKS)})")
            got[t] = [cast(v) for v in items.split(",") if v]
    return got


def shard_of(value: str) -> tuple[int, int]:
    k, _, n = value.partition("/")
    if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"expected K/N with 0 <= K < N, got {value!r}")
    return int(k), int(n)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="sst2", help=f"tasks, comma-separated: {', '.join(TASKS)} (default sst2)")
    p.add_argument("--sizes", action="append", help="training sizes, comma-separated, for every task; or "
                                                     "TASK=SIZES for one (repeatable); default: each task's")
    p.add_argument("--seeds", default="0", help="seeds, comma-separated (0: the first N examples)")
    p.add_argument("--arms", action="append", help=f"arms ({', '.join(ARMS)}), comma-separated, for every task; "
                                                    "or TASK=ARMS for one (repeatable); default: each task's")
    p.add_argument("--model", default="default", help="the checkpoint (default: bertheads' default)")
    p.add_argument("--limit-dev", action="append", help="score on the first N dev examples only (a check on the "
                                                         "CPU; fewer dev questions for SQuAD's many evaluations): "
                                                         "N for every task, or TASK=N (repeatable)")
    p.add_argument("--budget", type=float, help="start no run after this many seconds")
    p.add_argument("--shard", type=shard_of, help="K/N: run every N-th run of the plan from the K-th (0-based): N "
                                                  "processes with K = 0..N-1 share one device and its results files")
    p.add_argument("--threads", type=int, help="torch threads (default: 2 on the CPU, torch's own with CUDA)")
    p.add_argument("--cache", default=None, help="features cache folder (default: a temporary one)")
    p.add_argument("--out-dir", type=Path, default=OUT, help="where the results files are (default bench/out)")
    p.add_argument("--results", type=Path, help="one results file instead (one task only)")
    p.add_argument("--table", action="store_true", help="print the tables of the results and stop")
    p.add_argument("--per-seed", action="store_true", help="with --table: each seed's runs side by side too")
    args = p.parse_args()
    args.tasks = [t for t in args.task.split(",") if t]
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown or not args.tasks:
        p.error(f"unknown task {unknown} (known: {', '.join(TASKS)})")
    if args.results and len(args.tasks) > 1:
        p.error("--results takes one task; use --out-dir for several")
    args.arms_given = bool(args.arms)
    args.arms = per_task(args.arms, args.tasks, lambda t: TASKS[t].arms, str)
    bad = sorted({a for arms in args.arms.values() for a in arms if a not in ARMS})
    if bad:
        p.error(f"unknown arms {bad} (known: {', '.join(ARMS)})")
    if args.table:
        tables(args)
        return 0
    args.sizes = per_task(args.sizes, args.tasks, lambda t: TASKS[t].sizes, int)
    args.limit_dev = per_task(args.limit_dev, args.tasks, lambda t: [None], int)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
