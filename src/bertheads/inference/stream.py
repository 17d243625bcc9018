"""Prediction and evaluation of inputs of any size: the input is read a chunk of examples at a
time, each chunk is predicted with the usual sorted, padding-free batching, and its results are
written (in input order) before the next chunk is read, so memory follows the chunk size, not the
input. Under torchrun (WORLD_SIZE > 1) the chunks are shared out among the processes (chunk k to
rank k mod WORLD_SIZE); each writes its results to a part file beside the output and rank 0 joins
the parts in chunk order, so the output is the same bytes as one process writes.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bertheads.base.errors import UserError, where
from bertheads.base.progress import LogLines, progress_bar
from bertheads.base.schema import said, setting
from bertheads.base.values import field_list, positive_int
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.inference.analyze import analyze, bound_tasks, count_abstained, extras_of
from bertheads.inference.blanks import BlankLines
from bertheads.inference.path import Evaluation, head_outputs, predict_examples
from bertheads.inference.tables import head_types, head_values, is_parquet_output, parquet_sink
from bertheads.model import BertHeads
from bertheads.store.atomic import atomic_writer
from bertheads.tasks.forms import Extra
from bertheads.tasks.parts import learned_nothing_line
from bertheads.text.parquet import is_parquet, parquet_rows
from bertheads.text.readers import (
    carried_fields,
    file_format,
    progress_total,
    read_jsonl,
    read_lines,
    source_name,
)
from bertheads.text.rows import Rows

log = logging.getLogger("bertheads")

# Examples per chunk: large enough that the last, part-empty batches of a chunk cost little,
# small enough that a chunk's features and outputs stay a few megabytes.
CHUNK_SIZE = 2048


@dataclass
class StreamSettings:
    """How an input of any size is read and predicted (the flags of predict, evaluate and analyze)."""

    chunk_size: int = setting(CHUNK_SIZE, "inputs read, predicted and written together (memory follows this, not "
                                          "the input)", type=positive_int)
    batch_size: int = setting(INFERENCE_BATCH, "inputs per batch", type=positive_int)
    keep_fields: tuple[str, ...] = setting((), "input fields (comma-separated) copied into each prediction; `id` "
                                               "always is", type=field_list)
    skip_bad_lines: bool = setting(False, "report a malformed input line on stderr, skip it and go on (the count is "
                                          "printed at the end)")
    progress: bool = setting(True, "no progress bar (predict shows one with --output, on a terminal)", negate=True)


@dataclass
class StreamReport:
    """What a streamed run did."""

    examples: int = 0  # predicted (by this process)
    chunks: int = 0  # read (all of them, whichever process predicted them)
    skipped: int = 0  # bad records skipped (--skip-bad-lines)
    skipped_lines: list[str] = field(default_factory=list)  # the first few skipped records' messages
    abstained: int = 0  # predictions below --min-confidence ("abstained": true)

    def counted(self, predictions: list[dict]) -> list[dict]:
        """`predictions`, added to the count of inputs predicted and of those abstained on."""
        self.examples += len(predictions)
        self.abstained += sum(1 for p in predictions if p.get("abstained") is True)
        return predictions


class BadLines:
    """The `bad` callback readers take: counts and reports each skipped record on stderr."""

    def __init__(self, report: StreamReport, loud: bool = True) -> None:
        self.report = report
        self.loud = loud

    def __call__(self, error: UserError) -> None:
        self.report.skipped += 1
        if len(self.report.skipped_lines) < 10:
            self.report.skipped_lines.append(str(error))
        if self.loud:
            log.warning(f"skipped: {error}")


def chunks(items: Iterable, size: int) -> Iterator[list]:
    """Lists of `size` items (the last one shorter), taken from `items` as they come."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def counted_as(path) -> tuple[str, int]:
    """An input's progress unit, and what makes an input's number the count done through it:
    rows (Parquet, in memory) are numbered from 0, a file's lines from 1."""
    return ("row", 1) if isinstance(path, Rows) else ("line", 0)


