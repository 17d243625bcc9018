"""Reading classify data: GLUE TSV (SST-2, MRPC, RTE/MNLI, QNLI, STS-B headers), CSV and JSONL
with a header or keys naming the columns, and plain lines (a TAB separates a pair); the columns
found by name, the labels settled from the training file."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from bertheads.base.errors import UserError, header, where
from bertheads.base.schema import said
from bertheads.tasks.classify.spec import PROBLEMS, ClassifySpec
from bertheads.text.readers import (
    BadLine,
    carried_fields,
    file_format,
    find_column,
    read_jsonl,
    read_lines,
    read_table,
    required_text,
    source_name,
)
from bertheads.text.rows import Rows

TEXT_COLUMNS = ["sentence", "text", "sentence1", "#1 string", "premise", "question1", "text_a", "sentence_a",
                "question", "content", "review"]
PAIR_COLUMNS = ["sentence2", "#2 string", "hypothesis", "question2", "text_b", "sentence_b"]
LABEL_COLUMNS = ["label", "labels", "quality", "score", "gold_label", "target", "class"]
_INT = re.compile(r"^[+-]?\d+$")


@dataclass
class ClassifyExample:
    text: str
    pair: str | None = None
    label: object = None  # raw value as read (str, int, float or list)
    line: int | None = None
    extra: dict = field(default_factory=dict)  # fields carried into the prediction (id, --keep-fields)


def read_file(path: str | None, spec: ClassifySpec, fmt: str | None = None,
              need_labels: bool = True, limit: int | None = None) -> list[ClassifyExample]:
    """Read examples (the first `limit`); updates `spec`'s column names when they are detected."""
    examples = list(itertools.islice(iter_file(path, spec, fmt, need_labels), limit))
    if not examples:
        raise UserError(f"{where(source_name(path))}: no examples")
    return examples

def iter_file(path, spec: ClassifySpec, fmt: str | None = None, need_labels: bool = True,
              keep: tuple[str, ...] = (), bad: BadLine | None = None) -> Iterator[ClassifyExample]:
    """Examples as they are read (the columns of JSON lines are the first record's keys). A record's `id` and the `keep` fields go into `extra`; `bad` is told of
    a bad record, which is then skipped (default: raised)."""
    name = source_name(path)
    kind = "rows" if isinstance(path, Rows) else file_format(name, fmt)
    if kind == "lines":
        if need_labels:
            raise UserError(f"{where(name)}: plain text has no labels; use TSV, CSV or JSONL with a label column")
        if keep:
            raise UserError(f"{said('keep_fields')}: plain lines have no fields; use TSV, CSV or JSONL input")
        for line_no, line in read_lines(path):
            text, _, pair = line.partition("\t")
            if not text.strip():
                report(UserError(f"{where(name, line_no)}: empty text"), bad)
                continue
            yield ClassifyExample(text, pair if "\t" in line else None, None, line_no)
        return
    if kind in ("tsv", "csv", "rows"):
        columns, rows = ((path.columns, path.rows()) if kind == "rows"
                         else read_table(path, kind, bad, None if spec.header else headless_columns))
        for field_name in keep:
            if field_name not in columns:
                raise UserError(f"{header(name)}: {said('keep_fields')}: no column {field_name!r} "
                                f"(columns: {', '.join(columns)})")
    else:
        rows = read_jsonl(path, bad)
        try:
            first = next(rows)
        except StopIteration:
            raise UserError(f"{where(name)}: no examples") from None
        columns = list(first[1])
        rows = itertools.chain([first], rows)
    try:
        text_col, pair_col, label_col = detect_columns(columns, spec, name, need_labels)
    except UserError as exc:
        if kind not in ("tsv", "csv") or not spec.header:
            raise
        raise UserError(f"{exc}; if the first line is data, not column names, add a header row "
                        f"(e.g. sentence{'<TAB>' if kind == 'tsv' else ','}label) or give "
                        f"{said('header', False)}") from None
    for line_no, row in rows:
        try:
            example = row_example(row, line_no, name, text_col, pair_col, label_col, need_labels)
        except UserError as exc:
            report(exc, bad)
            continue
        example.extra = carried_fields(row, keep)
        yield example


def headless_columns(count: int) -> list[str]:
    """The columns of a table without a header row, by their number: text[, text_b], label."""
    return {1: ["text"], 2: ["text", "label"], 3: ["text", "text_b", "label"]}.get(
        count, ["text", "text_b", "label", *(f"column{i}" for i in range(4, count + 1))])


def report(error: UserError, bad: BadLine | None) -> None:
    """Raise a bad record's error, or tell `bad` of it (the record is then skipped)."""
    if bad is None:
        raise error
    bad(error)


def row_example(row: dict, line_no: int, path, text_col: str, pair_col: str | None, label_col: str | None,
                need_labels: bool) -> ClassifyExample:
    text = column_text(row, text_col, path, line_no)
    pair = column_text(row, pair_col, path, line_no) if pair_col else None
    label = row.get(label_col) if label_col else None
    if label_col and need_labels and (label is None or (isinstance(label, str) and not label.strip())):
        raise UserError(f"{where(path, line_no)}: missing label in column {label_col!r}")
    if isinstance(label, str):
        label = label.strip()
    return ClassifyExample(text, pair, label, line_no)


