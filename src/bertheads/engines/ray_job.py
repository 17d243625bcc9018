"""`bertheads predict MODEL --input PARQUET --output DIR --engine ray`: the job on Ray Data. The
input's row groups are the tasks, run by an actor pool of `--workers` (`GroupPredictor`: a
model loaded once per actor reads its row group, each row keeping its `_file` and `_row`, and
predicts it; Ray restarts a killed actor and retries its task), and each task's rows are one
Parquet part of the output folder, written into a temporary sibling that becomes `DIR` when
the job is done, with `summary.json`."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from bertheads.base.errors import UserError
from bertheads.base.extras import require
from bertheads.base.schema import FACE, said, setting, speaking
from bertheads.base.values import positive_int
from bertheads.engines.batches import ERROR, FILE, ROW, BatchPredictor
from bertheads.export.modes import RuntimeSettings
from bertheads.saved.bundle import model_folders
from bertheads.store.atomic import atomic_directory, atomic_write_text
from bertheads.store.guard import check_target
from bertheads.tasks.parts import ABSTAINED
from bertheads.text.parquet import parquet_files, read_group, row_groups

log = logging.getLogger("bertheads")
ENGINES = ("local", "ray")
SUMMARY = "summary.json"


@dataclass
class EngineSettings:
    """Where predict runs (the flags of predict)."""

    engine: str = setting("local", "local: this process (and torchrun's); ray: a Ray Data job over Parquet input "
                                   "(--input a file, folder or glob), writing Parquet parts and summary.json into "
                                   "the --output folder", choices=ENGINES, group="engine")
    workers: int = setting(2, "--engine ray: model copies (Ray actors), each a CPU", type=positive_int,
                           group="engine")
    address: str | None = setting(None, "--engine ray: the Ray cluster (default: $RAY_ADDRESS, else a local Ray "
                                        "started for the job)", group="engine")
    rows_per_batch: int = setting(10_000, "--engine ray: rows a worker reads and predicts per task, in whole row "
                                          "groups (sorted by length within them: fewer means more padding)",
                                  type=positive_int, group="engine")


def read_groups(batch):
    """Ray's read step: each (file, group, first row) item -> the row group's rows with `_file`, `_row`."""
    import pyarrow as pa

    tables = []
    for file, group, first in zip(batch["file"].to_pylist(), batch["group"].to_pylist(), batch["first"].to_pylist()):
        table = read_group(file, group)
        table = table.append_column(FILE, pa.array([file] * len(table), pa.string()))
        tables.append(table.append_column(ROW, pa.array(range(first, first + len(table)), pa.int64())))
    return pa.concat_tables(tables)


class GroupPredictor:
    """The job's Ray actor: a task's (file, row group, first row) items read where the model runs
    and predicted `rows_per_batch` rows a call of `BatchPredictor` (a task holds as many whole
    row groups as make about `rows_per_batch` rows: each call sorts its rows by length, so
    larger calls pad less). A read step of its own would want CPUs besides the actors' (with
    one CPU per worker, it held one and a single actor ran the whole job) and would move every
    row group through Ray's object store."""

    def __init__(self, rows_per_batch: int, face: str = "python", **predictor_args) -> None:
        self.rows_per_batch = rows_per_batch
        with speaking(face):  # its messages name settings as the job's caller does (--skip-bad-lines)
            self.predictor = BatchPredictor(**predictor_args)

    def __call__(self, items):
        import pyarrow as pa

        table = read_groups(items)
        step = self.rows_per_batch
        return pa.concat_tables([self.predictor(table.slice(i, step)) for i in range(0, len(table), step)])


