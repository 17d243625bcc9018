"""The on-disk cache of frozen-encoder states that `--mode features` trains from (its entries;
`training/features.py` gives a run's tasks their entries and evaluates heads over them).

Cache layout (`--cache-dir`, else `$BERTHEADS_CACHE`, else `~/.cache/bertheads`):
```
ROOT/features/KEY/states.npy    [rows, layers, hidden] float16 (or float32): one row per
                                feature for sequence-level heads ([CLS], or each layer's mean
                                or max over the feature's tokens), one per token for
                                token-level heads
ROOT/features/KEY/offsets.npy   [features + 1] int64: feature i owns rows offsets[i]:offsets[i+1]
ROOT/features/KEY/meta.json     what the entry holds (layers, dtype, sizes, source, build time)
```
KEY hashes the encoder (weights and config), the exact model inputs of every training feature
(so the data, tokenizer, --max-length, --stride and the task's encoding settings all count),
the layers kept, the positions stored (`cls`, `mean`, `max` or `tokens`: so a head that
pools otherwise never reads a stale entry) and the dtype. The layers are stored unmerged, so
every --combine reuses one entry. An entry is built in a temporary directory and renamed into
place: it is either complete or absent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.compute.batching import INFERENCE_BATCH, INFERENCE_TOKENS
from bertheads.compute.runner import run_heads
from bertheads.compute.states import EncoderStates
from bertheads.encoder.pretrained import weights_hash
from bertheads.store import lock
from bertheads.store.atomic import atomic_directory
from bertheads.store.encoder_refs import CACHE_ENV, cache_root  # noqa: F401 (where they were defined before)
from bertheads.store.rowfiles import create_npy
from bertheads.text.encoding import collate

log = logging.getLogger(__name__)

CACHE_DTYPES = ("float16", "float32")
CACHE_FORMAT = 1
POOLED = ("mean", "max")  # positions stored as one pooled row per feature
ONE_ROW = ("cls", *POOLED)  # positions stored as one row per feature


@dataclass
class CacheSettings:
    root: Path
    dtype: str = "float16"
    max_gb: float | None = None
    progress: bool = True
    batch_size: int = INFERENCE_BATCH
    max_tokens: int = INFERENCE_TOKENS

    @classmethod
    def from_options(cls, options: dict, progress: bool = True) -> CacheSettings:
        dtype = options.get("cache_dtype") or "float16"
        if dtype not in CACHE_DTYPES:
            raise UserError(f"{said('cache_dtype')}: expected float16 or float32, got {dtype!r}")
        max_gb = options.get("cache_max_gb")
        if max_gb is not None and max_gb <= 0:
            raise UserError(f"{said('cache_max_gb')}: expected a positive number, got {max_gb}")
        return cls(cache_root(options.get("cache_dir")), dtype, max_gb, progress)


def encoder_identity(encoder) -> str:
    """What fixes the encoder's outputs: its weights (content hash: the remembered one of the
    checkpoint it was loaded from, when it has a `reference`) and its config."""
    weights = weights_hash(encoder)
    config = {k: v for k, v in encoder.config.to_dict().items()
              if not k.startswith("_") and k not in ("transformers_version", "architectures")}
    digest = hashlib.sha256(weights.encode())
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def cache_key(encoder_id: str, features: Sequence[dict], layers: Sequence[int], positions: str,
              dtype: str, uses_token_types: bool) -> str:
    """The cache entry's name: the encoder, the exact model inputs of every feature (so the data,
    the tokenizer and every packing setting count), the layers kept, which positions and dtype."""
    digest = hashlib.sha256(f"v{CACHE_FORMAT}|{encoder_id}|{list(layers)}|{positions}|{dtype}".encode())
    for f in features:
        ids = np.asarray(f["input_ids"], dtype=np.int64)
        digest.update(struct.pack("<q", len(ids)))
        digest.update(ids.tobytes())
        if uses_token_types and f.get("token_type_ids") is not None:
            digest.update(np.asarray(f["token_type_ids"], dtype=np.int8).tobytes())
    return digest.hexdigest()[:32]


class CachedFeatures:
    """A task's training features as frozen-encoder states, read from a memory-mapped entry.

    `batch(idx, train_features)` is what the fine-tuning batch would be (input ids, mask,
    labels and the task's token fields) plus `states`: the head's input, a tensor `[B, T, H]`
    or a list of them, one per layer (T = 1 when only [CLS] is stored, or one pooled vector:
    then the attention mask is `[B, 1]` of ones, so pooling that one position gives it back).
    """

    def __init__(self, directory: Path, lengths: list[int], pad_id: int) -> None:
        self.directory = Path(directory)
        self.meta = json.loads((self.directory / "meta.json").read_text())
        self.states = np.load(self.directory / "states.npy", mmap_mode="r")  # [rows, L, H]
        self.offsets = np.load(self.directory / "offsets.npy")
        self.first_only = self.meta["positions"] in ONE_ROW
        self.pooled = self.meta["positions"] in POOLED
        self.lengths = lengths
        self.pad_id = pad_id

    def batch(self, idx: Sequence[int], train_features: Sequence[dict]) -> dict:
        batch = collate([train_features[i] for i in idx], self.pad_id)
        _, num_layers, hidden = self.states.shape
        if self.first_only:
            rows = np.asarray(self.states[np.asarray(idx)], dtype=np.float32)  # [B, L, H]
            out = rows.transpose(1, 0, 2)[:, :, None, :]  # [L, B, 1, H]
        else:
            width = batch["input_ids"].shape[1]
            out = np.zeros((num_layers, len(idx), width, hidden), dtype=np.float32)
            for j, i in enumerate(idx):
                start, end = self.offsets[i], self.offsets[i + 1]
                out[:, j, : end - start] = self.states[start:end].transpose(1, 0, 2)
        layers = [torch.from_numpy(np.ascontiguousarray(x)) for x in out]
        if self.pooled:
            batch["attention_mask"] = torch.ones(len(idx), 1, dtype=batch["attention_mask"].dtype)
        batch["states"] = layers[0] if num_layers == 1 else layers
        return batch


@dataclass
class CachedDev:
    """A task's dev set as cached states: its features (with labels), which example each
    belongs to, and the entry holding their states."""

    features: list
    owner: list
    cached: CachedFeatures


def ensure_cache(encoder, features: Sequence[dict], key: str, layers: tuple[int, ...], positions: str,
                 settings: CacheSettings, info: dict, device=None) -> Path:
    """The entry `ROOT/features/KEY`, built now if it does not exist yet."""
    entries = settings.root / "features"
    final = entries / key
    if (final / "meta.json").is_file():
        if entry_is_whole(final):
            say(settings, f"feature cache: reusing {final}")
            return final
        say(settings, f"feature cache: {final} is damaged (files missing or cut short); building it again")
        shutil.rmtree(final, ignore_errors=True)
    lengths = [len(f["input_ids"]) for f in features]
    rows = len(features) if positions in ONE_ROW else sum(lengths)
    hidden = encoder.info.hidden_size
    nbytes = rows * len(layers) * hidden * np.dtype(settings.dtype).itemsize
    check_space(settings, entries, nbytes, rows, len(layers), hidden)
    started = time.perf_counter()
    if os.environ.get("RANK", "0") == "0":  # one build of an entry at a time (torchrun's ranks share it)
        lock.hold(final, "feature-cache build")
    try:
        # built beside its final name; a process that finished the same entry first wins
        with atomic_directory(final, replace=False) as tmp:
            offsets = np.zeros(len(features) + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([1] * len(features) if positions in ONE_ROW else lengths)
            np.save(tmp / "offsets.npy", offsets)
            with create_npy(tmp / "states.npy", (rows, len(layers), hidden), settings.dtype) as out:
                runner = EncoderStates(encoder, layers, [positions], device, getattr(torch, settings.dtype))

                def write(idx: list[int], states: dict, _) -> None:  # each feature's rows to their place
                    block = states[positions]
                    for j, i in enumerate(idx):
                        out["array"].write(int(offsets[i]), block[j : j + 1] if positions in ONE_ROW
                                           else block[j, : lengths[i]])

                run_heads(runner, features, [positions], settings.batch_size, settings.max_tokens,
                          "feature cache" if settings.progress else None, sink=write)
            meta = {"format": CACHE_FORMAT, "key": key, "layers": list(layers), "positions": positions,
                    "dtype": settings.dtype, "features": len(features), "rows": rows, "hidden_size": hidden,
                    "bytes": nbytes, "build_seconds": round(time.perf_counter() - started, 3),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **info}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    finally:
        lock.release(final)
    say(settings, f"feature cache: built {final} ({nbytes / 1e9:.3f} GB, {time.perf_counter() - started:.1f} s)")
    return final


def entry_is_whole(directory: Path) -> bool:
    """An entry whose arrays are all there with the sizes its meta.json records."""
    try:
        meta = json.loads((directory / "meta.json").read_text())
        states = np.load(directory / "states.npy", mmap_mode="r")
        offsets = np.load(directory / "offsets.npy")
    except (OSError, ValueError):
        return False
    return (states.shape[0] == meta.get("rows") and len(offsets) == meta.get("features", -1) + 1
            and int(offsets[-1]) == states.shape[0])


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def check_space(settings: CacheSettings, entries: Path, nbytes: int, rows: int, layers: int, hidden: int) -> None:
    """Refuse to build an entry beyond `--cache-max-gb` (counting the entries already there) or
    beyond the free disk space."""
    need = f"{nbytes / 1e9:.3f} GB ({rows} rows x {layers} layers x {hidden} x {settings.dtype})"
    if settings.max_gb is not None:
        cap = settings.max_gb * 1e9
        if nbytes > cap:
            raise UserError(f"{said('cache_max_gb', settings.max_gb)}: the feature cache would need {need}; raise the "
                            f"cap, keep fewer {said('layers')}, use {said('cache_dtype', 'float16')} or "
                            f"{said('limit')} the data")
        used = directory_bytes(entries)
        if used + nbytes > cap:
            raise UserError(f"{said('cache_max_gb', settings.max_gb)}: {entries} already holds {used / 1e9:.3f} GB "
                            f"and this entry needs {need}; delete old entries there or raise the cap")
    probe = entries if entries.exists() else next((p for p in entries.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    if nbytes > free:
        raise UserError(f"{entries}: the feature cache needs {need} but only {free / 1e9:.3f} GB are free; "
                        f"choose another {said('cache_dir')}")


def say(settings: CacheSettings, message: str) -> None:
    if settings.progress:
        log.info(message)
