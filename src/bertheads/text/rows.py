"""Data held in memory, read like a file's records: a pandas DataFrame, a Hugging Face
`datasets.Dataset` (or one split of a `DatasetDict`), or a list of dicts.

Each row becomes the dict a JSON line would give (numpy values as Python ones, a missing value
as None, a `ClassLabel` number as its name), so the task readers apply the same column-role
rules and word their errors the same way, naming the row (`DataFrame row 3: empty text in column
'sentence'`; rows are counted from 0, as `df.iloc` and `dataset[i]` count them). Neither pandas
nor datasets is imported here: an object is recognised by the module its type comes from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

from bertheads.base.errors import RowsName, UserError

DEV_SPLITS = ("validation", "dev", "valid")  # the split of a DatasetDict that `train` evaluates on


class Rows:
    """Rows in memory, with a name for messages, the column names and a fresh iterator per read."""

    def __init__(self, name: str, columns: list[str], records: Callable[[], Iterator[dict]],
                 size: int | None, frame=None) -> None:
        self.name = RowsName(name)
        self.columns = columns
        self.records = records
        self.size = size
        self.frame = frame  # the DataFrame given, so predictions can come back as one

    def rows(self) -> Iterator[tuple[int, dict]]:
        """`(row number from 0, record)`, read again from the start at each call."""
        yield from enumerate(self.records())

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<{self.description()}>"

    def description(self) -> str:
        """What a saved model's config records for these rows (they are not a file)."""
        return f"{self.name} of {self.size:,} rows" if self.size is not None else str(self.name)


def origin(data) -> str:
    """The top-level package an object's type comes from ("pandas", "datasets", ...)."""
    return type(data).__module__.split(".")[0]


def is_dataset_dict(data) -> bool:
    return origin(data) == "datasets" and hasattr(data, "keys") and not hasattr(data, "features")


def as_rows(data, what: str = "data") -> Rows | None:
    """`data` as `Rows`, or None when it is a path, a stream or None (read as files are)."""
    if data is None or isinstance(data, (str, Path)) or hasattr(data, "readline"):
        return None
    if isinstance(data, Rows):
        return data
    if origin(data) == "pandas" and hasattr(data, "itertuples") and hasattr(data, "columns"):
        return frame_rows(data)
    if is_dataset_dict(data):
        raise UserError(f"{what}: a DatasetDict; pass one split, e.g. data[{next(iter(data.keys()), 'train')!r}] "
                        f"(splits: {', '.join(data.keys())})")
    if origin(data) == "datasets":
        return dataset_rows(data)
    if isinstance(data, (list, tuple)) and data and all(isinstance(r, dict) for r in data):
        records = list(data)
        return Rows("list", [str(k) for k in records[0]], lambda: (plain_record(r) for r in records), len(records))
    if isinstance(data, (list, tuple)):
        bad = next((i for i, r in enumerate(data) if not isinstance(r, dict)), None)
        if not data:
            raise UserError(f"{what}: an empty list")
        raise UserError(f"{what}: list item {bad}: expected a dict (one record with its columns), "
                        f"got {type(data[bad]).__name__}")
    raise UserError(f"{what}: expected a file path, a pandas DataFrame, a datasets.Dataset or a list of dicts, "
                    f"got {type(data).__name__}")


def frame_rows(frame) -> Rows:
    columns = [str(c) for c in frame.columns]
    check_unique(columns, "DataFrame")

    def records() -> Iterator[dict]:
        for values in frame.itertuples(index=False, name=None):
            yield {c: plain_value(v) for c, v in zip(columns, values)}

    return Rows("DataFrame", columns, records, len(frame), frame)


def dataset_rows(dataset) -> Rows:
    split = getattr(dataset, "split", None)
    name = f"Dataset {str(split)!r}" if split else "Dataset"
    features = getattr(dataset, "features", None) or {}
    columns = list(getattr(dataset, "column_names", None) or features)
    names = {c: label_names(features[c]) for c in features}
    names = {c: n for c, n in names.items() if n is not None}

    def records() -> Iterator[dict]:
        for row in dataset:
            record = plain_record(row)
            for column, (labels, nested) in names.items():
                if column in record:
                    record[column] = named(record[column], labels, nested)
            yield record

    size = len(dataset) if hasattr(dataset, "__len__") else None
    return Rows(name, columns, records, size)


def label_names(feature) -> tuple[list[str], bool] | None:
    """The names of a `ClassLabel` feature (or of a sequence of them: nested True), else None."""
    names = getattr(feature, "names", None)
    if isinstance(names, list):
        return names, False
    inner = getattr(feature, "feature", None)
    names = getattr(inner, "names", None)
    if isinstance(names, list):
        return names, True
    return None


def named(value, labels: list[str], nested: bool):
    """A ClassLabel number (or list of them) as its name; -1 (a dataset's "no label") as None."""
    def one(v):
        return labels[v] if isinstance(v, int) and 0 <= v < len(labels) else (None if v == -1 else v)
    if nested:
        return [one(v) for v in value] if isinstance(value, list) else value
    return one(value)


def plain_record(record: dict) -> dict:
    return {str(k): plain_value(v) for k, v in record.items()}


def plain_value(value):
    """A value as JSON would give it: numpy scalars and arrays as Python numbers and lists, a
    missing value (NaN, pandas.NA, NaT, None) as None; dicts and lists converted inside."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return plain_record(value)
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if origin(value) == "numpy":
        if hasattr(value, "tolist"):
            return plain_value(value.tolist())
    if type(value).__name__ in ("NAType", "NaTType"):
        return None
    if origin(value) == "pandas" and hasattr(value, "tolist"):  # e.g. a Categorical's values
        return plain_value(value.tolist())
    return value


def check_unique(columns: list[str], name: str) -> None:
    lower: dict[str, str] = {}
    for c in columns:
        if c.lower() in lower:
            raise UserError(f"{name}: columns {lower[c.lower()]!r} and {c!r} have the same name (ignoring case); "
                            f"column names must be unique")
        lower[c.lower()] = c


def split_dataset(data, dev, what: str = "train"):
    """A DatasetDict given to `train`: its "train" split, and (unless `dev` is given) its
    validation split as the dev set; anything else is returned as it is."""
    if not is_dataset_dict(data):
        return data, dev
    splits = list(data.keys())
    if "train" not in splits:
        raise UserError(f"{what}: the DatasetDict has no 'train' split (splits: {', '.join(splits)}); "
                        f"pass one split")
    if dev is None:
        dev = next((data[s] for s in DEV_SPLITS if s in splits), None)
    return data["train"], dev
