"""Saving and loading a model directory.

```
DIR/encoder/                 config, safetensors weights and tokenizer files: a directory that
                             transformers' AutoModel / AutoTokenizer.from_pretrained load
DIR/heads/NAME.safetensors   the weights of each head
DIR/bertheads.json           manifest: heads (kind, label map, packing and head settings), source
DIR/metrics.json             {"dev": {...}} for one head, {"dev": {NAME: {...}}} for several
DIR/checkpoint/, log.jsonl   while (or after) training: the resumable state and the log
```
Everything is written into a temporary sibling directory, fsynced and swapped into place in
one step, so a failed or interrupted save never leaves a half-written model or destroys the
previous one. Loading never unpickles: weights are safetensors, settings JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bertheads.atomic import atomic_directory
from bertheads.encoder import Encoder, encoder_hash
from bertheads.errors import UserError
from bertheads.model import BertHeads
from bertheads.tasks import TASKS

MANIFEST = "bertheads.json"
FORMAT_VERSION = 1
RUN_FILES = ("checkpoint", "log.jsonl", "tensorboard")  # a training run's own files in its --out
HEAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # head names: also file names under heads/


def task_class(kind: str):
    if kind not in TASKS:
        raise UserError(f"unknown task kind {kind!r} (known: {', '.join(TASKS)})")
    return TASKS[kind]


def check_writable_out(out: str | Path) -> Path:
    """Refuse to replace a directory that is not a bertheads model (the user's files stay)."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise UserError(f"{out}: exists and is not a directory")
        if any(not p.name.startswith(".checkpoint.") and p.name not in RUN_FILES for p in out.iterdir()) \
                and not (out / MANIFEST).is_file():
            raise UserError(f"{out}: exists, is not empty and is not a bertheads model; choose another --out")
    return out


def save(model: BertHeads, out: str | Path, metrics: dict | None = None, extra: dict | None = None) -> Path:
    """Write `model` to `out` atomically (replacing an earlier bertheads model there)."""
    out = check_writable_out(out)
    with atomic_directory(out, carry=RUN_FILES, label="model") as tmp:
        model.encoder.save(tmp / "encoder")
        (tmp / "heads").mkdir()
        for name, head in model.heads.items():
            state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
            save_file(state, str(tmp / "heads" / f"{name}.safetensors"))
        manifest = {
            "format_version": FORMAT_VERSION,
            "heads": {name: task.to_manifest() for name, task in model.tasks.items()},
            "encoder_hash": encoder_hash(model.encoder),
            **(extra or {}),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        if metrics is not None:
            (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return out


def is_model(path: str | Path | None) -> bool:
    """Whether `path` is a bertheads model directory (not a checkpoint name like 'default')."""
    return path not in (None, "", "default") and (Path(path) / MANIFEST).is_file()


def read_manifest(directory: str | Path) -> dict:
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise UserError(f"{directory}: no such model directory")
    if not path.is_file():
        raise UserError(f"{directory}: not a bertheads model (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    if manifest.get("format_version") != FORMAT_VERSION or not manifest.get("heads"):
        raise UserError(f"{path}: unsupported manifest (format_version {manifest.get('format_version')!r})")
    return manifest


def load(directory: str | Path, device: str | torch.device | None = None) -> BertHeads:
    """Load a saved model: the encoder from `DIR/encoder`, each head from its safetensors file."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    encoder = Encoder.load(str(directory / "encoder"))
    tasks = {}
    for name, entry in manifest["heads"].items():
        cls = task_class(entry["kind"])
        task = cls.build(cls.spec_from_dict(entry["spec"]), encoder)
        weights = directory / "heads" / f"{name}.safetensors"
        if not weights.is_file():
            raise UserError(f"{weights}: missing head weights")
        task.head.load_state_dict(load_file(str(weights)))
        tasks[name] = task
    model = BertHeads(encoder, tasks)
    model.manifest = manifest
    model.eval()
    if device is not None:
        model.to(device)
    return model