def read_chunks(task, path, settings: StreamSettings, report: StreamReport, need_labels: bool, fmt: str | None,
                rank: int = 0, world: int = 1, desc: str = "predict") -> Iterator[tuple[int, list]]:
    """`(chunk index, examples)` for each chunk of the input this process takes (chunk k when k
    mod world == rank), with a progress bar counting input lines or rows (rank 0's; a total where
    `progress_total` gives one cheaply)."""
    loud = rank == 0
    bad = BadLines(report, loud) if settings.skip_bad_lines else None
    examples = task.reading.iter_read(path, need_labels=need_labels, fmt=fmt, keep=tuple(settings.keep_fields), bad=bad)
    show = settings.progress and loud
    by_line = task.reading.counts_lines  # else records (e.g. questions, many to a line) are counted
    total = progress_total(path) if show and by_line else None
    unit, past = counted_as(path)
    bar = progress_bar(total, desc, unit, show=show, leave=False)
    lines = LogLines(desc, total, f"{unit}s" if by_line else "inputs", show=show)  # where no bar is drawn
    done = 0
    try:
        for k, chunk in enumerate(chunks(examples, settings.chunk_size)):
            report.chunks += 1
            if k % world == rank:
                yield k, chunk
            line = getattr(chunk[-1], "line", None) if by_line else None
            step = max(0, line + past - done) if isinstance(line, int) else len(chunk)
            bar.update(step)
            done += step
            lines.tick(done)
    finally:
        bar.close()


