"""Joint training measured, and the cost of many heads: sentiment (classify, SST-2), entities
(tag, CoNLL-2003) and QA (qa, SQuAD v1.1) on the default checkpoint, each head trained on the
first `--sst2-rows` / `--conll-rows` / `--squad-rows` training rows (sentences; questions),
`--epochs` epoch(s), batch 32, fp32, `recipe="fixed"`, `keep="last"`, evaluated on its dev set
(SST-2 dev accuracy, CoNLL dev entity F1, SQuAD `eval-split.json` F1; `--*-dev-rows` cut them
for smoke runs). The subsets are written once under `--work` (bench/out/joint/), never here.

`joint`: per seed, every head trained alone and all of them trained together (`train_multi`,
sampling `proportional`: every task's batches once per epoch, so each head takes the same steps
as alone; the shared part sees their sum), in two modes: `finetune` (the whole encoder, lr 5e-5)
and `branch` (`--tune-layers N`, each head its own top N layers on the frozen trunk, the branch default lr:
nothing trainable is shared, so joint and alone differ only in the heads' initial draws, batch
order and the schedule). The learning-rate schedule (warm-up 0.1, linear decay) runs over the
run's steps, so a head trained jointly takes its steps at points spread over a schedule as long
as all heads' steps together: the same steps, not the same learning rates. One JSON line per
arm (alone / joint) x mode x seed to `--out` (bench/out/joint.jsonl), with the optimizer steps
(log.jsonl) and training seconds (each `train` call, the gate after it included; branch and
features runs share one trunk cache, `--work`/cache, so the first run of a set pays its trunk).

`cost`: one 3-head model four ways (for `--seed`): (a) three fine-tuned models, (b) one joint
model (`train_multi`), (c) three branch heads combined (`bertheads.combine`), (d) three
features-mode heads combined. Models a `joint` run of the same sizes and seed saved are reused.
Per arm: `analyze` texts/s on the same inputs (the median of `--repeats` timed passes after a
warm-up; arm (a) runs each model's `analyze` in turn), folder size on disk (and with the
checkpoint that branch/features folders refer to instead of holding), each head's dev quality,
and the layer-count bound of its speed over arm (a). Two input sets, `--texts` each:

- `plain`: the first SST-2 dev sentences and the first CoNLL dev sentences (words joined by
  spaces), interleaved. A qa head needs a question with its passage: `analyze` asks it only
  when `questions=[...]` is given, so here the qa head (and arm (a)'s qa model) does not answer:
  two heads read one input.
- `asked`: the same texts, each the passage of a SQuAD question (the eval split's questions in
  order): all three heads answer. The qa head encodes question + passage, not the text alone,
  so it never shares the others' encoder pass (nor, with branches, their trunk).

The bound counts encoder layers run per input: separate models H x L; one encoder (joint,
features) L per distinct encoded input; branches (L - N) per distinct input + N per head. The
issue's L*H / ((L - N) + N*H) (6 layers, N=2, 3 heads: 1.8x) holds when every head reads the
same encoded input, which the qa head never does; `bound` is the one for the inputs run.

    # full runs (sizes as the issue; seeds enough to tell), one process, the 2-core machine;
    # the second adds qa where time allows (the alone models of the first are reused):
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/joint.py joint --seeds 1,2,3
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/joint.py joint --seeds 1,2,3 --heads sentiment,ner,qa
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/joint.py cost --seed 1
    PYTHONPATH=src python bench/joint.py table

    # smoke (64 rows, 64 dev rows, 64 texts; measured with OMP_NUM_THREADS=1 beside a benchmark
    # queue: joint with qa 106 s, cost 43 s after it, joint 2 seeds without qa 52 s):
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/joint.py joint --smoke --seeds 1 --heads sentiment,ner,qa
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/joint.py cost --smoke --seed 1

Cost, estimated from the smoke runs and bench/RESULTS.md's rates (SST-2 fine-tuning ~40 rows/s,
CoNLL ~80 sentences/s, SQuAD ~8.6 windows/s and 30 dev questions/s on the quiet 2-core machine;
x2-3 at one thread beside other jobs): one seed of `joint` with qa ~60-70 min loaded (the
fine-tuned qa runs and SQuAD's 3,335 dev questions dominate), without qa ~25 min; `cost` after
a `joint` run with qa of the same seed ~25 min (the features heads, then 4 arms x 2 sets x
(1 + 3) passes over 1,000 texts). Disk: ~0.5 GB of models a seed, ~2 GB of trunk cache.
SQuAD at 2,000 questions and 1 epoch is far from trained (F1 ~11 in bench/RESULTS.md): its
joint-vs-alone figure says little beyond "level or not".
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, cpu_line, require_data  # noqa: E402

HEADS = {  # head -> (kind, main dev metric, factor to points)
    "sentiment": ("classify", "accuracy", 100),
    "ner": ("tag", "f1", 100),
    "qa": ("qa", "f1", 1),  # (qa's F1 is in points already)
}
BATCH = 32


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- data subsets ---------------------------------------------------------------------------------
def first_lines(src: Path, dest: Path, rows: int) -> None:
    """A TSV's header and its first `rows` rows (all with 0)."""
    lines = src.read_text(encoding="utf-8").splitlines()
    dest.write_text("\n".join(lines[: rows + 1] if rows else lines) + "\n", encoding="utf-8")


