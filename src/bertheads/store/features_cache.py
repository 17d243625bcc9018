"""The on-disk cache of frozen-encoder states that `--mode features` trains from.

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
from bertheads.encoder.layers import cached_positions, normalise_layers, pool_tokens
from bertheads.encoder.pretrained import weights_hash
from bertheads.store import lock
from bertheads.store.atomic import atomic_directory
from bertheads.store.encoder_refs import CACHE_ENV, cache_root  # noqa: F401 (where they were defined before)
from bertheads.store.rowfiles import create_npy
from bertheads.text.batching import INFERENCE_BATCH, INFERENCE_TOKENS, run_in_length_order
from bertheads.text.encoding import collate, encoder_batch
from bertheads.text.runner import run_features

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
            raise UserError(f"--cache-dtype: expected float16 or float32, got {dtype!r}")
        max_gb = options.get("cache_max_gb")
        if max_gb is not None and max_gb <= 0:
            raise UserError(f"--cache-max-gb: expected a positive number, got {max_gb}")
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


def attach_cache(net, data: list, options: dict, model_name: str | None = None, train_path: str | None = None,
                 progress: bool = True) -> None:
    """Give every task of a features-mode run its cached encoder states (`TaskData.cached`,
    and `TaskData.dev_cached` for its dev set), building the cache entries that do not exist yet."""
    from accelerate import PartialState

    modes = {d.task.spec.mode for d in data}
    if modes != {"features"}:
        raise UserError("--mode features must be set for every head of a run (the encoder is either "
                        "frozen for all of them or fine-tuned)")
    settings = CacheSettings.from_options(options, progress)
    encoder = net.encoder
    encoder_id = encoder_identity(encoder)
    pad_id = encoder.tokenizer.pad_token_id or 0
    # cpu=True as in `fit`: without CUDA, that is what makes torchrun processes set up gloo.
    state = PartialState(cpu=not torch.cuda.is_available())
    for d in data:
        head = net.heads[d.name]
        layers = normalise_layers(head.layers, encoder.info.num_layers)
        positions = cached_positions(head)
        key = cache_key(encoder_id, d.train_features, layers, positions, settings.dtype,
                        encoder.info.uses_token_types)
        info = {"model": model_name, "train": str(train_path) if train_path else None, "task": d.task.kind,
                "head": d.name, "max_length": getattr(d.task.spec, "max_length", None)}
        with state.main_process_first():
            directory = ensure_cache(encoder, d.train_features, key, layers, positions, settings, info, state.device)
        d.cached = CachedFeatures(directory, [len(f["input_ids"]) for f in d.train_features], pad_id)
        if d.dev_examples is not None and state.is_main_process:  # the main process evaluates
            features, owner = d.task.encode_for_inference(d.dev_examples, encoder.tokenizer, with_labels=True)
            key = cache_key(encoder_id, features, layers, positions, settings.dtype, encoder.info.uses_token_types)
            info = {**info, "train": None, "dev": str(d.dev_path) if d.dev_path else None}
            directory = ensure_cache(encoder, features, key, layers, positions, settings, info, state.device)
            d.dev_cached = CachedDev(features, owner,
                                     CachedFeatures(directory, [len(f["input_ids"]) for f in features], pad_id))


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
                write_states(encoder, features, layers, positions, offsets, out["array"], settings, device)
            meta = {"format": CACHE_FORMAT, "key": key, "layers": list(layers), "positions": positions,
                    "dtype": settings.dtype, "features": len(features), "rows": rows, "hidden_size": hidden,
                    "bytes": nbytes, "build_seconds": round(time.perf_counter() - started, 3),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **info}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    finally:
        lock.release(final)
    say(settings, f"feature cache: built {final} ({nbytes / 1e9:.3f} GB, {time.perf_counter() - started:.1f} s)")
    return final


def write_states(encoder, features: Sequence[dict], layers: tuple[int, ...], positions: str,
                 offsets: np.ndarray, out, settings: CacheSettings, device=None) -> None:
    """Run the encoder over `features` in length-sorted batches and store each feature's rows
    (with `pwrite`, so batches may finish in any order: see `packing.run_batches`): [CLS], each
    layer pooled over the tokens the attention mask keeps (`mean`, `max`), or every token."""
    was_training = encoder.training
    encoder.eval()
    if device is not None:
        encoder.to(device)
    device = next(encoder.model.parameters()).device  # (loads a lazy encoder)
    pad_id = encoder.tokenizer.pad_token_id or 0
    lengths = [len(f["input_ids"]) for f in features]
    torch_dtype = getattr(torch, settings.dtype)

    def run(idx: list[int]) -> None:
        batch = encoder_batch([features[i] for i in idx], pad_id, device)
        # [CLS] of the last layer alone: that layer runs for [CLS] only
        states = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], layers=layers,
                         first_token_only=positions == "cls")
        if isinstance(states, torch.Tensor):
            states = [states]
        if torch_dtype == torch.float16 and any(s.abs().max() > 65000 for s in states):
            raise UserError("the encoder's hidden states exceed the float16 range; use --cache-dtype float32")
        if positions in ONE_ROW:
            mask = batch["attention_mask"]
            block = torch.stack([pool_tokens(s, mask, positions) for s in states], dim=1)
            block = block.to(torch_dtype).cpu().numpy()  # [B, L, H]
            for j, i in enumerate(idx):
                out.write(int(offsets[i]), block[j : j + 1])
        else:
            block = torch.stack(states, dim=2).to(torch_dtype).cpu().numpy()  # [B, T, L, H]
            for j, i in enumerate(idx):
                out.write(int(offsets[i]), block[j, : lengths[i]])

    try:
        run_in_length_order(features, run, device, settings.batch_size, settings.max_tokens,
                            progress="feature cache" if settings.progress else None)
    finally:
        encoder.train(was_training)


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
            raise UserError(f"--cache-max-gb {settings.max_gb:g}: the feature cache would need {need}; "
                            f"raise the cap, keep fewer --layers, use --cache-dtype float16 or --limit the data")
        used = directory_bytes(entries)
        if used + nbytes > cap:
            raise UserError(f"--cache-max-gb {settings.max_gb:g}: {entries} already holds {used / 1e9:.3f} GB "
                            f"and this entry needs {need}; delete old entries there or raise the cap")
    probe = entries if entries.exists() else next((p for p in entries.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    if nbytes > free:
        raise UserError(f"{entries}: the feature cache needs {need} but only {free / 1e9:.3f} GB are free; "
                        f"choose another --cache-dir")


def say(settings: CacheSettings, message: str) -> None:
    if settings.progress:
        log.info(message)


class CachedHead:
    """A head over a dev set's cached encoder states, without the encoder: the
    `text.runner.Runner` of `evaluate_cached` (`rows` index `dev.features`)."""

    workers = None  # batches side by side as torch's threads allow (`cpu_workers`)

    def __init__(self, name: str, task, head, dev: CachedDev, device: torch.device) -> None:
        self.name, self.task, self.head, self.dev, self.device = name, task, head, dev, device
        self.pad_id = dev.cached.pad_id

    def token_level(self, name: str) -> bool:
        return bool(self.head.token_level)

    def run(self, features: Sequence[dict], rows: Sequence[int], heads: Sequence[str],
            with_loss: bool = False) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The head's outputs for a batch of dev features (and its loss, with `with_loss`)."""
        batch = self.dev.cached.batch(rows, self.dev.features)
        states = batch.pop("states")
        states = [s.to(self.device) for s in states] if isinstance(states, list) else states.to(self.device)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        logits = self.head(states, batch)
        losses = {self.name: float(self.task.dev_loss(logits, batch))} if with_loss else {}
        return {self.name: logits.float().cpu().numpy()}, losses


def evaluate_cached(task, head, dev: CachedDev, examples: list, path=None, batch_size: int = INFERENCE_BATCH,
                    device=None) -> dict:
    """A head's dev metrics and mean `loss` from the dev set's cached states (what evaluating
    with the live frozen encoder gives, up to the cache's precision, in the same batches),
    without the encoder."""
    was_training = head.training
    head.eval()
    runner = CachedHead(task.kind, task, head, dev, device or next(head.parameters()).device)
    losses: dict[str, list[float]] = {}
    try:
        outputs = run_features(runner, dev.features, [runner.name], batch_size, losses=losses)[runner.name]
    finally:
        head.train(was_training)
    collected = task.collect(outputs, dev.owner, examples, dev.features)
    metrics = task.metrics(collected, examples, path, during_training=True)
    total, count = losses[runner.name]
    metrics["loss"] = total / count if count else float("nan")
    return metrics
