"""Predictions as typed Arrow columns and Parquet files: each head's fields as its kind types
them (`Publishing.output_columns`: `str`, `int`, `float`, `bool`, `ListOf`, `Struct`), so a
Parquet output holds labels, scores and entities as columns and structs, not JSON strings.
`ParquetSink` writes a file a chunk at a time (atomically: a temporary file renamed at the end)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bertheads.base.extras import require
from bertheads.store.atomic import atomic_writer
from bertheads.tasks.parts import ListOf, Struct


def arrow():
    require("parquet", "typed prediction columns (Parquet output, BatchPredictor)")
    import pyarrow

    return pyarrow


def arrow_type(kind):
    """A column type (`str`, `int`, `float`, `bool`, `ListOf`, `Struct`) as a pyarrow type."""
    pa = arrow()
    if isinstance(kind, Struct):
        return pa.struct([pa.field(name, arrow_type(k)) for name, k in kind.fields])
    if isinstance(kind, ListOf):
        return pa.list_(arrow_type(kind.item))
    return {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}[kind]


def head_types(tasks: Mapping[str, Any], prefix: bool = True) -> dict[str, Any]:
    """column -> type of each head's fields (`HEAD_FIELD`; the field alone without `prefix`):
    `tasks` are head -> its task as bound to the call's options (`Publishing.columns`: with
    `abstained` under a `min_confidence`)."""
    return {f"{h}_{name}" if prefix else name: kind
            for h, task in tasks.items() for name, kind in task.publishing.columns().fields}


def head_values(task, head: str, prediction: dict | None, prefix: bool = True) -> dict:
    """A prediction's values for its head's columns (nothing for a head that did not answer);
    `task`: the head's task as bound to the call's options."""
    if prediction is None:
        return {}
    return {f"{head}_{k}" if prefix else k: v for k, v in task.publishing.row(prediction).items()}


class ParquetSink:
    """Rows of carried fields (types as pyarrow infers them from the first chunk) and typed
    prediction columns, written a chunk at a time into one Parquet file."""

    def __init__(self, fh, types: dict[str, Any]) -> None:
        self.fh = fh
        self.types = types
        self.writer = None
        self.schema = None

    def write(self, carried: list[dict], predicted: list[dict]) -> None:
        pa = arrow()
        if self.schema is None:
            names = list(dict.fromkeys(k for r in carried for k in r))
            fields = [pa.field(n, pa.array([r.get(n) for r in carried]).type) for n in names if n not in self.types]
            self.schema = pa.schema([*fields, *(pa.field(n, arrow_type(k)) for n, k in self.types.items())])
            self.writer = parquet().ParquetWriter(self.fh, self.schema)
        rows = [{**c, **p} for c, p in zip(carried, predicted)]
        self.writer.write_table(pa.Table.from_pylist(rows, schema=self.schema))

    def close(self) -> None:
        if self.writer is None:  # no rows: the typed columns alone
            pa = arrow()
            self.schema = pa.schema([pa.field(n, arrow_type(k)) for n, k in self.types.items()])
            self.writer = parquet().ParquetWriter(self.fh, self.schema)
        self.writer.close()


@contextmanager
def parquet_sink(output: str | Path, types: dict[str, Any]) -> Iterator[ParquetSink]:
    """A `ParquetSink` whose file becomes `output` when the block ends without error."""
    arrow()
    with atomic_writer(output, "wb") as fh:
        sink = ParquetSink(fh, types)
        yield sink
        sink.close()


def is_parquet_output(output) -> bool:
    return output is not None and str(output).lower().endswith((".parquet", ".pq"))


def parquet():
    import pyarrow.parquet

    return pyarrow.parquet
