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


class DuplicateKey(ValueError):
    """A JSON object names the same key twice."""


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)  # the fast path; the duplicate is looked for only when there is one
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return out


def parse_json(text: str, path, line: int | None = None):
    """JSON text parsed; malformed, too deeply nested, or with a key twice in one object: a UserError."""
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where(path, (line or 1) - 1 + exc.lineno)}: malformed JSON ({exc.msg})") from None
    except RecursionError:
        raise UserError(f"{where(path, line)}: JSON nested too deeply") from None
    except DuplicateKey as exc:
        raise UserError(f"{where(path, line)}: key {exc.args[0]!r} appears twice in one object") from None


def check_header(header: list[str], path) -> None:
    """Column names must differ (ignoring case, as columns are looked up)."""
    seen: dict[str, int] = {}
    for i, name in enumerate(header, 1):
        key = name.lower()
        if key in seen:
            other = header[seen[key] - 1]
            same = "appears twice" if other == name else f"and {other!r} differ only in case"
            raise UserError(f"{where(path, 1)}: column {name!r} {same} (columns {seen[key]} and {i}); "
                            f"column names must be unique")
        seen[key] = i


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
    check_header(header, path)

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
        items = parse_json(text, path)
        if not isinstance(items, list):
            raise UserError(f"{where(path)}: expected a JSON array of objects or one object per line")
        for i, obj in enumerate(items, 1):
            if not isinstance(obj, dict):
                raise UserError(f"{where(path)}: record {i}: expected a JSON object")
            yield i, obj
        return
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        obj = parse_json(line, path, line_no)
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
