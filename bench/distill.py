"""Distillation on SST-2: a teacher fine-tuned on the first N labelled rows, the student fine-tuned
on those rows alone, and the student distilled (`bertheads.distill`) on the same rows plus the next
M training sentences without their labels, each scored on all of SST-2 dev (872), with each
model's prediction speed on the dev sentences (torch fp32, the same texts, one process).

```
python bench/distill.py                                   # MiniLM-L6 (default) as teacher and student
python bench/distill.py --teacher-model PATH/all-mpnet-base-v2   # the base-size teacher (bench/setup_mpnet.py)
python bench/distill.py --labelled 2000 --unlabelled 8000 --epochs 2 --distill-epochs 1 --max-length 64
```
With the same checkpoint as teacher and student, the student alone is the teacher's own run
(self-distillation: what the unlabelled sentences add), so it is trained once. Each arm's record
goes to bench/out/distill/results.jsonl; the table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATA, OUT, cpu_line  # noqa: E402


def write_data(folder, labelled: int, unlabelled: int) -> tuple[str, str, list[tuple[str, int]]]:
    lines = (DATA / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    train = folder / "labelled.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows[:labelled]), encoding="utf-8")
    pool = folder / "unlabelled.txt"
    pool.write_text("".join(f"{t}\n" for t, _ in rows[labelled:labelled + unlabelled]), encoding="utf-8")
    dev = [line.split("\t") for line in (DATA / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
           if line.strip()]
    return str(train), str(pool), [(t, int(y)) for t, y in dev]


def score(model, dev: list[tuple[str, int]]) -> dict:
    """Accuracy on dev and the prediction speed (sentences per second, the best of two passes)."""
    texts = [t for t, _ in dev]
    model.predict(texts[:64])
    best = 0.0
    for _ in range(2):
        start = time.perf_counter()
        predictions = model.predict(texts)
        best = max(best, len(texts) / (time.perf_counter() - start))
    accuracy = sum(int(p["label"]) == y for p, (_, y) in zip(predictions, dev)) / len(dev)
    return {"accuracy": round(accuracy, 4), "sentences_per_s": round(best, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher-model", default="default", help="the teacher's checkpoint")
    parser.add_argument("--student-model", default="default", help="the student's checkpoint")
    parser.add_argument("--labelled", type=int, default=2000)
    parser.add_argument("--unlabelled", type=int, default=8000)
    parser.add_argument("--epochs", type=int, default=2, help="the teacher's and the student-alone's epochs")
    parser.add_argument("--distill-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--soft-temperature", type=float, default=2.0)
    parser.add_argument("--soft-weight", type=float, default=0.5)
    parser.add_argument("--out-dir", default=str(OUT / "distill"))
    args = parser.parse_args()
    import bertheads

    folder = Path(args.out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    train, pool, dev = write_data(folder, args.labelled, args.unlabelled)
    settings = dict(epochs=args.epochs, batch_size=args.batch_size, progress=False, verbose=True)
    results = folder / "results.jsonl"
    rows = []

    def record(arm: str, model, seconds: float, checkpoint: str) -> None:
        row = {"arm": arm, "checkpoint": checkpoint, **score(model, dev), "train_seconds": round(seconds, 1),
               "labelled": args.labelled, "unlabelled": args.unlabelled if arm == "distilled" else 0,
               "machine": cpu_line(), "threads": __import__("torch").get_num_threads(), "args": vars(args)}
        rows.append(row)
        with open(results, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: row[k] for k in ("arm", "accuracy", "sentences_per_s", "train_seconds")}), flush=True)

    start = time.perf_counter()
    teacher = bertheads.train("classify", train, None, folder / "teacher", model=args.teacher_model,
                              max_length=args.max_length, overwrite=True, **settings)
    record("teacher", teacher, time.perf_counter() - start, args.teacher_model)
    if args.student_model != args.teacher_model:
        start = time.perf_counter()
        alone = bertheads.train("classify", train, None, None, model=args.student_model,
                                max_length=args.max_length, **settings)
        record("student alone", alone, time.perf_counter() - start, args.student_model)
    start = time.perf_counter()
    student = bertheads.distill(folder / "teacher", folder / "student", data=pool, train=train,
                                into=args.student_model, soft_temperature=args.soft_temperature,
                                soft_weight=args.soft_weight, overwrite=True,
                                **{**settings, "epochs": args.distill_epochs, "batch_size": 32})
    record("distilled", student, time.perf_counter() - start, args.student_model)
    print(f"\n{cpu_line()}, {os.environ.get('OMP_NUM_THREADS', 'all')} threads\n")
    print("| arm | checkpoint | labelled + unlabelled | SST-2 dev accuracy | sentences/s | training s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['checkpoint']} | {r['labelled']:,} + {r['unlabelled']:,} | {r['accuracy']:.4f} | "
              f"{r['sentences_per_s']:.0f} | {r['train_seconds']:.0f} |")


if __name__ == "__main__":
    main()
