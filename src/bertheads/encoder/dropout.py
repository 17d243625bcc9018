"""Dropout whose mask costs little on a CPU, for the hidden states and the attention weights.

torch's CPU dropout draws one Mersenne Twister number per element (`bernoulli_`, about 8 ns an
element here), which after bf16 matrix products is one of the largest costs of a training step.
Attention with dropout is worse off: torch's fused CPU attention takes no dropout, so a training
pass falls back to its reference path, whose dropout is torch's.
Written by hand because torch has no cheaper CPU mask: here one 64-bit draw of the same
generator gives the masks of four 16-bit elements (two 32-bit ones), turned into 0 or 1 of the
input's dtype by integer operations. Same distribution (the keep probability rounded to 2**-15
for 16-bit inputs, 2**-31 for fp32), same generator (a seeded run repeats; a resumed run goes on
with the stream it saved), the same scaling by 1/(1-p) as torch's. Other devices keep torch's
dropout, whose generators are fast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

# the integer type a mask element is built in, per input dtype, and its random bits per element
LANES = {torch.bfloat16: (torch.int16, 15), torch.float16: (torch.int16, 15), torch.float32: (torch.int32, 31)}
ONE_BITS = {torch.bfloat16: 0x3F80, torch.float16: 0x3C00, torch.float32: 0x3F800000}  # 1.0 in each dtype


def keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `shape` and `dtype` holding 1 (kept, probability 1-p) or 0 (dropped)."""
    lane_type, bits = LANES[dtype]
    count = shape.numel()
    per_word = 8 // torch.empty((), dtype=lane_type).element_size()
    words = torch.empty(-(-count // per_word), dtype=torch.int64).random_()  # uniform over [0, 2**63)
    lanes = words.view(lane_type)[:count].view(shape)
    lanes.bitwise_and_((1 << bits) - 1)  # `bits` uniform bits per element (the top lane has no more)
    lanes.sub_(round(p * (1 << bits)))  # negative: dropped
    lanes.bitwise_right_shift_(bits).bitwise_not_()  # all ones: kept; 0: dropped
    return lanes.bitwise_and_(ONE_BITS[dtype]).view(dtype)


class _MaskedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        mask = keep_mask(x.shape, p, x.dtype)
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p)
        return (x * mask).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return (grad * mask).mul_(ctx.scale), None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(x, p, training)` with the cheap mask where it applies (CPU, a float dtype it
    knows, 0 < p < 1)."""
    if not training or p <= 0.0 or p >= 1.0 or x.device.type != "cpu" or x.dtype not in LANES:
        return nn.functional.dropout(x, p, training)
    return _MaskedDropout.apply(x.contiguous(), p)


class MaskedDropout(nn.Dropout):
    """`nn.Dropout` with the cheap CPU mask (`p`, `inplace` and what reads them are unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def install_masked_dropout(model: nn.Module) -> int:
    """Replace every plain `nn.Dropout` inside `model` by `MaskedDropout` with the same `p`,
    training or not as it was; the number replaced. Weights, state dict and saved checkpoints
    are unchanged (dropout has none)."""
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Dropout:
                masked = MaskedDropout(child.p)
                masked.train(child.training)
                setattr(module, name, masked)
                replaced += 1
    return replaced


SDPA_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """`F.scaled_dot_product_attention` written out as transformers' eager attention does it
    (products in the inputs' dtype, the softmax in fp32), with the cheap mask on its weights."""
    scores = torch.matmul(query, key.transpose(-2, -1)) * (scale if scale is not None else query.shape[-1] ** -0.5)
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min) if attn_mask.dtype == torch.bool
                  else scores + attn_mask)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(dropout(weights, dropout_p, True), value)


class MaskedAttentionDropout(TorchFunctionMode):
    """While active: a CPU `F.scaled_dot_product_attention` call with dropout (a training pass)
    runs as `attention`; every other call as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and len(args) <= len(SDPA_PARAMETERS):
            given = {**dict(zip(SDPA_PARAMETERS, args)), **kwargs}
            query = given["query"]
            if (given.get("dropout_p", 0.0) > 0.0 and not given.get("is_causal") and not given.get("enable_gqa")
                    and query.device.type == "cpu" and query.dtype in LANES):
                return attention(query, given["key"], given["value"], given.get("attn_mask"), given["dropout_p"],
                                 given.get("scale"))
        return func(*args, **kwargs)
