"""Saving and loading a model directory.

```
DIR/encoder/                 config, safetensors weights and tokenizer files: a directory that
                             transformers' AutoModel / AutoTokenizer.from_pretrained load;
                             absent from a head-only model (see below)
DIR/heads/NAME.safetensors   the weights of each head
DIR/bertheads.json           manifest: heads (kind, label map, packing and head settings), source
DIR/metrics.json             {"dev": {...}} for one head, {"dev": {NAME: {...}}} for several
DIR/config.yaml              how a trained model was made: its full settings (a config file that
                             `bertheads train --config` runs again) and the versions used; the
                             manifest holds the same as `settings` and `made_with`
DIR/MLmodel                  MLflow's python_function flavour (`saved/mlmodel.py`): the directory is an MLflow model
DIR/README.md                the model card (`saved/card.py`): front matter for the Hugging Face
                             Hub, then the heads, labels, data, settings, dev metrics and usage
DIR/checkpoint/, log.jsonl   while (or after) training: the resumable state and the log
```
A model whose encoder is the unchanged checkpoint it was loaded from (features mode, and
`combine` of such models) is saved with its heads only: the manifest's `encoder` names that
checkpoint (`source` as given, resolved `path`, content `hash`), and loading finds it there
(or at `DIR/encoder`, where a copy may be put to move the model) and checks the hash.

Everything is written into a temporary sibling directory, fsynced and swapped into place in
one step, so a failed or interrupted save never leaves a half-written model or destroys the
previous one. Loading never unpickles: weights are safetensors, settings JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.encoder.pretrained import Encoder, encoder_hash, weights_hash
from bertheads.model import BertHeads, attach_branch
from bertheads.saved import card
from bertheads.saved.manifest import (  # noqa: F401  (MANIFEST, FORMAT_VERSION, HEAD_NAME, read_manifest: re-exported)
    FORMAT_VERSION,
    HEAD_NAME,
    MANIFEST,
    check_head_weights,
    first_line,
    read_head_weights,
    read_manifest,
)
from bertheads.saved.mlmodel import MLMODEL, mlmodel_text
from bertheads.store.atomic import atomic_directory
from bertheads.store.encoder_refs import load_reference, reference_location
from bertheads.store.guard import check_target, model_folder_above
from bertheads.tasks import TASKS

RUN_FILES = ("checkpoint", "log.jsonl", "tensorboard", "tracking")  # a training run's own files in its --out
CONFIG = "config.yaml"


def task_class(kind: str):
    if kind not in TASKS:
        raise UserError(f"unknown task kind {kind!r} (known: {', '.join(TASKS)})")
    return TASKS[kind]


def check_writable_out(out: str | Path, inputs=(), models=(), overwrite: bool | None = None,
                       home: str | Path | None = None) -> Path:
    """Check before any work that a model may be written to `out` (`store.guard.check_target`:
    never over or into a model read or over an input; a folder that is not empty and not a
    bertheads model only with `overwrite`; another model is replaced)."""
    return check_target(out, (MANIFEST, *RUN_FILES), inputs=inputs, models=models, overwrite=overwrite, home=home)


def model_folders(model: str | Path) -> list[Path]:
    """A model's folder and, for a head-only model, the checkpoint folder it reads (what no
    output may replace or go into)."""
    folders = [Path(model)]
    try:
        folders.append(Path(encoder_location(model)))
    except UserError:  # not a model (yet): loading it says so
        pass
    return folders


def save(model: BertHeads, out: str | Path, metrics: dict | None = None, extra: dict | None = None) -> Path:
    """Write `model` to `out` atomically (replacing an earlier bertheads model there). The
    commands that save check `out` with their inputs first (`check_writable_out`); here it is
    checked again as a folder (a model may be saved inside the model folder of a search)."""
    out = check_writable_out(out, home=model_folder_above(Path(out)))
    reference = getattr(model.encoder, "reference", None)
    with atomic_directory(out, carry=RUN_FILES, label="model") as tmp:
        if reference is None:
            model.encoder.save(tmp / "encoder")
        (tmp / "heads").mkdir()
        for name, head in model.heads.items():
            state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
            save_file(state, str(tmp / "heads" / f"{name}.safetensors"))
        manifest = {
            "format_version": FORMAT_VERSION,
            "heads": {name: {"kind": task.kind, "spec": asdict(task.spec)}
                      for name, task in model.tasks.items()},
            "encoder_hash": weights_hash(model.encoder),
            **({"encoder": reference} if reference else {}),
            **(extra or {}),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        if manifest.get("settings"):
            (tmp / CONFIG).write_text(config_text(manifest["settings"], manifest.get("made_with"), manifest.get("chosen")))
        if metrics is not None:
            (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (tmp / MLMODEL).write_text(mlmodel_text(model.tasks))
        card.write_card(tmp, lambda: card.build_card(model, manifest, metrics, out.name,
                                                     card.saved_usage(out.name, model.tasks)), out)
    return out


def config_text(settings: dict, made_with: dict | None = None, chosen: str | None = None) -> str:
    """A saved model's config.yaml: its settings, what the recipe for the data's size chose
    (the line training printed), then the versions that made it."""
    text = "# how this model was made; `bertheads train --config THIS_FILE --out DIR` trains it again\n"
    text += yaml.safe_dump(settings, sort_keys=False, allow_unicode=True)
    if chosen:
        text += yaml.safe_dump({"chosen": chosen}, sort_keys=False, allow_unicode=True, width=1000)
    if made_with:
        text += yaml.safe_dump({"made_with": made_with}, sort_keys=False)
    return text


def is_model(path: str | Path | None) -> bool:
    """Whether `path` is a bertheads model directory (not a checkpoint name like 'default')."""
    return path not in (None, "", "default") and (Path(path) / MANIFEST).is_file()


def encoder_location(directory: str | Path) -> str:
    """Where a saved model's encoder checkpoint is: `DIR/encoder`, or for a head-only model the
    checkpoint its manifest names."""
    directory = Path(directory)
    reference = read_manifest(directory).get("encoder")
    if reference is None:
        return str(directory / "encoder")
    return str(reference_location(directory, reference))


def load(directory: str | Path, device: str | torch.device | None = None, verify: bool = True) -> BertHeads:
    """Load a saved model: the encoder from `DIR/encoder` (or, for a head-only model, the
    checkpoint its manifest names), each head from its safetensors file.

    The manifest is checked against its schema, every weight file must hold exactly the
    tensors the manifest describes, and (unless `verify` is False) the encoder's weights must
    hash to the manifest's `encoder_hash`; any mismatch is a one-line `UserError`.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    reference = manifest.get("encoder")
    if reference:  # heads only: the checkpoint is found and its hash checked there
        encoder = load_reference(directory, reference)
    else:
        try:
            encoder = Encoder.load(str(directory / "encoder"), strict=True)
        except (UserError, MemoryError):
            raise
        except Exception as exc:  # a corrupt tokenizer or config file
            if "can't allocate memory" in str(exc):  # torch's allocator: the machine, not the file
                raise
            raise UserError(f"{directory / 'encoder'}: cannot load ({type(exc).__name__}: {first_line(exc)})") from None
        expected_hash = manifest.get("encoder_hash")
        if verify and expected_hash:
            digest = encoder_hash(encoder)
            if digest != expected_hash:
                raise UserError(f"{directory / 'encoder'}: weights do not match the manifest's encoder_hash "
                                f"({digest[:12]}... vs {expected_hash[:12]}...): changed after saving; "
                                f"{said('verify', False)} loads them anyway")
    tasks = {}
    for name, entry in manifest["heads"].items():
        cls = task_class(entry["kind"])
        spec = cls.spec_type.from_saved(entry["spec"])
        try:
            task = cls.build(spec, encoder)
            attach_branch(task.head, spec, encoder)
        except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as exc:
            raise UserError(f"{directory / MANIFEST}: heads.{name}.spec: cannot build the head "
                            f"({first_line(exc)})") from None
        weights = directory / "heads" / f"{name}.safetensors"
        state = read_head_weights(weights)
        check_head_weights(state, task.head.state_dict(), weights, task.modeling.output_hint())
        task.head.load_state_dict(state)
        tasks[name] = task
    model = BertHeads(encoder, tasks)
    model.manifest = manifest
    model.eval()
    if device is not None:
        model.to(device)
    return model
