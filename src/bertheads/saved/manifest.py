"""The model manifest (`bertheads.json`) read and checked against its schema, and the checks
that tie a model directory's weight files to it.

Every problem is one `UserError` line naming the file and the field: a manifest that is not
UTF-8 or not JSON, fields of the wrong type, a head name that is not a plain name (so it can
never reach outside `DIR/heads/`), head weights whose tensors do not match what the head's
spec builds (for example 3 labels for 2 output rows), and unreadable safetensors files.
"""

from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import fields
from pathlib import Path

from bertheads.base.errors import UserError, first_line
from bertheads.store.guard import MODEL_MANIFEST
from bertheads.tasks import TASKS

MANIFEST = MODEL_MANIFEST  # bertheads.json (the write guard, `store/guard.py`, knows a model by it)
FORMAT_VERSION = 1
# a head name: letters, digits, '_', '.', '-', not starting with '.', '_' or '-' (the same rule as
# multi-task configs and `combine --names`); it is also the head's file name under DIR/heads/
HEAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # \Z: no newline after it
ENCODER_HASH = re.compile(r"^[0-9a-f]{64}\Z")


def load_json(path: Path):
    """A JSON file decoded strictly as UTF-8; malformed or too deeply nested JSON is a UserError."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply") from None


def read_manifest(directory: str | Path) -> dict:
    """The checked manifest of a model directory."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise UserError(f"{directory}: no such model directory")
    if not path.is_file():
        raise UserError(f"{directory}: not a bertheads model (no {MANIFEST})")
    return check_manifest(load_json(path), path)


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
