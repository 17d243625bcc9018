"""Base-size quality rows: bertheads against the Hugging Face Trainer on one base-size checkpoint
(all-mpnet-base-v2 from `bench/setup_mpnet.py` unless `--model` names another), with the same
data and hyperparameters, in one run, one side after the other in this process:

- sst2: the first `--sst2-limit` (8,000) training sentences, 1 epoch, dev accuracy;
- mrpc: the full training set, `--pair-epochs` (3), dev accuracy and F1;
- conll: CoNLL-2003, full, 1 epoch, dev entity F1 (first-piece labels on the Trainer's side);
- squad: the first `--squad-limit` questions of `squad/train-split.json`, 1 epoch, exact match and
  F1 on `squad/eval-split.json` (the first `--squad-eval-limit`), the Trainer's logits through
  our decoding.

Each side is the one in bench/classify.py, bench/tag.py or bench/qa.py (their hyperparameters:
batch 32 (qa 16), lr 5e-5, warm-up 10%, weight decay 0.01, seed 42); only the checkpoint differs.

    python bench/setup_mpnet.py                       # once: prints the model folder
    nice -n 10 python bench/base_size.py --tasks sst2  # --model FOLDER for another checkpoint

Results: bench/out/NAME.json (written after each row) and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import classify  # noqa: E402
import qa  # noqa: E402
import tag  # noqa: E402
from common import OUT, environment, require_data, save_json  # noqa: E402
from setup_mpnet import CACHE  # noqa: E402

TASKS = ("sst2", "mrpc", "conll", "squad")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def timed(fn, *args, **kwargs) -> tuple[dict, float]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, round(time.perf_counter() - start, 1)


def classify_row(name: str, args, work: Path) -> dict:
    parts, limit = {"sst2": (("sst2",), args.sst2_limit), "mrpc": (("glue", "MRPC"), None)}[name]
    folder = require_data(*parts)
    hyper = classify.Hyper(epochs=1 if name == "sst2" else args.pair_epochs)
    row = {"train_examples": len(classify.read_split(folder / "train.tsv")[0][: limit or None]),
           "epochs": hyper.epochs, "hyper": vars(hyper)}
    for side, run in (("ours", classify.run_ours), ("trainer", classify.run_trainer)):
        if side not in args.sides:
            continue
        result, seconds = timed(run, name, folder, hyper, limit, work / f"{name}-{side}", model=args.model)
        row[side] = {"dev": result["dev"], "call_s": seconds, "train_wall_s": result["usage"]["wall_s"],
                     "load": [result["usage"]["load_before"], result["usage"]["load_after"]]}
        log(f"{name}: {side} dev {result['dev']} ({seconds} s)")
    row["metrics"] = {side: {k: row[side]["dev"].get(k) for k in ("accuracy", "f1")} for side in args.sides}
    row["main"] = "accuracy" if name == "sst2" else "f1"
    return row


def conll_row(args, work: Path) -> dict:
    from bertheads.tasks.tag.scheme import tag_list

    data = require_data("conll2003")
    train, dev = tag.read_conll(data / "train.txt", args.conll_limit), tag.read_conll(data / "dev.txt")
    labels = tag_list([type("S", (), {"tags": t})() for _, t in train], with_inside=False)
    tmp = Path(tempfile.mkdtemp(prefix="base-size-conll-"))
    tag.write_conll(tmp / "train.txt", train)
    tag.write_conll(tmp / "dev.txt", dev)
    row = {"train_examples": len(train), "epochs": 1, "hyper": tag.HYPER, "main": "f1"}
    ours, seconds = timed(tag.run_ours, tmp / "train.txt", tmp / "dev.txt", work / "conll-ours", 1, model=args.model)
    row["ours"] = {"dev_f1": ours["dev_f1"], "call_s": seconds}
    log(f"conll: ours F1 {ours['dev_f1']:.4f} ({seconds} s)")
    theirs, seconds = timed(tag.run_trainer, train, dev, labels, args.model, work / "conll-trainer", 1)
    row["trainer"] = {"dev_f1": theirs["dev_f1"], "call_s": seconds}
    log(f"conll: Trainer F1 {theirs['dev_f1']:.4f} ({seconds} s)")
    row["metrics"] = {side: {"f1": row[side]["dev_f1"]} for side in ("ours", "trainer")}
    return row


def squad_row(args, work: Path) -> dict:
    import bertheads
    from bertheads.tasks.qa.formats import read_examples

    train_path, eval_path = require_data("squad", "train-split.json"), require_data("squad", "eval-split.json")
    train = read_examples(str(train_path))[: args.squad_limit]
    evaluate = read_examples(str(eval_path))[: args.squad_eval_limit]
    row = {"train_examples": len(train), "eval_examples": len(evaluate), "epochs": qa.EPOCHS, "main": "f1"}
    _, seconds = timed(qa.train_ours, train_path, args.squad_limit, work / "squad-ours", model=args.model)
    model = bertheads.load(work / "squad-ours")
    _, answers = qa.predict_ours(model, [{"question": e.question, "context": e.context} for e in evaluate])
    row["ours"] = {**qa.scores(answers, evaluate), "call_s": seconds}
    log(f"squad: ours {row['ours']}")
    theirs, seconds = timed(qa.run_trainer, args.model, train, evaluate, work / "squad-trainer")
    row["trainer"] = {**qa.scores(theirs["answers"], evaluate), "call_s": seconds}
    log(f"squad: Trainer {row['trainer']}")
    row["metrics"] = {side: {k: row[side][k] for k in ("exact_match", "f1")} for side in ("ours", "trainer")}
    return row


def markdown(results: dict) -> str:
    lines = ["| task | train examples | epochs | metric | bertheads | Trainer | bertheads s | Trainer s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, row in results["rows"].items():
        sides = [row["metrics"].get(side, {}) for side in ("ours", "trainer")]
        for metric in next(s for s in sides if s):
            cells = [f"{s[metric]:.4f}" if metric in s else "" for s in sides]
            times = [str(row.get(side, {}).get("call_s", "")) for side in ("ours", "trainer")]
            lines.append(f"| {name} | {row['train_examples']} | {row['epochs']} | {metric} | {' | '.join(cells)} "
                         f"| {' | '.join(times)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(CACHE / "all-mpnet-base-v2"), help="checkpoint folder (both sides)")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated: " + ", ".join(TASKS))
    parser.add_argument("--sst2-limit", type=int, default=8000, help="first N SST-2 training sentences")
    parser.add_argument("--pair-epochs", type=int, default=3, help="MRPC epochs")
    parser.add_argument("--conll-limit", type=int, help="first N CoNLL training sentences (default: all)")
    parser.add_argument("--squad-limit", type=int, default=1500, help="first N SQuAD training questions")
    parser.add_argument("--squad-eval-limit", type=int, default=1000, help="first N SQuAD eval questions")
    parser.add_argument("--sides", default="ours,trainer", help="which sides run: ours, trainer or both (sst2, mrpc)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--name", default="base_size", help="results in bench/out/NAME.json and NAME/")
    args = parser.parse_args(argv)
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip() in ("ours", "trainer")]
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: no checkpoint there (run bench/setup_mpnet.py first)")
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        parser.error(f"--tasks: unknown {', '.join(unknown)} (known: {', '.join(TASKS)})")
    work = OUT / args.name
    work.mkdir(parents=True, exist_ok=True)
    results = {"command": " ".join(["python", "bench/base_size.py", *sys.argv[1:]]), "model": args.model,
               "environment": environment(), "load_average_start": os.getloadavg(), "rows": {}}
    log(f"{args.model}: {', '.join(names)}; {results['environment']['machine']}, load {os.getloadavg()}")
    for name in names:
        if name in ("sst2", "mrpc"):
            results["rows"][name] = classify_row(name, args, work)
        elif name == "conll":
            results["rows"][name] = conll_row(args, work)
        else:
            results["rows"][name] = squad_row(args, work)
        results["load_average_end"] = os.getloadavg()
        save_json(args.name, results)
    print(markdown(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
