"""What a qa student learns from its teacher: start and end probabilities by character, read
onto the student's own windows (so tokenizers and windows may differ), softened at a
temperature, beside the gold start and end tokens where a question has an answer."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from bertheads.tasks.base import HeadSettings
from bertheads.tasks.distilling import NO_TARGET, mixed, soft_kl
from bertheads.tasks.parts import Distilling
from bertheads.tasks.qa.formats import QAExample


class QADistilling(Distilling):
    """A qa head's student: its spec, the teacher's span probabilities, its targets and loss."""

    def student_spec(self) -> HeadSettings:
        """The teacher's reading of passages; the null answer's scaling fitted again (and its
        threshold, where it was tuned)."""
        spec = super().student_spec()
        spec.null_scaling = None
        if spec.tune_threshold:
            spec.null_threshold = None
        return spec

    def teacher_scores(self, outputs: list, owner: list[int], examples: list, features: list) -> list:
        """Per question, the teacher's start and end probabilities by character: each window's
        softmax over [CLS] and its passage tokens, a token's start probability kept at its first
        character, its end probability at its last (a character several windows read keeps the
        highest): `(start chars, start probs, end chars, end probs)`."""
        found: list[tuple[dict, dict]] = [({}, {}) for _ in examples]
        for out, k, f in zip(outputs, owner, features):
            c0, c1 = f["_context"]
            if c1 < c0:
                continue
            rows = np.r_[0, np.arange(c0, c1 + 1)]
            scores = np.asarray(out, dtype=np.float64)[rows]
            probs = np.exp(scores - scores.max(0))
            probs /= probs.sum(0)
            offsets = f["_offsets"]
            for column, (chars, side) in enumerate(zip(found[k], (0, 1))):
                for row, p in zip(rows[1:], probs[1:, column]):
                    at = int(offsets[row][side])
                    chars[at] = max(chars.get(at, 0.0), float(p))
        return [tuple(np.asarray(x, dtype=d) for chars in pair for x, d in
                      ((list(chars), np.int64), (list(chars.values()), np.float32))) for pair in found]

    def soft_targets(self, examples: list[QAExample], scores: list, tokenizer, with_labels: bool) -> list[dict]:
        """The student's own windows, each token's target the teacher's probability at its
        first (start) or last (end) character, [CLS]'s what the window leaves out (the teacher's
        mass on answers outside it): log-probabilities in `soft_tok_spans` (`NO_TARGET`: none)."""
        features, owner = self.task.modeling.encode_for_inference(examples, tokenizer, with_labels)
        for f, k in zip(features, owner):
            starts, ends = (dict(zip(scores[k][i].tolist(), scores[k][i + 1].tolist())) for i in (0, 2))
            probs = np.zeros((len(f["input_ids"]), 2), dtype=np.float64)
            c0, c1 = f["_context"]
            for row in range(c0, c1 + 1):
                probs[row] = starts.get(int(f["_offsets"][row][0]), 0.0), ends.get(int(f["_offsets"][row][1]), 0.0)
            inside = probs.sum(0)
            probs /= np.maximum(inside, 1.0)  # (windows of a student longer than the teacher's)
            probs[0] = np.maximum(1.0 - np.minimum(inside, 1.0), 1e-6)
            f["soft_tok_spans"] = np.where(probs > 0, np.log(np.maximum(probs, 1e-30)), NO_TARGET).astype(np.float32)
            f["gold"] = 1.0 if with_labels else 0.0
            if not with_labels:
                f["start_positions"], f["end_positions"] = 0, 0
        return features

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor], temperature: float,
             soft_weight: float) -> torch.Tensor:
        """The mean over start and end of KL on each window's softmax at the temperature (times
        T^2), beside the gold start and end tokens' cross-entropy where a window has them."""
        teacher = batch["soft_tok_spans"][:, : logits.size(1)]
        mask = batch.get("attention_mask")
        if mask is not None:
            off = mask[..., None] == 0
            logits, teacher = logits.masked_fill(off, NO_TARGET), teacher.masked_fill(off, NO_TARGET)
        soft = (soft_kl(logits[..., 0], teacher[..., 0], temperature)
                + soft_kl(logits[..., 1], teacher[..., 1], temperature)) / 2
        hard = (F.cross_entropy(logits[..., 0], batch["start_positions"].long(), reduction="none")
                + F.cross_entropy(logits[..., 1], batch["end_positions"].long(), reduction="none")) / 2
        return mixed(soft, hard, batch["gold"], soft_weight)
