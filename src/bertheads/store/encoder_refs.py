"""Checkpoints by content: their remembered weight hashes, and the reference a head-only model
directory keeps to the unchanged checkpoint its heads were trained on.

Hashing a checkpoint's weights reads all of them (most of a second for MiniLM-L6 on a busy
CPU). The hash of a checkpoint directory is remembered in `ROOT/checkpoints.json` (ROOT: the
feature cache's folder) against the size and modification time of each of its files, and
computed again when any of them changes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bertheads.base.errors import UserError
from bertheads.encoder.pretrained import DEFAULT_MODEL, Encoder, encoder_hash, resolve_model
from bertheads.store.atomic import atomic_write_text

CACHE_ENV = "BERTHEADS_CACHE"
MEMO = "checkpoints.json"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """`--cache-dir`, else `$BERTHEADS_CACHE`, else `~/.cache/bertheads`."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or "~/.cache/bertheads").expanduser()


def fingerprint(directory: Path) -> list:
    """Name, size and modification time of every file of a checkpoint directory."""
    entries = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        stat = path.stat()
        entries.append([str(path.relative_to(directory)), stat.st_size, stat.st_mtime_ns])
    return entries


def checkpoint_hash(encoder: Encoder, directory: str | Path, root: Path | None = None) -> str:
    """`encoder_hash` of an encoder just loaded from `directory`, remembered while the
    directory's files stay as they are."""
    directory = Path(directory).resolve()
    memo_path = (root or cache_root()) / MEMO
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if not isinstance(memo, dict):
        memo = {}
    stamp = fingerprint(directory)
    entry = memo.get(str(directory))
    if isinstance(entry, dict) and entry.get("files") == stamp and isinstance(entry.get("hash"), str):
        return entry["hash"]
    digest = encoder_hash(encoder)
    memo = {k: v for k, v in memo.items() if Path(k).is_dir()}  # forget checkpoints that are gone
    memo[str(directory)] = {"files": stamp, "hash": digest}
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo_path, json.dumps(memo, indent=1) + "\n")
    except OSError:  # a read-only cache folder: the hash is just not remembered
        pass
    return digest


def reference(encoder: Encoder, model_name: str, root: Path | None = None) -> dict | None:
    """What a head-only model directory stores about the checkpoint `encoder` was loaded
    from: the name given, its resolved path and the content hash of its weights."""
    path = Path(resolve_model(model_name)).resolve()
    if not (path / "config.json").is_file():  # a hub name: no local files to refer to
        return None
    path = str(path)
    return {"source": model_name or DEFAULT_MODEL, "path": path, "hash": checkpoint_hash(encoder, path, root)}


def load_reference(directory: Path, ref: dict) -> Encoder:
    """The encoder of a head-only model: `DIR/encoder` when a copy was put there, else the
    recorded path, else the source name resolved on this machine (`default`: this
    installation's checkpoint); its weights must hash to the recorded value."""
    candidates = [directory / "encoder", Path(ref.get("path") or "")]
    found = next((c for c in candidates if str(c) not in ("", ".") and (c / "config.json").is_file()), None)
    if found is None:
        source = ref.get("source")
        try:
            found = Path(resolve_model(source)) if source else None
        except UserError:
            found = None
        if found is None or not (found / "config.json").is_file():
            raise UserError(f"{directory}: holds heads only; its encoder, {ref.get('source')!r} at {ref.get('path')}, "
                            f"is not on this machine; copy that checkpoint to {directory / 'encoder'}")
    encoder = Encoder.load(str(found), lazy=True)  # the weights load on first use (the hash is remembered)
    digest = checkpoint_hash(encoder, found)
    if digest != ref.get("hash"):
        raise UserError(f"{directory}: the checkpoint at {found} is not the one its heads were trained on "
                        f"(weights hash {digest[:12]}..., expected {str(ref.get('hash'))[:12]}...)")
    encoder.reference = {**ref, "path": str(found.resolve())}
    return encoder
