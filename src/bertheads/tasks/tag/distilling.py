"""What a tag student learns from its teacher: each word's tag logits, at the student's first
piece of the same word (words matched by where they start in the text), softened at a
temperature, beside the word's gold tag where it has one."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from bertheads.tasks.distilling import mixed, soft_kl
from bertheads.tasks.parts import Distilling
from bertheads.tasks.tag.formats import TagExample


class TagDistilling(Distilling):
    """A tag head's student: the teacher's word scores, its targets per first piece and loss."""

    def teacher_scores(self, outputs: list, owner: list[int], examples: list, features: list) -> list:
        """Each input's raw tag logits per word (its first piece's) and, for raw text, the
        words' character spans (so a student whose tokenizer differs finds the same words)."""
        rows, spans = self.task.judging.word_rows(outputs, owner, examples, features)
        return [(np.asarray(r, dtype=np.float32), None if s is None else np.asarray(s)) for r, s in zip(rows, spans)]

    def soft_targets(self, examples: list[TagExample], scores: list, tokenizer, with_labels: bool) -> list[dict]:
        """Each window's first piece of a word carries the teacher's logits for that word
        (`soft_tok_logits`, `tok_soft_mask`): words matched by their character start in raw
        text, by their index in given words; a word the teacher has no score for learns none."""
        features, owner = self.task.modeling.encode_windows(examples, tokenizer, with_labels, for_inference=True)
        spans = {k: f["_spans"] for f, k in zip(features, owner) if f.get("_spans") is not None}
        for f, k in zip(features, owner):
            logits, teacher_spans = scores[k]
            words = np.asarray(f["_word"], dtype=np.int64)
            if teacher_spans is not None and k in spans:
                starts = {int(s): i for i, s in enumerate(np.asarray(teacher_spans)[:, 0])}
                rows = np.asarray([starts.get(int(spans[k][w][0]), -1) for w in words], dtype=np.int64)
            else:
                rows = np.where(words < len(logits), words, -1)
            ok = rows >= 0
            soft = np.zeros((len(f["input_ids"]), len(self.spec.tags)), dtype=np.float32)
            mask = np.zeros(len(f["input_ids"]), dtype=np.int64)
            soft[f["_pos"][ok]], mask[f["_pos"][ok]] = logits[rows[ok]], 1
            f["soft_tok_logits"], f["tok_soft_mask"] = soft, mask.tolist()
            if not with_labels:
                f["tok_labels"] = [-100] * len(f["input_ids"])
        return features

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor], temperature: float,
             soft_weight: float) -> torch.Tensor:
        """Per word (its first piece): KL on the tag softmaxes at the temperature (times T^2),
        beside cross-entropy on the word's gold tag where it has one; the mean over words."""
        n = logits.size(1)
        mask = batch["tok_soft_mask"][:, :n] == 1
        if not bool(mask.any()):
            return logits.sum() * 0.0
        scores, labels = logits[mask], batch["tok_labels"][:, :n][mask]
        soft = soft_kl(scores, batch["soft_tok_logits"][:, :n][mask], temperature)
        hard = F.cross_entropy(scores.float(), labels.clamp(min=0), reduction="none")
        return mixed(soft, hard, labels != -100, soft_weight)