def distributed() -> tuple[int, int]:
    """(rank, world size) under torchrun; (0, 1) otherwise."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def predict_chunks(net: BertHeads, name: str, path, settings: StreamSettings | None = None, fmt: str | None = None,
                   task=None) -> Iterator[tuple[list, list[dict]]]:
    """`(examples, predictions)` for each chunk of a file or of rows in memory, in input order
    (`task`: the head's, bound to the call's options; default the model's): what Python's
    iteration over predictions reads."""
    settings = settings or StreamSettings()
    task = task or net.tasks[name]
    for _, chunk in read_chunks(task, as_source(path), settings, StreamReport(), False, fmt):
        yield chunk, predict_examples(net, name, chunk, settings.batch_size, task)


def predict_stream(net: BertHeads, name: str, path, output: str | None = None, settings: StreamSettings | None = None,
                   fmt: str | None = None, write: Callable[[str], None] | None = None, task=None) -> StreamReport:
    """Predict the input a chunk at a time and write each chunk's rendered results as soon as
    it is done: to `output` (written atomically: a temporary file, renamed once complete), else
    to `write` (default: stdout, flushed after each chunk). Under torchrun the chunks are shared
    among the processes and rank 0 writes `output` (which must then be a file)."""
    settings = settings or StreamSettings()
    path = as_source(path)
    rank, world = distributed()
    if world > 1:
        if output is None:
            raise UserError(f"under torchrun, name the output file with {said('output')} (the processes' parts "
                            f"are joined there)")
        if is_parquet_output(output):  # the parts are joined byte for byte, which Parquet files are not
            raise UserError(f"{said('output', output)}: under torchrun the output is JSON lines (the processes' "
                            f"parts are joined byte for byte); for Parquet out, run one process or "
                            f"{said('engine')} ray")
        return predict_sharded(net, name, path, Path(output), settings, fmt, rank, world, task)
    task = task or net.tasks[name]
    report = StreamReport()
    if is_parquet_output(output):
        with parquet_sink(output, head_types({name: task}, prefix=False)) as sink:
            for _, chunk in read_chunks(task, path, settings, report, False, fmt):
                predictions = report.counted(predict_examples(net, name, chunk, settings.batch_size, task))
                sink.write([{k: p[k] for k in ("id", *settings.keep_fields) if k in p} for p in predictions],
                           [head_values(task, name, p, prefix=False) for p in predictions])
        return report
    blanks = BlankLines()
    last = None
    with writer(output, write) as put, blanks.active():
        for _, chunk in read_chunks(task, path, settings, report, False, fmt):
            predictions = report.counted(predict_examples(net, name, chunk, settings.batch_size, task))
            put(blanks.render(task, predictions, chunk, fmt))
            last = getattr(chunk[-1], "line", None)
        if isinstance(last, int) and blanks.pending:
            put(blanks.after(last))
    return report


@contextmanager
def writer(output: str | None, write: Callable[[str], None] | None = None) -> Iterator[Callable[[str], None]]:
    """Where a streamed run's text goes: `output` (written atomically: a temporary file, renamed
    once complete), else `write` (default: stdout, flushed after each chunk)."""
    if output is None:
        yield write or stdout_writer
        return
    with atomic_writer(output) as fh:
        yield fh.write


def analyzed_chunks(path, settings: StreamSettings, report: StreamReport,
                    extras: dict[str, Extra]) -> Iterator[list[tuple[int, dict]]]:
    """`analyze_records` a chunk at a time, its progress in log lines where no bar is drawn
    (input lines or rows done, of the input's where `progress_total` gives that cheaply)."""
    unit, past = counted_as(path)
    lines = LogLines("analyze", progress_total(path) if settings.progress else None, f"{unit}s", show=settings.progress)
    for chunk in chunks(analyze_records(path, settings, report, extras), settings.chunk_size):
        yield chunk
        lines.tick(chunk[-1][0] + past if isinstance(chunk[-1][0], int) else report.examples)


def analyze_records(path, settings: StreamSettings, report: StreamReport,
                    extras: dict[str, Extra]) -> Iterator[tuple[int, dict]]:
    """`(line, record)` of an `analyze` input: JSON Lines records (or Parquet rows) with `text`
    and the extra field of each head's input form it gives (`id`, the `--keep-fields`), or plain
    lines (`TEXT`, or `TEXT<TAB>VALUE` for the extra a form reads after a TAB)."""
    bad = BadLines(report) if settings.skip_bad_lines else None
    name = source_name(path)
    after_tab = [e.key for e in extras.values() if e.tab]
    if isinstance(path, Rows):
        records = ((i, {k: v for k, v in r.items() if v is not None}) for i, r in path.rows())
    elif file_format(name, None) != "jsonl":
        for line_no, line in read_lines(path, bad):
            text, tab, second = line.partition("\t")
            yield line_no, {"text": text, **(dict.fromkeys(after_tab, second) if tab else {})}
        return
    else:
        records = read_jsonl(path, bad)
    for line_no, record in records:
        problem = next((f"{e.key}: expected {e.says()}" for e in extras.values()
                        if e.key in record and not e.fits(record[e.key])), None)
        if not isinstance(record.get("text", ""), str):
            problem = "text: expected a string"
        if "text" not in record:
            problem = f"no \"text\" field (fields: {', '.join(record) or 'none'})"
        if problem is not None:
            error = UserError(f"{where(name, line_no)}: {problem}")
            if bad is None:
                raise error
            bad(error)
            continue
        yield line_no, record


def analyze_stream(net: BertHeads, path, output: str | None = None, settings: StreamSettings | None = None,
                   write: Callable[[str], None] | None = None, **options) -> StreamReport:
    """Every head on each input, one encoder pass for the heads whose inputs encode alike, a
    chunk at a time in input order: one JSON line `{"id"?, kept fields, HEAD: prediction, ...}`
    per input, to `output` (atomically) or to `write` (default: stdout). A head whose input
    form needs more than the text answers for the records that give it (`analyze_inputs`)."""
    settings = settings or StreamSettings()
    report = StreamReport()
    extras = extras_of(net)
    path = as_source(path)
    if is_parquet_output(output):
        tasks = bound_tasks(net, options)
        with parquet_sink(output, head_types(tasks)) as sink:
            for chunk in analyzed_chunks(path, settings, report, extras):
                records = [record for _, record in chunk]
                results = analyze_chunk(net, records, extras, settings, **options)
                report.chunks += 1
                report.examples += len(records)
                report.abstained += count_abstained(results)
                sink.write([carried_fields(r, settings.keep_fields) for r in records],
                           [{k: v for h, p in result.items() for k, v in head_values(tasks[h], h, p).items()}
                            for result in results])
        return report

    blanks = BlankLines()

    def lines() -> Iterator[str]:
        with blanks.active():
            yield from analyzed_lines()
        if last[0] is not None and blanks.pending:
            yield blanks.after(last[0])

    last: list[int | None] = [None]

    def analyzed_lines() -> Iterator[str]:
        for chunk in analyzed_chunks(path, settings, report, extras):
            records = [record for _, record in chunk]
            results = analyze_chunk(net, records, extras, settings, **options)
            report.chunks += 1
            report.examples += len(records)
            report.abstained += count_abstained(results)
            last[0] = chunk[-1][0]
            yield blanks.lines([(line, json.dumps({**carried_fields(r, settings.keep_fields), **result},
                                                  ensure_ascii=False) + "\n")
                                for (line, _), r, result in zip(chunk, records, results)])

    with writer(output, write) as put:
        for text in lines():
            put(text)
    return report


def analyze_chunk(net: BertHeads, records: list[dict], extras: dict[str, Extra], settings: StreamSettings,
                  **options) -> list[dict]:
    """`{head: prediction}` per record; records with the same extra fields run together."""
    results: list[dict] = [{} for _ in records]
    groups: dict[tuple, list[int]] = {}
    for i, record in enumerate(records):
        groups.setdefault(tuple(r for r, e in extras.items() if e.key in record), []).append(i)
    for given, idx in groups.items():
        values = {r: [records[i][extras[r].key] for i in idx] for r in given}
        for i, result in zip(idx, analyze(net, [records[i]["text"] for i in idx], values,
                                          settings.batch_size, **options)):
            results[i] = result
    return results


def as_source(path):
    """Parquet input (a file, a folder or a glob) as `Rows` read a row group at a time; else `path`."""
    return parquet_rows(path) if is_parquet(path) else path


def stdout_writer(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# -- several processes (torchrun) ---------------------------------------------------------
def part_path(output: Path, rank: int, world: int) -> Path:
    return output.parent / f".{output.name}.part{rank}-of-{world}.tmp"


def process_group():
    """The default process group (gloo: it carries only small status objects), started when
    torchrun's environment is there and it is not running yet."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(days=7))
    return dist


def predict_sharded(net: BertHeads, name: str, path, output: Path, settings: StreamSettings, fmt: str | None,
                    rank: int, world: int, task=None) -> StreamReport:
    """This process's chunks into its part file; then every process says how it went, and rank
    0 joins the parts in chunk order into `output` (atomically) when all went well. A process
    that failed makes every process fail with its rank and message."""
    if output.is_dir():
        raise UserError(f"{said('output', output)}: is a directory; name a file")
    if source_name(path) is None:
        raise UserError(f"under torchrun, give the input as a file with {said('input')} (every process reads it)")
    output.parent.mkdir(parents=True, exist_ok=True)
    task = task or net.tasks[name]
    report = StreamReport()
    part = part_path(output, rank, world)
    sizes: list[int] = []  # bytes of each chunk this process wrote, in order
    status: dict = {"rank": rank, "error": None}
    blanks = BlankLines()
    try:
        with open(part, "wb") as fh, blanks.active():
            last = None  # (index, last line) of this process's last chunk
            for k, chunk in read_chunks(task, path, settings, report, False, fmt, rank, world):
                preds = report.counted(predict_examples(net, name, chunk, settings.batch_size, task))
                data = blanks.render(task, preds, chunk, fmt).encode("utf-8")
                fh.write(data)
                sizes.append(len(data))
                last = (k, getattr(chunk[-1], "line", None))
            if last is not None and last[0] == report.chunks - 1 and isinstance(last[1], int) and blanks.pending:
                tail = blanks.after(last[1]).encode("utf-8")  # the input's last blank lines end the last chunk
                fh.write(tail)
                sizes[-1] += len(tail)
    except UserError as exc:
        status["error"] = str(exc)
    except Exception as exc:  # an internal fault: still reported by rank, with its type
        status["error"] = f"{type(exc).__name__}: {exc}"
    status.update(sizes=sizes, chunks=report.chunks, skipped=report.skipped, examples=report.examples)
    dist = process_group()
    statuses: list = [None] * world
    dist.all_gather_object(statuses, status)
    failed = [s for s in statuses if s["error"]]
    try:
        if failed:
            first = failed[0]
            raise UserError(f"rank {first['rank']} of {world} failed: {first['error']}")
        if rank == 0:
            join_parts(output, [part_path(output, r, world) for r in range(world)], [s["sizes"] for s in statuses])
    finally:
        dist.barrier()  # rank 0 has read the parts before any process removes its own
        part.unlink(missing_ok=True)
    report.examples = sum(s["examples"] for s in statuses)
    return report


def join_parts(output: Path, parts: list[Path], sizes: list[list[int]]) -> None:
    """Chunk k is the (k // world)-th piece of part k mod world: copy them in chunk order."""
    world = len(parts)
    total = sum(len(s) for s in sizes)
    handles = [open(p, "rb") for p in parts]
    try:
        with atomic_writer(output, "wb") as out:
            for k in range(total):
                r, i = k % world, k // world
                out.write(handles[r].read(sizes[r][i]))
    finally:
        for h in handles:
            h.close()


# -- evaluation -----------------------------------------------------------------------------
def evaluate_stream(net: BertHeads, name: str, path, settings: StreamSettings | None = None, task=None) -> dict:
    """A head's metrics and mean loss on a labelled file read a chunk at a time: each chunk's
    outputs are reduced to what the metrics need (`model.Evaluation`) before the next is read.
    Metrics that need every output at once (a kind's call option that writes every prediction
    to a file) keep them all."""
    settings = settings or StreamSettings()
    task = task or net.tasks[name]
    report = StreamReport()
    path = as_source(path)
    evaluation = Evaluation(task, path)
    losses: dict[str, list[float]] = {}
    loss = [0.0, 0]
    for _, chunk in read_chunks(task, path, settings, report, True, None, desc="evaluate"):
        outputs = head_outputs(net, name, chunk, settings.batch_size, task=task, losses=losses,
                               progress=f"chunk {report.chunks}" if settings.progress else None)  # the chunk's own bar
        evaluation.add(outputs, chunk)
        loss = [loss[0] + losses[name][0], loss[1] + losses[name][1]]
    if not evaluation.parts:
        raise UserError(f"{path}: no examples")
    metrics = evaluation.result(tuple(loss))
    if report.skipped:
        metrics["skipped"] = report.skipped
    why = task.judging.learned_nothing(metrics)
    if why:
        metrics["learned_nothing"] = why
        log.warning(learned_nothing_line(name, why))
    return metrics