def conll_blocks(path: Path) -> list[str]:
    return [b for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip()]


def first_sentences(src: Path, dest: Path, rows: int) -> None:
    blocks = conll_blocks(src)
    dest.write_text("\n\n".join(blocks[:rows] if rows else blocks) + "\n", encoding="utf-8")


def first_questions(src: Path, dest: Path, rows: int) -> None:
    """A SQuAD file cut after its first `rows` questions (articles and paragraphs kept whole up to there)."""
    data = json.loads(src.read_text(encoding="utf-8"))
    left, articles = rows or float("inf"), []
    for article in data["data"]:
        paragraphs = []
        for p in article["paragraphs"]:
            if left <= 0:
                break
            qas = p["qas"][: int(min(left, len(p["qas"])))]
            left -= len(qas)
            paragraphs.append({**p, "qas": qas})
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
        if left <= 0:
            break
    dest.write_text(json.dumps({"version": data.get("version", "1.1"), "data": articles}), encoding="utf-8")


def data_files(args) -> dict[str, tuple[Path, Path]]:
    """head -> (train, dev) files of the run's sizes under the work folder."""
    folder = args.work / "data"
    folder.mkdir(parents=True, exist_ok=True)
    plan = {
        "sentiment": (first_lines, require_data("sst2", "train.tsv"), require_data("sst2", "dev.tsv"), "tsv",
                      args.sst2_rows, args.sst2_dev_rows),
        "ner": (first_sentences, require_data("conll2003", "train.txt"), require_data("conll2003", "dev.txt"), "txt",
                args.conll_rows, args.conll_dev_rows),
        "qa": (first_questions, require_data("squad", "train-split.json"), require_data("squad", "eval-split.json"),
               "json", args.squad_rows, args.squad_dev_rows),
    }
    out = {}
    for head in args.heads:
        cut, train, dev, ext, rows, dev_rows = plan[head]
        pair = folder / f"{head}-train-{rows}.{ext}", folder / f"{head}-dev-{dev_rows or 'all'}.{ext}"
        for src, dest, n in ((train, pair[0], rows), (dev, pair[1], dev_rows)):
            if not dest.is_file():
                cut(src, dest, n)
        out[head] = pair
    return out


# -- training -------------------------------------------------------------------------------------
def sizes_key(args) -> str:
    dev = "-".join(str(getattr(args, f"{s}_dev_rows") or "all") for s in ("sst2", "conll", "squad"))
    return f"sst{args.sst2_rows}-conll{args.conll_rows}-squad{args.squad_rows}-e{args.epochs}-dev{dev}"


def mode_options(mode: str, tune: int) -> dict:
    return {"finetune": {"mode": "finetune"}, "branch": {"tune_layers": tune}, "features": {"mode": "features"}}[mode]


