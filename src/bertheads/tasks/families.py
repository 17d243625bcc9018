"""Each checkpoint family's own heads: the layout of its transformers `*ForSequenceClassification`,
`*ForTokenClassification` and `*ForQuestionAnswering` heads, how a fresh head is initialised,
which of the checkpoint's weights it starts from, and where its weights go in those classes.

| family | sequence head | token head | starts from |
|---|---|---|---|
| bert (and unknown types) | [CLS], dense, tanh, dropout, linear | dropout, linear | the checkpoint's pooler |
| roberta, xlm-roberta | dropout, [CLS], dense, tanh, dropout, out_proj | dropout, linear | nothing |
| mpnet | dropout, [CLS], dense, tanh, dropout, out_proj | dropout, linear | nothing |
| electra | dropout, [CLS], dense, GELU, dropout, out_proj | dropout, linear | nothing |
| deberta, deberta-v2 | dropout, [CLS], dense, pooler_hidden_act, dropout, linear | dropout, linear | `pooler.dense` |
| distilbert | [CLS], dense, ReLU, dropout, linear | dropout, linear | nothing |
| modernbert | [CLS] or mean, dense, act, norm, dropout, linear | dense, act, norm, dropout, linear | `head` (MLM) |

A head records its family (`HeadSettings.head_family`); a head saved before families were
known has BERT's layout, whatever its encoder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from bertheads.base.errors import UserError

BASE = "{base}."  # stands for the transformers class's base model prefix in key maps


@dataclass(frozen=True)
class Family:
    """One checkpoint family's head layouts (see the module's table)."""

    name: str
    model_types: tuple[str, ...]
    activation: str = "tanh"  # the sequence head's activation, or "config:ATTR" (its config names it)
    dropout_first: bool = False  # dropout on the first token before the dense layer
    norm: bool = False  # a LayerNorm after the activation (ModernBERT's prediction head)
    token_dense: bool = False  # the token and span heads have the dense, act, norm block too
    pooling: str = "cls"  # "cls" or "config:ATTR" (ModernBERT: classifier_pooling)
    init: str = "normal"  # "bert" (std 0.02, as bertheads always did), "normal" (initializer_range), "modernbert"
    start_from: str | None = None  # prefix of the checkpoint's weights the sequence head starts from
    sequence_keys: dict | tuple = field(default_factory=dict)  # our key prefix -> the transformers class's
    # (a tuple: maps tried in order, the first whose layers the class has wins)
    token_keys: dict = field(default_factory=lambda: {"out.": "classifier."})
    span_keys: dict = field(default_factory=lambda: {"out.": "qa_outputs."})
    dense_bias: str | None = None  # config attribute saying whether the dense layer has a bias
    norm_bias: str | None = None  # config attribute saying whether the norm has a bias
    norm_eps: str = "layer_norm_eps"


ROBERTA_KEYS = {"pooler.": "classifier.dense.", "out.": "classifier.out_proj."}
MODERNBERT_KEYS = {"pooler.": "head.dense.", "norm.": "head.norm.", "out.": "classifier."}

FAMILIES: dict[str, Family] = {f.name: f for f in (
    # BERT's head computes RoBERTa's too (the two differ in dropout only), so a BERT-layout head
    # saved on another family's checkpoint still exports to that family's class where it matches
    Family("bert", ("bert",), init="bert", start_from="pooler",
           sequence_keys=({"pooler.": BASE + "pooler.dense.", "out.": "classifier."}, ROBERTA_KEYS)),
    Family("roberta", ("roberta", "xlm-roberta", "camembert"), dropout_first=True, sequence_keys=ROBERTA_KEYS),
    Family("mpnet", ("mpnet",), dropout_first=True, sequence_keys=ROBERTA_KEYS),
    Family("electra", ("electra",), activation="gelu", dropout_first=True, sequence_keys=ROBERTA_KEYS),
    Family("deberta", ("deberta-v2", "deberta"), activation="config:pooler_hidden_act", dropout_first=True,
           start_from="pooler.dense.", sequence_keys={"pooler.": "pooler.dense.", "out.": "classifier."}),
    Family("distilbert", ("distilbert",), activation="relu",
           sequence_keys={"pooler.": "pre_classifier.", "out.": "classifier."}),
    Family("modernbert", ("modernbert",), activation="config:classifier_activation", norm=True, token_dense=True,
           pooling="config:classifier_pooling", init="modernbert", start_from="head.",
           sequence_keys=MODERNBERT_KEYS, token_keys={"dense.": "head.dense.", "norm.": "head.norm.",
                                                     "out.": "classifier."},
           span_keys={"dense.": "head.dense.", "norm.": "head.norm.", "out.": "classifier."},
           dense_bias="classifier_bias", norm_bias="norm_bias", norm_eps="norm_eps"),
)}
BY_MODEL_TYPE = {t: f for f in FAMILIES.values() for t in f.model_types}


def family_of_config(config) -> Family:
    """The family of a checkpoint's config (BERT's layout for a type no family claims)."""
    return BY_MODEL_TYPE.get(getattr(config, "model_type", None), FAMILIES["bert"])


def settle_family(spec, encoder) -> Family:
    """The head's family: the one its spec records, else the encoder's (then recorded)."""
    name = getattr(spec, "head_family", None)
    if name is None:
        name = family_of_config(getattr(encoder, "config", None)).name
        spec.head_family = name
    if name not in FAMILIES:
        raise UserError(f"head_family {name!r}: not a family this version knows ({', '.join(FAMILIES)})")
    return FAMILIES[name]


def config_value(config, name: str, default):
    value = getattr(config, name, None) if config is not None else None
    return default if value is None else value


def activation(family: Family, config) -> Callable[[torch.Tensor], torch.Tensor]:
    """The sequence head's activation function."""
    name = family.activation
    if name.startswith("config:"):
        name = config_value(config, name[7:], "gelu")
    if name == "tanh":
        return torch.tanh
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def pooling(family: Family, config) -> str:
    """How the sequence head reads the sequence: "cls" (the first token) or "mean"."""
    if family.pooling.startswith("config:"):
        return str(config_value(config, family.pooling[7:], "cls"))
    return family.pooling


