"""Crash points for the tests of what survives a kill: a point named in `$BERTHEADS_CRASH_AT`
kills the process there (SIGKILL, like a power cut), as the fault tests set it in a child."""

from __future__ import annotations

import os
import signal

CRASH_ENV = "BERTHEADS_CRASH_AT"  # tests: "POINT" or "POINT:N" kills the process (SIGKILL) there
ONCE_ENV = "BERTHEADS_CRASH_ONCE"  # tests: a file; only the process that creates it first is killed
_crash_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Die at once (SIGKILL, like a power cut to this process) when `$BERTHEADS_CRASH_AT` names
    this point: `NAME` the first time it is reached, `NAME:N` the N-th time. With
    `$BERTHEADS_CRASH_ONCE=FILE` only one process of many dies (the one that creates FILE), so
    the restarted worker of an engine goes on. For tests only."""
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    point, _, count = wanted.rpartition(":")
    if not count.isdigit():
        point, count = wanted, "1"
    if point != name:
        return
    _crash_counts[name] = _crash_counts.get(name, 0) + 1
    if _crash_counts[name] >= int(count or 1):
        once = os.environ.get(ONCE_ENV)
        if once:
            try:
                os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        os.kill(os.getpid(), signal.SIGKILL)
