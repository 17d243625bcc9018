"""The gate before a lower precision is used: its outputs against fp32's on the model's own dev
data (or a sample the user gives), timed on the same inputs, and the verdict kept for this machine.

```
DIR/gate.json   {"manifest_sha256", "machines": {MACHINE: {"openvino/bf16": {"passed", "why",
                 "inputs_per_s", "fp32_inputs_per_s", "tolerance_points", "min_agreement",
                 "heads": {NAME: {"data", "examples", "metric", "fp32", "value", "change_points",
                 "label_agreement"}}, "export_sha256", "device", "machine"}}}}
```
MACHINE is `machine().line()` (the CPU, its flags, cores and threads): a verdict and its speed hold
for the machine that measured them. The model folder's file is written only by the commands whose
work is the gate (`train` at its end, `export --to onnx`, `bertheads gate`); a command that reads a
model (`predict`, `evaluate`, `analyze`, `serve`) keeps the verdicts it had to make in the user's
cache (`$BERTHEADS_CACHE/gate/`, one file per model, export and machine), so a read-only model
folder pays for them once. A verdict holds while the model (its manifest and head weights) and,
for an exported mode, the export are the ones it was made on.

A mode passes when every head has at least `modes.MIN_INPUTS` labelled inputs, its main metric
falls by at most `modes.TOLERANCE` points (a gain never refuses) and at least `modes.AGREEMENT`
of its predictions, scores left out, are fp32's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bertheads.base.bounded import read_json
from bertheads.base.errors import SystemFault, UserError
from bertheads.base.extras import require
from bertheads.base.machine import machine, resolve_device
from bertheads.base.runtimes import RUNTIMES, runtime_named
from bertheads.base.schema import said
from bertheads.export.modes import AGREEMENT, MIN_INPUTS, TOLERANCE, Mode, check_mode
from bertheads.export.onnx import META, ONNX_DIR, export_onnx, manifest_digest
from bertheads.export.runtimes import missing_export, open_runner
from bertheads.inference.path import head_outputs
from bertheads.saved import bundle
from bertheads.saved.manifest import GATE  # DIR/gate.json, checked when the model folder is opened
from bertheads.store.atomic import atomic_write_text
from bertheads.store.encoder_refs import cache_root, inside

log = logging.getLogger("bertheads")

GATE_EXAMPLES = 1000  # dev inputs compared per head (the first ones)


class NoEvidence(UserError):
    """The gate has nothing, or too little, to judge a lower precision on."""


def export_digest(directory: Path) -> str | None:
    path = directory / ONNX_DIR / META
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def here() -> str:
    """The machine a verdict belongs to."""
    return machine().line()


def cache_file(manifest: str, export: str | None) -> Path:
    """The user's cache of verdicts on a model (its manifest's digest), its export and this machine."""
    key = hashlib.sha256("\n".join((manifest, export or "", here())).encode()).hexdigest()[:32]
    return cache_root() / "gate" / f"{key}.json"


def _read(path: Path) -> dict:
    """Verdicts kept in the user's cache (a file that cannot be read holds none)."""
    try:
        saved = read_json(path) if path.is_file() else {}
    except UserError:
        return {}
    return saved if isinstance(saved, dict) else {}


def read_records(directory: Path) -> dict[str, dict]:
    """The verdicts that hold for this model, its export and this machine: the model folder's
    (its gate.json checked when the folder is opened), then those of the user's cache."""
    directory = Path(directory)
    if not (directory / bundle.MANIFEST).is_file():
        return {}  # not a model: opening it says so
    bundle.read_manifest(directory)
    manifest, export, machine_line = manifest_digest(directory), export_digest(directory), here()
    out: dict[str, dict] = {}
    folder = read_json(directory / GATE) if (directory / GATE).is_file() else {}  # its shape checked above
    for saved in (_read(cache_file(manifest, export)), folder):  # the folder's last: it wins
        if saved.get("manifest_sha256") != manifest:
            continue
        for key, record in (saved.get("machines") or {}).get(machine_line, {}).items():
            if isinstance(record, dict) and (key.startswith("torch/") or record.get("export_sha256") == export):
                out[key] = record
    return out


