"""Where a command's output file may go, checked before any work: never over one of its inputs,
never into a model folder (the one read, any other, or the checkpoint a head-only model reads),
and never where another live run is writing (one lock per output, `store/lock.py`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bertheads.base.errors import UserError
from bertheads.saved.bundle import MANIFEST, encoder_location
from bertheads.store import lock
from bertheads.store.atomic import missing_parents, remove_made


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (after links: a symlink or a hard link to it counts)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def inside(path: Path, folder: Path) -> bool:
    """Whether `path` (resolved) lies in `folder` (resolved) or is it."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


def model_folder_above(path: Path) -> Path | None:
    """The nearest folder above `path` that is a bertheads model (holds a manifest)."""
    for parent in path.resolve().parents:
        if (parent / MANIFEST).is_file():
            return parent
    return None


def model_folders(model: str | Path) -> list[Path]:
    """A model's folder and, for a head-only model, the checkpoint folder it reads."""
    folders = [Path(model)]
    try:
        folders.append(Path(encoder_location(model)))
    except UserError:  # not a model (yet): loading it says so
        pass
    return folders


def check_output(output: str | Path, inputs: Iterable[str | Path | None] = (), models: Iterable[str | Path] = (),
                 flag: str = "--output") -> Path:
    """`output` as a Path, or a one-line UserError when it is a folder, sits under a file, is
    one of `inputs`, or lies inside a model folder (one of `models` or any other)."""
    out = Path(output)
    if out.is_dir():
        raise UserError(f"{flag} {output}: is a directory; give a file name")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UserError(f"{flag} {output}: {parent} is not a directory")
    for given in inputs:
        if given not in (None, "-") and isinstance(given, (str, Path)) and same_file(out, Path(given)):
            raise UserError(f"{flag} {output}: is the input {given}; write the output to another file")
    for model in models:
        for folder in model_folders(model):
            if inside(out, folder):
                raise UserError(f"{flag} {output}: is inside the model folder {folder}; bertheads never writes "
                                f"a command's output into a model; choose a file outside it")
    folder = model_folder_above(out)
    if folder is not None:
        raise UserError(f"{flag} {output}: is inside the model folder {folder}; bertheads never writes a "
                        f"command's output into a model; choose a file outside it")
    return out


@contextmanager
def claimed_output(output: str | Path | None, inputs: Iterable[str | Path | None] = (),
                   models: Iterable[str | Path] = (), what: str = "predict", flag: str = "--output") -> Iterator:
    """`check_output`, then this run's lock on the output for the block (a second run writing
    the same file stops at once with one line); folders made for the lock are removed again
    when the block leaves them empty. Under torchrun the checks run in every process and rank 0
    holds the lock."""
    if output is None:
        yield None
        return
    out = check_output(output, inputs, models, flag)
    if os.environ.get("RANK", "0") != "0":
        yield out
        return
    made = missing_parents(out)
    target = lock.hold(out, what, instead="output file")
    try:
        yield out
    finally:
        lock.release(target)
        remove_made(made)
