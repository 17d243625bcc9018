"""A classify head: the sequence head of the checkpoint's family over one vector per input,
and what it is trained on (one feature per text, or per window of a long one) and its loss."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import nn
from torch.nn import functional as F

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.encoder.layers import POOLINGS, LayerCombine, pool_tokens
from bertheads.tasks.base import HeadSettings, init_linear
from bertheads.tasks.classify.descriptions import SCALE, SHRINK, description_weights
from bertheads.tasks.classify.formats import ClassifyExample
from bertheads.tasks.classify.spec import LONG_INPUTS, POOLS, ClassifySpec
from bertheads.tasks.families import (
    FAMILIES,
    Family,
    activation,
    copy_start,
    dense_block,
    init_head_linear,
    pooling,
    settle_family,
)
from bertheads.tasks.families import start_weights as checkpoint_start
from bertheads.tasks.parts import Modeling
from bertheads.tasks.recipes import Fallback, Recipe
from bertheads.text.encoding import encode_texts, encode_windows

log = logging.getLogger(__name__)

# a `normalised` head's input: its unit vector times this (a linear head read mean-pooled states
# of the last 4 layers, normalised, best at x5 of the readers tried; bench/RESULTS.md)
READER_SCALE = 5.0


class ClassifyHead(nn.Module):
    """The sequence head of the checkpoint's family (`tasks/families.py`): BERT's pooler (dense
    + tanh over [CLS]), dropout and a linear layer; RoBERTa's, ELECTRA's, DeBERTa's, DistilBERT's
    or ModernBERT's own layout for those checkpoints. It reads one vector per input: [CLS], or
    the mean or max of the tokens the attention mask keeps (`pooling`, settled by
    `ClassifyTask.build`; `family_pooling` is what the family's transformers class reads). A
    head from label descriptions (`spec.cosine`) is dropout and one linear layer over that
    vector L2-normalised, times `SCALE * SHRINK` (`descriptions.py`); `pooler_state` may then hold its
    "out.weight" and "out.bias". A `spec.normalised` head (the audit's reader of frozen states) is
    dropout and one linear layer over each layer's pooled vector L2-normalised, merged,
    normalised again, times `READER_SCALE`."""

    token_level = False

    def __init__(self, hidden_size: int, num_outputs: int, settings: HeadSettings, pooler_state=None,
                 family: Family | None = None, config=None) -> None:
        super().__init__()
        family = family or FAMILIES["bert"]
        self.layers = tuple(settings.layers)
        self.combine = LayerCombine(len(self.layers), settings.combine)
        size = self.combine.output_size(hidden_size)
        self.cosine = bool(getattr(settings, "cosine", False))
        self.normalised = bool(getattr(settings, "normalised", False)) and not self.cosine
        self.settings = settings  # (what `encoder_tuned` reads the descriptions from)
        self.family_pooling = pooling(family, config)
        chosen = getattr(settings, "pooling", None)
        self.pooling = chosen if chosen in POOLINGS else self.family_pooling
        self.dropout = nn.Dropout(settings.dropout)
        if self.cosine:  # (no dense layer: the normalised vector is what the descriptions are compared in)
            self.pooler = self.norm = None
            self.out = nn.Linear(size, num_outputs)
            copy_out(self.out, pooler_state)
            return
        if self.normalised:
            self.pooler = self.norm = None
            self.out = init_linear(nn.Linear(size, num_outputs))
            return
        if family.init == "bert":  # as bertheads always built it (same weights for the same seed)
            self.pooler = init_linear(nn.Linear(size, size))
            self.norm = None
        else:
            dense, self.norm = dense_block(family, config, size)
            self.pooler = init_head_linear(dense, family, config, "dense")
        copy_start(self.pooler, self.norm, pooler_state)
        self.activation = activation(family, config)
        self.dropout_first = family.dropout_first
        if family.init == "bert":
            self.out = init_linear(nn.Linear(size, num_outputs))
        else:
            self.out = init_head_linear(nn.Linear(size, num_outputs), family, config, "out")
        copy_out(self.out, pooler_state)

    def encoder_tuned(self, encoder) -> None:
        """The encoder was tuned after the head was built (`--mode contrastive`): a head from
        label descriptions starts from their vectors on the tuned encoder."""
        if self.cosine:
            copy_out(self.out, description_weights(self.settings, encoder))

    def forward(self, hidden, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.normalised:  # each layer pooled and normalised before the merge
            layers = hidden if isinstance(hidden, (list, tuple)) else [hidden]
            pooled = [F.normalize(pool_tokens(h, batch.get("attention_mask"), self.pooling), dim=-1) for h in layers]
            return self.out(self.dropout(F.normalize(self.combine(pooled), dim=-1) * READER_SCALE))
        states = self.combine(hidden)
        # [CLS], or the mean/max of every token the mask keeps, specials included (cached pooled
        # states come as one position with a mask of ones)
        cls = pool_tokens(states, batch.get("attention_mask"), self.pooling)
        if self.cosine:
            return self.out(self.dropout(F.normalize(cls, dim=-1))) * (SCALE * SHRINK)
        if self.dropout_first:
            cls = self.dropout(cls)
        pooled = self.activation(self.pooler(cls))
        if self.norm is not None:
            pooled = self.norm(pooled)
        return self.out(self.dropout(pooled))


class ClassifyModeling(Modeling):
    """A classify head's features (one per text, or per window of a long one), its loss and its
    training recipe."""

    prepare_options = ("limit",)
    # by the training data's size, as measured on SST-2 (bench/small_data.py, docs/little-data.md):
    # up to 200 examples SetFit's recipe (contrastive) beat the head alone on the frozen encoder;
    # at 800 and 1,000, contrastive on 40 pairs an example beat fine-tuning (by less at 1,000); at 2,000 batch 8
    # still beat batch 32 (5 seeds)
    # still; each row's faster modes with what they cost there (the same docs and tables)
    recipes = (Recipe(200, "contrastive", 8, steps=300, epochs=(3, 20),
                      fallbacks=(Fallback("features", 3.3, "SST-2 at 200 rows, 5 seeds"),)),
               Recipe(1000, "contrastive", 8, steps=300, epochs=(3, 20), pairs_each=40,
                      fallbacks=(Fallback("finetune", 1.6, "SST-2 at 800 rows, 5 seeds"),
                                 Fallback("features", 6.9, "SST-2 at 800 rows, 1 seed"))),
               Recipe(2000, "finetune", 8, steps=300, epochs=(3, 20),
                      fallbacks=(Fallback("features", 4.0, "SST-2 at 2,000 rows, 1 seed"),)),
               Recipe(None, "finetune", 32, fallbacks=(Fallback("features", 4.4, "SST-2 at 8,000 rows, 1 epoch, 1 run"),)))

    @classmethod
    def start_weights(cls, spec: ClassifySpec, encoder) -> dict | None:
        """The checkpoint's weights the head's dense layer starts from (BERT's pooler, ...); a
        head from label descriptions, its output layer from their vectors (`descriptions.py`)."""
        family = settle_family(spec, encoder)
        if spec.cosine:
            settle_pooling(spec, encoder, family)
            return description_weights(spec, encoder)
        if spec.normalised:
            return None  # (no dense layer to start)
        return checkpoint_start(family, encoder)

    def recipe(self, examples: int, how: str = "auto") -> Recipe:
        """The table's row; contrastive mode pairs single labelled texts, so text pairs and
        regression fine-tune instead (with the row's batch size and step budget)."""
        row = super().recipe(examples, how)
        if row.mode == "contrastive" and (self.spec.pair or self.spec.problem == "regression"):
            return replace(row, mode="finetune")
        return row

    def encode(self, examples: list[ClassifyExample], tokenizer, with_labels: bool = True,
               path: str | None = None) -> list[dict]:
        """One feature per example, or with `long_input="windows"` one per window (each window
        of a training text learns the text's label)."""
        return self.encode_for_inference(examples, tokenizer, with_labels, path)[0]

    def encode_for_inference(self, examples: list[ClassifyExample], tokenizer, with_labels: bool = False,
                             path: str | None = None) -> tuple[list[dict], list[int]]:
        """One feature per example (longer inputs are truncated, as in training), or one per
        window; and each feature's example."""
        spec = self.spec
        texts, pairs = [e.text for e in examples], [e.pair for e in examples]
        if spec.long_input == "windows":
            check_windows(spec)
            feats, owner = encode_windows(tokenizer, texts, pairs, spec.max_length, spec.stride)
        else:
            feats, owner = encode_texts(tokenizer, texts, pairs, spec.max_length), list(range(len(examples)))
        if with_labels:
            targets = [self.task.reading.label_target(e, path) for e in examples]
            for f, k in zip(feats, owner):
                f["labels"] = targets[k]
        return feats, owner

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        labels = batch["labels"]
        if self.spec.problem == "regression":
            return F.mse_loss(logits.squeeze(-1), labels.float())
        if self.spec.problem == "multi_label":
            return F.binary_cross_entropy_with_logits(logits, labels.float())
        weight = None
        if self.spec.label_weights:
            weight = torch.tensor(self.spec.label_weights, dtype=logits.dtype, device=logits.device)
        return F.cross_entropy(logits, labels.long(), weight=weight)

    def pair_labels(self, features: list[dict]) -> list[frozenset]:
        """`--mode contrastive`: each feature's label (multi-label: its labels, SetFit's rule: a
        label in common makes a positive pair); regression and text pairs are refused."""
        spec = self.spec
        if spec.problem == "regression":
            raise UserError(f"{said('mode', 'contrastive')}: regression has no labels to pair texts by; use "
                            f"{said('mode', 'features')} or finetune")
        if spec.pair:
            raise UserError(f"{said('mode', 'contrastive')}: it tunes the encoder on single texts, and these inputs are "
                            f"text pairs; use {said('mode', 'features')} or finetune")
        if spec.problem == "multi_label":
            return [frozenset(i for i, on in enumerate(f["labels"]) if on) for f in features]
        return [frozenset((int(f["labels"]),)) for f in features]

    def output_hint(self) -> str:
        count = 1 if self.spec.problem == "regression" else len(self.spec.labels)
        return f" ({self.spec.problem}, {len(self.spec.labels)} labels: {count} outputs)"


def check_windows(spec: ClassifySpec) -> None:
    if spec.long_input not in LONG_INPUTS:
        raise UserError(f"{said('long_input')}: expected one of {', '.join(LONG_INPUTS)}, got {spec.long_input!r}")
    if spec.pool not in POOLS:
        raise UserError(f"{said('pool')}: expected one of {', '.join(POOLS)}, got {spec.pool!r}")
    if not 0 <= spec.stride < spec.max_length - 3:
        raise UserError(f"{said('stride', spec.stride)}: must be at least 0 and below {said('max_length')} minus 3")


def copy_out(out: nn.Linear, state: dict | None) -> None:
    """The output layer's start weights ("out.weight", "out.bias"), where `state` holds them."""
    if state and "out.weight" in state:
        with torch.no_grad():
            out.weight.copy_(state["out.weight"])
            out.bias.copy_(state["out.bias"])


def settle_pooling(spec: ClassifySpec, encoder, family: Family) -> None:
    """The spec's `pooling` settled: "auto" is the pooling the checkpoint declares (a
    sentence-transformers `Pooling` module) for a head on a frozen encoder (`mode` features, and
    contrastive: the encoder is tuned on the sentence embeddings it was made for) and for a head
    from label descriptions, else the family's own head; None (a spec saved before the field) is
    the family's own head."""
    own = pooling(family, getattr(encoder, "config", None))
    if spec.pooling is None:
        spec.pooling = own
    elif spec.pooling == "auto":
        declared = None
        if (spec.mode in ("features", "contrastive") or spec.cosine) and hasattr(encoder, "declared_pooling"):
            declared = encoder.declared_pooling()
        spec.pooling = declared or own
        if declared and declared != own:
            log.info(f"the head reads the {declared} of the tokens, the pooling the checkpoint declares "
                     f"({said('pooling', 'cls')}: [CLS])")
    if spec.pooling not in POOLINGS:
        raise UserError(f"{said('pooling')}: expected auto, {', '.join(POOLINGS)}, got {spec.pooling!r}")