def dense_block(family: Family, config, size: int) -> tuple[nn.Linear, nn.LayerNorm | None]:
    """The dense layer (and, where the family has one, its norm) of a head."""
    bias = bool(config_value(config, family.dense_bias, True)) if family.dense_bias else True
    dense = nn.Linear(size, size, bias=bias)
    norm = None
    if family.norm:
        norm_bias = bool(config_value(config, family.norm_bias, True)) if family.norm_bias else True
        norm = nn.LayerNorm(size, eps=float(config_value(config, family.norm_eps, 1e-5)), bias=norm_bias)
    return dense, norm


def token_block(family: Family, config, size: int) -> tuple[nn.Linear, nn.LayerNorm | None]:
    """The dense layer and norm a family puts before its token and span classifiers."""
    dense, norm = dense_block(family, config, size)
    return init_head_linear(dense, family, config, "dense"), norm


def init_head_linear(layer: nn.Linear, family: Family, config, role: str) -> nn.Linear:
    """Initialise a new linear layer as the family's own code does (`role`: "dense" or "out")."""
    if family.init == "bert":
        std = 0.02
    elif family.init == "modernbert":
        base = float(config_value(config, "initializer_range", 0.02))
        layers = int(config_value(config, "num_hidden_layers", 1))
        std = base / math.sqrt(2.0 * layers) if role == "dense" else layer.in_features ** -0.5
        cutoff = float(config_value(config, "initializer_cutoff_factor", 3.0))
        nn.init.trunc_normal_(layer.weight, mean=0.0, std=std, a=-cutoff * std, b=cutoff * std)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
        return layer
    else:
        std = float(config_value(config, "initializer_range", 0.02))
    nn.init.normal_(layer.weight, mean=0.0, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def start_weights(family: Family, encoder) -> dict[str, torch.Tensor] | None:
    """The checkpoint's weights a new sequence head of `family` starts from, keyed as the
    head's dense layer ("weight", "bias") and norm ("norm.weight", ...); None when it has none."""
    if family.start_from is None:
        return None
    if family.start_from == "pooler":
        return getattr(encoder, "pooler_state", None)
    read = getattr(encoder, "checkpoint_tensors", None)
    found = read(family.start_from) if read is not None else {}
    if family.norm:  # ModernBERT's prediction head: dense.* and norm.*
        found = {k.removeprefix("dense."): v for k, v in found.items() if k.startswith(("dense.", "norm."))}
    return found if "weight" in found else None


def token_start_weights(spec, encoder) -> dict[str, torch.Tensor] | None:
    """The checkpoint's weights a token head's block starts from, where the spec's family has one
    (ModernBERT's masked-LM head); a token kind's `Modeling.start_weights`."""
    family = settle_family(spec, encoder)
    return start_weights(family, encoder) if family.token_dense else None


def copy_start(dense: nn.Linear, norm: nn.LayerNorm | None, state: dict | None) -> None:
    """Copy start weights into the dense layer and norm where their shapes fit."""
    if not state:
        return
    with torch.no_grad():
        for name, target in (("weight", dense.weight), ("bias", dense.bias),
                             ("norm.weight", getattr(norm, "weight", None)), ("norm.bias", getattr(norm, "bias", None))):
            value = state.get(name)
            if target is not None and value is not None and tuple(value.shape) == tuple(target.shape):
                target.copy_(value)


def copy_into(model: nn.Module, head: nn.Module, keys: dict[str, str] | tuple, what: str) -> None:
    """Load the head's weights into the transformers model's head by the family's key map (the
    first of several that fits); refuse (UserError) a head whose layers that model does not
    have, or that leaves part of that model's head unset."""
    if isinstance(keys, tuple):
        for i, option in enumerate(keys):
            try:
                return copy_into(model, head, option, what)
            except UserError:
                if i == len(keys) - 1:
                    raise
    base = model.base_model_prefix
    theirs = model.state_dict()
    mapped = {}
    for key, value in head.state_dict().items():
        if key.startswith(("combine.", "branch.")):  # a single layer's combine computes nothing; a branch
            continue  # is the encoder's top layers (`export/hf.py` puts them there)
        prefix = next((p for p in keys if key.startswith(p)), None)
        target = None if prefix is None else keys[prefix].replace("{base}", base) + key[len(prefix):]
        if target not in theirs or tuple(theirs[target].shape) != tuple(value.shape):
            raise UserError(f"{what}: {type(model).__name__} has no layer for {key} "
                            f"{list(value.shape)}, so the head has no equivalent")
        mapped[target] = value
    head_keys = {k for k in theirs if not k.startswith(base + ".")} | \
        {k for k in theirs for p in keys.values() if p.startswith(BASE) and k.startswith(p.replace("{base}", base))}
    unset = sorted(head_keys - set(mapped))
    if unset:
        raise UserError(f"{what}: {type(model).__name__} has head weights this head lacks ({', '.join(unset[:3])}), "
                        f"so the head has no equivalent")
    model.load_state_dict(mapped, strict=False)
