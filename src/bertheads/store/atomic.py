"""Writing files and directories so that a reader sees the old version or the new one, never
half of one: everything is written beside its target under a temporary name, then renamed.

Temporary names are `.NAME.PID.tmp` (a file's: `.NAME.PID.XXXX.tmp`) in the target's folder; leftovers of a process that no
longer runs (killed mid-write) are recognised by that name and removed by the next writer.

A directory replaces an older one in a single step where the system allows it (Linux
`renameat2(RENAME_EXCHANGE)`: the finished directory and the old one trade places), so the
target is at every moment the old version or the new one. Elsewhere the old one is first
renamed to `.NAME.PID.old`; when a writer dies between the two renames, the next writer
(`remove_stale`) puts it back. Files and directories are fsynced before they are renamed.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bertheads.store.crash import crash_point
from bertheads.store.faults import system_fault, tree_bytes


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a text file through a temporary file in the same directory, then rename it."""
    with atomic_writer(path) as fh:
        fh.write(text)


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's data and metadata to the disk."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (deepest first), and `root` itself."""
    for path in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
        fsync_path(path)
    fsync_path(root)


def _renameat2():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()
AT_FDCWD, RENAME_EXCHANGE = -100, 2


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step; False where the system cannot."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def link_tree(source: Path, target: Path) -> None:
    """Hard-link the files of `source` (a file or a directory tree) at `target` (copy where
    links are refused): the new directory shares them with the old."""
    if source.is_dir():
        target.mkdir()
        for child in source.iterdir():
            link_tree(child, target / child.name)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def temporary_sibling(target: Path) -> Path:
    """A fresh empty directory beside `target`, named after it and this process."""
    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    return tmp


def remove_stale(parent: Path, name: str) -> None:
    """Delete the leftovers `.NAME.PID.*` of writers whose process no longer runs; an old
    version set aside (`.NAME.PID.old`) by a writer that died before its replacement took its
    place is put back first."""
    if not parent.is_dir():
        return
    if not (parent / name).exists():
        for old in parent.glob(f".{glob.escape(name)}.*.old"):
            pid = old.name[len(name) + 2 :].split(".")[0]
            if pid.isdigit() and not process_runs(int(pid)):
                os.rename(old, parent / name)
                fsync_path(parent)
                break
    for leftover in parent.glob(f".{glob.escape(name)}.*"):
        parts = leftover.name[len(name) + 2 :].split(".")
        if not parts or not parts[0].isdigit() or int(parts[0]) == os.getpid():
            continue
        if not process_runs(int(parts[0])):
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)


def process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def swap_into_place(tmp: Path, out: Path, label: str = "save") -> None:
    """Rename the finished directory `tmp` to `out`, replacing an older `out`: in one step
    where the system can exchange the two, else through `.NAME.PID.old` (see `remove_stale`)."""
    if out.is_dir() and not out.is_symlink() and exchange(tmp, out):  # tmp now holds the old version
        fsync_path(out.parent)
        crash_point(f"{label}:swapped")
        shutil.rmtree(tmp, ignore_errors=True)
    elif out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.{os.getpid()}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(out, old)
        crash_point(f"{label}:set-aside")
        os.rename(tmp, out)
        fsync_path(out.parent)
        crash_point(f"{label}:swapped")
        old.unlink() if old.is_symlink() else shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
        fsync_path(out.parent)


@contextmanager
def atomic_directory(out: str | Path, replace: bool = True, carry: tuple[str, ...] = (),
                     label: str = "save") -> Iterator[Path]:
    """Yield an empty temporary directory; when the block ends without error it becomes `out`.

    `replace=False`: when `out` appeared meanwhile (another process wrote the same thing),
    that one is kept and this one discarded. `carry`: entries of the old `out` that the new
    one keeps (hard-linked: a training run's checkpoint and log). On error the temporary
    directory is removed. `label` names the crash points (`LABEL:written`, `:synced`,
    `:swapped`) that tests stop the process at.
    """
    out = Path(out)
    made = missing_parents(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(out.parent, out.name)
        tmp = temporary_sibling(out)
    except OSError as exc:
        remove_made(made)
        raise system_fault(exc, out, label) or exc from None
    try:
        yield tmp
        crash_point(f"{label}:written")
        for path in tmp.rglob("*"):  # ordinary modes whatever the umask of the writers
            path.chmod(0o755 if path.is_dir() else 0o644)
        for name in carry:
            if (out / name).exists() and not (tmp / name).exists():
                link_tree(out / name, tmp / name)
        fsync_tree(tmp)
        crash_point(f"{label}:synced")
        if replace:
            swap_into_place(tmp, out, label)
        else:
            try:
                os.rename(tmp, out)
                fsync_path(out.parent)
            except OSError:
                if not out.exists():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
    except BaseException as exc:
        written = tree_bytes(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        remove_made(made)
        fault = system_fault(exc, out, label, written)
        if fault is not None:
            raise fault from None
        raise


@contextmanager
def atomic_writer(path: str | Path, mode: str = "w") -> Iterator:
    """An open file (text for "w", bytes for "wb") that becomes `path` when the block ends
    without error; until then it is a temporary file beside it (`.NAME.PID.XXXX.tmp`), removed
    on error, or by the next writer of `path` when this process was killed."""
    path = Path(path)
    made = missing_parents(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path.parent, path.name)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        remove_made(made)
        raise system_fault(exc, path, "file") or exc from None
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        written = tree_bytes(Path(tmp))
        Path(tmp).unlink(missing_ok=True)
        remove_made(made)
        fault = system_fault(exc, path, "file", written)
        if fault is not None:
            raise fault from None
        raise


def missing_parents(path: Path) -> list[Path]:
    """The folders above `path` that do not exist yet (deepest first): a failed write removes
    the ones it made, so a run that fails leaves no empty folder behind."""
    missing = []
    for parent in path.absolute().parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def remove_made(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (something else was put there), or already gone
            break
