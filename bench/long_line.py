"""Peak memory of `bertheads predict` on one huge line against a normal one (classify, truncate).

usage: python bench/long_line.py [--words 4000000] [--model DIR]   (without --model a model is
trained for one epoch on examples/sentiment with the default checkpoint into bench/out/long-line)
Prints one markdown row per input: the line's size, peak RSS of the whole command, wall time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from common import cpu_line  # noqa: E402


def run(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one command run in a fresh process (its own rusage)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(proc.stderr.read().decode())
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=4_000_000)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    out = ROOT / "bench/out/long-line"
    out.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "bertheads"]
    model = args.model or str(out / "model")
    if args.model is None and not (out / "model/bertheads.json").is_file():
        subprocess.run(cli + ["train", "classify", "--train", str(ROOT / "examples/sentiment/train.tsv"),
                              "--out", model, "--epochs", "1", "--no-progress", "--overwrite"], check=True)
    normal = out / "normal.txt"
    normal.write_text("a warm, funny and wonderfully acted film\n")
    huge = out / "huge.txt"
    words = ("a warm funny and wonderfully acted film " * (args.words // 7 + 1)).split()[: args.words]
    huge.write_text(" ".join(words) + "\n")
    print(f"<!-- {cpu_line()} -->")
    print("| input | bytes | peak RSS MB | wall s |\n|---|---|---|---|")
    for name, path in (("one short line", normal), (f"one line of {args.words:,} words", huge)):
        wall, peak = run(cli + ["predict", model, "--input", str(path)])
        print(f"| {name} | {path.stat().st_size:,} | {peak:.0f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
