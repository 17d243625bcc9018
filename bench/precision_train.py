"""Training in bf16 against fp32 on this machine: the same command, `--precision fp32` and
`--precision bf16`, one epoch each, for classify (SST-2, the first N training sentences), tag
(CoNLL-2003, the first N training sentences) and qa (the first N questions of SQuAD's
train-split.json, dev: the first `--qa-dev` of eval-split.json), on the embedded default checkpoint.

    .venv/bin/python bench/precision_train.py --kinds classify,tag --classify-limit 8000 --tag-limit 4000
    .venv/bin/python bench/precision_train.py --kinds classify,qa --attention-dropout default,0   # each both ways

`--attention-dropout default,0` runs every precision with the checkpoint's attention dropout and
with `--attention-dropout 0` (the fused attention kernels), rows side by side.

Each run is the whole `bertheads train` command, timed from start to exit; the loop's own rate
(`train_examples_per_second` of metrics.json, evaluation left out) and the dev metric are read
back. With `--repeats 2` the order alternates (fp32, bf16, then bf16, fp32) so a change of load
on the shared machine falls on both; the figures are medians. bf16 needs a CPU with AMX or
AVX512_BF16 (or a GPU): elsewhere `--precision bf16` is refused and its rows say so.
With `--trainer`, the Hugging Face Trainer on the same rows, checkpoint, batch size, learning rate
and epoch, `bf16=False` and `bf16=True` (bench/gpu_sides.py's Trainer sides, in this process
after ours; its loop rate is its own `train_runtime`; its predictions on 200 dev inputs are not
timed here), in the same run.
Results: bench/out/precision-train.json and Markdown rows on stdout, each with the CPU line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, cpu_line, median, require_data, save_json  # noqa: E402

MAIN_METRIC = {"classify": "accuracy", "tag": "f1", "qa": "f1"}  # qa's in percent, the others' fractions


def squad_subset(source: Path, questions: int, out: Path) -> Path:
    """The first `questions` questions of a SQuAD file, with their passages."""
    from small_data_tasks import read_squad, write_squad

    write_squad(read_squad(source)[:questions], out)
    return out


def subset(kind: str, limit: int, qa_dev: int = 500) -> tuple[Path, Path]:
    """The first `limit` training examples of the kind's data, written under bench/out, and its dev file."""
    OUT.mkdir(parents=True, exist_ok=True)
    if kind == "qa":
        return (squad_subset(require_data("squad", "train-split.json"), limit, OUT / f"squad-train-{limit}.json"),
                squad_subset(require_data("squad", "eval-split.json"), qa_dev, OUT / f"squad-eval-{qa_dev}.json"))
    if kind == "classify":
        lines = require_data("sst2", "train.tsv").read_text(encoding="utf-8").splitlines()
        path = OUT / f"sst2-train-{limit}.tsv"
        path.write_text("\n".join(lines[: limit + 1]) + "\n", encoding="utf-8")
        return path, require_data("sst2", "dev.tsv")
    blocks = require_data("conll2003", "train.txt").read_text(encoding="utf-8").strip().split("\n\n")
    path = OUT / f"conll-train-{limit}.txt"
    path.write_text("\n\n".join(blocks[:limit]) + "\n", encoding="utf-8")
    return path, require_data("conll2003", "dev.txt")