def store(directory: Path, key: str, record: dict, say: Callable[[str], None], into_model: bool = False) -> None:
    """Keep one verdict: in DIR/gate.json for the commands whose work is the gate, else in the
    user's cache. Where neither can be written, it is said, and the check runs again next time."""
    directory = Path(directory)
    manifest, export = manifest_digest(directory), export_digest(directory)
    target = directory / GATE if into_model else cache_file(manifest, export)
    saved = _read(target)
    machines = saved.get("machines") if saved.get("manifest_sha256") == manifest else None
    machines = {m: {k: v for k, v in records.items() if k.startswith("torch/") or v.get("export_sha256") == export}
                for m, records in (machines or {}).items()}
    machines.setdefault(here(), {})[key] = record
    text = json.dumps({"manifest_sha256": manifest, "machines": machines}, indent=1) + "\n"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, text)
    except (OSError, SystemFault) as exc:
        say(f"could not write {target} ({exc}); the check runs again next time")


def recorded_dev(manifest: dict, name: str) -> str | None:
    """The dev file a head was trained with, as its saved settings name it."""
    settings = manifest.get("settings")
    settings = settings if isinstance(settings, dict) else {}
    tasks = settings.get("tasks")
    entry = (tasks.get(name) if isinstance(tasks, dict) else settings) if "tasks" in settings else settings
    dev = entry.get("dev") if isinstance(entry, dict) else None
    return dev if isinstance(dev, str) and dev else None


def dev_path(manifest: dict, name: str, directory: Path, own: bool = False) -> str | None:
    """The dev file a head was trained with, when it is still there and lies inside the model
    folder (relative paths from the folder). A model folder is someone else's data: a file it
    names elsewhere is never opened (`--gate-data` gives one), unless `own` (the run that
    recorded it, training, gates the folder it just wrote)."""
    dev = recorded_dev(manifest, name)
    if dev is None:
        return None
    if own:  # as training read it (from where it ran), else from the folder
        return next((str(c) for c in (Path(dev), directory / dev) if c.is_file()), None)
    candidate = directory / dev  # from the folder; an absolute path stays itself
    return str(candidate) if candidate.is_file() and inside(candidate, directory) else None


def outside_dev(directory: Path, heads) -> str | None:
    """Why a head's recorded dev file is not read: it lies outside the model folder (None: it does not)."""
    manifest = bundle.read_manifest(directory)
    for name in heads:
        dev = recorded_dev(manifest, name)
        if dev is not None and not inside(directory / dev, directory):
            return (f"the dev file {directory / bundle.MANIFEST} records for head {name}, {dev!r}, lies outside the "
                    f"model folder and is not opened")
    return None


def gate_data(directory: Path, heads, given: str | None, own: bool = False) -> dict[str, str] | None:
    """Each head's data for the gate: `given` (a user sample) or its own dev file inside the
    model folder (`dev_path`; `own`: wherever the run that wrote the folder read it); None when
    a head has neither."""
    manifest = bundle.read_manifest(directory)
    out = {}
    for name in heads:
        path = given or dev_path(manifest, name, directory, own)
        if path is None:
            return None
        out[name] = path
    return out


def without_scores(value):
    """A prediction with its float values (scores) left out: what label agreement compares."""
    if isinstance(value, dict):
        return {k: without_scores(v) for k, v in value.items() if not isinstance(v, float)}
    if isinstance(value, (list, tuple)):
        return [without_scores(v) for v in value if not isinstance(v, float)]
    return value


def labelled(task, name: str, path: str, limit: int = GATE_EXAMPLES, recorded: bool = False) -> list:
    """The first `limit` labelled inputs of `path`; NoEvidence when they are too few to judge by.
    `recorded`: the file is the one the model folder names, whose content is never shown (a
    problem reading it is said as its not fitting the head)."""
    try:
        examples = task.reading.read(path, need_labels=True)[:limit]
    except UserError:
        if not recorded:
            raise
        raise NoEvidence(f"{path}: the dev file the model records does not fit head {name} "
                         f"({said('gate_data')} gives one)") from None
    if len(examples) < MIN_INPUTS:
        raise NoEvidence(f"{path}: {len(examples)} labelled input{'s' * (len(examples) != 1)} for head {name}; the "
                         f"gate needs at least {MIN_INPUTS} to judge a lower precision ({said('gate_data')} gives more)")
    return examples


def timed(runner, name: str, examples: list, progress: str | None = None) -> tuple[list, float]:
    """One head's outputs for `examples` and the seconds a pass over them takes, end to end
    (encoding and decoding included). The outputs come from a first pass, which also meets every
    batch shape once (OpenVINO, for one, prepares its kernels for each new shape, and torch's
    first calls pay their set-up); the seconds are those of a second pass, the speed a model
    runs at after its first batches. `progress` names a bar (where bars are drawn)."""
    outputs = head_outputs(runner, name, examples, progress=progress)
    start = time.perf_counter()
    head_outputs(runner, name, examples, progress=progress and f"{progress}, timed")
    return outputs, time.perf_counter() - start


