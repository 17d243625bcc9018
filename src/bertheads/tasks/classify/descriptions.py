"""A classify head from label descriptions (`ClassifySpec.label_descriptions`): each label's
description read ("LABEL: a text like the label's", or a file of such lines), its pooled vector
from the encoder, and the output layer those vectors make.

The head they make is an ordinary linear layer over the L2-normalised pooled vector of the text
(`ClassifySpec.cosine`), its output times `SCALE` (one over the temperature of the similarities):
its weights are the normalised description vectors (over `SHRINK`), so its logits are scaled cosine similarities,
the softmax (sigmoid for multi-label) of them its scores. Without training rows the head predicts
so; with them it starts so (a prototype initialisation). The scale stays outside the weights so
that a step of the usual head learning rate moves them far enough, relative to their size. Export and calibration read it as any head's output layer (a temperature
folds into its weight and bias as into any)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.nn import functional as F

from bertheads.base.errors import UserError, where
from bertheads.base.schema import said
from bertheads.encoder.layers import LayerCombine, pool_tokens
from bertheads.tasks.classify.formats import normalise_label, sort_key
from bertheads.text.encoding import encode_texts, encoder_batch
from bertheads.text.readers import read_text

log = logging.getLogger(__name__)

SCALE = 20.0  # logits = SCALE * cosine similarity (a temperature of 0.05; a dev set may refit it)
# the weights hold the vectors divided by SHRINK, the output is multiplied by SCALE * SHRINK: the
# usual head learning rate then moves them 5 times as far for their size (features mode, seed 0,
# 200 rows: TREC 0.774 against 0.736 undivided, SST-2 0.782 against 0.786; bench/RESULTS.md)
SHRINK = 5.0
# multi-label: a label is on (probability 0.5) from this cosine similarity up. Measured on two
# multi-label sets (GoEmotions' Ekman groups, CoNLL sentences by the entity types they name;
# bench/zero_shot_multilabel.py): 0.3 turned nearly every label off (micro-F1 0.08 and 0.02), and
# no cut did better than turning every label on; 0 (closer to the description than to an
# unrelated text) is the best cut of 0 or more on both sets' choosing splits
MULTI_LABEL_CUT = 0.0
MOST_DESCRIPTIONS = 1000


def read_descriptions(items: list) -> list[tuple[str, str]]:
    """(label, description) pairs from "LABEL: text" items, each of which may instead name a file
    of such lines (blank lines and lines starting with # skipped); one-line errors name the item
    or the file and line."""
    pairs, seen = [], {}
    for item in items or ():
        if not isinstance(item, str) or not item.strip():
            raise UserError(f"{said('label_descriptions')}: expected 'LABEL: a text like the label's' or a file of such "
                            f"lines, got {item!r}")
        if ":" not in item and Path(item).is_file():
            lines = [(where(item, n), line) for n, line in enumerate(read_text(item).splitlines(), 1)
                     if line.strip() and not line.lstrip().startswith("#")]
        else:
            lines = [(said("label_descriptions"), item)]
        for at, line in lines:
            label, sep, text = line.partition(":")
            if not sep or not label.strip() or not text.strip():
                what = "no such file, and not" if ":" not in line and at == said("label_descriptions") else "expected"
                raise UserError(f"{at}: {what} 'LABEL: a text like the label's', got {line.strip()[:80]!r}")
            label = label.strip()
            if label in seen:
                raise UserError(f"{at}: label {label!r} is described twice (once is enough; it may be a long text)")
            seen[label] = True
            pairs.append((label, text.strip()))
    if len(pairs) > MOST_DESCRIPTIONS:
        raise UserError(f"{said('label_descriptions')}: {len(pairs)} labels, more than {MOST_DESCRIPTIONS}")
    if pairs and len(pairs) < 2:
        raise UserError(f"{said('label_descriptions')}: one label ({pairs[0][0]!r}); describe two or more")
    return pairs


def settle_descriptions(spec, path, zero_label: bool) -> None:
    """The spec's descriptions read (files expanded, so the saved head holds the texts) and
    matched to its labels: without training rows the labels are the described ones, in the
    order given; with rows every training label needs one description (by its value or its
    `label_names` name), and a described label no row has is added (refused with label names).
    The head is then `cosine`."""
    pairs = read_descriptions(spec.label_descriptions)
    if not pairs:
        spec.label_descriptions, spec.cosine = None, False
        return
    if spec.problem == "regression":
        raise UserError(f"{said('label_descriptions')}: regression has no labels to describe")
    if zero_label:
        spec.labels = [normalise_label(label) for label in [p[0] for p in pairs]]
        if len(set(spec.labels)) != len(spec.labels):
            raise UserError(f"{said('label_descriptions')}: two labels read as the same value ({spec.labels})")
        spec.label_names = None
    else:
        names = list(spec.label_names) if spec.label_names else [None] * len(spec.labels)
        unseen = [label for label, _ in pairs if normalise_label(label) not in spec.labels and label not in names]
        if unseen and spec.label_names:
            raise UserError(f"{said('label_descriptions')}: {unseen[0]!r} is no label of {path} (its labels: "
                            f"{', '.join(map(str, spec.shown_labels()))})")
        if unseen:  # a described label no row has yet: the head knows it from its description alone
            spec.labels = sorted([*spec.labels, *map(normalise_label, unseen)], key=sort_key)
            names = [None] * len(spec.labels)
            log.info(f"{said('label_descriptions')}: {', '.join(map(repr, unseen))} in no row of {path}: "
                     f"known from {'its description' if len(unseen) == 1 else 'their descriptions'} alone")
        order = {}
        for label, text in pairs:
            found = [i for i, (value, name) in enumerate(zip(spec.labels, names))
                     if normalise_label(label) == value or label == name]
            if not found:
                raise UserError(f"{said('label_descriptions')}: {label!r} is no label of {path} (its labels: "
                                f"{', '.join(map(str, spec.shown_labels()))})")
            order[found[0]] = f"{label}: {text}"
        missing = [str(shown) for i, shown in enumerate(spec.shown_labels()) if i not in order]
        if missing:
            raise UserError(f"{said('label_descriptions')}: no description of label {missing[0]!r} of {path}; "
                            f"describe every label or none")
        pairs = [(str(spec.shown_labels()[i]), order[i].partition(": ")[2]) for i in range(len(spec.labels))]
    spec.label_descriptions = [f"{label}: {text}" for label, text in pairs]
    spec.cosine = True


def description_texts(spec) -> list[str]:
    """Each label's description, in output order."""
    return [item.partition(":")[2].strip() for item in spec.label_descriptions]


def description_vectors(spec, encoder) -> torch.Tensor:
    """The descriptions' pooled vectors as a fresh head reads texts (its layers, their combine,
    its pooling), L2-normalised: `[labels, size]`."""
    model = encoder.model  # (loads a lazy encoder's weights)
    device = next(model.parameters()).device
    features = encode_texts(encoder.tokenizer, description_texts(spec), None, spec.max_length)
    pad = encoder.tokenizer.pad_token_id or 0
    combine = LayerCombine(len(spec.layers), spec.combine)
    rows = []
    was_training = encoder.training
    encoder.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(features), 32):
                batch = encoder_batch(features[start:start + 32], pad, device)
                states = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                                 layers=tuple(spec.layers))
                rows.append(pool_tokens(combine(states).float(), batch["attention_mask"], spec.pooling).cpu())
    finally:
        encoder.train(was_training)
    return F.normalize(torch.cat(rows), dim=-1)


def description_weights(spec, encoder) -> dict[str, torch.Tensor]:
    """The output layer the descriptions make ("out.weight", "out.bias"): the normalised
    description vectors, and a bias of 0 (multi-label: -MULTI_LABEL_CUT, so that a label's
    probability passes 0.5 at that similarity), both divided by SHRINK."""
    vectors = description_vectors(spec, encoder)
    bias = -MULTI_LABEL_CUT if spec.problem == "multi_label" else 0.0
    return {"out.weight": vectors / SHRINK, "out.bias": torch.full((vectors.shape[0],), bias / SHRINK)}
