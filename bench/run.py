"""Run every benchmark script present in bench/ in turn, passing --limit through.

    .venv/bin/python bench/run.py --limit 2000 [--only classify,tag]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

SCRIPTS = ("classify", "tag", "qa", "features", "multi")  # in this order, each if present


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, help="passed to each script as --limit")
    parser.add_argument("--only", help="comma-separated subset of: " + ", ".join(SCRIPTS))
    args = parser.parse_args()
    here = Path(__file__).resolve().parent
    chosen = args.only.split(",") if args.only else SCRIPTS
    failed = []
    for name in chosen:
        script = here / f"{name}.py"
        if not script.is_file():
            print(f"bench/run.py: skipping {name} (no {script.name})", flush=True)
            continue
        cmd = [sys.executable, str(script)] + (["--limit", str(args.limit)] if args.limit else [])
        print(f"bench/run.py: {' '.join(cmd)}", flush=True)
        if subprocess.call(cmd) != 0:
            failed.append(name)
    if failed:
        print(f"bench/run.py: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