def groups_per_task(groups: list, rows_per_batch: int) -> int:
    """Whole row groups per task: as many as make about `rows_per_batch` rows (at least one)."""
    mean_rows = sum(g[3] for g in groups) / max(1, len(groups))
    return max(1, int(rows_per_batch // max(1.0, mean_rows)))


def start_ray(settings: EngineSettings):
    """The Ray this job runs on: one already started in this process, `--address`/`$RAY_ADDRESS`,
    else a local one with a CPU per worker."""
    require("ray", said("engine", "ray"))
    import ray

    if not ray.is_initialized():
        address = settings.address or os.environ.get("RAY_ADDRESS") or None
        kwargs = {} if address else {"num_cpus": settings.workers}
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **kwargs)
    return ray


def ray_predict(model_dir: str, source: str, output: str, heads: list[str] | None, runtime: RuntimeSettings,
                settings: EngineSettings, skip_bad_lines: bool = False, batch_size: int | None = None,
                options: dict | None = None) -> dict:
    """Predict Parquet input on Ray Data into the folder `output`; the job's summary. `options`:
    the heads' inference options (`min_confidence`, `calibrate`, ...), as `BatchPredictor` takes them."""
    require("ray", said("engine", "ray"))
    out = check_target(output, SUMMARY, inputs=[source], models=model_folders(model_dir), flag="output")
    if out.exists():
        raise UserError(f"{said('output', output)}: the folder exists; {said('engine', 'ray')} writes a new folder "
                        f"(remove it, or choose another {said('output')})")
    groups = row_groups(source)
    ray = start_ray(settings)
    predictor_args = {"model": str(Path(model_dir).absolute()), "heads": heads, "skip_bad_rows": skip_bad_lines,
                      "device": runtime.device, "runtime": runtime.runtime, "precision": runtime.precision,
                      "encoder": runtime.encoder, "verify": runtime.verify,
                      **({"batch_size": batch_size} if batch_size else {}), **(options or {})}
    checked = BatchPredictor(**predictor_args)  # a bad model, head, setting or option: one line here
    mode = checked.model.mode
    abstaining = [c for c in checked.output_types() if c.endswith("_" + ABSTAINED)]  # with --min-confidence
    if mode is not None:  # `auto` decided once, here: the workers run the mode it chose
        predictor_args.update(runtime=mode.runtime, precision=mode.precision)
    started = time.monotonic()
    with atomic_directory(out, replace=False, label="engine") as tmp:
        items = [{"file": str(Path(f).absolute()), "group": g, "first": first} for f, g, first, _ in groups]
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        ds = ds.map_batches(GroupPredictor, fn_constructor_kwargs={"rows_per_batch": settings.rows_per_batch,
                                                                  "face": FACE.get(), **predictor_args},
                            concurrency=settings.workers, batch_size=groups_per_task(groups, settings.rows_per_batch),
                            batch_format="pyarrow")
        try:
            ds.write_parquet(str(tmp.absolute()))
        except Exception as exc:
            raise engine_error(exc) from None
        seconds = time.monotonic() - started
        summary = job_summary(tmp, groups, seconds, settings, skip_bad_lines, source, abstaining)
        atomic_write_text(tmp / SUMMARY, json.dumps(summary, indent=2) + "\n")
    return summary


def engine_error(exc: BaseException) -> BaseException:
    """The UserError a worker raised (a bad record, a bad setting), out of the engine's wrapping
    of it (whose text holds the worker's traceback), as its own one line; any other error as it is."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, UserError) and "\n" not in str(e):
            return e
        for line in str(e).splitlines():
            if line.startswith(WORKER_ERROR):
                return UserError(line[len(WORKER_ERROR):])
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return exc


WORKER_ERROR = f"{UserError.__module__}.UserError: "  # how a worker's traceback ends


def job_summary(folder: Path, groups: list, seconds: float, settings: EngineSettings, skipped_column: bool,
                source: str, abstaining: list[str] = ()) -> dict:
    """rows, failures (rows skipped as malformed, the first ten named), predictions (rows
    predicted, times the heads with --min-confidence) and those abstained (below it), time,
    rows/s, parts."""
    import pyarrow.dataset as pads

    parts = [p for p in parquet_files(folder)] if any(folder.glob("*.parquet")) else []
    rows, failures, named, abstained = 0, 0, [], 0
    if parts:
        data = pads.dataset([str(p) for p in parts], format="parquet")
        rows = data.count_rows()
        for column in abstaining:
            abstained += sum(1 for v in data.to_table(columns=[column]).column(column).to_pylist() if v is True)
        if skipped_column:
            errors = [e for e in data.to_table(columns=[ERROR]).column(ERROR).to_pylist() if e is not None]
            failures, named = len(errors), errors[:10]
            for e in named:
                log.warning(f"skipped: {e}")
    expected = sum(g[3] for g in groups)
    if rows != expected:
        raise UserError(f"{said('engine', 'ray')}: wrote {rows} rows of {expected} in {source}; the output is not kept")
    return {"input": str(source), "rows": rows, "failures": failures, "failed_rows": named,
            "predictions": (rows - failures) * max(1, len(abstaining)), "abstained": abstained,
            "seconds": round(seconds, 3), "rows_per_second": round(rows / seconds, 1) if seconds else None,
            "workers": settings.workers, "parts": len(parts)}
