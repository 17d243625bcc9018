"""A training run's resumable state in `OUT/checkpoint/`, and the run's identity that a resume
must match.

```
checkpoint/state.json              format, the run's identity (data, start model, settings,
                                   processes) and the loop's position: epoch, batch within the
                                   epoch's batch order, optimizer step, kept evaluation, history
checkpoint/model.safetensors       the weights that train (every weight when fine-tuning)
checkpoint/optimizer.safetensors   AdamW's moments and steps; optimizer.json its settings
checkpoint/scheduler.json          the learning-rate schedule's position
checkpoint/rng-R.safetensors       process R's torch (and CUDA) random states;
checkpoint/rng-R.json              its Python and NumPy random states
```
Nothing is pickled. The directory is written beside the old one and swapped in whole, so the
previous checkpoint stays until the new one is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertheads.base.errors import UserError
from bertheads.base.schema import said, tagged
from bertheads.encoder.pretrained import weights_hash
from bertheads.saved.bundle import MANIFEST, check_writable_out
from bertheads.store import lock
from bertheads.store.atomic import atomic_directory, missing_parents, remove_made, remove_stale
from bertheads.text.rows import Rows
from bertheads.training.settings import TrainSettings

DIRECTORY = "checkpoint"
FORMAT = 1
# settings that do not change what a run computes: a resume may give other values
NOT_COMPARED = tagged(TrainSettings, "not-compared")
# what a setting added later was in a checkpoint written before it existed
BEFORE = {"precision": "fp32"}


def identity(model, data: list, settings, world: int) -> dict:
    """What a resumed run must share with the run that wrote the checkpoint: a hash of the
    training features and dev files, of the start encoder and heads, the settings, the processes."""
    digest = hashlib.sha256()
    for d in data:
        digest.update(json.dumps([d.name, {"kind": d.task.kind, "spec": asdict(d.task.spec)}], sort_keys=True, default=str).encode())
        for f in d.train_features:
            digest.update(json.dumps(f, sort_keys=True, default=plain).encode())
        if isinstance(d.dev_path, Rows):  # dev rows given in memory: their records
            for _, record in d.dev_path.rows():
                digest.update(json.dumps(record, sort_keys=True, default=str).encode())
        elif d.dev_path:
            digest.update(Path(d.dev_path).read_bytes())
    heads = hashlib.sha256()
    for name, tensor in sorted(model.heads.state_dict().items()):
        heads.update(name.encode())
        heads.update(tensor.detach().cpu().contiguous().float().numpy().tobytes())
    compared = {k: v for k, v in asdict(settings).items() if k not in NOT_COMPARED}
    return {"data": digest.hexdigest(), "encoder": weights_hash(model.encoder), "heads": heads.hexdigest(),
            "settings": json.loads(json.dumps(compared, default=str)), "processes": world}


def plain(value):
    return value.tolist() if hasattr(value, "tolist") else str(value)


def mismatch(saved: dict, current: dict) -> str | None:
    """Why a checkpoint does not belong to this run (None when it does)."""
    if saved.get("data") != current["data"]:
        return "it was made from other training or dev data (or other task settings)"
    if saved.get("encoder") != current["encoder"] or saved.get("heads") != current["heads"]:
        return "it was made from another start model (--model)"
    for key, value in current["settings"].items():
        made = saved.get("settings", {}).get(key, BEFORE.get(key))
        if made != value:
            return f"it was made with --{key.replace('_', '-')} {made}, this run has {value}"
    if saved.get("processes") != current["processes"]:
        return f"it was made by {saved.get('processes')} processes, this run has {current['processes']}"
    return None


# -- random states ------------------------------------------------------------------------
def rng_state() -> tuple[dict, dict]:
    """This process's random states: (tensors, JSON)."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    py = random.getstate()
    return tensors, {"python": [py[0], list(py[1]), py[2]],
                     "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}


def set_rng_state(tensors: dict, saved: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted((k for k in tensors if k.startswith("cuda.")), key=lambda k: int(k[5:]))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, state, gauss = saved["python"]
    random.setstate((version, tuple(state), gauss))
    kind, keys, pos, has_gauss, cached = saved["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


# -- optimizer as tensors + JSON ------------------------------------------------------------
def optimizer_parts(state: dict) -> tuple[dict, dict]:
    tensors, other = {}, {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                other[f"{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "other": other}


def optimizer_state(tensors: dict, saved: dict) -> dict:
    state: dict = {}
    for name, value in [*tensors.items(), *saved["other"].items()]:
        index, _, key = name.partition(".")
        state.setdefault(int(index), {})[key] = value
    groups = []
    for group in saved["param_groups"]:
        group = dict(group)
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


# -- writing and reading ----------------------------------------------------------------------
def trainable_state(model, frozen: bool) -> dict:
    module = model.heads if frozen else model
    return {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}


def write(out: str | Path, model, frozen: bool, optimizer, scheduler, rng: list, run_identity: dict,
          progress: dict) -> Path:
    """Write `OUT/checkpoint/` (replacing the previous one only once this one is complete).
    `rng` holds every process's `rng_state()`, in rank order."""
    target = Path(out) / DIRECTORY
    with atomic_directory(target, label="checkpoint") as tmp:
        save_file(trainable_state(model, frozen), str(tmp / "model.safetensors"))
        tensors, rest = optimizer_parts(optimizer.state_dict())
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(rest, default=plain))
        (tmp / "scheduler.json").write_text(json.dumps(scheduler.state_dict(), default=plain))
        for rank, (rng_tensors, rng_json) in enumerate(rng):
            save_file(rng_tensors, str(tmp / f"rng-{rank}.safetensors"))
            (tmp / f"rng-{rank}.json").write_text(json.dumps(rng_json))
        state = {"format": FORMAT, "identity": run_identity, "progress": progress}
        (tmp / "state.json").write_text(json.dumps(state, indent=1, default=plain) + "\n")
    return target


def exists(out: str | Path) -> bool:
    return (Path(out) / DIRECTORY / "state.json").is_file()


def read(out: str | Path, rank: int) -> dict:
    """Everything in `OUT/checkpoint/` this process needs, checked; a one-line UserError when
    the checkpoint is missing or damaged."""
    directory = Path(out) / DIRECTORY
    if rank == 0:
        remove_stale(Path(out), DIRECTORY)
    if not (directory / "state.json").is_file():
        raise UserError(f"{said('resume')}: {out} holds no checkpoint to resume (no {DIRECTORY}/state.json)")
    try:
        state = json.loads((directory / "state.json").read_text())
        if state.get("format") != FORMAT:
            raise UserError(f"{directory}: unsupported checkpoint format {state.get('format')!r}")
        return {
            "state": state,
            "model": load_file(str(directory / "model.safetensors")),
            "optimizer": optimizer_state(load_file(str(directory / "optimizer.safetensors")),
                                         json.loads((directory / "optimizer.json").read_text())),
            "scheduler": json.loads((directory / "scheduler.json").read_text()),
            "rng": (load_file(str(directory / f"rng-{rank}.safetensors")),
                    json.loads((directory / f"rng-{rank}.json").read_text())),
        }
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise UserError(f"{directory}: damaged checkpoint ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}); start again with {said('overwrite')}") from None


def restore(saved: dict, model, frozen: bool, optimizer, scheduler) -> None:
    """Put the weights, optimizer, schedule and random states of a read checkpoint back."""
    module = model.heads if frozen else model
    try:
        module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise UserError(f"checkpoint: does not fit this model ({str(exc).splitlines()[0]})") from None
    scheduler.load_state_dict(saved["scheduler"])
    set_rng_state(*saved["rng"])


# -- the run's claim on its --out ------------------------------------------------------------------
# --out folders that did not exist before this process's run claimed them -> the folders above
# them that did not exist either
FRESH: dict[Path, list[Path]] = {}


def abandon_fresh(out: str | Path) -> None:
    """After a fault of the environment (a full disk): remove `out` when this run created it, so a
    failed run leaves nothing where there was nothing (a folder that existed keeps its model)."""
    out = Path(out).absolute()
    if out in FRESH:
        shutil.rmtree(out, ignore_errors=True)
        lock.release(out)
        remove_made(FRESH.pop(out))


def claim_out(out: str | Path, resume: bool, overwrite: bool, inputs=(), home: str | Path | None = None) -> Path:
    """Check, before any work, that a run may write to `out`: never over its `inputs` (the data
    files, a local checkpoint) or into a model (`saved.bundle.check_writable_out`; `home`: the
    search whose model folder holds this run's); a model or checkpoint of another run there is
    replaced only with `overwrite`; `resume` needs a checkpoint."""
    out = check_writable_out(out, inputs, overwrite=overwrite or resume, home=home)
    fresh = None if out.exists() else missing_parents(out)
    if os.environ.get("RANK", "0") == "0":  # one run per folder (the processes of one torchrun share it)
        lock.hold(out, "run")
    remove_stale(out.parent, out.name)  # leftovers of an interrupted save; a model set aside goes back
    FRESH.pop(out.absolute(), None)
    if fresh is not None:
        FRESH[out.absolute()] = fresh
    try:
        return check_resumable(out, resume, overwrite)
    except UserError:
        lock.release(out)  # (refused: no lock file left beside it)
        remove_made(FRESH.pop(out.absolute(), []))
        raise


def check_resumable(out: Path, resume: bool, overwrite: bool) -> Path:
    """A checkpoint to resume, or a model or checkpoint of another run replaced only with `overwrite`."""
    if resume and overwrite:
        raise UserError(f"{said('resume')} and {said('overwrite')}: choose one (continue the run in {said('out')}, or replace it)")
    if resume:
        if not (out / DIRECTORY).exists() and not any(out.glob(f".{DIRECTORY}.*.old")):
            done = " (its run finished: the checkpoint is removed then)" if (out / MANIFEST).is_file() else ""
            raise UserError(f"{said('resume')}: {out} holds no checkpoint to resume{done}")
        return out
    if not overwrite and ((out / MANIFEST).is_file() or (out / DIRECTORY).exists()):
        what = "the checkpoint of an unfinished run" if (out / DIRECTORY).exists() else "a model from another run"
        raise UserError(f"{out}: holds {what}; add {said('overwrite')} to replace it, {said('resume')} to "
                        f"continue its run, or choose another {said('out')}")
    return out


def start_fresh(out: Path) -> None:
    """A new run in `out`: the checkpoint, log, event files and tracker state of an earlier run
    go (its model stays until this run saves one)."""
    for name in (DIRECTORY, "tensorboard", "tracking"):
        remove(out, name)
    (out / "log.jsonl").unlink(missing_ok=True)


def remove(out: Path, name: str = DIRECTORY) -> None:
    """Delete `OUT/NAME` by first renaming it to a leftover name (a kill midway leaves a
    leftover that the next run removes, never a half-deleted checkpoint)."""
    target = Path(out) / name
    if not target.exists():
        return
    doomed = Path(out) / f".{name}.{os.getpid()}.tmp"
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(target, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
