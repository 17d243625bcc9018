"""What resumable training costs (the default checkpoint, SST-2):

1. one checkpoint of a fine-tuning run: seconds to write (fsynced) and to read back, MB on disk;
   the run's identity hash (once per run) and one model save, for scale;
2. a --limit'ed SST-2 epoch with the run's files (log.jsonl every 10 steps, one checkpoint
   at its last step) and without them (no --out: no log, no checkpoint), rounds alternating
   between the sides (the machine is shared, so medians and the ratio are quoted); and what
   one checkpoint per epoch (the default) costs against a full 67,349-example epoch.

    nice -n 10 .venv/bin/python bench/checkpoint.py --limit 640 --rounds 3

Results: bench/out/checkpoint.json; a Markdown summary on stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import environment, require_data, save_json  # noqa: E402

SST2_EXAMPLES = 67349


def directory_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def prepare(limit: int):
    import torch

    from bertheads.encoder.pretrained import Encoder
    from bertheads.model import BertHeads
    from bertheads.training.flags import kind_defaults
    from bertheads.training.joint import prepare_task

    torch.manual_seed(42)
    encoder = Encoder.load("default")
    data = prepare_task("classify", str(require_data("sst2", "train.tsv")), None, encoder,
                        kind_defaults("classify"), limit)
    return BertHeads(encoder, {data.name: data.task}), [data]


def checkpoint_cost(work: Path, repeats: int) -> dict:
    from bertheads.saved import bundle
    from bertheads.training import checkpoint
    from bertheads.training.loop import TrainSettings, plan_epoch, set_up, train_step

    net, data = prepare(256)
    settings = TrainSettings(epochs=1, progress=False)
    run = set_up(net, data, settings)
    started = time.perf_counter()
    identity = checkpoint.identity(net, data, settings, run.world)
    identity_s = time.perf_counter() - started
    for t, idx in plan_epoch(data, settings, 0, 0, 1)[:2]:  # optimizer state exists after a step
        train_step(run, data, settings, t, idx)
    out = work / "cost"
    writes, reads = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        checkpoint.write(out, net, run.frozen, run.optimizer, run.scheduler, [checkpoint.rng_state()], identity,
                         {"step": 2})
        writes.append(time.perf_counter() - started)
        started = time.perf_counter()
        saved = checkpoint.read(out, 0)
        checkpoint.restore(saved, net, run.frozen, run.optimizer, run.scheduler)
        reads.append(time.perf_counter() - started)
    sizes = {p.name: round(p.stat().st_size / 1e6, 2) for p in (out / "checkpoint").iterdir()}
    started = time.perf_counter()
    bundle.save(net, work / "model")
    save_s = time.perf_counter() - started
    return {"write_s": writes, "read_restore_s": reads, "write_median_s": statistics.median(writes),
            "read_restore_median_s": statistics.median(reads), "mb": round(directory_mb(out / "checkpoint"), 1),
            "files_mb": sizes, "identity_s_256_examples": identity_s, "model_save_s": save_s,
            "model_mb": round(directory_mb(work / "model"), 1)}


def epoch_round(work: Path, limit: int, with_checkpoint: bool, name: str) -> dict:
    from bertheads.training.loop import TrainSettings, fit, plan_epoch

    net, data = prepare(limit)
    steps = len(plan_epoch(data, TrainSettings(), 0, 0, 1))
    settings = TrainSettings(epochs=1, progress=False, save_every=steps)
    out = work / name if with_checkpoint else None
    cpu = time.process_time()
    started = time.perf_counter()
    result = fit(net, data, settings, out)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    if out is not None:
        shutil.rmtree(out, ignore_errors=True)
    epoch_s = len(data[0].train_features) / result["history"][0]["train_examples_per_second"]
    return {"checkpoint": with_checkpoint, "epoch_s": epoch_s, "fit_wall_s": wall, "fit_cpu_s": cpu, "steps": steps,
            "loadavg": open("/proc/loadavg").read().split()[:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=640, help="SST-2 training examples in the timed epochs")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (with, without), alternating")
    parser.add_argument("--repeats", type=int, default=3, help="checkpoint writes timed")
    parser.add_argument("--name", default="checkpoint")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir=os.environ.get("BENCH_TMP")))
    try:
        cost = checkpoint_cost(work, args.repeats)
        rounds = []
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            for side in order:
                rounds.append(epoch_round(work, args.limit, side, f"r{r}-{int(side)}"))
                print(rounds[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with_s = statistics.median(x["epoch_s"] for x in rounds if x["checkpoint"])
    without_s = statistics.median(x["epoch_s"] for x in rounds if not x["checkpoint"])
    per_example = without_s / args.limit
    full_epoch_s = per_example * SST2_EXAMPLES
    result = {"environment": environment(), "limit": args.limit, "cost": cost, "rounds": rounds,
              "epoch_with_s": with_s, "epoch_without_s": without_s, "ratio": with_s / without_s,
              "full_epoch_estimate_s": full_epoch_s,
              "default_overhead_full_epoch": cost["write_median_s"] / full_epoch_s}
    path = save_json(args.name, result)
    print(f"\n| | |\n|---|---|\n| checkpoint size | {cost['mb']} MB ({cost['files_mb']}) |")
    print(f"| write (fsynced), median of {args.repeats} | {cost['write_median_s']:.2f} s |")
    print(f"| read + restore | {cost['read_restore_median_s']:.2f} s |")
    print(f"| model save (for scale) | {cost['model_save_s']:.2f} s, {cost['model_mb']} MB |")
    print(f"| run identity hash (256 examples) | {cost['identity_s_256_examples']:.2f} s |")
    print(f"| SST-2 epoch of {args.limit}: with one checkpoint / without (median) | {with_s:.1f} s / "
          f"{without_s:.1f} s = {with_s / without_s:.3f} |")
    print(f"| one checkpoint against a full SST-2 epoch (~{full_epoch_s:.0f} s at this speed) | "
          f"{100 * cost['write_median_s'] / full_epoch_s:.3f}% |")
    print(f"\n{path}")


if __name__ == "__main__":
    main()
