"""Dropout whose mask costs little on a CPU.

torch's CPU dropout draws one Mersenne Twister number per element (`bernoulli_`, about 8 ns an
element here), which after bf16 matrix products is one of the largest costs of a training step.
Written by hand because torch has no cheaper CPU mask: here one 64-bit draw of the same
generator gives the masks of four 16-bit elements (two 32-bit ones), turned into 0 or 1 of the
input's dtype by integer operations. Same distribution (the keep probability rounded to 2**-15
for 16-bit inputs, 2**-31 for fp32), same generator (a seeded run repeats; a resumed run goes on
with the stream it saved), the same scaling by 1/(1-p) as torch's. Other devices keep torch's
dropout, whose generators are fast.
"""

from __future__ import annotations

import torch
from torch import nn

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
