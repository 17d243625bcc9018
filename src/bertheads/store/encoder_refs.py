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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from bertheads.base.errors import SystemFault, UserError
from bertheads.base.schema import said
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


def read_memo(root: Path | None = None) -> dict:
    """The remembered checkpoint hashes (`ROOT/checkpoints.json`): {resolved path: {files, hash}}."""
    try:
        memo = json.loads(((root or cache_root()) / MEMO).read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


def remember(directory: Path, stamp: list, digest: str, root: Path | None = None) -> None:
    """Remember the hash of the checkpoint at `directory` (resolved) while its files are `stamp`."""
    memo_path = (root or cache_root()) / MEMO
    memo = {k: v for k, v in read_memo(root).items() if Path(k).is_dir()}  # forget checkpoints that are gone
    memo[str(directory)] = {"files": stamp, "hash": digest}
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo_path, json.dumps(memo, indent=1) + "\n")
    except (OSError, SystemFault):  # a read-only cache folder: the hash is just not remembered
        pass


def remembered_hash(directory: str | Path, root: Path | None = None) -> str | None:
    """The remembered hash of the checkpoint at `directory` while its files are unchanged (no
    weight is read); None when it is not remembered or its files changed."""
    directory = Path(directory).resolve()
    entry = read_memo(root).get(str(directory))
    if isinstance(entry, dict) and isinstance(entry.get("hash"), str) and entry.get("files") == fingerprint(directory):
        return entry["hash"]
    return None


def checkpoint_hash(encoder: Encoder, directory: str | Path, root: Path | None = None) -> str:
    """`encoder_hash` of an encoder just loaded from `directory`, remembered while the
    directory's files stay as they are."""
    directory = Path(directory).resolve()
    known = remembered_hash(directory, root)
    if known is not None:
        return known
    stamp = fingerprint(directory)
    digest = encoder_hash(encoder)
    remember(directory, stamp, digest, root)
    return digest


def reference(encoder: Encoder, model_name: str, root: Path | None = None) -> dict | None:
    """What a head-only model directory stores about the checkpoint `encoder` was loaded
    from: the name given, its resolved path and the content hash of its weights (remembered in
    the default cache folder too: a checkpoint named on the command line is one the model may
    read later, see `reference_location`)."""
    path = Path(resolve_model(model_name)).resolve()
    if not (path / "config.json").is_file():  # a hub name: no local files to refer to
        return None
    digest = checkpoint_hash(encoder, path, root)
    if root is not None and Path(root).expanduser().resolve() != cache_root().resolve():
        remember(path, fingerprint(path), digest)
    return {"source": model_name or DEFAULT_MODEL, "path": str(path), "hash": digest}


# the checkpoint the user named for a head-only model (`--encoder`, `load(..., encoder=)`)
NAMED_ENCODER: ContextVar[str | None] = ContextVar("named_encoder", default=None)


@contextmanager
def named_encoder(name_or_path: str | None) -> Iterator[None]:
    """Head-only models loaded in this block read their encoder from `name_or_path` (when given)."""
    token = NAMED_ENCODER.set(name_or_path or None)
    try:
        yield
    finally:
        NAMED_ENCODER.reset(token)


def inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def reference_location(directory: Path, ref: dict) -> Path:
    """Where the encoder of a head-only model is read from: the checkpoint the user named
    (`--encoder`), else `DIR/encoder` (a copy put there, inside the folder), else the path the
    manifest records (relative to the folder), or the checkpoint its `source` names, when that
    is inside the folder, this installation's default checkpoint, or a checkpoint this user's
    bertheads has read before (remembered in the cache's checkpoints.json: trained on, or named
    with --encoder). Any other place outside the folder is refused with one line."""
    named = NAMED_ENCODER.get()
    if named:
        path = Path(resolve_model(named))
        if not (path / "config.json").is_file():
            raise UserError(f"{said('encoder', named)}: not a checkpoint directory (no config.json)")
        return path
    copy = directory / "encoder"
    if (copy / "config.json").is_file():
        if not inside(copy, directory):
            raise UserError(f"{copy}: leads outside the model folder (to {copy.resolve()}); put the checkpoint "
                            f"itself there, or name it with {said('encoder')}")
        return copy
    source = ref.get("source")
    default = Path(resolve_model(DEFAULT_MODEL)).resolve() if source in (None, "", DEFAULT_MODEL) else None
    outside = None
    for given in (ref.get("path"), None if default else source):
        if not isinstance(given, str) or not given:
            continue
        path = (directory / Path(given).expanduser()).resolve()  # an absolute path stays itself
        if not (path / "config.json").is_file():
            continue
        if inside(path, directory) or path == default or str(path) in read_memo():
            return path
        outside = outside or path
    if default is not None and (default / "config.json").is_file():
        return default
    if outside is not None:
        raise UserError(f"{directory}: holds heads only; its manifest names the encoder at {outside}, outside the "
                        f"model folder, which bertheads has not read before; if you trust that checkpoint, name it: "
                        f"{said('encoder', outside)} (or copy it to {directory / 'encoder'})")
    raise UserError(f"{directory}: holds heads only; its encoder, {source!r} at {ref.get('path')}, "
                    f"is not on this machine; copy that checkpoint to {directory / 'encoder'} (or name it with "
                    f"{said('encoder')})")


def load_reference(directory: Path, ref: dict) -> Encoder:
    """The encoder of a head-only model, from `reference_location`; its weights must hash to
    the recorded value (checked before any weight is read when the hash is remembered)."""
    found = reference_location(directory, ref)
    known = remembered_hash(found)
    if known is not None and known != ref.get("hash"):
        raise UserError(f"{directory}: the checkpoint at {found} is not the one its heads were trained on "
                        f"(weights hash {known[:12]}..., expected {str(ref.get('hash'))[:12]}...)")
    encoder = Encoder.load(str(found), lazy=True)  # the weights load on first use (the hash is remembered)
    digest = checkpoint_hash(encoder, found)
    if digest != ref.get("hash"):
        raise UserError(f"{directory}: the checkpoint at {found} is not the one its heads were trained on "
                        f"(weights hash {digest[:12]}..., expected {str(ref.get('hash'))[:12]}...)")
    encoder.reference = {**ref, "path": str(found.resolve())}
    return encoder
