"""Tagged-sentence readers: CoNLL columns, JSONL and (to predict) raw text lines."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from bertheads.base.errors import UserError, where
from bertheads.base.schema import said
from bertheads.tasks.tag.scheme import TAG_RE, check_tag
from bertheads.text.readers import (
    BadLine,
    carried_fields,
    file_format,
    open_lines,
    read_jsonl,
    read_lines,
    source_name,
)
from bertheads.text.rows import Rows

COLUMN_SPLIT = re.compile(r"[ \t]+")  # CoNLL columns; other white space belongs to the word
DOCSTART = "-DOCSTART-"
TABLE_HEADERS = ("label", "labels", "class", "target", "tags", "tag", "ner_tags")  # a table's label column
CONLL_SUFFIXES = (".conll", ".conll03", ".conllx", ".iob", ".iob2", ".bio", ".bioes", ".ner")
TOKEN_KEYS = ("tokens", "words")
TAG_KEYS = ("tags", "ner_tags", "labels")


@dataclass
class TagExample:
    """A sentence as words (CoNLL/JSONL) or a raw text (words found by the tokenizer)."""

    words: list[str] | None = None
    tags: list[str] | None = None
    text: str | None = None
    line: int | None = None
    word_lines: list[int] | None = None  # CoNLL: the line of each word (for error messages)
    rows: list[str] | None = None  # CoNLL: the original lines, for `--format conll` output
    docstart: list[str] = field(default_factory=list)  # -DOCSTART- lines before the sentence
    extra: dict = field(default_factory=dict)  # fields carried into the prediction (id, --keep-fields)


def read_tagged(path: str | None, spec, fmt: str | None, need_labels: bool) -> list[TagExample]:
    """CoNLL or JSONL sentences; for prediction also raw text (lines or JSONL "text").
    `spec` is the tag head's settings (its `tag_column` says which CoNLL column holds the tag).

    Without a format: `.jsonl`/`.json` files are JSONL; files to train or evaluate on, and
    `.conll`/`.iob`/`.bio`/`.tsv`-like files, are CoNLL; anything else to predict is raw text."""
    examples = list(iter_tagged(path, spec, fmt, need_labels))
    if not examples:
        kind = "rows" if isinstance(path, Rows) else tagged_format(source_name(path), fmt, need_labels)
        raise UserError(f"{where(source_name(path))}: {'no sentences' if kind == 'conll' else 'no records'}")
    return examples


def tagged_format(path, fmt: str | None, need_labels: bool) -> str:
    """conll, jsonl or lines (see `read_tagged`)."""
    kind = file_format(path, fmt)
    if kind == "tsv":
        kind = "conll"
    elif kind == "lines" and fmt in (None, "auto") and (
            need_labels or (path is not None and str(path).lower().endswith(CONLL_SUFFIXES))):
        kind = "conll"
    return kind


def iter_tagged(path, spec, fmt: str | None, need_labels: bool, keep: tuple[str, ...] = (),
                bad: BadLine | None = None) -> Iterator[TagExample]:
    """`read_tagged`, one sentence at a time as the input is read. JSON records carry their `id`
    and the `keep` fields into `extra`; `bad` is told of a bad record (a CoNLL sentence with a
    bad line), which is then skipped (default: raised)."""
    name = source_name(path)
    kind = "rows" if isinstance(path, Rows) else tagged_format(name, fmt, need_labels)
    if kind in ("jsonl", "rows"):
        yield from iter_tag_jsonl(path, need_labels, keep, bad)
        return
    if keep:
        raise UserError(f"{said('keep_fields')}: {kind} input has no fields; use JSONL")
    if kind == "conll":
        yield from iter_conll(path, spec, need_labels, bad)
        return
    if kind != "lines":
        raise UserError(f"{where(name)}: tag reads CoNLL columns, JSONL or plain lines, not {kind}")
    if need_labels:
        raise UserError(f"{where(name)}: plain lines have no tags; use CoNLL columns or JSONL")
    for n, line in read_lines(path):
        yield TagExample(text=line, line=n)


def iter_conll(path, spec, need_labels: bool, bad: BadLine | None = None) -> Iterator[TagExample]:
    """CoNLL sentences as they are read (each once the blank line after it arrives)."""
    name = source_name(path)
    columns = None
    current: TagExample | None = None
    broken = False  # the current sentence had a bad line (skipped with it)
    docstart: list[str] = []
    empty = True
    seen_words = False  # a word line was read (the first one may be a table's header or row)
    for line_no, raw in enumerate(open_lines(path), 1):
        line = raw.rstrip("\r\n").rstrip("\r").rstrip(" \t")
        parts = COLUMN_SPLIT.split(line.lstrip(" \t")) if line.strip(" \t") else []
        if not parts or parts[0] == DOCSTART:
            if current is not None and not broken:
                yield current
            current, broken = None, False
            if parts:
                docstart.append(line)
                empty = False
            continue
        empty = False
        if broken:
            continue
        try:
            if columns is None:
                if need_labels and len(parts) < 2:
                    raise UserError(f"{where(name, line_no)}: expected at least 2 columns (word and tag), found 1")
                col = column_index(spec.tag_column, len(parts), name, line_no) if need_labels else None
                columns = len(parts)
            elif len(parts) != columns:
                raise UserError(f"{where(name, line_no)}: expected {columns} columns like the first line, "
                                f"found {len(parts)}")
            if need_labels:
                if current is None and not seen_words:
                    check_not_table(line, parts[col], name, line_no)
                check_tag(parts[col], name, line_no)
        except UserError as exc:
            if bad is None:
                raise
            bad(exc)
            broken = True
            continue
        if current is None:
            current = TagExample(words=[], tags=[] if need_labels else None, line=line_no, word_lines=[],
                                 rows=[], docstart=docstart)
            docstart = []
        seen_words = True
        current.words.append(parts[0])
        current.word_lines.append(line_no)
        current.rows.append(line)
        if need_labels:
            current.tags.append(parts[col])
    if current is not None and not broken:
        yield current
    if empty:
        raise UserError(f"{where(name)}: file is empty")


def iter_tag_jsonl(path, need_labels: bool, keep: tuple[str, ...] = (),
                   bad: BadLine | None = None) -> Iterator[TagExample]:
    name = source_name(path)
    for line_no, obj in path.rows() if isinstance(path, Rows) else read_jsonl(path, bad):
        try:
            example = tag_record(obj, name, line_no, need_labels)
        except UserError as exc:
            if bad is None:
                raise
            bad(exc)
            continue
        example.extra = carried_fields(obj, keep)
        yield example


def tag_record(obj: dict, path, line_no: int, need_labels: bool) -> TagExample:
    tokens = next((obj[k] for k in TOKEN_KEYS if k in obj), None)
    if tokens is None:
        text = obj.get("text")
        if need_labels or not isinstance(text, str):
            raise UserError(f"{where(path, line_no)}: expected a \"tokens\" list"
                            + ("" if need_labels else " or a \"text\" string"))
        if not text.strip():
            raise UserError(f"{where(path, line_no)}: empty text")
        return TagExample(text=text, line=line_no)
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise UserError(f"{where(path, line_no)}: \"tokens\" must be a non-empty list of strings")
    tags = next((obj[k] for k in TAG_KEYS if k in obj), None)
    if need_labels:
        if tags is None:
            raise UserError(f"{where(path, line_no)}: missing \"tags\"")
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise UserError(f"{where(path, line_no)}: \"tags\" must be a list of strings")
        if len(tags) != len(tokens):
            raise UserError(f"{where(path, line_no)}: {len(tokens)} tokens but {len(tags)} tags")
        for t in tags:
            check_tag(t, path, line_no)
    return TagExample(words=tokens, tags=tags if need_labels else None, line=line_no)


def check_not_table(line: str, tag: str, path, line_no: int) -> None:
    """Refuse a first line that is a TSV table's (a header, or a sentence and its label), not a
    CoNLL word and its tag."""
    cells = line.split("\t")
    sentence = " " in cells[0].strip() and not TAG_RE.match(tag)
    if len(cells) < 2 or not (sentence or cells[-1].strip().lower() in TABLE_HEADERS):
        return
    raise UserError(f"{where(path, line_no)}: this looks like a TSV table (a text and its label per row), not "
                    f"CoNLL (one word and its tag per line, a blank line between sentences); tag reads CoNLL "
                    f'columns or JSON lines {{"words": [...], "tags": [...]}}')


def column_index(tag_column: int | None, columns: int, path, line_no: int) -> int:
    if tag_column is None:
        return columns - 1
    index = tag_column - 1 if tag_column > 0 else columns + tag_column
    if tag_column == 0 or not 1 <= index < columns:
        raise UserError(f"{where(path, line_no)}: {said('tag_column', tag_column)} is not a tag column "
                        f"(the line has {columns} columns; the word is column 1)")
    return index


def separator(line: str) -> str:
    return "\t" if "\t" in line else " "
