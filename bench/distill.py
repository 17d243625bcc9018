"""Distillation on SST-2 (or CoNLL-2003, `--task conll`): a teacher fine-tuned on the first N
labelled rows, the student fine-tuned on those rows alone, and the student distilled
(`bertheads.distill`) on the same rows plus the next M training sentences without their labels
(CoNLL: as raw text), each scored on the task's dev set (SST-2 accuracy, CoNLL entity F1), with
each model's prediction speed on the dev inputs (torch fp32, the same inputs, one process).

```
python bench/distill.py                                   # MiniLM-L6 (default) as teacher and student
python bench/distill.py --teacher-model PATH/all-mpnet-base-v2   # the base-size teacher (bench/setup_mpnet.py)
python bench/distill.py --teacher-folder bench/out/base_size_sst2_2000/sst2-ours   # a teacher trained already
python bench/distill.py --labelled 2000 --unlabelled 8000 --epochs 2 --distill-epochs 1 --max-length 64
python bench/distill.py --task conll --labelled 2000 --unlabelled 12000 --max-length 128
```
With the same checkpoint as teacher and student, the student alone is the teacher's own run
(self-distillation: what the unlabelled sentences add), so it is trained once. Each arm's record
goes to bench/out/distill/results.jsonl; the table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATA, OUT, cpu_line  # noqa: E402


def write_data(task: str, folder: Path, labelled: int, unlabelled: int, limit_dev: int | None):
    """The task's labelled rows, the next rows without labels, a dev file and its texts:
    `(kind, train, pool, dev, texts, metric)`. SST-2: sentences; CoNLL-2003: sentences, the
    unlabelled ones as raw text lines (their tokens joined by spaces)."""
    if task == "sst2":
        rows = [line.split("\t") for line in (DATA / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
                if line.strip()]
        (folder / "labelled.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows[:labelled]),
                                             encoding="utf-8")
        pool = [t for t, _ in rows[labelled:labelled + unlabelled]]
        dev = (DATA / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()
        dev = dev[: 1 + limit_dev] if limit_dev else dev
        (folder / "dev.tsv").write_text("\n".join(dev) + "\n", encoding="utf-8")
        texts = [line.split("\t")[0] for line in dev[1:] if line.strip()]
        train, dev_path, kind, metric = folder / "labelled.tsv", folder / "dev.tsv", "classify", "accuracy"
    else:
        def blocks(name: str) -> list[str]:
            text = (DATA / "conll2003" / name).read_text(encoding="utf-8")
            return [b.strip("\n") for b in text.split("\n\n") if b.strip()]

        rows = blocks("train.txt")
        (folder / "labelled.txt").write_text("\n\n".join(rows[:labelled]) + "\n", encoding="utf-8")
        pool = [" ".join(line.split()[0] for line in b.splitlines()) for b in rows[labelled:labelled + unlabelled]]
        dev = blocks("dev.txt")[:limit_dev or None]
        (folder / "dev.txt").write_text("\n\n".join(dev) + "\n", encoding="utf-8")
        texts = [[line.split()[0] for line in b.splitlines()] for b in dev]
        train, dev_path, kind, metric = folder / "labelled.txt", folder / "dev.txt", "tag", "f1"
    (folder / "unlabelled.txt").write_text("".join(f"{t}\n" for t in pool), encoding="utf-8")
    return kind, str(train), str(folder / "unlabelled.txt"), str(dev_path), texts, metric


def score(model, dev: str, texts: list, metric: str) -> dict:
    """The dev metric and the prediction speed on the dev texts (inputs per second, the best of
    two passes)."""
    model.predict(texts[:64])
    best = 0.0
    for _ in range(2):
        start = time.perf_counter()
        model.predict(texts)
        best = max(best, len(texts) / (time.perf_counter() - start))
    return {metric: round(float(model.evaluate(dev)[metric]), 4), "inputs_per_s": round(best, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="sst2", choices=("sst2", "conll"))
    parser.add_argument("--limit-dev", type=int, default=None, help="score on the first N dev rows only")
    parser.add_argument("--teacher-model", default="default", help="the teacher's checkpoint")
    parser.add_argument("--student-model", default="default", help="the student's checkpoint")
    parser.add_argument("--teacher-folder", default=None,
                        help="a bertheads model already trained on the same labelled rows (e.g. bench/base_size.py's "
                             "sst2-ours): scored and distilled from, not trained again")
    parser.add_argument("--labelled", type=int, default=2000)
    parser.add_argument("--unlabelled", type=int, default=8000)
    parser.add_argument("--epochs", type=int, default=2, help="the teacher's and the student-alone's epochs")
    parser.add_argument("--distill-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--soft-temperature", type=float, default=2.0)
    parser.add_argument("--soft-weight", type=float, default=0.5)
    parser.add_argument("--out-dir", default=None, help="default: bench/out/distill (conll: distill-conll)")
    args = parser.parse_args()
    import bertheads

    folder = Path(args.out_dir or OUT / ("distill" if args.task == "sst2" else f"distill-{args.task}"))
    folder.mkdir(parents=True, exist_ok=True)
    kind, train, pool, dev, texts, metric = write_data(args.task, folder, args.labelled, args.unlabelled,
                                                        args.limit_dev)
    settings = dict(epochs=args.epochs, batch_size=args.batch_size, progress=False, verbose=True)
    results = folder / "results.jsonl"
    rows = []

    def record(arm: str, model, seconds: float, checkpoint: str) -> None:
        row = {"arm": arm, "task": args.task, "checkpoint": checkpoint, **score(model, dev, texts, metric),
               "train_seconds": round(seconds, 1),
               "labelled": args.labelled, "unlabelled": args.unlabelled if arm == "distilled" else 0,
               "machine": cpu_line(), "threads": __import__("torch").get_num_threads(), "args": vars(args)}
        rows.append(row)
        with open(results, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: row[k] for k in ("arm", metric, "inputs_per_s", "train_seconds")}), flush=True)

    start = time.perf_counter()
    if args.teacher_folder:
        teacher_folder = Path(args.teacher_folder)
        record("teacher", bertheads.load(teacher_folder), 0.0, str(teacher_folder))
    else:
        teacher_folder = folder / "teacher"
        teacher = bertheads.train(kind, train, None, teacher_folder, model=args.teacher_model,
                                  max_length=args.max_length, overwrite=True, **settings)
        record("teacher", teacher, time.perf_counter() - start, args.teacher_model)
    if args.student_model != args.teacher_model or args.teacher_folder:
        start = time.perf_counter()
        alone = bertheads.train(kind, train, None, None, model=args.student_model,
                                max_length=args.max_length, **settings)
        record("student alone", alone, time.perf_counter() - start, args.student_model)
    start = time.perf_counter()
    student = bertheads.distill(teacher_folder, folder / "student", data=pool, train=train,
                                model=args.student_model, soft_temperature=args.soft_temperature,
                                soft_weight=args.soft_weight, overwrite=True,
                                **{**settings, "epochs": args.distill_epochs, "batch_size": 32})
    record("distilled", student, time.perf_counter() - start, args.student_model)
    print(f"\n{cpu_line()}\n")
    print(f"| arm | checkpoint | labelled + unlabelled | {args.task} dev {metric} | inputs/s | training s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['checkpoint']} | {r['labelled']:,} + {r['unlabelled']:,} | {r[metric]:.4f} | "
              f"{r['inputs_per_s']:.0f} | {r['train_seconds']:.0f} |")


if __name__ == "__main__":
    main()
