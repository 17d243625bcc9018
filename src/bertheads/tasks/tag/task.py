"""Token tagging: one tag per word (NER, chunking) read from the token states.

Formats: CoNLL columns (word first, tag last or `--tag-column`; blank lines end a sentence,
`-DOCSTART-` lines are skipped) and JSONL `{"tokens": [...], "tags": [...]}`; predict also
takes raw text (one text a line, or JSONL `{"text": ...}`) and returns entities with character
offsets. Schemes: IOB2, IOB1, IOBES and BILOU, decoded with the conlleval rules that seqeval's
default mode applies.

A word is predicted from its first word piece. An input longer than `max_length` is cut into
windows overlapping by `stride` tokens; each word takes its prediction from the window where its
first piece has the most context on both sides. The task holds its parts: reading
(`reading.py`, readers in `formats.py`), head, loss and recipe (`head.py`), decoding, metrics and
what scores mean (`judging.py`, schemes and entity metrics in `scheme.py`), what it shows and how
it exports (`publishing.py`); its settings are `spec.py`.
"""

from __future__ import annotations

from bertheads.base.errors import UserError, where
from bertheads.base.schema import said
from bertheads.tasks.base import Parts, Task
from bertheads.tasks.families import copy_start, settle_family
from bertheads.tasks.tag.distilling import TagDistilling
from bertheads.tasks.tag.formats import read_tagged
from bertheads.tasks.tag.head import TagHead, TagModeling, special_layout
from bertheads.tasks.tag.judging import TagJudging, TagScoring
from bertheads.tasks.tag.publishing import TagExporting, TagPublishing
from bertheads.tasks.tag.reading import TagReading
from bertheads.tasks.tag.scheme import detect_scheme, tag_list
from bertheads.tasks.tag.spec import TagSpec


class TagTask(Task):
    kind = "tag"
    spec_type = TagSpec
    help = "one tag per word (NER, chunking) from the token states; entities with offsets"
    parts = Parts(TagReading, TagModeling, TagJudging, TagScoring, TagPublishing, TagExporting, distilling=TagDistilling)

    @classmethod
    def build(cls, spec: TagSpec, encoder, pooler_state=None) -> TagTask:
        """A fresh head; `pooler_state`: the checkpoint's weights a family's token block starts from."""
        family = settle_family(spec, encoder)
        head = TagHead(encoder.info.hidden_size, len(spec.tags), spec, family, getattr(encoder, "config", None))
        if head.dense is not None:
            copy_start(head.dense, head.norm, pooler_state)
        return cls(spec, head)

    @classmethod
    def prepare(cls, path: str, spec: TagSpec, encoder) -> list:
        """Read the training file, settle the scheme and tag list; the examples."""
        check_settings(spec, encoder.tokenizer)
        examples = read_tagged(path, spec, fmt=None, need_labels=True)
        spec.scheme = detect_scheme(examples, path)
        spec.tags = tag_list(examples, spec.label_subwords == "all", spec.scheme)
        if len(spec.tags) < 2:
            raise UserError(f"{where(path)}: training data has only one tag ({spec.tags[0]!r}); need at least two")
        return examples


def check_settings(spec: TagSpec, tokenizer) -> None:
    if spec.label_subwords not in ("first", "all"):
        raise UserError(f"{said('label_subwords')}: expected first or all, got {spec.label_subwords!r}")
    if spec.head_type not in ("linear", "bilstm"):
        raise UserError(f"{said('head_type', flag='--head')}: expected linear or bilstm, got {spec.head_type!r}")
    n_prefix, n_suffix = special_layout(tokenizer)
    if spec.max_length <= n_prefix + n_suffix + 1:
        raise UserError(f"{said('max_length', spec.max_length)} is too small")