def common_settings(args, seed: int) -> dict:
    return {"seed": seed, "epochs": args.epochs, "batch_size": BATCH, "precision": "fp32", "recipe": "fixed",
            "keep": "last", "progress": False, "verbose": False, "cache_dir": str(args.work / "cache")}


def model_dir(args, seed: int, name: str) -> Path:
    return args.work / "models" / sizes_key(args) / f"s{seed}" / name


def trained_model(folder: Path, train) -> dict:
    """Train into `folder` unless a finished model is there; {seconds, steps (optimizer steps,
    from log.jsonl), dev: {head: metrics}}."""
    stamp = folder.with_name(folder.name + ".run.json")
    if (folder / "metrics.json").is_file() and stamp.is_file():
        return json.loads(stamp.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    log(f"training {folder}")
    start = time.perf_counter()
    train(folder)
    steps = [json.loads(line).get("step", 0) for line in (folder / "log.jsonl").read_text().splitlines() if line.strip()] \
        if (folder / "log.jsonl").is_file() else []
    record = {"seconds": round(time.perf_counter() - start, 1), "steps": max(steps, default=None),
              "dev": json.loads((folder / "metrics.json").read_text())["dev"]}
    stamp.write_text(json.dumps(record))
    return record


def train_alone(args, files, seed: int, mode: str, head: str) -> dict:
    import bertheads

    train, dev = files[head]
    kind = HEADS[head][0]
    return trained_model(model_dir(args, seed, f"alone-{mode}-{head}"), lambda out: bertheads.train(
        kind, str(train), str(dev), str(out), model=args.model, head_name=head, **common_settings(args, seed),
        **mode_options(mode, args.tune_layers)))


def train_joint(args, files, seed: int, mode: str) -> dict:
    import bertheads

    config = args.work / "data" / f"joint-{'-'.join(args.heads)}.yaml"
    config.write_text("tasks:\n" + "".join(
        f"  {h}: {{kind: {HEADS[h][0]}, train: {files[h][0]}, dev: {files[h][1]}}}\n" for h in args.heads)
        + "sampling: proportional\n")
    name = f"joint-{mode}-{'-'.join(args.heads)}"
    return trained_model(model_dir(args, seed, name), lambda out: bertheads.train_multi(
        str(config), str(out), model=args.model, **common_settings(args, seed), **mode_options(mode, args.tune_layers)))


def main_metric(dev: dict, head: str) -> float | None:
    """The head's main dev figure in points (0-100): a one-head model's metrics.json holds its
    metrics flat, a joint one's under each head's name."""
    metrics = dev[head] if isinstance(dev.get(head), dict) else dev
    value = metrics.get(HEADS[head][1])
    return None if value is None else float(value) * HEADS[head][2]


def write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def run_joint(args) -> None:
    files = data_files(args)
    for seed in args.seeds:
        for mode in args.modes:
            label = mode if mode != "branch" else f"branch N={args.tune_layers}"
            alone = {h: train_alone(args, files, seed, mode, h) for h in args.heads}
            joint = train_joint(args, files, seed, mode)
            for arm, heads, seconds, steps in (
                    ("alone", {h: main_metric(r["dev"], h) for h, r in alone.items()},
                     sum(r["seconds"] for r in alone.values()), {h: r.get("steps") for h, r in alone.items()}),
                    ("joint", {h: main_metric(joint["dev"], h) for h in args.heads}, joint["seconds"],
                     joint.get("steps"))):
                write(args.out, {"bench": "joint", "arm": arm, "tasks": "+".join(args.heads), "mode": label,
                                 "seed": seed, "heads": heads,
                                 "train_seconds": seconds, "steps": steps, "sizes": sizes_key(args),
                                 "cpu": cpu_line()})


# -- cost of many heads -----------------------------------------------------------------------------
def dev_sentences(args, n: int) -> list[str]:
    with open(require_data("sst2", "dev.tsv"), encoding="utf-8") as fh:
        sst = [r["sentence"].strip() for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)][: n // 2]
    conll = [" ".join(line.split()[0] for line in block.splitlines())
             for block in conll_blocks(require_data("conll2003", "dev.txt"))][: n - len(sst)]
    return [t for pair in zip(sst, conll) for t in pair] + sst[len(conll):] + conll[len(sst):]


def squad_questions(n: int) -> list[str]:
    data = json.loads(require_data("squad", "eval-split.json").read_text(encoding="utf-8"))
    questions = [q["question"] for a in data["data"] for p in a["paragraphs"] for q in p["qas"]]
    return [questions[i % len(questions)] for i in range(n)]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def checkpoint_bytes(folder: Path) -> int:
    """The weights of the checkpoint a branch or features folder refers to instead of holding
    them (one copy for all its heads); 0 for a folder holding its encoder."""
    manifest = json.loads((folder / "bertheads.json").read_text())
    source = Path((manifest.get("encoder") or {}).get("path") or "")
    if (folder / "encoder").is_dir() or not source.is_dir():
        return 0
    return sum(p.stat().st_size for p in source.rglob("*") if p.suffix in (".safetensors", ".bin") and p.is_file())


def layer_bound(arm: str, layers: int, tune: int, heads: list[str], asked: bool) -> dict:
    """Encoder layers run per input for `arm` and for three separate models, with the speed-up bound.
    Heads reading the text alone share one encoded input; a qa head reads its own."""
    answering = [h for h in heads if asked or h != "qa"]
    inputs = [[h for h in answering if h != "qa"], [h for h in answering if h == "qa"]]
    inputs = [group for group in inputs if group]
    separate = layers * len(answering)
    ran = {"separate": separate,
           "joint": layers * len(inputs), "features": layers * len(inputs),
           "branch": sum((layers - tune) + tune * len(group) for group in inputs)}[arm]
    return {"layers_per_input": ran, "separate_layers_per_input": separate, "bound": round(separate / ran, 3)}


def timed(run, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_cost(args) -> None:
    import bertheads
    from bertheads.encoder.pretrained import Encoder

    files = data_files(args)
    seed, heads = args.seed, args.heads
    layers = Encoder.load(args.model, lazy=True).info.num_layers
    # the models: arm -> (folders to load, dev quality per head)
    arms: dict[str, tuple[list[Path], dict]] = {}
    alone = {h: train_alone(args, files, seed, "finetune", h) for h in heads}
    arms["separate"] = ([model_dir(args, seed, f"alone-finetune-{h}") for h in heads],
                        {h: main_metric(r["dev"], h) for h, r in alone.items()})
    joint = train_joint(args, files, seed, "finetune")
    arms["joint"] = ([model_dir(args, seed, f"joint-finetune-{'-'.join(heads)}")],
                     {h: main_metric(joint["dev"], h) for h in heads})
    for mode in ("branch", "features"):
        parts = {h: train_alone(args, files, seed, mode, h) for h in heads}
        combined = model_dir(args, seed, f"combined-{mode}-{'-'.join(heads)}")
        if not (combined / "bertheads.json").is_file():
            shutil.rmtree(combined, ignore_errors=True)
            bertheads.combine([model_dir(args, seed, f"alone-{mode}-{h}") for h in heads], combined, names=heads)
        arms[mode] = ([combined], {h: main_metric(r["dev"], h) for h, r in parts.items()})
    texts = dev_sentences(args, args.texts)
    questions = squad_questions(len(texts))
    sets = {"plain": None, **({"asked": questions} if "qa" in heads else {})}
    for arm in args.arms:
        folders, quality = arms[arm]
        models = [bertheads.load(f, runtime="torch", precision="fp32", verbose=False) for f in folders]
        speed, bounds = {}, {}
        for name, asked in sets.items():
            def run(models=models, asked=asked):
                for m in models:
                    extra = {"questions": asked} if asked is not None and "qa" in m.heads else {}
                    m.analyze(texts, batch_size=BATCH, **extra)
            seconds = timed(run, args.repeats)
            speed[name] = round(len(texts) / seconds, 1)
            bounds[name] = layer_bound(arm, layers, args.tune_layers, heads, asked is not None)
            log(f"{arm} {name}: {speed[name]} texts/s")
        on_disk = sum(folder_bytes(f) for f in folders)
        referred = max(checkpoint_bytes(f) for f in folders)
        write(args.cost_out, {
            "bench": "cost", "arm": arm, "seed": seed, "heads": quality, "texts": len(texts), "repeats": args.repeats,
            "texts_per_s": speed, "layer_bound": bounds, "disk_bytes": on_disk,
            "disk_bytes_with_checkpoint": on_disk + referred, "holds_encoder": not referred,
            "tune_layers": args.tune_layers if arm == "branch" else None, "encoder_layers": layers, "sizes": sizes_key(args), "cpu": cpu_line()})


# -- tables ------------------------------------------------------------------------------------------
def records(path: Path, bench: str) -> list[dict]:
    if not path.is_file():
        return []
    return [r for r in map(json.loads, filter(str.strip, path.read_text().splitlines())) if r.get("bench") == bench]


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def joint_table(rows: list[dict]) -> str:
    lines = ["| sizes | trained together | mode | head | alone (mean) | joint (mean) | joint - alone (points) "
             "| seeds joint ahead |", "|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, dict] = {}
    for r in rows:  # the last record of an arm and seed wins (a rerun)
        key = (r["sizes"], r.get("tasks", "+".join(r["heads"])), r["mode"])
        groups.setdefault(key, {}).setdefault(r["seed"], {})[r["arm"]] = r["heads"]
    for (sizes, tasks, mode), seeds in groups.items():
        paired = [s for s in seeds.values() if {"alone", "joint"} <= set(s)]
        for head in dict.fromkeys(h for s in paired for h in s["alone"]):
            pairs = [(s["alone"][head], s["joint"].get(head)) for s in paired
                     if s["alone"].get(head) is not None and s["joint"].get(head) is not None]
            if not pairs:
                continue
            diffs = [j - a for a, j in pairs]
            spread = f" ± {statistics.stdev(diffs):.1f}" if len(diffs) > 1 else ""
            lines.append(f"| {sizes} | {tasks} | {mode} | {head} ({HEADS[head][1]}) | {fmt(statistics.fmean(a for a, _ in pairs), 1)} "
                         f"| {fmt(statistics.fmean(j for _, j in pairs), 1)} | {statistics.fmean(diffs):+.1f}{spread} "
                         f"| {sum(d > 0 for d in diffs)}/{len(diffs)} |")
    return "\n".join(lines)


def issue_bound(layers: int, tune: int, heads: int) -> float:
    """L*H / ((L - N) + N*H): every head's input run through the trunk once and each branch."""
    return layers * heads / ((layers - tune) + tune * heads)


def cost_table(rows: list[dict]) -> str:
    latest = {(r["sizes"], r["seed"], r["arm"]): r for r in rows}
    lines = ["| sizes | arm | texts/s plain | x separate (bound) | texts/s asked | x separate (bound) "
             "| MB on disk (+ checkpoint) | quality (points) |", "|---|---|---|---|---|---|---|---|"]
    names = {"separate": "(a) 3 fine-tuned models", "joint": "(b) joint model", "branch": "(c) 3 branch heads N=",
             "features": "(d) 3 features heads"}
    notes = []
    for (sizes, seed, arm), r in latest.items():
        peer = latest.get((sizes, seed, "separate"))
        cells = []
        for name in ("plain", "asked"):
            speed = r["texts_per_s"].get(name)
            base = peer["texts_per_s"].get(name) if peer else None
            bound = r["layer_bound"].get(name, {}).get("bound")
            ratio = f"{speed / base:.2f}x" if speed and base else "-"
            cells += [fmt(speed, 1), ratio + (f" ({bound:.2f}x, {speed / base / bound:.0%} of it)"
                                              if bound and base and arm != "separate" else "")]
        label = names[arm] + (str(r["tune_layers"]) if arm == "branch" else "")
        quality = ", ".join(f"{h} {fmt(v, 1)}" for h, v in r["heads"].items())
        disk = f"{r['disk_bytes'] / 1e6:.1f} ({r['disk_bytes_with_checkpoint'] / 1e6:.1f})"
        lines.append(f"| {sizes} s{seed} | {label} | {' | '.join(cells)} | {disk} | {quality} |")
        if arm == "branch" and peer and "encoder_layers" in r:
            heads, tune, layers = len(r["heads"]), r["tune_layers"], r["encoder_layers"]
            bound = issue_bound(layers, tune, heads)
            best = max(r["texts_per_s"][k] / peer["texts_per_s"][k] for k in r["texts_per_s"] if k in peer["texts_per_s"])
            notes.append(f"- {sizes} s{seed}: the aim's bound L*H/((L-N)+N*H) = {layers}*{heads}/(({layers}-{tune})"
                         f"+{tune}*{heads}) = {bound:.2f}x (aim >= {0.9 * bound:.2f}x) holds only when all {heads} heads "
                         f"read one encoded input; measured at best {best:.2f}x ({best / bound:.0%} of it); the "
                         f"bound of the inputs run is in brackets.")
    return "\n".join(lines + ([""] + notes if notes else []))


def print_tables(args) -> None:
    cpu = {r["cpu"] for r in records(args.out, "joint") + records(args.cost_out, "cost")}
    print(f"{'; '.join(sorted(cpu)) or cpu_line()}\n")
    if rows := records(args.out, "joint"):
        print(f"### Joint training against each head alone ({args.out})\n\n{joint_table(rows)}\n")
    if rows := records(args.cost_out, "cost"):
        print(f"### Cost of three heads ({args.cost_out})\n\n{cost_table(rows)}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("joint", "cost", "table"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--heads", default="sentiment,ner", help="of sentiment, ner, qa (cost: default all three)")
    parser.add_argument("--sst2-rows", type=int, default=4000)
    parser.add_argument("--conll-rows", type=int, default=4000)
    parser.add_argument("--squad-rows", type=int, default=2000)
    parser.add_argument("--sst2-dev-rows", type=int, default=0, help="0: all 872")
    parser.add_argument("--conll-dev-rows", type=int, default=0, help="0: all 3,250")
    parser.add_argument("--squad-dev-rows", type=int, default=0, help="0: all 3,335 of eval-split.json")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--tune-layers", type=int, default=2, help="N of the branch arms")
    parser.add_argument("--modes", default="finetune,branch", help="joint: finetune, branch")
    parser.add_argument("--seeds", default="1,2,3", help="joint: the seeds")
    parser.add_argument("--seed", type=int, default=1, help="cost: the seed of its models")
    parser.add_argument("--arms", default="separate,joint,branch,features", help="cost: the arms measured")
    parser.add_argument("--texts", type=int, default=1000, help="cost: inputs per set (half SST-2, half CoNLL)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="64 rows of every set, 64 dev rows, 64 texts, 1 repeat")
    parser.add_argument("--work", type=Path, default=OUT / "joint")
    parser.add_argument("--out", type=Path, default=OUT / "joint.jsonl")
    parser.add_argument("--cost-out", type=Path, default=OUT / "heads_cost.jsonl")
    args = parser.parse_args()
    if args.command == "cost" and args.heads == parser.get_default("heads"):
        args.heads = "sentiment,ner,qa"
    args.heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    if unknown := set(args.heads) - set(HEADS):
        parser.error(f"--heads: unknown {sorted(unknown)} (of {', '.join(HEADS)})")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.modes = [m.strip() for m in args.modes.split(",")]
    args.arms = [a.strip() for a in args.arms.split(",")]
    if args.smoke:
        for name in ("sst2_rows", "conll_rows", "squad_rows", "sst2_dev_rows", "conll_dev_rows", "squad_dev_rows"):
            setattr(args, name, 64)
        args.texts, args.repeats = 64, 1
        if args.out == parser.get_default("out"):
            args.out = OUT / "joint-smoke.jsonl"
        if args.cost_out == parser.get_default("cost_out"):
            args.cost_out = OUT / "heads_cost-smoke.jsonl"
    if args.command == "joint":
        run_joint(args)
    elif args.command == "cost":
        run_cost(args)
    print_tables(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
