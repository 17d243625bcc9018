"""The one check before every write: where an output (a file or a folder) may go.

Every command and Python entry point that writes (train, tune, audit, select, calibrate,
combine, export, predict, analyze, extract, report, the engines' outputs) calls `check_target`
before any work. It refuses, in one line naming the path and what it is:

- the input itself (after links: a symlink or a hard link to it counts), always;
- a folder holding any input, or a model read, always;
- a model folder (one read, or any other) and any place inside one, always: an output never
  goes over or into a model (a model's own outputs, `MODEL/report` and `MODEL/onnx`, go inside
  its `home`; a command that writes a model may replace another model that it does not read:
  `train` asks for `--overwrite` then, `training/checkpoint.py` `claim_out`);
- for a folder output: an existing file, always; a folder that is not empty and is not this
  command's own earlier output (it holds no `marker`), unless `overwrite`.

`overwrite` never lifts the first three: inputs and models are never deleted.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from pathlib import Path

from bertheads.base.errors import UserError
from bertheads.base.schema import said

MODEL_MANIFEST = "bertheads.json"  # what makes a folder a bertheads model (`saved.manifest.MANIFEST`)
# what bertheads' own writers leave in a folder for a moment (`store/atomic.py`, `store/lock.py`)
LEFTOVER = re.compile(r"^\..+\.\d+(\.[^.]+)?\.(tmp|old)$|^\..+\.lock$")


def same_path(a: Path, b: Path) -> bool:
    """Whether two paths name one file or folder (after links: a symlink or a hard link counts)."""
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


def is_model(folder: Path) -> bool:
    return (folder / MODEL_MANIFEST).is_file()


def model_folder_above(path: Path) -> Path | None:
    """The nearest folder above `path` that is a bertheads model (holds a manifest)."""
    for parent in path.resolve().parents:
        if is_model(parent):
            return parent
    return None


def input_paths(inputs: Iterable) -> list[Path]:
    """The paths among `inputs` (None, '-' for stdin and data in memory are skipped; a glob
    gives the files it matches)."""
    paths = []
    for given in inputs:
        if given in (None, "", "-") or not isinstance(given, (str, Path)):
            continue
        text = str(given)
        if glob.has_magic(text) and not Path(text).exists():
            paths += [Path(p) for p in glob.glob(text)]
        else:
            paths.append(Path(text))
    return paths


def check_target(out: str | Path, marker: str | tuple[str, ...] | None = None, *, inputs: Iterable = (), models: Iterable = (),
                 home: str | Path | None = None, overwrite: bool | None = None, flag: str = "out",
                 what: str | None = None) -> Path:
    """`out` as a Path, once it may be written (see the module's docstring); else a one-line
    UserError. `marker`: None for a file output; for a folder output, the file its own earlier
    versions hold (`MODEL_MANIFEST` for a model; several: any of them). `inputs`: what the command reads (files,
    folders, globs; other values are skipped); `models`: the model folders it reads (and the
    checkpoint a head-only one reads); `home`: the model folder this output belongs inside;
    `overwrite`: None where the command has no such option; `flag`: the setting that named
    `out` (`--out`, `out=`); `what`: the output, in words."""
    out = Path(out)
    named, another = said(flag, str(out)), f"choose another {said(flag)}"
    markers = (marker,) if isinstance(marker, str) else tuple(marker or ())
    noun = "file" if marker is None else "folder"
    model_output = MODEL_MANIFEST in markers
    what = what or ("a bertheads model" if model_output else f"an earlier output of this command (no {markers[0]})"
                    if markers else "a file")
    read = input_paths(inputs)
    model_paths = [Path(m) for m in models if m not in (None, "")]
    for given in read:
        if same_path(out, given):
            raise UserError(f"{named}: is the input {given}; write the output to another {noun}")
    for model in model_paths:
        if same_path(out, model):
            raise UserError(f"{named}: is the model folder read ({model}); bertheads never writes over a model; "
                            f"{another}")
    if out.exists() and not out.is_dir() and marker is not None:
        raise UserError(f"{named}: exists and is not a directory; {another}")
    if out.is_dir() and marker is None:
        raise UserError(f"{named}: is a directory; give a file name")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UserError(f"{named}: {parent} is not a directory")
    if out.is_dir():
        for given in [*read, *model_paths]:
            if inside(given, out):
                held = "the model" if given in model_paths else "the input"
                raise UserError(f"{named}: holds {held} {given}; writing there would delete it; {another}")
    home_path = Path(home) if home is not None else None
    for folder in [*model_paths, model_folder_above(out)]:
        if folder is not None and inside(out, folder) and not same_path(out, folder) \
                and not (home_path is not None and same_path(folder, home_path)):
            raise UserError(f"{named}: is inside the model folder {folder}; bertheads never writes a command's "
                            f"output into a model; choose a {noun} outside the model")
    if out.is_dir() and is_model(out) and not model_output:
        raise UserError(f"{named}: is a model folder; bertheads never writes over a model; {another}")
    if markers and out.is_dir() and not overwrite and not any((out / m).exists() for m in markers) \
            and any(not LEFTOVER.match(p.name) for p in out.iterdir()):
        hint = f" (or add {said('overwrite')} to replace it)" if overwrite is not None else ""
        raise UserError(f"{named}: exists, is not empty and is not {what}; {another}{hint}")
    return out
