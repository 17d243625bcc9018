"""What a classify student learns from its teacher: the teacher's logits of each text, softened
at a temperature (single-label: KL on the softmaxes; multi-label: each label's sigmoid; regression:
the value), beside the gold label where a text has one."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from bertheads.tasks.classify.formats import ClassifyExample
from bertheads.tasks.classify.spec import ClassifySpec
from bertheads.tasks.distilling import mixed, soft_bce, soft_kl
from bertheads.tasks.parts import Distilling


class ClassifyDistilling(Distilling):
    """A classify head's student: its spec, the teacher's logits, its targets and loss."""

    def student_spec(self) -> ClassifySpec:
        """The teacher's labels, problem and columns; the pooling and multi-label thresholds
        settled again for the student."""
        spec = super().student_spec()
        spec.pooling, spec.thresholds = "auto", None
        return spec

    def teacher_scores(self, outputs: list, owner: list[int], examples: list, features: list) -> list:
        """Each text's raw logits (its windows' pooled), before any temperature."""
        return [np.asarray(o, dtype=np.float32) for o in self.task.judging.collect(outputs, owner, examples, features)]

    def soft_targets(self, examples: list[ClassifyExample], scores: list, tokenizer,
                     with_labels: bool) -> list[dict]:
        """Each feature (a window learns its text's) carries the teacher's logits (`soft`) and
        whether it has a gold label (`gold`; a placeholder label where not)."""
        feats, owner = self.task.modeling.encode_for_inference(examples, tokenizer, with_labels)
        blank = 0.0 if self.spec.problem == "regression" else \
            [0.0] * len(self.spec.labels) if self.spec.problem == "multi_label" else 0
        for f, k in zip(feats, owner):
            f["soft"] = np.asarray(scores[k], dtype=np.float32).tolist()
            f["gold"] = 1.0 if with_labels else 0.0
            if not with_labels:
                f["labels"] = blank
        return feats

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor], temperature: float,
             soft_weight: float) -> torch.Tensor:
        """Single-label: KL on the softmaxes at the temperature (times T^2) beside cross-entropy;
        multi-label: each label's sigmoid at the temperature as a target; regression: the
        teacher's value (squared error), beside the gold value's."""
        teacher, labels, gold = batch["soft"].float(), batch["labels"], batch["gold"]
        if self.spec.problem == "regression":
            value = logits.squeeze(-1)
            soft, hard = (value - teacher.squeeze(-1)) ** 2, (value - labels.float()) ** 2
        elif self.spec.problem == "multi_label":
            soft = soft_bce(logits, teacher, temperature)
            hard = F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none").mean(-1)
        else:
            weight = None
            if self.spec.label_weights:
                weight = torch.tensor(self.spec.label_weights, dtype=logits.dtype, device=logits.device)
            soft = soft_kl(logits, teacher, temperature)
            hard = F.cross_entropy(logits, labels.long(), weight=weight, reduction="none")
        return mixed(soft, hard, gold, soft_weight)