def column_text(row: dict, column: str, path, line_no: int) -> str:
    """A row's text in `column`: missing, not text or blank is a one-line error."""
    return required_text(row.get(column), where(path, line_no), f"text in column {column!r}")


def detect_columns(columns: list[str], spec: ClassifySpec, path, need_labels: bool):
    """Text, pair and label columns from the header (or the spec's stored/overridden names).

    To predict (`need_labels` False), a stored column name the file lacks is found again by
    its role, so a model trained on a TSV `sentence` column reads JSONL `{"text": ...}`; the
    spec is then left as it was."""
    if not need_labels and (spec.text_column not in (None, *columns) or spec.pair_column not in (None, *columns)):
        roles = ClassifySpec(pair=spec.pair)
        return detect_columns(columns, roles, path, need_labels)
    lower = [c.lower() for c in columns]
    text_col = find_column(columns, TEXT_COLUMNS, spec.text_column, path, "text")
    if not spec.text_column and "question" in lower and "sentence" in lower:  # QNLI
        text_col = columns[lower.index("question")]
    if text_col is None:
        raise UserError(f"{header(path)}: no text column found (columns: {', '.join(columns)}); "
                        f"name one with {said('text_column')}")
    if spec.pair_column:
        pair_col = find_column(columns, [], spec.pair_column, path, "second text")
    elif text_col.lower() == "question" and "sentence" in lower:
        pair_col = columns[lower.index("sentence")]
    else:
        pair_col = find_column(columns, PAIR_COLUMNS, None, path, "second text")
    if spec.pair and pair_col is None:
        raise UserError(f"{header(path)}: the model reads text pairs but no second text column was found "
                        f"(columns: {', '.join(columns)}); name one with {said('pair_column')}")
    if not need_labels and spec.label_column and spec.label_column not in columns:
        label_col = None  # labels are optional for predict
    else:
        label_col = find_column(columns, LABEL_COLUMNS, spec.label_column, path, "label")
    if need_labels and label_col is None:
        raise UserError(f"{header(path)}: no label column found (columns: {', '.join(columns)}); "
                        f"name one with {said('label_column')}")
    spec.text_column, spec.pair_column = text_col, pair_col
    if label_col:
        spec.label_column = label_col
    return text_col, pair_col, label_col


def check_label_names(spec: ClassifySpec, path) -> None:
    """`--label-names` fits the training labels: single-label, one name per label."""
    if spec.problem != "single_label":
        raise UserError(f"{said('label_names')}: only for single-label classification (this is {spec.problem})")
    if len(spec.label_names) != len(spec.labels):
        raise UserError(f"{said('label_names')}: {len(spec.label_names)} names for the {len(spec.labels)} labels of "
                        f"{path} ({', '.join(map(str, spec.labels))}, in this order)")
    clash = [n for n in spec.label_names if normalise_label(n) in spec.labels
             and spec.labels.index(normalise_label(n)) != spec.label_names.index(n)]
    if clash:
        raise UserError(f"{said('label_names')}: {clash[0]!r} is also another label's value; choose other names")


def normalise_label(value):
    """Labels compare as ints when they look like ints, else as stripped strings."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value).strip()
    return int(text) if _INT.match(text) else text


def to_float(value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def infer_labels(examples: list[ClassifyExample], path, problem: str | None) -> tuple[str, list]:
    """Problem type and label list from training labels: lists make it multi-label, numbers
    with a fraction make it regression, anything else single-label (ints sort numerically)."""
    values = [e.label for e in examples]
    if problem and problem not in PROBLEMS:
        raise UserError(f"{said('problem')}: expected one of {', '.join(PROBLEMS)}, got {problem!r}")
    if problem == "multi_label" or (problem is None and any(isinstance(v, list) for v in values)):
        for e in examples:
            if not isinstance(e.label, list):
                raise UserError(f"{where(path, e.line)}: expected a list of labels like the other rows, got {e.label!r}")
        labels = sorted({normalise_label(x) for v in values for x in v}, key=sort_key)
        return "multi_label", labels
    numeric = [to_float(v) for v in values]
    fractional = any(x is not None and not float(x).is_integer() for x in numeric) or any(
        isinstance(v, str) and "." in v and to_float(v) is not None for v in values)
    if problem == "regression" or (problem is None and fractional):
        for e, x in zip(examples, numeric):
            if x is None:
                raise UserError(f"{where(path, e.line)}: label {e.label!r} is not a number")
        return "regression", []
    labels = sorted({normalise_label(v) for v in values}, key=sort_key)
    if len(labels) < 2:
        raise UserError(f"{where(path)}: training data has only one label ({labels[0]!r}); need at least two")
    return "single_label", labels


def sort_key(label):
    return (0, label, "") if isinstance(label, int) else (1, 0, str(label))
