"""One run per output folder: an exclusive lock beside the folder (`.NAME.lock`, so that the
folder itself can be swapped into place atomically) held for the run's duration.

The lock is the kernel's (`flock`): it goes with the process that holds it, so a run that was
killed leaves no lock that blocks the next one (only its file, which the next run reuses). The file names the holder (pid, command, start)
for the message the second run prints.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from bertheads.base.errors import UserError

_HELD: dict[Path, int] = {}  # target -> the open lock file's descriptor


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


def holder(path: Path) -> str:
    """Who holds the lock at `path`, as the lock file says."""
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    started = time.strftime("%H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid', '?')}, since {started}: {info.get('command', '?')}"


def hold(target: str | Path, what: str = "run", instead: str = "folder") -> Path:
    """Take the lock of `target` for this process (again: a no-op), or refuse at once, naming the
    process that holds it (and saying to choose another `instead`). Released when the process
    ends or by `release`."""
    target = Path(target).absolute()
    if target in _HELD:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    path = lock_path(target)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{target}: another bertheads {what} is writing here ({holder(path)}); wait for it "
                            f"to end or choose another {instead}") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed the file between our open and our lock: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "started": time.time(),
                             "command": " ".join(["bertheads", *sys.argv[1:]])[:300]}).encode())
    _HELD[target] = fd
    return target


def release(target: str | Path) -> None:
    """Give the lock of `target` back and delete its file (a process that opened the file meanwhile
    finds it gone once it has the lock, and locks a new one)."""
    target = Path(target).absolute()
    fd = _HELD.pop(target, None)
    if fd is None:
        return
    lock_path(target).unlink(missing_ok=True)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
