"""Writing files and directories so that a reader sees the old version or the new one, never
half of one: everything is written beside its target under a temporary name, then renamed.

Temporary names are `.NAME.PID.tmp` in the target's folder; leftovers of a process that no
longer runs (killed mid-write) are recognised by that name and removed by the next writer.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a text file through a temporary file in the same directory, then rename it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def temporary_sibling(target: Path) -> Path:
    """A fresh empty directory beside `target`, named after it and this process."""
    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    return tmp


def remove_stale(parent: Path, name: str) -> None:
    """Delete the leftovers `.NAME.PID.*` of writers whose process no longer runs."""
    if not parent.is_dir():
        return
    for leftover in parent.glob(f".{name}.*"):
        parts = leftover.name[len(name) + 2 :].split(".")
        if not parts or not parts[0].isdigit() or int(parts[0]) == os.getpid():
            continue
        try:
            os.kill(int(parts[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        except PermissionError:
            continue


def swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished directory `tmp` to `out`, replacing an older `out`."""
    if out.exists():
        old = out.parent / f".{out.name}.{os.getpid()}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


@contextmanager
def atomic_directory(out: str | Path, replace: bool = True) -> Iterator[Path]:
    """Yield an empty temporary directory; when the block ends without error it becomes `out`.

    `replace=False`: when `out` appeared meanwhile (another process wrote the same thing),
    that one is kept and this one discarded. On error the temporary directory is removed.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out.parent, out.name)
    tmp = temporary_sibling(out)
    try:
        yield tmp
        for path in tmp.rglob("*"):  # ordinary modes whatever the umask of the writers
            path.chmod(0o755 if path.is_dir() else 0o644)
        if replace:
            swap_into_place(tmp, out)
        else:
            try:
                os.rename(tmp, out)
            except OSError:
                if not out.exists():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_writer(path: str | Path, mode: str = "w") -> Iterator:
    """An open file (text for "w", bytes for "wb") that becomes `path` when the block ends
    without error; until then it is a temporary file beside it, removed on error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