def train_once(kind: str, train: Path, dev: Path, precision: str, out: Path, batch: int,
               attention_dropout: str = "default") -> dict:
    command = [sys.executable, "-m", "bertheads", "train", kind, "--model", "default", "--train", str(train),
               "--dev", str(dev), "--epochs", "1", "--batch-size", str(batch), "--mode", "finetune", "--seed", "42",
               "--precision", precision, "--out", str(out), "--overwrite", "-q",
               *([] if attention_dropout == "default" else ["--attention-dropout", attention_dropout])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        return {"refused": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    metrics = json.loads((out / "metrics.json").read_text())
    epoch = metrics["history"][-1]
    name = next(iter(epoch["dev"])) if isinstance(next(iter(epoch["dev"].values())), dict) else None
    dev_metrics = epoch["dev"][name] if name else epoch["dev"]
    return {"command_seconds": round(seconds, 1), "train_examples_per_second": epoch["train_examples_per_second"],
            "metric": MAIN_METRIC[kind], "value": dev_metrics[MAIN_METRIC[kind]], "command": " ".join(command[1:])}


def trainer_once(kind: str, train: Path, dev: Path, bf16: bool, batch: int) -> dict:
    """The Trainer's side of the kind on the same training file, one epoch, in bf16 or fp32."""
    import tempfile
    from types import SimpleNamespace

    from gpu_sides import read_tsv, trainer_classify, trainer_tag
    from tag import read_conll

    args = SimpleNamespace(model="default", batch_size=batch, lr=5e-5)
    work = Path(tempfile.mkdtemp(prefix="precision-trainer-"))
    start = time.perf_counter()
    if kind == "classify":
        texts, labels = read_tsv(train)
        dev_texts, dev_labels = read_tsv(dev, 200)
        record, _ = trainer_classify(args, "cpu", work, (texts, labels), (dev_texts, dev_labels), 2, bf16=bf16)
    else:
        record, _ = trainer_tag(args, "cpu", work, read_conll(train), read_conll(dev, 200), bf16=bf16)
    return {"command_seconds": round(time.perf_counter() - start, 1),
            "train_examples_per_second": round(record["train_examples_per_second"], 1)}


def side_name(precision: str, attention_dropout: str) -> str:
    return precision if attention_dropout == "default" else f"{precision}, attention dropout {attention_dropout}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="classify,tag")
    parser.add_argument("--classify-limit", type=int, default=8000)
    parser.add_argument("--tag-limit", type=int, default=4000)
    parser.add_argument("--qa-limit", type=int, default=400, help="qa: training questions")
    parser.add_argument("--qa-dev", type=int, default=500, help="qa: dev questions (eval-split.json's first)")
    parser.add_argument("--attention-dropout", default="default",
                        help="comma-separated: default (the checkpoint's) and/or values for --attention-dropout")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--trainer", action="store_true", help="the Trainer fp32 and bf16 on the same rows too")
    args = parser.parse_args()
    result: dict = {"machine": cpu_line(), "command": " ".join(sys.argv), "load_average_start": os.getloadavg(),
                    "kinds": {}}
    dropouts = args.attention_dropout.split(",")
    for kind in args.kinds.split(","):
        limit = {"classify": args.classify_limit, "tag": args.tag_limit, "qa": args.qa_limit}[kind]
        train, dev = subset(kind, limit, args.qa_dev)
        sides = [(p, d) for p in ("fp32", "bf16") for d in dropouts]
        runs: dict[str, list[dict]] = {side_name(p, d): [] for p, d in sides}
        for r in range(args.repeats):
            for precision, dropout in (sides if r % 2 == 0 else sides[::-1]):
                name = side_name(precision, dropout)
                got = train_once(kind, train, dev, precision, OUT / f"precision-{kind}-{precision}-{dropout}",
                                 args.batch_size, dropout)
                print(f"[{time.strftime('%H:%M:%S')}] {kind} {name}: {got}", file=sys.stderr, flush=True)
                runs[name].append(got)
        entry = {"examples": limit, "runs": runs}
        if args.trainer and kind != "qa":  # (no Trainer side for qa here)
            entry["trainer"] = {p: [] for p in ("fp32", "bf16")}
            for r in range(args.repeats):
                for precision in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
                    got = trainer_once(kind, train, dev, precision == "bf16", args.batch_size)
                    print(f"[{time.strftime('%H:%M:%S')}] {kind} Trainer {precision}: {got}", file=sys.stderr, flush=True)
                    entry["trainer"][precision].append(got)
        result["kinds"][kind] = entry
    result["load_average_end"] = os.getloadavg()
    save_json("precision-train", result)
    print(f"<!-- {result['machine']}; load average {result['load_average_start'][0]:.1f} -> "
          f"{result['load_average_end'][0]:.1f} -->")
    print("| kind (examples, 1 epoch) | precision | train examples/s | whole command s | dev metric | "
          "loop speed vs fp32 | command vs fp32 |")
    print("|---|---|---|---|---|---|---|")
    for kind, entry in result["kinds"].items():
        ok = {p: [r for r in rs if "refused" not in r] for p, rs in entry["runs"].items()}
        base = ok[side_name("fp32", dropouts[0])]
        for precision, rows in ok.items():
            if not rows:
                print(f"| {kind} ({entry['examples']}) | {precision} | refused: {entry['runs'][precision][0]['refused']} "
                      f"| | | | |")
                continue
            rate = median([r["train_examples_per_second"] for r in rows])
            wall = median([r["command_seconds"] for r in rows])
            value = median([r["value"] for r in rows])
            ratio = rate / median([r["train_examples_per_second"] for r in base]) if base else float("nan")
            wall_ratio = median([r["command_seconds"] for r in base]) / wall if base else float("nan")
            print(f"| {kind} ({entry['examples']}) | {precision} | {rate:.1f} | {wall:.0f} | "
                  f"{rows[0]['metric']} {value * (1 if kind == 'qa' else 100):.2f} | {ratio:.2f}x | {wall_ratio:.2f}x |")
        for precision, rows in entry.get("trainer", {}).items():
            rate = median([r["train_examples_per_second"] for r in rows])
            base_rate = median([r["train_examples_per_second"] for r in entry["trainer"]["fp32"]])
            print(f"| {kind} ({entry['examples']}), the Trainer | {precision} | {rate:.1f} | "
                  f"{median([r['command_seconds'] for r in rows]):.0f} (in-process) | | {rate / base_rate:.2f}x | |")


if __name__ == "__main__":
    main()
