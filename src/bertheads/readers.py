"""Reading the standard table formats (TSV, CSV, JSONL) with file and line numbers kept
for error messages."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from bertheads.errors import UserError, where

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def read_text(path: str | None) -> str:
    """A whole file (or stdin for None / '-') as text, BOM removed."""
    if path in (None, "-"):
        return sys.stdin.read()
    p = Path(path)
    if not p.exists():
        raise UserError(f"{path}: no such file")
    if p.is_dir():
        raise UserError(f"{path}: is a directory, expected a file")
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def file_format(path: str | None, fmt: str | None = None) -> str:
    """`tsv`, `csv`, `jsonl` or `lines`, from `fmt` or the file name."""
    if fmt and fmt != "auto":
        return fmt
    if path in (None, "-"):
        return "lines"
    suffix = Path(path).suffix.lower()
    return {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}.get(
        suffix, "lines"
    )


def read_table(path: str | None, fmt: str) -> tuple[list[str], Iterator[tuple[int, dict]]]:
    """Header and `(line number, row dict)` for TSV/CSV files with a header row."""
    text = read_text(path)
    if not text.strip():
        raise UserError(f"{where(path)}: file is empty")
    if fmt == "tsv":
        reader = csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader)]

    def rows() -> Iterator[tuple[int, dict]]:
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(header):
                raise UserError(
                    f"{where(path, line)}: expected {len(header)} columns like the header, found {len(row)}"
                )
            yield line, dict(zip(header, row))

    return header, rows()


def read_jsonl(path: str | None) -> Iterator[tuple[int, dict]]:
    """`(line number, object)` for each non-blank line of a JSON Lines file."""
    text = read_text(path)
    if not text.strip():
        raise UserError(f"{where(path)}: file is empty")
    stripped = text.lstrip()
    if stripped.startswith("["):  # a JSON array of objects is accepted too
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where(path, exc.lineno)}: malformed JSON ({exc.msg})") from None
        for i, obj in enumerate(items, 1):
            if not isinstance(obj, dict):
                raise UserError(f"{where(path)}: record {i}: expected a JSON object")
            yield i, obj
        return
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where(path, line_no)}: malformed JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{where(path, line_no)}: expected a JSON object")
        yield line_no, obj


def read_lines(path: str | None) -> Iterator[tuple[int, str]]:
    """`(line number, line)` for plain text input; blank lines are skipped."""
    text = read_text(path)
    if not text.strip():
        raise UserError(f"{where(path)}: file is empty")
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield line_no, line


def find_column(columns: list[str], wanted: list[str], override: str | None, path, role: str) -> str | None:
    """The first header name matching `wanted` (case-insensitive), or the override."""
    if override:
        if override not in columns:
            raise UserError(f"{where(path, 1)}: no column {override!r} for the {role} (columns: {', '.join(columns)})")
        return override
    lower = {c.lower(): c for c in columns}
    for name in wanted:
        if name in lower:
            return lower[name]
    return None
