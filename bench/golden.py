"""Golden outputs for a refactor: train a few small models on `examples/` once, then record what
`predict`, `evaluate` and `analyze` write for them; after a change, record again and compare the
files byte for byte (the models stay the ones trained before the change).

    python bench/golden.py train bench/out/golden/models       # once, on the code before the change
    python bench/golden.py record bench/out/golden/models bench/out/golden/before
    python bench/golden.py record bench/out/golden/models bench/out/golden/after   # after the change
    python bench/golden.py compare bench/out/golden/before bench/out/golden/after
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BERTHEADS = [sys.executable, "-m", "bertheads"]
FAST = ["--epochs", "1", "--seed", "7", "--no-progress", "-q"]

# name -> training arguments (`bertheads train ...`), each a small model of the embedded default checkpoint
MODELS = {
    "sentiment": ["classify", "--train", "sentiment/train.tsv", "--dev", "sentiment/dev.tsv",
                  "--label-names", "negative,positive", "--mode", "finetune", "--batch-size", "16"],
    "sentiment-features": ["classify", "--train", "sentiment/train.tsv", "--dev", "sentiment/dev.tsv",
                           "--mode", "features", "--layers", "-1,-2", "--epochs", "3"],
    "ner": ["tag", "--train", "ner/train.conll", "--dev", "ner/dev.conll", "--batch-size", "8",
            "--mode", "finetune"],
    "qa": ["qa", "--train", "qa/train.json", "--dev", "qa/dev.json", "--max-length", "192", "--stride", "64",
           "--batch-size", "8", "--mode", "finetune"],
    "demo": ["multi", "--config", "demo.yaml", "--batch-size", "16"],
}

# name -> (output file, command arguments after the model folder); inputs are relative to examples/
RUNS = {
    "sentiment": [("predict.jsonl", ["predict", "--input", "sentiment/dev.tsv"]),
                  ("predict-abstain.jsonl", ["predict", "--input", "sentiment/dev.tsv", "--min-confidence", "0.7"]),
                  ("predict-raw.jsonl", ["predict", "--input", "sentiment/dev.tsv", "--no-calibrate", "--min-score",
                                         "0.6"]),
                  ("evaluate.json", ["evaluate", "--data", "sentiment/dev.tsv", "--json", "--target-accuracy", "0.9"]),
                  ("analyze.jsonl", ["analyze", "--input", "analyze.jsonl"])],
    "sentiment-features": [("predict.jsonl", ["predict", "--input", "sentiment/dev.tsv"]),
                           ("evaluate.json", ["evaluate", "--data", "sentiment/dev.tsv", "--json"])],
    "ner": [("predict.jsonl", ["predict", "--input", "ner/dev.conll"]),
            ("predict.conll", ["predict", "--input", "ner/dev.conll", "--format", "conll"]),
            ("predict-abstain.jsonl", ["predict", "--input", "ner/dev.conll", "--min-confidence", "0.5"]),
            ("evaluate.json", ["evaluate", "--data", "ner/dev.conll", "--json"])],
    "qa": [("predict.jsonl", ["predict", "--input", "qa/dev.json"]),
           ("predict-train.jsonl", ["predict", "--input", "qa/train.json", "--min-confidence", "0.3"]),
           ("evaluate.json", ["evaluate", "--data", "qa/dev.json", "--json"])],
    "demo": [("analyze.jsonl", ["analyze", "--input", "analyze.jsonl"]),
             ("predict-sentiment.jsonl", ["predict", "--head", "sentiment", "--input", "sentiment/dev.tsv"]),
             ("predict-ner.jsonl", ["predict", "--head", "ner", "--input", "ner/dev.conll"]),
             ("evaluate-qa.json", ["evaluate", "--head", "qa", "--data", "qa/dev.json", "--json"])],
}

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def train(models: Path) -> None:
    for name, args in MODELS.items():
        out = models / name
        if (out / "bertheads.json").exists():
            continue
        cmd = [*BERTHEADS, "train", *args, "--out", str(out.resolve()), *FAST]
        subprocess.run(cmd, cwd=EXAMPLES, env=ENV, check=True)


def record(models: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for name, runs in RUNS.items():
        for file, (command, *args) in runs:
            cmd = [*BERTHEADS, command, str((models / name).resolve()), *args, "--runtime", "torch", "-q"]
            if command != "evaluate":
                cmd += ["--precision", "fp32"]
            done = subprocess.run(cmd, cwd=EXAMPLES, env=ENV, capture_output=True, check=False)
            if done.returncode:
                sys.exit(f"{name} {file}: exit {done.returncode}: {done.stderr.decode()[-2000:]}")
            (into / f"{name}--{file}").write_bytes(done.stdout)


def compare(before: Path, after: Path) -> int:
    names = sorted(p.name for p in before.iterdir())
    _, differ, missing = filecmp.cmpfiles(before, after, names, shallow=False)
    for name in differ + missing:
        print(f"differs: {name}")
    print(f"{len(names) - len(differ) - len(missing)} of {len(names)} files byte-identical")
    return 1 if differ or missing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("train", "record", "compare"))
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args()
    if args.step == "train":
        train(args.paths[0])
    elif args.step == "record":
        record(*args.paths[:2])
    else:
        return compare(*args.paths[:2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
