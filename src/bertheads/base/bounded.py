"""JSON and YAML read with bounds: a file from someone else (a model folder's JSON files, a config
file, a search space) can hold a few kilobytes that expand to gigabytes (YAML aliases of aliases)
or nest deeper than Python's parsers recurse. Each bound crossed is one `UserError` line naming
the file, checked before the data is built.

The limits, far above any file bertheads writes or a person types:

- JSON of a model folder (`bertheads.json`, `metrics.json`, `onnx/export.json`, `gate.json`):
  at most `MAX_JSON_BYTES` (64 MiB) and `MAX_DEPTH` (64) levels of nesting;
- YAML (and TOML) config files: at most `MAX_CONFIG_BYTES` (16 MiB), `MAX_DEPTH` levels,
  `MAX_ALIASES` (100) aliases (`*name`) and `MAX_NODES` (100,000) values once every alias is
  counted as the copy it stands for (a "billion laughs" file is refused at composing, in
  milliseconds, before anything is built from it).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from bertheads.base.errors import UserError, where

MAX_JSON_BYTES = 64 << 20
MAX_CONFIG_BYTES = 16 << 20
MAX_DEPTH = 64
MAX_ALIASES = 100
MAX_NODES = 100_000


def too_deep(value, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` (parsed JSON) nests lists and objects deeper than `limit` levels."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def parse_json(text: str, at: str):
    """JSON text parsed with the depth bound; malformed or too deep: one line starting with `at`."""
    deep = UserError(f"{at}: JSON nested too deeply (more than {MAX_DEPTH} levels)")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{at}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    except RecursionError:
        raise deep from None
    if too_deep(value):
        raise deep
    return value


def read_json(path: str | Path):
    """A JSON file of a model folder, decoded strictly as UTF-8, within the size and depth bounds."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise UserError(f"{path}: {size:,} bytes, more than the {MAX_JSON_BYTES:,} a model folder's JSON file "
                            f"may hold")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_json(text, str(path))


class Bound(Exception):
    """A bound crossed while reading YAML (`mark`: where)."""

    def __init__(self, what: str, mark=None) -> None:
        super().__init__(what)
        self.what, self.mark = what, mark


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts aliases and nesting as it composes."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self.aliases = 0
        self.depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise Bound(f"more than {MAX_ALIASES} aliases (*name)", self.peek_event().start_mark)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise Bound(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def expanded_size(node, sizes: dict) -> int:
    """Values under `node` with each alias counted as a copy of what it names (`sizes`: by node)."""
    key = id(node)
    if key not in sizes:
        if isinstance(node, yaml.SequenceNode):
            sizes[key] = 1 + sum(expanded_size(n, sizes) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            sizes[key] = 1 + sum(expanded_size(k, sizes) + expanded_size(v, sizes) for k, v in node.value)
        else:
            sizes[key] = 1
    return sizes[key]


def key_lines(node, prefix: tuple = ()) -> dict[tuple, int]:
    """Line number of every mapping key in a composed YAML tree, by its path."""
    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, str(key.value))
            lines[path] = key.start_mark.line + 1
            lines.update(key_lines(value, path))
    return lines


def read_yaml(text: str, path) -> tuple[object, dict[tuple, int]]:
    """YAML text's data and the line of each key (`key_lines`), within the bounds; malformed or
    over a bound: one line naming `path` (and the line)."""
    if len(text) > MAX_CONFIG_BYTES:
        raise UserError(f"{where(path)}: {len(text):,} characters, more than the {MAX_CONFIG_BYTES:,} a config file "
                        f"may hold")
    loader = BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and expanded_size(node, {}) > MAX_NODES:
            raise Bound(f"more than {MAX_NODES:,} values once its aliases are expanded")
        data = loader.construct_document(node) if node is not None else None
    except Bound as exc:
        line = exc.mark.line + 1 if exc.mark is not None else None
        raise UserError(f"{where(path, line)}: refused: {exc.what} (a config file this large or deep is not "
                        f"read)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{where(path, mark.line + 1 if mark else None)}: malformed YAML ({problem})") from None
    finally:
        loader.dispose()
    return data, key_lines(node)
