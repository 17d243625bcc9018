"""Reading tag data (`formats.py` holds the readers)."""

from __future__ import annotations

from collections.abc import Iterator

from bertheads.base.errors import UserError, where
from bertheads.tasks.base import TextInput
from bertheads.tasks.parts import Reading
from bertheads.tasks.tag.formats import CONLL_SUFFIXES, TagExample, iter_tagged, read_tagged
from bertheads.tasks.tag.spec import TagSpec
from bertheads.text.readers import source_name


class TagReading(Reading):
    """A tag head's data: CoNLL columns, JSON lines of tokens and tags, raw text lines (predict),
    rows in memory and Python texts or token lists."""

    formats = ("conll", "jsonl", "lines")
    text_formats = ("conll", "jsonl")

    def blank_record(self, example) -> dict:
        """A JSON line of tokens with no tags yet (a raw text: its text, to be split and tagged)."""
        if example.words is not None:
            return {"tokens": list(example.words), "tags": []}
        return {"text": example.text, "tags": []}

    def read(self, path: str | None, need_labels: bool = True, fmt: str | None = None) -> list[TagExample]:
        examples = read_tagged(path, self.spec, fmt, need_labels)
        if need_labels:
            known = set(self.spec.tags)
            for e in examples:
                for tag, line in zip(e.tags, e.word_lines or [e.line] * len(e.tags)):
                    if tag not in known:
                        raise UserError(f"{where(path, line)}: tag {tag!r} was not seen in training "
                                        f"(known: {', '.join(self.spec.tags)})")
        return examples

    def iter_read(self, path, need_labels: bool = True, fmt: str | None = None, keep: tuple[str, ...] = (),
                  bad=None) -> Iterator[TagExample]:
        """`read`, one sentence at a time as the input is read (`bad`: see `iter_tagged`)."""
        known = set(self.spec.tags)
        name = source_name(path)
        for e in iter_tagged(path, self.spec, fmt, need_labels, keep, bad):
            if need_labels:
                unknown = [(t, line) for t, line in zip(e.tags, e.word_lines or [e.line] * len(e.tags))
                           if t not in known]
                if unknown:
                    tag, line = unknown[0]
                    error = UserError(f"{where(name, line)}: tag {tag!r} was not seen in training "
                                      f"(known: {', '.join(self.spec.tags)})")
                    if bad is None:
                        raise error
                    bad(error)
                    continue
            yield e

    def from_inputs(self, inputs: list) -> list[TagExample]:
        """Examples from Python values: a raw text, a list of words, or a dict with
        "text" or "tokens"."""
        out = []
        for i, item in enumerate(inputs):
            if isinstance(item, dict):
                item = item.get("text", item.get("tokens", item.get("words")))
            if isinstance(item, str):
                if not item.strip():
                    raise UserError(f"input {i}: empty text")
                out.append(TagExample(text=item))
            elif isinstance(item, (list, tuple)) and item and all(isinstance(w, str) for w in item):
                out.append(TagExample(words=list(item)))
            else:
                raise UserError(f"input {i}: expected a text, a list of words or a dict with 'text' or 'tokens'")
        return out

    @classmethod
    def sniff_format(cls, path: str) -> str | None:
        return "conll" if str(path).lower().endswith(CONLL_SUFFIXES) else None

    @classmethod
    def claims_records(cls, keys: set[str]) -> bool:
        return bool(keys & {"tokens", "words"})

    @classmethod
    def read_texts(cls, path: str | None, fmt: str) -> list[TextInput]:
        """Each sentence's words joined by single spaces; `extra["words"]` holds each word's span."""
        out = []
        for e in read_tagged(path, TagSpec(), fmt, need_labels=False):
            if e.words is None:
                raise UserError(f"{where(path, e.line)}: 'tokens' must be a non-empty list of non-empty strings")
            spans, position = [], 0
            for word in e.words:
                spans.append([position, position + len(word)])
                position += len(word) + 1
            out.append(TextInput(" ".join(e.words), None, e.line, {"words": spans}))
        return out