def compare(reference, candidate, data: dict[str, str], limit: int = GATE_EXAMPLES,
            runs: dict | None = None, recorded: bool = False) -> dict[str, dict]:
    """Each head's main metric and predictions from `candidate` against `reference` (both runners
    holding the same tasks) on the first `limit` labelled inputs of its data, with the seconds each
    took. `runs` keeps fp32's outputs between calls; `recorded`: the data is the model's own dev
    files (`labelled`)."""
    runs = {} if runs is None else runs
    out = {}
    for name, path in data.items():
        task = reference.tasks[name]
        if name not in runs:
            examples = labelled(task, name, path, limit, recorded)
            runs[name] = (examples, *timed(reference, name, examples, f"gate {name}: fp32"))
        examples, ref, ref_seconds = runs[name]
        got, seconds = timed(candidate, name, examples, f"gate {name}: lower precision")
        metric = task.judging.main_metric
        ref_value = float(task.judging.metrics(ref, examples)[metric])
        got_value = float(task.judging.metrics(got, examples)[metric])
        scale = 100.0 if abs(ref_value) <= 1 and abs(got_value) <= 1 else 1.0  # fractions as points
        same = [without_scores(a) == without_scores(b)
                for a, b in zip(task.judging.decode(ref, examples), task.judging.decode(got, examples))]
        out[name] = {"data": path, "examples": len(examples), "metric": metric, "fp32": ref_value,
                     "value": got_value, "change_points": (got_value - ref_value) * scale,
                     "label_agreement": sum(same) / len(same), "seconds": seconds, "fp32_seconds": ref_seconds}
    return out


def problems(precision: str, heads: dict[str, dict]) -> list[str]:
    """Why a lower precision fails the gate (nothing when it passes)."""
    out = []
    for name, h in heads.items():
        if h["examples"] < MIN_INPUTS:
            out.append(f"{name}: {h['examples']} inputs, fewer than {MIN_INPUTS}")
        if h["change_points"] < -TOLERANCE[precision]:
            out.append(f"{name}: {h['metric']} falls {-h['change_points']:.2f} points, more than "
                       f"{TOLERANCE[precision]}")
        if h["label_agreement"] < AGREEMENT[precision]:
            out.append(f"{name}: {h['label_agreement']:.1%} same predictions as fp32, fewer than "
                       f"{AGREEMENT[precision]:.0%}")
    return out


def rate(heads: dict[str, dict], field: str = "seconds") -> float:
    """Inputs a second over every head's timed pass."""
    seconds = sum(h[field] for h in heads.values())
    return sum(h["examples"] for h in heads.values()) / seconds if seconds > 0 else 0.0


def verdict(directory: Path, mode: Mode, heads: dict[str, dict]) -> dict:
    why = problems(mode.precision, heads)
    return {"passed": not why, "why": "; ".join(why), "inputs_per_s": rate(heads),
            "fp32_inputs_per_s": rate(heads, "fp32_seconds"), "tolerance_points": TOLERANCE[mode.precision],
            "min_agreement": AGREEMENT[mode.precision], "heads": heads, "device": str(mode.device),
            "export_sha256": export_digest(directory) if runtime_named(mode.runtime).graphs else None,
            "machine": here()}


def summary(record: dict) -> str:
    """One line: each head's metric change and label agreement."""
    parts = [f"{name}: {h['metric']} {h['change_points']:+.2f} points, {h['label_agreement']:.1%} same predictions "
             f"on {h['examples']} inputs" for name, h in record["heads"].items()]
    return "; ".join(parts)


