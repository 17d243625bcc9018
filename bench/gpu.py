"""bertheads fine-tuning and prediction in bf16 (`--precision bf16`, the encoder's SDPA
attention) against the Hugging Face Trainer with `bf16=True` and the text-classification
pipeline with `dtype=torch.bfloat16` on our model's transformers export, on the same checkpoint,
data and hyperparameters, in one run (bench/gpu.sh).

On a CUDA device every side runs there; without one they run on the CPU (ours in what
`--precision auto` gives there), which is only a check that the script works. Records wall
times, examples per second, ratios and dev accuracy in bench/out/gpu.json (or `--out`), and with
`--results FILE` appends a row to that Markdown file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import DATA, OUT, environment  # noqa: E402


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def read_tsv(path: Path, limit: int | None = None) -> tuple[list[str], list[int]]:
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    rows = [line.rsplit("\t", 1) for line in lines if line.strip()][:limit]
    return [r[0] for r in rows], [int(r[1]) for r in rows]


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def run_ours(args, device: str, work: Path) -> dict:
    import bertheads

    # bf16 on a GPU; on a CPU what --precision auto gives there (bf16 only with AMX/AVX512_BF16)
    precision = "bf16" if device == "cuda" else "auto"
    settings = bertheads.TrainSettings(epochs=1, batch_size=args.batch_size, lr=args.lr, progress=False,
                                       device=device, precision=precision)
    sync(device)
    start = time.perf_counter()
    bertheads.train("classify", str(args.train), None, work / "ours", model=args.model, settings=settings,
                    limit=args.limit)
    sync(device)
    train_s = time.perf_counter() - start
    texts, gold = read_tsv(args.dev, args.dev_limit)
    model = bertheads.load(work / "ours", device=device, runtime="torch", precision=precision)
    start = time.perf_counter()
    predicted = [p["label"] for p in model.predict(texts)]
    sync(device)
    predict_s = time.perf_counter() - start
    return {"train_seconds": train_s, "predict_seconds": predict_s, "dev_examples": len(texts),
            "accuracy": float(np.mean(np.asarray(predicted) == np.asarray(gold))),
            "mode": f"{model.mode.runtime} {model.mode.precision} on {model.mode.device}"}


def run_pipeline(device: str, work: Path, texts: list[str], gold: list[int]) -> dict:
    """The transformers text-classification pipeline in bf16 on our model's transformers export."""
    import torch
    from transformers import pipeline

    from bertheads.export.hf import export_hf

    export_hf(work / "ours", work / "hf")
    pipe = pipeline("text-classification", model=str(work / "hf"), device=0 if device == "cuda" else -1,
                    dtype=torch.bfloat16)
    sync(device)
    start = time.perf_counter()
    out = pipe(texts, batch_size=64, truncation=True)
    sync(device)
    seconds = time.perf_counter() - start
    labels = [int(pipe.model.config.label2id.get(o["label"], o["label"].rsplit("_", 1)[-1])) for o in out]
    return {"predict_seconds": seconds, "dev_examples": len(texts),
            "accuracy": float(np.mean(np.asarray(labels) == np.asarray(gold)))}


def run_trainer(args, device: str, work: Path) -> dict:
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from bertheads.encoder.pretrained import quiet_transformers, resolve_model

    quiet_transformers()
    source = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(source)
    texts, gold = read_tsv(args.train, args.limit)
    dev_texts, dev_gold = read_tsv(args.dev, args.dev_limit)

    def dataset(t, y):
        enc = tokenizer(t, truncation=True, max_length=128)
        return [{**{k: enc[k][i] for k in enc}, "labels": y[i]} for i in range(len(t))]

    torch.manual_seed(42)
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=2)
    targs = TrainingArguments(output_dir=str(work / "trainer"), num_train_epochs=1,
                              per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
                              learning_rate=args.lr, warmup_steps=0.1, weight_decay=0.01, bf16=True,
                              use_cpu=device == "cpu", eval_strategy="no", save_strategy="no",
                              logging_strategy="no", report_to="none", disable_tqdm=True, seed=42)
    trainer = Trainer(model=model, args=targs, train_dataset=dataset(texts, gold),
                      data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer)
    sync(device)
    start = time.perf_counter()
    trainer.train()
    sync(device)
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    prediction = trainer.predict(dataset(dev_texts, dev_gold))
    sync(device)
    predict_s = time.perf_counter() - start
    return {"train_seconds": train_s, "predict_seconds": predict_s, "dev_examples": len(dev_texts),
            "accuracy": float(np.mean(prediction.predictions.argmax(-1) == np.asarray(dev_gold)))}


