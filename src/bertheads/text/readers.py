"""Reading the standard table formats (TSV, CSV, JSONL) with file and line numbers kept
for error messages."""

from __future__ import annotations

import csv
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path

from bertheads.base.errors import UserError, header, where
from bertheads.text.parquet import is_parquet, row_groups
from bertheads.text.rows import Rows

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
BadLine = Callable[[UserError], None]  # told of a bad record that is then skipped


def check_input_file(path: str | None) -> None:
    """Refuse (one line) an input path that is missing or a directory; None / '-' is stdin."""
    if path in (None, "-") or is_parquet(path):  # a Parquet folder or glob is input too
        return
    p = Path(path)
    if not p.exists():
        raise UserError(f"{path}: no such file")
    if p.is_dir():
        raise UserError(f"{path}: is a directory, expected a file")


def read_text(path: str | None) -> str:
    """A whole file (or stdin for None / '-') as text, BOM removed."""
    if path in (None, "-"):
        return sys.stdin.read()
    check_input_file(path)
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise not_utf8(path) from None


LINE_LIMIT_ENV = "BERTHEADS_MAX_LINE_MB"
LINE_LIMIT_MB = 256.0  # a line longer than this (in millions of characters) is refused


def line_limit() -> int:
    """The longest line read, in characters (`$BERTHEADS_MAX_LINE_MB` millions; default 256)."""
    try:
        return max(1, int(float(os.environ.get(LINE_LIMIT_ENV, LINE_LIMIT_MB)) * 1_000_000))
    except ValueError:
        raise UserError(f"${LINE_LIMIT_ENV}: expected a number of millions of characters, "
                        f"got {os.environ[LINE_LIMIT_ENV]!r}") from None


def bounded(lines, limit: int, name, bad: BadLine | None) -> Iterator[str]:
    """`lines` (an object with `readline`), each read at most `limit` characters at a time: a longer
    line is refused with its number, or, with `bad`, reported and read past (a blank line stands
    in for it, so later line numbers stay right)."""
    line_no = 0
    while line := lines.readline(limit + 1):
        line_no += 1
        if len(line) > limit and not line.endswith("\n"):
            size = len(line)
            while (rest := lines.readline(1 << 20)) and not rest.endswith("\n"):
                size += len(rest)
            size += len(rest)
            error = UserError(f"{where(name, line_no)}: a line of {size:,} characters is longer than the limit of "
                              f"{limit:,} (${LINE_LIMIT_ENV} sets it, in millions)")
            if bad is None:
                raise error
            bad(error)
            line = "\n"
        yield line


def open_lines(path, bad: BadLine | None = None) -> Iterator[str]:
    """The lines of a file (or stdin for None / '-', or an open text stream), read as they are
    needed, each with its line ending; BOM removed. A line over `line_limit()` is refused with its
    number (`bad`: reported, and a blank line given in its place)."""
    limit = line_limit()
    if path is not None and not isinstance(path, (str, Path)):
        yield from bounded(path, limit, None, bad) if hasattr(path, "readline") else path  # an open stream
        return
    if path in (None, "-"):
        yield from bounded(sys.stdin, limit, None, bad)
        return
    check_input_file(path)
    p = Path(path)
    with open(p, encoding="utf-8-sig", newline="") as fh:
        try:
            yield from bounded(fh, limit, path, bad)
        except UnicodeDecodeError:
            raise not_utf8(path) from None


def not_utf8(path) -> UserError:
    """The error for a file that is not UTF-8, naming the line and the byte in it that is not
    (the decoder reads blocks of many lines, so its own position does not say which line)."""
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return UserError(f"{where(path, line_no)}: not UTF-8 text (byte {exc.start + 1} of the line, "
                                 f"0x{raw[exc.start]:02x})")
    return UserError(f"{where(path)}: not UTF-8 text")


def source_name(path) -> str | None:
    """What error messages call the input: its path (or the name of rows in memory), or None for
    stdin and streams."""
    if isinstance(path, Rows):
        return path.name
    return str(path) if isinstance(path, (str, Path)) and path != "-" else None


COUNT_AHEAD_BYTES = 256 << 20  # a file up to this size is counted before it is read, for a progress ETA


def count_lines(path) -> int | None:
    """Lines in a file (for a progress total; Parquet input and rows in memory: their rows, from
    the metadata, no data read); None for stdin and streams."""
    if isinstance(path, Rows):
        return path.size
    if is_parquet(path):
        return sum(rows for *_, rows in row_groups(path))
    if source_name(path) is None or not Path(path).is_file():
        return None
    total, last = 0, b"\n"
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            total += block.count(b"\n")
            last = block[-1:]
    return total + (last != b"\n")


def progress_total(path) -> int | None:
    """`count_lines(path)` where that is cheap: a file over `COUNT_AHEAD_BYTES` is not read twice
    (its progress shows done and rate, no ETA); None where unknown."""
    if isinstance(path, (str, Path)) and not is_parquet(path) and source_name(path) is not None:
        try:
            if Path(path).stat().st_size > COUNT_AHEAD_BYTES:
                return None
        except OSError:
            return None
    return count_lines(path)


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