class Gate:
    """The gate for one model on one device: fp32 loaded, read and timed once for every mode
    checked; each verdict kept (`store`) as it is made."""

    def __init__(self, directory: str | Path, device: torch.device, verify: bool = True, given: str | None = None,
                 say: Callable[[str], None] | None = None, into_model: bool = False, fresh: bool = False,
                 own: bool = False):
        """`fresh`: every mode measured again, the kept verdicts left unread; `own`: the dev files
        the folder records are the ones the caller just trained with (`gate_data`)."""
        self.directory, self.device, self.verify, self.given = Path(directory), device, verify, given
        self.say, self.into_model, self.own = say or log.info, into_model, own
        self.records = {} if fresh else read_records(self.directory)
        self.reference = None
        self.runs: dict = {}
        self._data: dict[str, str] | None = None

    def data(self) -> dict[str, str]:
        """Each head's labelled file; NoEvidence when a head has none."""
        if self._data is None:
            heads = bundle.read_manifest(self.directory)["heads"]
            found = gate_data(self.directory, heads, self.given, self.own)
            if found is None:
                why = outside_dev(self.directory, heads) or "no dev data recorded with the model"
                raise NoEvidence(f"{why} ({said('gate_data')} gives some)")
            self._data = found
        return self._data

    def record(self, mode: Mode) -> dict:
        """`mode`'s verdict: the one kept for this machine (on the same data, when --gate-data is
        given), else measured now and kept. NoEvidence when there is nothing to judge it on."""
        kept = self.records.get(mode.key)
        if kept is not None and (self.given is None or all(h.get("data") == self.given
                                                           for h in kept["heads"].values())):
            return kept
        data = self.data()
        if self.reference is None:
            self.reference = bundle.load(self.directory, self.device, self.verify)
        self.say(f"checking {mode.runtime} {mode.precision} against fp32 on {', '.join(sorted(set(data.values())))} ...")
        candidate = open_runner(self.directory, mode, self.verify)
        record = verdict(self.directory, mode, compare(self.reference, candidate, data, runs=self.runs,
                                                       recorded=self.given is None and not self.own))
        store(self.directory, mode.key, record, self.say, self.into_model)
        self.records[mode.key] = record
        return record

    def fp32_rate(self) -> float | None:
        """torch fp32's inputs a second as the kept verdicts measured it (their median)."""
        rates = sorted(r["fp32_inputs_per_s"] for r in self.records.values() if r.get("fp32_inputs_per_s"))
        return rates[len(rates) // 2] if rates else None


def lower_modes(directory: Path, device: torch.device, exported: bool = True) -> list[Mode]:
    """The lower-precision modes this machine runs on `device` for the model (and, with
    `exported`, its export's graphs), in the registry's order."""
    out = []
    for runtime in RUNTIMES.values():
        for precision in runtime.precisions:
            graph_there = precision not in runtime.graphs or (
                exported and not missing_export(directory, runtime.name, precision))
            if precision not in TOLERANCE or not graph_there:
                continue
            try:
                check_mode(runtime.name, precision, device)
            except UserError:
                continue  # not on this machine (bf16 without AMX/AVX512_BF16, fp16 off a GPU, no openvino)
            out.append(Mode(runtime.name, precision, device))
    return out


def gate_model(directory: str | Path, given: str | None = None, say: Callable[[str], None] | None = None,
               device: str | torch.device | None = "cpu", exported: bool = True,
               verify: bool = True, own: bool = False) -> dict | None:
    """Every lower precision this machine runs the model in, checked against fp32 and written
    into DIR/gate.json (`bertheads gate`, the end of `train`, `export --to onnx`); None when the
    machine runs none. `own`: the run that wrote the folder (training) gates it on the dev files
    it was given, wherever they are."""
    directory, say = Path(directory), say or log.info
    where = resolve_device(device)
    modes = lower_modes(directory, where, exported)
    if not modes:
        log.debug(f"gate: no lower precision of {directory} to check on {where} here ({machine().flag_text()})")
        return None
    checked = Gate(directory, where, verify, given, say, into_model=True, fresh=True, own=own)  # verdicts made here
    out = {}
    for mode in modes:
        try:
            record = checked.record(mode)
        except NoEvidence as exc:
            say(f"gate: no lower precision checked: {exc}")
            break
        out[mode.key] = record
        say(f"gate {mode.runtime} {mode.precision}: "
            + (f"passed, {record['inputs_per_s']:.0f} inputs/s against fp32's {record['fp32_inputs_per_s']:.0f} "
               f"({summary(record)})" if record["passed"] else f"REFUSED ({record['why']})"))
    return out


def export_checked(directory: str | Path, out: str | Path | None = None, quantize_to: str | None = None,
                   gate_file: str | None = None, say: Callable[[str], None] | None = None,
                   openvino: bool = True) -> dict:
    """`bertheads export --to onnx`: the graphs (int8 calibrated on the dev data), then each
    lower-precision mode of the export this machine runs checked against fp32 (DIR/gate.json)."""
    require("export", "export --to onnx")  # before the model is read: the missing extra is the first thing to say
    directory = Path(directory)
    say = say or log.info
    heads = bundle.read_manifest(directory)["heads"]
    data = gate_data(directory, heads, gate_file)
    if data is None and (why := outside_dev(directory, heads)):
        say(f"gate: {why}; {said('gate_data')} gives the data to check lower precisions on")
    meta = export_onnx(directory, out, quantize_to, say, calibration=data, openvino=openvino)
    if data is None or (out is not None and Path(out).resolve() != (directory / ONNX_DIR).resolve()):
        return meta
    gate_model(directory, gate_file, say)
    return meta
