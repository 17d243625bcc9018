"""Run one `bertheads` command in this process with the time of each part recorded (what
bench/warm.py launches). The parts are the functions a training run passes through, timed by
wrapping them; their names exist in the code before and after the fast warm-run changes.

usage: python bench/warm_run.py PARTS.json -- train classify ...   (BENCH_SPAWNED: the
parent's time.time() at launch, so the import time before `main` counts as start-up)
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

START = float(os.environ.get("BENCH_SPAWNED", time.time()))
PARTS: dict[str, float] = {}


def timed(owner, attr: str, part: str) -> None:
    original = getattr(owner, attr)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            PARTS[part] = PARTS.get(part, 0.0) + time.perf_counter() - began

    setattr(owner, attr, wrapper)


def main() -> int:
    out, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    import importlib

    from bertheads.cli import main as cli
    from bertheads.encoder.pretrained import Encoder
    from bertheads.saved import bundle
    from bertheads.store import features_cache as cache
    from bertheads.training import joint as multitask

    train = importlib.import_module("bertheads.training.loop")  # the package's `train` is the API function

    PARTS["imports"] = time.time() - START
    load = Encoder.load.__func__
    Encoder.load = classmethod(lambda cls, *a, **k: timed_call("load encoder", load, cls, *a, **k))
    timed(multitask, "read_data", "read + tokenize")
    timed(cache, "encoder_identity", "key: encoder hash")
    if hasattr(multitask, "reference"):  # the remembered checkpoint hash (after the change)
        timed(multitask, "reference", "key: encoder hash")
    timed(cache, "cache_key", "key: data hash")
    timed(cache, "ensure_cache", "cache entry")
    timed(train, "train_epoch", "epoch")
    timed(multitask, "evaluate_task", "dev")
    timed(bundle, "save", "save")
    run_main = cli.main

    def main_then_record(_argv=None) -> int:
        code = run_main(argv)
        PARTS["total"] = time.time() - START
        with open(out, "w") as f:
            json.dump({k: round(v, 3) for k, v in PARTS.items()}, f)
        return code

    if not hasattr(cli, "command"):  # code before the quick exit: the command was main()
        return main_then_record()
    cli.main = main_then_record  # command() calls main(), then ends the process as `bertheads` does
    cli.command()
    return 0


def timed_call(part: str, fn, *args, **kwargs):
    began = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        PARTS[part] = PARTS.get(part, 0.0) + time.perf_counter() - began


if __name__ == "__main__":
    sys.exit(main())