def check_header(columns: list[str], path) -> None:
    """Column names must differ (ignoring case, as columns are looked up)."""
    seen: dict[str, int] = {}
    for i, name in enumerate(columns, 1):
        key = name.lower()
        if key in seen:
            other = columns[seen[key] - 1]
            same = "appears twice" if other == name else f"and {other!r} differ only in case"
            raise UserError(f"{header(path)}: column {name!r} {same} (columns {seen[key]} and {i}); "
                            f"column names must be unique")
        seen[key] = i


def read_table(path, fmt: str, bad: BadLine | None = None,
               names: Callable[[int], list[str]] | None = None) -> tuple[list[str], Iterator[tuple[int, dict]]]:
    """Header and `(line number, row dict)` for TSV/CSV files with a header row, read as the
    rows are needed (a row with the wrong column count raises when it is reached). With
    `names`, the file has no header row: its columns are `names(number of columns)`."""
    lines = open_lines(path, bad)
    if fmt == "tsv":
        reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(lines)
    header, first = None, []
    for row in reader:
        if row and not (len(row) == 1 and not row[0].strip()):
            header = [h.strip() for h in row] if names is None else names(len(row))
            first = [] if names is None else [(reader.line_num, row)]
            break
    if header is None:
        raise UserError(f"{where(source_name(path))}: file is empty")
    path = source_name(path)
    check_header(header, path)

    def rows() -> Iterator[tuple[int, dict]]:
        for line, row in itertools.chain(first, ((reader.line_num, row) for row in reader)):
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(header):
                error = UserError(f"{where(path, line)}: expected {len(header)} columns like the header, "
                                  f"found {len(row)}")
                if bad is None:
                    raise error
                bad(error)
                continue
            yield line, dict(zip(header, row))

    return header, rows()


def read_jsonl(path, bad: BadLine | None = None, name: str | None = None) -> Iterator[tuple[int, dict]]:
    """`(line number, object)` for each non-blank line of a JSON Lines file, read as needed
    (a JSON array of objects is read whole). `bad`: called with the error of a malformed line,
    which is then skipped (default: raised). `name`: the file's name when `path` is a stream.
    Rows in memory (`text/rows.py`) are read as such a file's records, numbered from 0."""
    if isinstance(path, Rows):
        yield from path.rows()
        return
    name = name or source_name(path)
    lines = open_lines(path, bad)
    seen = False
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not seen and line.lstrip().startswith("["):  # a JSON array of objects is accepted too
            text = line + "".join(lines)
            items = parse_json(text, name, line_no)
            if not isinstance(items, list):
                raise UserError(f"{where(name)}: expected a JSON array of objects or one object per line")
            for i, obj in enumerate(items, 1):
                if not isinstance(obj, dict):
                    raise UserError(f"{where(name)}: record {i}: expected a JSON object")
                yield i, obj
            return
        seen = True
        try:
            obj = parse_json(line.strip(), name, line_no)
            if not isinstance(obj, dict):
                raise UserError(f"{where(name, line_no)}: expected a JSON object")
        except UserError as exc:
            if bad is None:
                raise
            bad(exc)
            continue
        yield line_no, obj
    if not seen:
        raise UserError(f"{where(name)}: file is empty")


# told the number of each blank line `read_lines` passes over (set by a streamed predict or
# analyze, which keep a record in the output for each; see `inference/blanks.py`)
BLANK_LINES: ContextVar[Callable[[int], None] | None] = ContextVar("blank_lines", default=None)


def read_lines(path, bad: BadLine | None = None) -> Iterator[tuple[int, str]]:
    """`(line number, line)` for plain text input, read as needed; blank lines are skipped
    (and told to `BLANK_LINES` when it is set)."""
    seen = False
    for line_no, line in enumerate(open_lines(path, bad), 1):
        line = line.rstrip("\r\n")
        if line.strip():
            seen = True
            yield line_no, line
        elif (tell := BLANK_LINES.get()) is not None:
            tell(line_no)
    if not seen:
        raise UserError(f"{where(source_name(path))}: file is empty")


def find_column(columns: list[str], wanted: list[str], override: str | None, path, role: str) -> str | None:
    """The first header name matching `wanted` (case-insensitive), or the override."""
    if override:
        if override not in columns:
            raise UserError(f"{header(path)}: no column {override!r} for the {role} (columns: {', '.join(columns)})")
        return override
    lower = {c.lower(): c for c in columns}
    for name in wanted:
        if name in lower:
            return lower[name]
    return None


def carried_fields(record: dict, keep: tuple[str, ...] | list[str] = ()) -> dict:
    """What a prediction carries back from its input record: its `id`, and the `keep` fields."""
    extra = {"id": record["id"]} if "id" in record else {}
    for name in keep:
        extra[name] = record.get(name)
    return extra


def required_text(value, at: str, what: str) -> str:
    """A record's text, `what` it is (`question`, `text in column 'sentence'`): missing, not a
    string or blank is a one-line error `AT: ...`."""
    if value is None:
        raise UserError(f"{at}: missing {what}")
    if not isinstance(value, str):
        raise UserError(f"{at}: {what}: expected a string, got {type(value).__name__}")
    if not value.strip():
        raise UserError(f"{at}: empty {what}")
    return value
