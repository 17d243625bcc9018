"""Where a command's output may go, checked before any work (`store/guard.py` `check_target`,
with the model folders a command reads: the one given and the checkpoint a head-only model
reads), and never where another live run is writing (one lock per output, `store/lock.py`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bertheads.saved.bundle import model_folders
from bertheads.store import lock
from bertheads.store.atomic import missing_parents, remove_made
from bertheads.store.guard import check_target


def read_folders(models: Iterable[str | Path | None]) -> list[Path]:
    """The folders of the models a command reads (`model_folders` of each)."""
    return [folder for model in models if model not in (None, "") for folder in model_folders(model)]


def check_output(output: str | Path, inputs: Iterable[str | Path | None] = (), models: Iterable[str | Path] = (),
                 flag: str = "output", marker: str | None = None, overwrite: bool | None = None,
                 home: str | Path | None = None) -> Path:
    """`output` as a Path once `store.guard.check_target` allows it (a file, or with `marker`
    a folder); a one-line UserError when it is one of `inputs`, holds one, or is (or lies in)
    a model folder (one of `models` or any other)."""
    return check_target(output, marker, inputs=inputs, models=read_folders(models), flag=flag,
                        overwrite=overwrite, home=home)


@contextmanager
def claimed_output(output: str | Path | None, inputs: Iterable[str | Path | None] = (),
                   models: Iterable[str | Path] = (), what: str = "predict", flag: str = "output",
                   marker: str | None = None) -> Iterator:
    """`check_output`, then this run's lock on the output for the block (a second run writing
    the same file stops at once with one line); folders made for the lock are removed again
    when the block leaves them empty. Under torchrun the checks run in every process and rank 0
    holds the lock."""
    if output is None:
        yield None
        return
    out = check_output(output, inputs, models, flag, marker)
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
