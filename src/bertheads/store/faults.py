"""Faults of the environment met while writing (a full disk, permission denied, a read-only or
vanished folder), each said as one `SystemFault` line naming the target and what was kept."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from bertheads.base.errors import SystemFault

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def size_text(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} GB"


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` (a file or a directory); 0 when it is gone."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of `path` (or of its nearest existing parent)."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def is_disk_full(exc: BaseException) -> bool:
    """An error that says the disk is full: an OSError with ENOSPC/EDQUOT, or a library's own error
    (safetensors, torch) whose message carries the system's words."""
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        return True
    text = str(exc)
    return "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text


def system_fault(exc: BaseException, target: Path, what: str, written: int | None = None,
                 kept: bool = True) -> SystemFault | None:
    """The one-line fault for an error of the environment met while writing `target` (None when
    `exc` is not one): a full disk (how much was written when it filled, how much is free),
    permission denied, a read-only file system, a folder that vanished. `kept`: say that the
    target's earlier version is untouched (true of the atomic writers)."""
    if is_disk_full(exc):
        free = free_bytes(target.parent)
        wrote = f"needed more than the {size_text(written)} written when it filled, " if written else ""
        return SystemFault(f"{target}: no space left on the device while writing the {what} ({wrote}"
                           f"{size_text(free) if free is not None else 'nothing'} free there)"
                           + (f"; what was at {target} before is unchanged" if kept else ""))
    if not isinstance(exc, OSError):
        return None
    name = exc.filename or target
    if exc.errno in (errno.EACCES, errno.EPERM):
        return SystemFault(f"{target}: permission denied writing the {what} ({name})")
    if exc.errno == errno.EROFS:
        return SystemFault(f"{target}: read-only file system; choose an output folder that can be written")
    if exc.errno == errno.ENOENT and not target.parent.exists():
        return SystemFault(f"{target}: the folder {target.parent} disappeared while writing the {what}")
    if exc.errno == errno.ENOTDIR:
        return SystemFault(f"{target}: a part of the path is not a folder ({name})")
    return None
