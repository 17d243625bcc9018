"""`--mode contrastive`, SetFit's recipe for tens to a few hundred labelled texts, its first
stage: the encoder tuned on pairs of training texts, the cosine of their sentence vectors (the
head's pooling of the last layer) pulled to 1 for a pair with a label in common and to 0 for
one without. The heads then learn alone on the tuned, frozen encoder's cached states (the
features-mode path, `training/features.py` and `training/loop.py`), and the model saves its
tuned encoder as a fine-tuned one does: every head, export, runtime and the server read it as
any other bertheads model.

SetFit's defaults throughout: "oversampling" pairs (`make_pairs`), 16 pairs a step, one pass,
AdamW at 2e-5 with a tenth of the steps' warm-up and linear decay, dropout on. The loss is
sentence-transformers' `CosineSimilarityLoss` written out (a few lines): its module wants a
`SentenceTransformer`, and the encoder and pooling here are bertheads' own.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np
import torch
from torch.nn import functional as F

from bertheads.base.errors import UserError
from bertheads.base.machine import DTYPES, resolve_device, training_precision
from bertheads.base.progress import LogLines, bars_shown, progress_bar
from bertheads.base.schema import said
from bertheads.encoder.layers import head_pooling, pool_tokens
from bertheads.text.encoding import encoder_batch
from bertheads.training.loop import SHOW_LOSS_SECONDS
from bertheads.training.settings import MOST_PAIRS, TrainSettings

log = logging.getLogger(__name__)

PAIR_BATCH = 16  # pairs per step (SetFit's default batch size)
PAIR_LR = 2e-5  # the encoder's learning rate (SetFit's body_learning_rate)
PAIR_WARMUP = 0.1  # share of the steps of linear warm-up (SetFit's warmup_proportion)
ALL_PAIRS_UPTO = 1_000_000  # up to this many pairs of examples every one is considered; past it, a random draw


def make_pairs(groups: Sequence[frozenset], seed: int, most: int | None = MOST_PAIRS) -> list[tuple[int, int, float]]:
    """Pairs `(i, j, target)` of training inputs for contrastive tuning, by SetFit's
    "oversampling": of every pair of inputs (an input with itself included), in an order drawn
    with `seed`, those with a label in common (`groups[i] & groups[j]`: target 1.0) and those
    without (0.0) are taken alternately, the smaller sort repeated until it matches the larger
    one's count; at most `most` pairs in all. Refused without both sorts (one label only)."""
    n = len(groups)
    rng = np.random.default_rng(seed)
    if n * (n + 1) // 2 <= ALL_PAIRS_UPTO:
        left, right = np.triu_indices(n)
        order = rng.permutation(len(left))
        left, right = left[order], right[order]
    else:
        left, right = rng.integers(0, n, ALL_PAIRS_UPTO), rng.integers(0, n, ALL_PAIRS_UPTO)
    same = np.fromiter((bool(groups[a] & groups[b]) for a, b in zip(left.tolist(), right.tolist())), bool, len(left))
    positive = np.flatnonzero(same)
    negative = np.flatnonzero(~same)
    if not len(positive) or not len(negative):
        raise UserError(f"{said('mode', 'contrastive')}: the training data needs two labels or more (every pair of "
                        f"its texts is {'alike' if len(positive) else 'unlike'}); use {said('mode', 'features')}")
    each = max(len(positive), len(negative))
    if most:
        each = min(each, max(1, most // 2))
    pairs = []
    for k in range(each):
        p, q = positive[k % len(positive)], negative[k % len(negative)]
        pairs += [(int(left[p]), int(right[p]), 1.0), (int(left[q]), int(right[q]), 0.0)]
    return pairs


def cosine_loss(first: torch.Tensor, second: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' CosineSimilarityLoss: the mean squared gap between the vectors'
    cosine and the target (1 alike, 0 unlike)."""
    return F.mse_loss(F.cosine_similarity(first.float(), second.float()), targets)


def tune_encoder(net, data: list, settings: TrainSettings) -> dict:
    """Tune `net.encoder` on pairs of each task's training features (`Modeling.pair_labels`:
    a kind without contrastive tuning refuses here, before any step); the encoder's outputs
    are its own afterwards (no `reference` to the checkpoint). Returns what the run records."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError(f"{said('mode', 'contrastive')}: runs in one process (its encoder tuning is not shared "
                        "between processes); start it without torchrun or accelerate launch")
    pairs = []  # (task, left, right, target)
    for t, d in enumerate(data):
        groups = d.task.modeling.pair_labels(d.train_features)
        pairs += [(t, i, j, y) for i, j, y in make_pairs(groups, settings.seed + t, settings.pairs or MOST_PAIRS)]
    order = np.random.default_rng(settings.seed).permutation(len(pairs))
    pairs = [pairs[k] for k in order]
    poolings = [head_pooling(net.heads[d.name]) or "mean" for d in data]
    encoder = net.encoder
    device = resolve_device(settings.device)
    precision = training_precision(settings.precision, device)[0]
    autocast = DTYPES["bf16"] if precision == "bf16" else None  # (fp16 would need a gradient scaler: fp32)
    torch.manual_seed(settings.seed)
    encoder.to(device)
    encoder.requires_grad_(True)
    encoder.set_attention_dropout(settings.attention_dropout)
    encoder.train()
    steps = math.ceil(len(pairs) / PAIR_BATCH)
    fused = True if device.type in ("cpu", "cuda") else None  # (as `training.loop.set_up`)
    optimizer = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=PAIR_LR, weight_decay=0.0,
                                  fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay(int(PAIR_WARMUP * steps), steps))
    pad_id = encoder.tokenizer.pad_token_id or 0
    bar = progress_bar(steps, "contrastive pairs", "batch", show=settings.progress)
    lines = LogLines("contrastive pairs", len(pairs), "text pairs", show=settings.progress)  # where no bar is drawn
    if lines.on:
        log.info(f"contrastive tuning: {len(pairs)} pairs in {steps} steps of {PAIR_BATCH}, before the head's epochs")
    started, running = time.perf_counter(), None
    last_shown = started - SHOW_LOSS_SECONDS
    for step in range(steps):
        chunk = pairs[step * PAIR_BATCH:(step + 1) * PAIR_BATCH]
        loss = pair_step(encoder, data, chunk, poolings, pad_id, device, autocast)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.detach()
        running = value if running is None else 0.98 * running + 0.02 * value  # on the device, no wait
        now = time.perf_counter()
        if bars_shown() and now - last_shown >= SHOW_LOSS_SECONDS:  # read from the device this often only
            bar.set_postfix(loss=f"{float(running):.4f}", refresh=False)
            last_shown = now
        bar.update(1)
        if lines.due():
            log.info(lines.line(min(len(pairs), (step + 1) * PAIR_BATCH), f"loss={float(running):.4f}"))
    bar.close()
    running = None if running is None else float(running)
    encoder.eval()
    encoder.requires_grad_(False)
    encoder.reference = None  # tuned: the model directory holds these weights, not a reference
    seconds = time.perf_counter() - started
    log.info(f"contrastive tuning: {len(pairs)} pairs in {steps} steps of {PAIR_BATCH}, loss {running:.4f}, "
             f"{seconds:.1f} s")
    return {"pair_count": len(pairs), "steps": steps, "loss": running, "seconds": round(seconds, 1)}


def pair_step(encoder, data: list, chunk: list, poolings: list[str], pad_id: int, device,
              autocast) -> torch.Tensor:
    """The loss of one batch of pairs: both sides of every pair through the encoder in one pass."""
    features = [data[t].train_features[i] for t, i, _, _ in chunk] + [data[t].train_features[j] for t, _, j, _ in chunk]
    batch = encoder_batch(features, pad_id, device)
    with torch.autocast(device.type, dtype=autocast) if autocast else nullcontext():
        states = encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    mask = batch["attention_mask"]
    vectors = torch.stack([pool_tokens(states[k:k + 1], mask[k:k + 1], poolings[chunk[k % len(chunk)][0]])[0]
                           for k in range(len(features))]) if len(set(poolings)) > 1 else \
        pool_tokens(states, mask, poolings[0])
    targets = torch.tensor([y for *_, y in chunk], dtype=torch.float32, device=device)
    return cosine_loss(vectors[:len(chunk)], vectors[len(chunk):], targets)


def warmup_then_decay(warmup: int, total: int):
    """The learning rate's factor at a step: rising linearly over `warmup` steps, then falling
    linearly to 0 at `total` (transformers' linear schedule)."""
    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))
    return factor
