"""Fine-tuning against a warm features-mode run, each as a whole command (process start to
exit), on the first 8,000 SST-2 training sentences for 1 epoch, both at their defaults.

Sides alternate within each round (the machine is shared). The features cache is built once
before the rounds (a cold run, reported apart); every timed features run finds it warm. Each
run goes through bench/warm_run.py, which also records the time of each part.

usage: python bench/warm.py [--src SRC] [--rounds 2] [--finetune-rounds 1] [--name NAME]
  --src: the `src` folder to run (another checkout's, to time the code before a change)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import require_data, save_json  # noqa: E402

HERE = Path(__file__).resolve().parent


def run(src: str, args: list[str], work: Path, tag: str) -> dict:
    """One command through warm_run.py: wall time, the parts and the kept dev metrics."""
    parts = work / f"{tag}.parts.json"
    out = work / f"{tag}.model"
    env = {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "BENCH_SPAWNED": repr(time.time())}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / "warm_run.py"), str(parts), "--", *args, "--out", str(out),
                           "--no-progress", "-q"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{tag} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out)
    return {"wall_s": round(wall, 2), "parts": json.loads(parts.read_text()),
            "dev_accuracy": metrics["dev"]["accuracy"], "model_bytes": size,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(HERE.parent / "src"))
    ap.add_argument("--rounds", type=int, default=2, help="rounds of warm features runs")
    ap.add_argument("--finetune-rounds", type=int, default=1, help="rounds (of --rounds) that also fine-tune")
    ap.add_argument("--limit", type=int, default=8000)
    ap.add_argument("--name", default="warm")
    ap.add_argument("--features-flags", default="", help="extra flags for the features side")
    ap.add_argument("--cache-dir", default=None, help="default: a fresh temporary folder")
    a = ap.parse_args()
    sst2 = require_data("sst2")
    base = ["train", "classify", "--train", str(sst2 / "train.tsv"), "--dev", str(sst2 / "dev.tsv"),
            "--limit", str(a.limit), "--epochs", "1"]
    work = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    cache = a.cache_dir or str(work / "cache")
    features = [*base, "--mode", "features", "--cache-dir", cache, *a.features_flags.split()]
    result = {"src": a.src, "limit": a.limit, "features_args": features, "finetune_args": base,
              "cold": run(a.src, features, work, "cold"), "warm": [], "finetune": []}
    print("cold features run:", json.dumps(result["cold"]), flush=True)
    for r in range(a.rounds):
        sides = ["warm", "finetune"] if r % 2 == 0 else ["finetune", "warm"]
        for side in sides:
            if side == "finetune" and r >= a.finetune_rounds:
                continue
            rec = run(a.src, features if side == "warm" else base, work, f"{side}{r}")
            result[side].append(rec)
            print(f"round {r} {side}:", json.dumps(rec), flush=True)
    for side in ("warm", "finetune"):
        if result[side]:
            result[f"{side}_median_s"] = statistics.median(x["wall_s"] for x in result[side])
    if result["finetune"] and result["warm"]:
        result["speedup"] = round(result["finetune_median_s"] / result["warm_median_s"], 2)
        print(f"fine-tuning {result['finetune_median_s']:.1f} s, warm features {result['warm_median_s']:.1f} s: "
              f"{result['speedup']}x")
    shutil.rmtree(work, ignore_errors=True)
    print("wrote", save_json(a.name, result))


if __name__ == "__main__":
    main()
