"""The model manifest (`bertheads.json`) read and checked against its schema, the one check of a
model folder when it is opened (`read_manifest`), and the checks that tie a model directory's
weight files to it.

A model folder is data from someone else. Every problem is one `UserError` line naming the file
and the field: a manifest that is not UTF-8 or not JSON, larger or deeper than
`base/bounded.py` reads, fields of the wrong type, a head name that is not a plain name (so it
can never reach outside `DIR/heads/`), a value a head cannot use (a temperature that is not a
finite number in range, labels or tags named twice, layers the encoder lacks, a length beyond
the checkpoint's positions, counts that are not counts: each kind's `check_saved`), the other
JSON files of the folder (`metrics.json`, `onnx/export.json`, `gate.json`) out of bounds or of
the wrong shape, an export's graph file that is not a plain name in `onnx/`, head weights whose
tensors do not match what the head's spec builds (for example 3 labels for 2 output rows), and
unreadable safetensors files.
"""

from __future__ import annotations

import math
import re
import types
import typing
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

from bertheads.base.bounded import read_json
from bertheads.base.errors import UserError, first_line
from bertheads.encoder.pretrained import max_tokens
from bertheads.store.encoder_refs import reference_location
from bertheads.store.guard import MODEL_MANIFEST
from bertheads.tasks import TASKS
from bertheads.tasks.base import SavedValue, shown

MANIFEST = MODEL_MANIFEST  # bertheads.json (the write guard, `store/guard.py`, knows a model by it)
FORMAT_VERSION = 1
# a head name: letters, digits, '_', '.', '-', not starting with '.', '_' or '-' (the same rule as
# multi-task configs and `combine --names`); it is also the head's file name under DIR/heads/
HEAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # \Z: no newline after it
ENCODER_HASH = re.compile(r"^[0-9a-f]{64}\Z")
# the model folder's other JSON files, checked when it is opened (`export/onnx.py` and `export/gate.py`
# write the last two under these names)
METRICS = "metrics.json"
ONNX_DIR, EXPORT_META = "onnx", "export.json"
GATE = "gate.json"
GRAPH_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # a graph's file: a plain name in DIR/onnx/


def read_manifest(directory: str | Path) -> dict:
    """A model folder opened: the one check every command and Python entry point that opens a
    saved model goes through (`saved/bundle.py` `load`, the ONNX and OpenVINO runners, the gate,
    export, report, combine, calibrate). Its manifest is read within `base/bounded.py`'s bounds,
    checked against the schema (`check_manifest`) and each head's values against what the head
    and its encoder can use (`check_values`); `metrics.json`, `onnx/export.json` and `gate.json`,
    when there, are read within the same bounds and their shapes checked (`check_folder_files`).
    Returns the checked manifest."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise UserError(f"{directory}: no such model directory")
    if not path.is_file():
        raise UserError(f"{directory}: not a bertheads model (no {MANIFEST})")
    data = check_manifest(read_json(path), path)
    check_values(data, path, *encoder_limits(directory, data))
    check_folder_files(directory)
    return data


def encoder_limits(directory: Path, manifest: dict) -> tuple[int | None, int | None]:
    """(layers, most tokens an input may have) of the encoder the folder's heads sit on, read from
    its `config.json` and `tokenizer_config.json` (`encoder/pretrained.py` `max_tokens`); None
    where they cannot be read here (loading the encoder then says why)."""
    reference = manifest.get("encoder")
    try:
        location = reference_location(directory, reference) if isinstance(reference, dict) else directory / "encoder"
        config = read_json(location / "config.json") if (location / "config.json").is_file() else None
        tokenizer = location / "tokenizer_config.json"
        tokenizer = read_json(tokenizer) if tokenizer.is_file() else {}
    except UserError:
        return None, None
    if not isinstance(config, dict):
        return None, None
    layers = config.get("num_hidden_layers", config.get("n_layers"))
    stated = tokenizer.get("model_max_length") if isinstance(tokenizer, dict) else None
    limit = max_tokens(SimpleNamespace(**{str(k): v for k, v in config.items()}),
                       SimpleNamespace(model_max_length=stated if isinstance(stated, int) else None))
    return (layers if isinstance(layers, int) and layers > 0 else None), limit


def check_values(manifest: dict, path: Path | str, num_layers: int | None = None,
                 max_tokens: int | None = None) -> None:
    """Each head's spec values are ones its kind can use with this encoder (`check_saved`)."""
    for name, entry in manifest["heads"].items():
        try:
            TASKS[entry["kind"]].spec_type.check_saved(entry["spec"], num_layers, max_tokens)
        except SavedValue as exc:
            raise UserError(f"{path}: heads.{name}.spec.{exc}") from None


