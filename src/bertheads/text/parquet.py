"""Parquet input: a file, a folder (its `*.parquet` files, sorted) or a glob, read a row group at
a time so memory follows the row group, not the input. As `Rows` (`text/rows.py`) the kinds'
readers take them as they take a DataFrame, naming a bad row by its file and row."""

from __future__ import annotations

import glob
from collections.abc import Iterator
from pathlib import Path

from bertheads.base.errors import UserError
from bertheads.base.extras import require
from bertheads.text.rows import Rows, plain_record

SUFFIXES = (".parquet", ".pq")


def is_parquet(path) -> bool:
    """Whether `path` names Parquet input: a .parquet file, a folder of them, or a glob of them."""
    if path is None or not isinstance(path, (str, Path)):
        return False
    text = str(path)
    if text.endswith(SUFFIXES):
        return True
    p = Path(text)
    return p.is_dir() and any(p.rglob("*.parquet"))


def parquet_files(path: str | Path) -> list[Path]:
    """The Parquet files `path` names (a file, a folder searched recursively, or a glob), sorted."""
    text = str(path)
    if any(c in text for c in "*?["):
        files = sorted(Path(p) for p in glob.glob(text, recursive=True) if p.endswith(SUFFIXES))
    elif Path(text).is_dir():
        files = sorted(p for p in Path(text).rglob("*") if p.name.endswith(SUFFIXES) and not p.name.startswith("."))
    else:
        files = [Path(text)] if Path(text).is_file() else []
    if not files:
        raise UserError(f"{text}: no Parquet files found (a .parquet file, a folder of them or a glob)")
    return files


def row_groups(path: str | Path) -> list[tuple[str, int, int, int]]:
    """(file, row group, its first row in the file, its rows) of every row group of the input."""
    pq = parquet()
    out = []
    for file in parquet_files(path):
        try:
            meta = pq.ParquetFile(file).metadata
        except Exception as exc:  # pyarrow's errors: ArrowInvalid, OSError
            raise UserError(f"{file}: not a readable Parquet file ({exc})") from None
        first = 0
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            out.append((str(file), g, first, rows))
            first += rows
    return out


def read_group(file: str, group: int, columns: list[str] | None = None):
    """One row group as a pyarrow Table."""
    return parquet().ParquetFile(file).read_row_group(group, columns=columns)


def parquet_rows(path: str | Path) -> Rows:
    """Parquet input as `Rows` ("FILE row N" in messages, rows counted from 0 in each file)."""
    groups = row_groups(path)
    first = parquet().ParquetFile(groups[0][0]).schema_arrow.names if groups else []
    name = str(path) if len({g[0] for g in groups}) != 1 else groups[0][0]

    def records() -> Iterator[dict]:
        for file, group, _, _ in groups:
            for record in read_group(file, group).to_pylist():
                yield plain_record(record)

    return Rows(name, [str(c) for c in first], records, sum(g[3] for g in groups))


def parquet():
    require("parquet", "Parquet input or output")
    import pyarrow.parquet

    return pyarrow.parquet
