"""Saving and loading a model directory.

```
DIR/encoder/                 config, safetensors weights and tokenizer files: a directory that
                             transformers' AutoModel / AutoTokenizer.from_pretrained load;
                             absent from a head-only model (see below)
DIR/heads/NAME.safetensors   the weights of each head
DIR/bertheads.json           manifest: heads (kind, label map, packing and head settings), source
DIR/metrics.json             {"dev": {...}} for one head, {"dev": {NAME: {...}}} for several
```
A model whose encoder is the unchanged checkpoint it was loaded from (features mode, and
`combine` of such models) is saved with its heads only: the manifest's `encoder` names that
checkpoint (`source` as given, resolved `path`, content `hash`), and loading finds it there
(or at `DIR/encoder`, where a copy may be put to move the model) and checks the hash.

Everything is written into a temporary sibling directory and renamed into place, so a failed
or interrupted save never leaves a half-written model or destroys the previous one. Loading
never unpickles: weights are safetensors, settings JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bertheads.atomic import atomic_directory
from bertheads.checkpoints import load_reference
from bertheads.encoder import Encoder, encoder_hash
from bertheads.errors import UserError
from bertheads.model import BertHeads
from bertheads.tasks import TASKS

MANIFEST = "bertheads.json"
FORMAT_VERSION = 1
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
        if any(out.iterdir()) and not (out / MANIFEST).is_file():
            raise UserError(f"{out}: exists, is not empty and is not a bertheads model; choose another --out")
    return out


def save(model: BertHeads, out: str | Path, metrics: dict | None = None, extra: dict | None = None) -> Path:
    """Write `model` to `out` atomically (replacing an earlier bertheads model there)."""
    out = check_writable_out(out)
    reference = getattr(model.encoder, "reference", None)
    with atomic_directory(out) as tmp:
        if reference is None:
            model.encoder.save(tmp / "encoder")
        (tmp / "heads").mkdir()
        for name, head in model.heads.items():
            state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
            save_file(state, str(tmp / "heads" / f"{name}.safetensors"))
        manifest = {
            "format_version": FORMAT_VERSION,
            "heads": {name: task.to_manifest() for name, task in model.tasks.items()},
            "encoder_hash": reference["hash"] if reference else encoder_hash(model.encoder),
            **({"encoder": reference} if reference else {}),
            **(extra or {}),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        if metrics is not None:
            (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return out


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


def encoder_location(directory: str | Path) -> str:
    """Where a saved model's encoder checkpoint is: `DIR/encoder`, or for a head-only model the
    checkpoint its manifest names."""
    directory = Path(directory)
    reference = read_manifest(directory).get("encoder")
    if reference is None or (directory / "encoder" / "config.json").is_file():
        return str(directory / "encoder")
    path = Path(reference.get("path") or "")
    return str(path) if (path / "config.json").is_file() else str(reference.get("source"))


def load(directory: str | Path, device: str | torch.device | None = None) -> BertHeads:
    """Load a saved model: the encoder from `DIR/encoder`, each head from its safetensors file."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    reference = manifest.get("encoder")
    encoder = load_reference(directory, reference) if reference else Encoder.load(str(directory / "encoder"))
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