def check_folder_files(directory: Path) -> None:
    """The folder's `metrics.json`, `onnx/export.json` and `gate.json`, where there, within the
    bounds and of the shape their readers take."""
    metrics = directory / METRICS
    if metrics.is_file():
        data = read_json(metrics)
        expect(data, dict, metrics, "", "an object")
        for key in ("dev", "learned_nothing", "calibration"):
            if data.get(key) is not None:
                expect(data[key], dict, metrics, key, "an object")
        if data.get("best_epoch") is not None and not number(data["best_epoch"]):
            raise UserError(f"{metrics}: best_epoch: expected a number, got {shown(data['best_epoch'])}")
        history = data.get("history")
        if history is not None:
            expect(history, list, metrics, "history", "a list of epochs")
            for i, entry in enumerate(history):
                expect(entry, dict, metrics, f"history[{i}]", "an object")
                if not number(entry.get("epoch")):
                    raise UserError(f"{metrics}: history[{i}].epoch: expected a number, got {shown(entry.get('epoch'))}")
                if entry.get("dev") is not None:
                    expect(entry["dev"], dict, metrics, f"history[{i}].dev", "an object")
    export = directory / ONNX_DIR / EXPORT_META
    if export.is_file():
        data = read_json(export)
        expect(data, dict, export, "", "an object")
        graphs = data.get("graphs", {})
        expect(graphs, dict, export, "graphs", "an object of graphs")
        for name, graph in graphs.items():
            expect(graph, dict, export, f"graphs.{name}", "an object")
            for key in ("file", "weights"):
                value = graph.get(key)
                if value is not None and not (isinstance(value, str) and GRAPH_FILE.match(value)):
                    raise UserError(f"{export}: graphs.{name}.{key}: expected a file name in {export.parent} (not a "
                                    f"path), got {shown(value)}")
    gate = directory / GATE
    if gate.is_file():
        data = read_json(gate)
        expect(data, dict, gate, "", "an object")
        expect(data.get("machines", {}), dict, gate, "machines", "an object of machines")
        for machine, records in data.get("machines", {}).items():
            expect(records, dict, gate, f"machines[{machine!r}]", "an object of modes")
            for key, record in records.items():
                at = f"machines[{machine!r}].{key}"
                expect(record, dict, gate, at, "an object")
                if not isinstance(record.get("passed"), bool):
                    raise UserError(f"{gate}: {at}.passed: expected true or false, got {shown(record.get('passed'))}")
                for field in ("inputs_per_s", "fp32_inputs_per_s"):
                    if record.get(field) is not None and not (number(record[field]) and record[field] >= 0):
                        raise UserError(f"{gate}: {at}.{field}: expected a finite number of 0 or more, got "
                                        f"{shown(record[field])}")
                expect(record.get("heads", {}), dict, gate, f"{at}.heads", "an object of heads")
                for head, measured in record.get("heads", {}).items():
                    expect(measured, dict, gate, f"{at}.heads.{head}", "an object")


