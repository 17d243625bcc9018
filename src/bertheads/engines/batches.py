"""`BatchPredictor`: a model loaded once per worker, mapping a batch (a pandas DataFrame, a
pyarrow Table or RecordBatch, or a dict of numpy arrays, whichever the engine hands it) to the
same batch with one column per head and field (`HEAD_FIELD`), every head from one encoder pass
(`inference/analyze.py`). The columns' types are each kind's (`Publishing.output_columns`), so
the result writes to Parquet as it is.

The input columns are `analyze`'s record fields: `text`, and the extra input of each head's form
(`second_text` for a pair head, `question` for a qa head, whose `text` is the passage);
`columns={"text": "review"}` reads them from other columns.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bertheads.api import Model, load
from bertheads.base.errors import UserError
from bertheads.base.schema import FACE, from_mapping, names, said, setting, speaking, unknown_name
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.export.modes import RuntimeSettings
from bertheads.inference.analyze import analyze, bound_tasks
from bertheads.inference.tables import arrow, arrow_type, head_types, head_values
from bertheads.store.crash import crash_point

TEXT = "text"  # the shared text's column
ERROR = "error"  # with skip_bad_rows: why a row was skipped (null when it was not)
FILE, ROW = "_file", "_row"  # where a row was read (the Ray job's reader adds them)


@dataclass
class BatchSettings:
    """What a `BatchPredictor` reads and adds (besides `RuntimeSettings`' device, runtime, precision)."""

    heads: tuple | None = setting(None, "the heads to run (default: every head)", cli=False)
    columns: dict = setting(help="input name -> the batch's column holding it (e.g. {'text': 'review'})",
                            factory=dict, cli=False)
    batch_size: int = setting(INFERENCE_BATCH, "inputs per encoder batch", cli=False)
    skip_bad_rows: bool = setting(False, "a row without a usable text gets null predictions and its reason in "
                                         "the 'error' column, instead of failing the batch", cli=False)


_LOADED: dict[tuple, Any] = {}  # (model, runtime settings) -> Model: one load per worker process


def loaded_model(model, runtime: RuntimeSettings):
    """The `Model` of a directory, loaded once per process (a `Model` is used as it is)."""
    if isinstance(model, Model):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise UserError(f"BatchPredictor: model: expected a model directory or a loaded Model, got "
                        f"{type(model).__name__}")
    key = (str(model), runtime.device, runtime.runtime, runtime.precision, runtime.encoder)
    if key not in _LOADED:
        _LOADED[key] = load(model, runtime)
    return _LOADED[key]


class BatchPredictor:
    """`predictor(batch)` -> the batch with `HEAD_FIELD` columns. `model`: a model directory (or
    a loaded `Model`); `heads`, `columns`, `batch_size`, `skip_bad_rows`: `BatchSettings`;
    `device`, `runtime`, `precision`, ...: `RuntimeSettings` (default: the CPU in fp32, as a
    worker of a data engine usually has it); any other keyword is a head's inference option
    (`min_confidence`, `calibrate`, `long_input`, `threshold`, ...), as `Model.predict` (one
    head) and `Model.analyze` (several: each given to the heads whose kind takes it) take them;
    with `min_confidence` each head adds its `HEAD_abstained` column."""

    def __init__(self, model, heads: Sequence[str] | str | None = None, **given) -> None:
        if isinstance(heads, str):
            heads = (heads,)
        if heads is not None and (not isinstance(heads, Sequence) or not all(isinstance(h, str) for h in heads)):
            raise UserError(f"BatchPredictor: heads: expected a head's name or a list of names, got {heads!r}")
        batch_keys = set(names(BatchSettings)) - {"heads"}
        runtime_keys = set(names(RuntimeSettings))
        self.settings = from_mapping(BatchSettings, {"heads": tuple(heads) if heads else None,
                                                     **{k: v for k, v in given.items() if k in batch_keys}})
        runtime_given = {k: v for k, v in given.items() if k in runtime_keys}
        self.runtime = from_mapping(RuntimeSettings, runtime_given,
                                    base=RuntimeSettings(device="cpu", runtime="torch", precision="fp32"))
        self.model_ref = model
        self.model = loaded_model(model, self.runtime)
        net = self.model.net
        chosen = list(self.settings.heads or net.tasks)
        for name in chosen:
            if name not in net.tasks:
                raise UserError(f"no head {name!r} (the model has: {', '.join(net.tasks)})")
        self.heads = chosen
        self.face = FACE.get()  # how its messages name settings, in whichever process it runs
        options = {k: v for k, v in given.items() if k not in batch_keys | runtime_keys and v is not None}
        declared = {n for h in self.heads for n in net.tasks[h].options.declared()}
        for name, value in options.items():
            if not any(name in t.options.declared() for t in net.tasks.values()):
                raise UserError(unknown_name(name, [*batch_keys, *runtime_keys, *declared], "setting",
                                             of=" of BatchPredictor"))
            if name not in declared:  # another kind's option: "... is for tag heads, not classify"
                net.tasks[self.heads[0]].options.check({name: value})
        self.options = options
        self.tasks()  # the options checked against the heads now, not in a worker

    def tasks(self) -> dict:
        """head -> its task bound to the options: one head takes every option (or refuses it, as
        `Model.predict` does); several heads each take those of their kind (`Model.analyze`)."""
        net = self._model().net
        if len(self.heads) == 1:
            return {self.heads[0]: net.tasks[self.heads[0]].options.bind(self.options)}
        return bound_tasks(net, self.options, self.heads)

    # -- pickled to the engine's workers without the model; loaded again there, once ----------
    def __getstate__(self) -> dict:
        ref = self.model_ref
        if isinstance(ref, Model):
            if ref.directory is None:
                raise UserError("BatchPredictor: a model that is not saved cannot go to other processes; "
                                "pass its directory")
            ref = ref.directory
        return {"model_ref": str(ref), "settings": self.settings, "runtime": self.runtime, "heads": self.heads,
                "options": self.options, "face": self.face}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.model = None

    # -- what it reads and adds ---------------------------------------------------------------
    def inputs(self) -> dict[str, str]:
        """input name -> the batch column it is read from: `text`, then each head's extra."""
        net = self._model().net
        names = [TEXT] + [net.tasks[h].reading.form.extra.key for h in self.heads if net.tasks[h].reading.form.extra]
        return {n: self.settings.columns.get(n, n) for n in dict.fromkeys(names)}

    def output_types(self) -> dict[str, Any]:
        """column -> its type (`Struct`/`ListOf`/Python type) of the columns added, in order."""
        out = head_types(self.tasks())
        if self.settings.skip_bad_rows:
            out[ERROR] = str
        return out

    def output_schema(self):
        """The added columns as a pyarrow schema."""
        pa = arrow()
        return pa.schema([pa.field(name, arrow_type(kind)) for name, kind in self.output_types().items()])

    # -- the call -------------------------------------------------------------------------------
    def __call__(self, batch):
        with speaking(self.face):
            return self.predict_batch(batch)

    def predict_batch(self, batch):
        crash_point("engine:batch")
        pa = arrow()
        model = self._model()
        read = column_reader(batch)
        size = batch_length(batch)
        wanted = self.inputs()
        present = batch_columns(batch)
        values: dict[str, list] = {}
        for name, column in wanted.items():
            if column not in present:
                heads = [h for h in self.heads if (model.net.tasks[h].reading.form.extra or None) and
                         model.net.tasks[h].reading.form.extra.key == name] if name != TEXT else self.heads
                raise UserError(f"the batch has no column {column!r} (read as {name!r} by head "
                                f"{', '.join(repr(h) for h in heads)}); columns: {', '.join(map(str, present))}; "
                                f"heads=[...] leaves a head out, columns={{{name!r}: 'COLUMN'}} maps another")
            values[name] = read(column)
        where = row_names(read, present, size)
        errors: list[str | None] = [None] * size
        for name, column in wanted.items():
            for i, v in enumerate(values[name]):
                if errors[i] is None and not (isinstance(v, str) and v.strip()):
                    errors[i] = f"{where(i)}: column {column!r} is {describe_value(v)}, expected a text"
        if any(errors) and not self.settings.skip_bad_rows:
            raise UserError(next(e for e in errors if e) + f" ({said('skip_bad_rows', True, flag='--skip-bad-lines')} skips it)")
        good = [i for i, e in enumerate(errors) if e is None]
        texts = [values[TEXT][i] for i in good]
        extras = {model.net.tasks[h].reading.form.extra.request: [values[model.net.tasks[h].reading.form.extra.key][i] for i in good]
                  for h in self.heads if model.net.tasks[h].reading.form.extra}
        results = (analyze(model.net, texts, extras, self.settings.batch_size, heads=self.heads, **self.options)
                   if texts else [])
        tasks = self.tasks()
        rows: list[dict] = [{} for _ in range(size)]
        for i, result in zip(good, results):
            row = rows[i]
            for h in self.heads:
                row.update(head_values(tasks[h], h, result[h]))
        if self.settings.skip_bad_rows:
            for i, e in enumerate(errors):
                rows[i][ERROR] = e
        arrays = {name: pa.array([r.get(name) for r in rows], type=arrow_type(kind))
                  for name, kind in self.output_types().items()}
        return with_columns(batch, arrays)

    def _model(self):
        if self.model is None:
            self.model = loaded_model(self.model_ref, self.runtime)
        return self.model


# -- batches of each engine ----------------------------------------------------------------------
def is_frame(batch) -> bool:
    return type(batch).__module__.split(".")[0] == "pandas" and hasattr(batch, "columns")


def is_arrow(batch) -> bool:
    return type(batch).__module__.split(".")[0] == "pyarrow" and hasattr(batch, "schema")


def batch_columns(batch) -> list[str]:
    if is_frame(batch):
        return [str(c) for c in batch.columns]
    if is_arrow(batch):
        return list(batch.schema.names)
    if isinstance(batch, Mapping):
        return [str(c) for c in batch]
    raise UserError(f"BatchPredictor: expected a pandas DataFrame, a pyarrow Table or a dict of arrays, "
                    f"got {type(batch).__name__}")


def batch_length(batch) -> int:
    if is_frame(batch) or is_arrow(batch):
        return len(batch)
    return len(next(iter(batch.values()))) if batch else 0


def column_reader(batch):
    """column -> its values as Python objects."""
    if is_frame(batch):
        return lambda c: [plain(v) for v in batch[c].tolist()]
    if is_arrow(batch):
        return lambda c: batch.column(c).to_pylist()
    return lambda c: [plain(v) for v in list(batch[c])]


def plain(value):
    """A missing value (None, NaN, pandas' NA) as None; numpy strings and numbers as Python's."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if type(value).__name__ in ("NAType", "NaTType"):
        return None
    return value.item() if hasattr(value, "item") and not isinstance(value, str) else value


def row_names(read, present: list[str], size: int):
    """i -> how a message names row i: its file and row when the batch carries them."""
    if FILE in present and ROW in present:
        files, numbers = read(FILE), read(ROW)
        return lambda i: f"{files[i]} row {numbers[i]}"
    return lambda i: f"batch row {i}"


def describe_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "empty"
    return f"a {type(value).__name__}"


def with_columns(batch, arrays: dict):
    """The batch with the columns added, in the batch's own type."""
    if is_frame(batch):
        out = batch.copy()
        for name, array in arrays.items():
            values = array.to_pandas()
            values.index = batch.index
            out[name] = values
        return out
    if is_arrow(batch):
        for name, array in arrays.items():
            if name in batch.schema.names:
                batch = batch.drop_columns([name])
            batch = batch.append_column(arrow().field(name, array.type), array)
        return batch
    return {**batch, **{name: array.to_numpy(zero_copy_only=False) for name, array in arrays.items()}}
