"""The kind-independent math of distillation (Hinton et al., 2015): a student's logits against a
teacher's, both softened by one temperature, the gradient's scale kept by T^2; and the mix of
that with a gold loss where a row has a label. Each kind's `Distilling` part decides what its
targets are (`soft_targets`) and calls these (`loss`)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

NO_TARGET = -1e4  # a teacher logit that stands for "no score here" (a position the teacher never saw)


def soft_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per row (the last dimension is the classes): KL(teacher || student) of the softmaxes at
    `temperature`, times T^2 so the gradients keep their size as T changes."""
    t = float(temperature)
    target = F.log_softmax(teacher.float() / t, dim=-1)
    return (target.exp() * (target - F.log_softmax(student.float() / t, dim=-1))).sum(-1) * (t * t)


def soft_bce(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per row: the binary cross-entropy of each output against the teacher's sigmoid at
    `temperature` (independent labels), averaged over the outputs, times T^2."""
    t = float(temperature)
    loss = F.binary_cross_entropy_with_logits(student.float() / t, torch.sigmoid(teacher.float() / t), reduction="none")
    return loss.mean(-1) * (t * t)


def mixed(soft: torch.Tensor, hard: torch.Tensor, gold: torch.Tensor, soft_weight: float) -> torch.Tensor:
    """The mean over rows of the teacher's loss, mixed on rows with a gold label (`gold` > 0)
    with the gold loss: `soft_weight` of one, the rest of the other."""
    w = float(soft_weight)
    has = gold.to(soft.dtype) > 0
    return torch.where(has, w * soft + (1 - w) * hard, soft).mean()