def expect(value, kind: type, path: Path, field: str, what: str) -> None:
    if not isinstance(value, kind):
        raise UserError(f"{path}: {field + ': ' if field else ''}expected {what}, got {json_type(value)}")


def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_manifest(data, path: Path | str) -> dict:
    """`data` checked against the manifest schema (errors name `path` and the field)."""
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {json_type(data)}")
    version = data.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise UserError(f"{path}: unsupported manifest (format_version {version!r}; this version reads "
                        f"{FORMAT_VERSION})")
    heads = data.get("heads")
    if not isinstance(heads, dict) or not heads:
        raise UserError(f"{path}: heads: expected an object of head names to head entries, got {json_type(heads)}")
    for name, entry in heads.items():
        at = f"{path}: heads.{name}"
        if not HEAD_NAME.match(name) or len(name) > 200:
            raise UserError(f"{path}: heads: {name!r} is not a valid head name (letters, digits, '_', '.', '-'; "
                            f"not a path)")
        if not isinstance(entry, dict):
            raise UserError(f"{at}: expected an object with 'kind' and 'spec', got {json_type(entry)}")
        kind = entry.get("kind")
        if kind not in TASKS:
            raise UserError(f"{at}.kind: expected one of {', '.join(TASKS)}, got {kind!r}")
        spec = entry.get("spec")
        if not isinstance(spec, dict):
            raise UserError(f"{at}.spec: expected an object of head settings, got {json_type(spec)}")
        check_spec(spec, TASKS[kind].spec_type, f"{at}.spec")
    digest = data.get("encoder_hash")
    if digest is not None and not (isinstance(digest, str) and ENCODER_HASH.match(digest)):
        raise UserError(f"{path}: encoder_hash: expected 64 hexadecimal digits, got {digest!r}")
    return data


def check_spec(spec: dict, spec_type: type, at: str) -> None:
    """Each known field of `spec` has the type its dataclass field declares (unknown fields are ignored)."""
    hints = typing.get_type_hints(spec_type)
    for f in fields(spec_type):
        if f.name in spec and not fits(spec[f.name], hints[f.name]):
            raise UserError(f"{at}.{f.name}: expected {type_name(hints[f.name])}, got {spec[f.name]!r}")
    for name in ("labels", "tags"):
        values = spec.get(name)
        if isinstance(values, list) and not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                                for v in values):
            raise UserError(f"{at}.{name}: expected a list of strings or integers")
    for name in ("max_length", "stride", "max_question_length", "n_best", "max_answer_length", "lstm_size"):
        value = spec.get(name)
        if isinstance(value, int) and value < 1:
            raise UserError(f"{at}.{name}: expected a positive integer, got {value}")


def fits(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is list or origin is list:
        return isinstance(value, list) and all(fits(v, args[0]) for v in value) if args else isinstance(value, list)
    return True  # a type this schema does not know: left to the task


def type_name(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is list:
        plural = {int: "integers", str: "strings", float: "numbers"}.get(args[0], "values") if args else "values"
        return f"a list of {plural}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
            type(None): "null"}.get(hint, str(hint))


def json_type(value) -> str:
    if value is None:
        return "nothing (missing or null)"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def read_head_weights(path: Path) -> dict:
    """A head's tensors from its safetensors file (a missing, truncated or corrupt file is a UserError)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise UserError(f"{path}: missing head weights")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable safetensors file ({first_line(exc)})") from None


def check_head_weights(state: dict, expected: dict, path: Path, hint: str = "") -> None:
    """The file's tensors are exactly the head's, with the head's shapes."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = ([f"missing {', '.join(missing[:3])}"] if missing else []) + (
            [f"unexpected {', '.join(unexpected[:3])}"] if unexpected else [])
        raise UserError(f"{path}: tensors do not match the head the manifest describes ({'; '.join(parts)})")
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise UserError(f"{path}: {key} has shape {list(state[key].shape)} but the manifest's spec{hint} "
                            f"makes {list(tensor.shape)}")
