"""An experiment, not a bertheads setting: fine-tuning with the word-embedding matrix frozen (out
of AdamW, gradient clipping and the dense embedding gradient, about half of the default
checkpoint's weights) against the full model, in fp32 and bf16, on the first N SST-2 training
sentences, 1 epoch, batch 32, seed 42, dev accuracy on SST-2 dev. Each run is a fresh process
that calls `bertheads.train` with `training.loop.param_groups` wrapped to freeze the matrix.

    .venv/bin/python bench/frozen_embeddings.py --limit 8000

Results: one JSON line per run and Markdown rows on stdout, with the CPU line.
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

from common import cpu_line  # noqa: E402
from precision_train import subset  # noqa: E402


def run(variant: str, precision: str, train: str, dev: str) -> None:
    """One training run in this process (the worker side)."""
    import bertheads
    from bertheads.training import loop

    if variant == "frozen":
        groups = loop.param_groups

        def frozen_groups(model, weight_decay):
            for name, p in model.named_parameters():
                if "word_embeddings" in name:
                    p.requires_grad_(False)
            return groups(model, weight_decay)

        loop.param_groups = frozen_groups
    start = time.perf_counter()
    model = bertheads.train("classify", train, dev, None, epochs=1, batch_size=32, mode="finetune", seed=42,
                            precision=precision, progress=False, verbose=False)
    last = model.metrics["history"][-1]
    dev_metrics = next(iter(last["dev"].values())) if "accuracy" not in last["dev"] else last["dev"]
    print(json.dumps({"variant": variant, "precision": precision,
                      "train_examples_per_second": last["train_examples_per_second"],
                      "accuracy": dev_metrics["accuracy"], "seconds": round(time.perf_counter() - start, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=8000)
    parser.add_argument("--worker", nargs=4, metavar=("VARIANT", "PRECISION", "TRAIN", "DEV"))
    args = parser.parse_args()
    if args.worker:
        run(*args.worker)
        return
    train, dev = subset("classify", args.limit)  # the first N SST-2 training sentences, and SST-2 dev
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    rows = []
    for variant, precision in (("full", "fp32"), ("frozen", "fp32"), ("frozen", "bf16"), ("full", "bf16")):
        done = subprocess.run([sys.executable, __file__, "--worker", variant, precision, str(train), str(dev)], env=env,
                              capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"<!-- {cpu_line()} -->")
    print("| word embeddings | precision | train examples/s | dev accuracy |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['precision']} | {r['train_examples_per_second']:.1f} | {r['accuracy'] * 100:.2f} |")


if __name__ == "__main__":
    main()