HEADER = ("\n## GPU recipe (bench/gpu.sh): bf16 training and prediction against the Trainer and the pipeline\n\n"
          "| date | device | machine | train examples | train s ours / Trainer | predict sent/s ours / Trainer / "
          "pipeline bf16 | accuracy ours / Trainer / pipeline |\n|---|---|---|---|---|---|---|\n")


def append_row(path: Path, result: dict) -> None:
    """One Markdown row for RESULTS.md (the section's header first when it is not there yet)."""
    ours, peer, pipe = result["ours"], result["trainer"], result["pipeline"]
    text = path.read_text() if path.exists() else ""
    if "## GPU recipe (bench/gpu.sh)" not in text:
        text += HEADER
    n = ours["dev_examples"]
    text += (f"| {time.strftime('%Y-%m-%d')} | {result['device']} | {result['environment'].get('machine', '')} | "
             f"{result['train_examples']} | {ours['train_seconds']:.1f} / {peer['train_seconds']:.1f} | "
             f"{n / ours['predict_seconds']:.0f} / {n / peer['predict_seconds']:.0f} / "
             f"{n / pipe['predict_seconds']:.0f} | {ours['accuracy']:.4f} / {peer['accuracy']:.4f} / "
             f"{pipe['accuracy']:.4f} |\n")
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--train", type=Path, default=DATA / "sst2" / "train.tsv")
    parser.add_argument("--dev", type=Path, default=DATA / "sst2" / "dev.tsv")
    parser.add_argument("--model", default="default")
    parser.add_argument("--limit", type=int, help="first N training sentences (default: all)")
    parser.add_argument("--dev-limit", type=int)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--out", type=Path, default=OUT / "gpu.json")
    parser.add_argument("--results", type=Path, help="append the result as a row of this Markdown file "
                                                     "(bench/RESULTS.md)")
    args = parser.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="bertheads-gpu-") as tmp:
        work = Path(tmp)
        log(f"ours (bf16 autocast) on {device}")
        ours = run_ours(args, device, work)
        log(f"ours: {ours}")
        log(f"Trainer (bf16=True) on {device}")
        peer = run_trainer(args, device, work)
        log(f"Trainer: {peer}")
        log(f"pipeline (dtype=bfloat16) on {device}")
        texts, gold = read_tsv(args.dev, args.dev_limit)
        pipe = run_pipeline(device, work, texts, gold)
        log(f"pipeline: {pipe}")
    examples = args.limit or len(read_tsv(args.train)[0])
    result = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "train_examples": examples,
              "ours": ours, "trainer": peer, "pipeline": pipe, "environment": environment(),
              "command": " ".join(sys.argv),
              "training_speedup": peer["train_seconds"] / ours["train_seconds"],
              "prediction_speedup": peer["predict_seconds"] / ours["predict_seconds"],
              "pipeline_prediction_speedup": pipe["predict_seconds"] / ours["predict_seconds"],
              "accuracy_difference_points": 100 * (ours["accuracy"] - peer["accuracy"])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.results:
        append_row(args.results, result)
    print(json.dumps({k: result[k] for k in ("device", "train_examples", "training_speedup", "prediction_speedup",
                                             "accuracy_difference_points")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
