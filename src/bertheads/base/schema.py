"""One settings schema: a group of settings is a dataclass whose fields carry their help, value
type and flag; the command-line flags, the config file's fields and the Python keyword arguments
are all derived from it, and an unknown name is refused with the closest known one suggested.

```
@dataclass
class Serving:
    port: int = setting(8000, "TCP port", type=positive_int)
    verbose: bool = setting(False, "log every request")

add_flags(parser, Serving)                 # --port PORT, --verbose
Serving(**vars_for(Serving, args))         # from parsed flags
from_mapping(Serving, {"prot": 1}, "f.yaml")  # f.yaml: unknown setting 'prot' (did you mean 'port'?)
```
Written here rather than taken from a library (pydantic, simple-parsing) because the rules are
ours: argparse types that raise one-line errors, config values converted like their flags, and
the suggestion in the message.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import difflib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from bertheads.base.errors import UserError

MISSING = dataclasses.MISSING
INFERENCE_COMMANDS = ("predict", "evaluate", "serve")  # the commands that take a head's inference options (`at`)


def setting(default: Any = MISSING, help: str = "", *, type: Callable | None = None,
            choices: Iterable | None = None, flag: str | None = None, metavar: str | None = None,
            cli: bool = True, factory: Callable | None = None, negate: bool = False, toggle: bool = False,
            aliases: Iterable[str] = (), group: str | None = None, tags: Iterable[str] = (),
            append: bool = False, coerce: Callable | None = None, after: str | None = None,
            at: Iterable[str] = (), positional: bool = False, required: bool = False, nargs: str | None = None,
            short: str | None = None, exclusive: str | None = None, extra: Mapping[str, Any] | None = None) -> Any:
    """A dataclass field with what its flag needs: `help`, a value `type` (an argparse type
    that raises `ArgumentTypeError`), `choices`, the `flag` (default `--name-with-dashes`),
    `cli=False` for settings only Python and config files give, `negate` for a True-by-default
    bool shown as `--no-NAME`, `toggle` for a bool given as `--NAME` or `--no-NAME`. `aliases`: deprecated flag spellings (`--old-name`), still
    read with a warning, as are their names in config files and keyword arguments; `group`:
    the `--help` section; `tags`: what the setting is to its users (see `tagged`); `append`: a
    repeatable flag collecting a list; `coerce`: turns a config value (a list, a number) into
    the text the flag's `type` reads; `after`: the flag is listed after that field's (of any
    of the classes `add_flags` is given); `at`: the prediction commands (predict, evaluate,
    serve) that take it too, as an override of a saved head's value or a call's option;
    `positional`: an argument, not a flag; `required`, `nargs`; `short`: a one-letter flag
    (`-v`) besides the long one; `exclusive`: flags of one name exclude each other; `extra`:
    more metadata for the group's own use."""
    meta = {**(extra or {}), "at": tuple(at), "help": help, "type": type, "choices": tuple(choices) if choices is not None else None,
            "flag": flag, "metavar": metavar, "cli": cli, "negate": negate, "toggle": toggle, "aliases": tuple(aliases),
            "group": group, "tags": frozenset(tags), "append": append, "coerce": coerce,
            "after": after, "positional": positional, "required": required, "nargs": nargs, "short": short,
            "exclusive": exclusive}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def settled(default: Any = MISSING, *, factory: Callable | None = None, tags: Iterable[str] = ()) -> Any:
    """A field that is no setting but a value a run settles (a head's labels), with `tags`."""
    meta = {"tags": frozenset(tags)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def is_setting(f: dataclasses.Field) -> bool:
    """A field declared with `setting` (a dataclass may also hold values that are no setting)."""
    return "help" in f.metadata


def settings_of(cls) -> dict[str, dataclasses.Field]:
    """name -> field of the settings of `cls` (its fields declared with `setting`)."""
    return {f.name: f for f in dataclasses.fields(cls) if is_setting(f)}


def flag_of(f: dataclasses.Field) -> str:
    meta = f.metadata
    if meta.get("flag"):
        return meta["flag"]
    return ("--no-" if meta.get("negate") else "--") + f.name.replace("_", "-")


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def is_bool(f: dataclasses.Field) -> bool:
    return f.type in (bool, "bool")


def is_optional_bool(f: dataclasses.Field) -> bool:
    """A `bool | None` field: true, false, or not given (an override of a saved value)."""
    return f.type in ("bool | None", "Optional[bool]", bool | None)


def tagged(cls, tag: str) -> tuple[str, ...]:
    """The names of the fields of `cls` that carry `tag`."""
    return tuple(f.name for f in dataclasses.fields(cls) if tag in f.metadata.get("tags", ()))


FACE: contextvars.ContextVar[str] = contextvars.ContextVar("bertheads_face", default="python")
"""Who is calling: "python" (the API, the default), "cli" (set by `cli/main.py`) or "mlflow" (an
MLflow model's predict, `serve/pyfunc.py`); messages name a setting as that caller writes it (`said`)."""


@contextlib.contextmanager
def speaking(face: str) -> Iterator[None]:
    """Messages within name settings as `face` ("python", "cli", "mlflow") writes them: how a
    worker of another process (Ray's) speaks to the face that started the job."""
    token = FACE.set(face)
    try:
        yield
    finally:
        FACE.reset(token)


def said(name: str, value: Any = MISSING, flag: str | None = None) -> str:
    """A setting as the caller names it: `--label-column` (or `--max-length 512`) on the command
    line, `label_column=` (or `max_length=512`) from Python. `name` is the field's name, or a
    flag (`--label-column`), which is turned into the field's; `flag`: the field's own flag
    where it is not `--name` (a tag head's `head_type` is `--head`)."""
    name = name.lstrip("-").replace("-", "_")
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if FACE.get() == "mlflow":  # what an MLflow model's predict keeps: a `params` entry (saved/mlmodel.py)
        return f"params={{{name!r}: ...}}" if value is MISSING else f"params={{{name!r}: {value!r}}}"
    if FACE.get() == "cli":
        if flag and isinstance(value, bool):
            return flag
        if isinstance(value, bool):  # a switch: --name, --no-name
            return "--" + ("" if value else "no-") + name.replace("_", "-")
        flag = flag or "--" + name.replace("_", "-")
        return flag if value is MISSING else f"{flag} {value}"
    return f"{name}=" if value is MISSING else f"{name}={value!r}"


def warn(message: str) -> None:
    """One line on stderr: `bertheads: warning: MESSAGE`."""
    print(f"bertheads: warning: {message}", file=sys.stderr)


class DeprecatedFlag(argparse.Action):
    """An old spelling of a flag: stores into the new flag's dest after a warning."""

    def __init__(self, option_strings, dest, new: str = "", flag_value: Any = None, **kwargs) -> None:
        self.new, self.flag_value = new, flag_value
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        warn_renamed(option_string, self.new)
        setattr(namespace, self.dest, self.flag_value if self.nargs == 0 else values)


def ordered_fields(classes: Iterable) -> list[dataclasses.Field]:
    """The fields of several classes in the order their flags are listed (see `after`)."""
    fields = [f for c in classes for f in dataclasses.fields(c)]
    out = [f for f in fields if not f.metadata.get("after")]
    for f in fields:
        if f.metadata.get("after"):
            at = next((i for i, g in enumerate(out) if g.name == f.metadata["after"]), len(out) - 1)
            out.insert(at + 1, f)
    return out


def add_flags(parser, cls, defaults: Mapping[str, Any] | None = None, skip: Iterable[str] = (),
              only: Iterable[str] | None = None, suppress: bool = False, required: Iterable[str] = (),
              choices: Mapping[str, Iterable] | None = None) -> None:
    """One flag (or argument) for each command-line field of `cls` (a class, or a tuple of
    classes whose flags are listed together; `defaults` override the dataclass's), in the
    argument group its `group` names. `only` may name fields that are otherwise no flag
    (`cli=False`); `required`: fields this command requires; `choices`: a field's choices known
    only now (a registry's). With `suppress`, a flag not given
    leaves no value (so what was given can be told from the defaults); `--help` still shows
    the default."""
    defaults = dict(defaults or {})
    skip, only, required = set(skip), set(only) if only is not None else None, set(required)
    groups = {g.title: g for g in getattr(parser, "_action_groups", [])}
    exclusive: dict[str, Any] = {}
    for f in ordered_fields(cls if isinstance(cls, tuple) else (cls,)):
        meta = f.metadata
        wanted = f.name in only if only is not None else meta.get("cli", True)
        if not is_setting(f) or not wanted or f.name in skip:
            continue
        default = defaults.get(f.name, default_of(f))
        target = parser
        if meta.get("group") and hasattr(parser, "add_argument_group"):
            target = groups.get(meta["group"]) or parser.add_argument_group(meta["group"])
            groups[meta["group"]] = target
        if meta.get("exclusive"):
            if meta["exclusive"] not in exclusive:
                exclusive[meta["exclusive"]] = target.add_mutually_exclusive_group()
            target = exclusive[meta["exclusive"]]
        kwargs: dict[str, Any] = {"help": meta.get("help", "")}
        shown = default
        if is_bool(f) and meta.get("toggle"):
            kwargs["action"] = argparse.BooleanOptionalAction
            shown = None
        elif is_bool(f):
            kwargs["action"] = "store_false" if meta.get("negate") else "store_true"
            shown = False  # a switch has no default to show
        elif meta.get("append"):
            kwargs["action"] = "append"
            shown = None
        if not is_bool(f):
            for key in ("type", "choices", "metavar", "nargs"):
                if meta.get(key) is not None:
                    kwargs[key] = meta[key]
            if choices and f.name in choices:
                kwargs["choices"] = tuple(choices[f.name])
        if meta.get("positional"):
            action = target.add_argument(f.name, **kwargs)
            action.shown_default, action.setting = None, f
            continue
        kwargs["dest"] = f.name
        if meta.get("required") or f.name in required:
            kwargs["required"] = True
        kwargs["default"] = argparse.SUPPRESS if suppress else (None if meta.get("append") else default)
        spellings = [meta["short"]] if meta.get("short") else []
        action = target.add_argument(*spellings, flag_of(f), **kwargs)
        action.shown_default, action.setting = shown, f
        for old in meta.get("aliases", ()):
            extra = {k: kwargs[k] for k in ("type", "choices", "metavar") if k in kwargs}
            if is_bool(f):
                extra.update(nargs=0, flag_value=not meta.get("negate"))
            alias = target.add_argument(old, action=DeprecatedFlag, new=flag_of(f), dest=f.name,
                                        default=argparse.SUPPRESS, help=argparse.SUPPRESS, **extra)
            alias.setting = f


def add_override_flags(parser, fields: Iterable[dataclasses.Field], helps: Mapping[str, str] | None = None) -> None:
    """One flag per field, each defaulting to None (not given: the saved value stands); a
    `bool | None` field gets `--NAME` and `--no-NAME`. `helps`: a field's help for this use."""
    for f in fields:
        meta = f.metadata
        kwargs: dict[str, Any] = {"dest": f.name, "help": (helps or {}).get(f.name, meta.get("help", "")),
                                  "default": None}
        if is_bool(f) or is_optional_bool(f):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            for key in ("type", "choices", "metavar"):
                if meta.get(key) is not None:
                    kwargs[key] = meta[key]
        parser.add_argument(flag_of(f), **kwargs).setting = f


def vars_for(cls, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of `cls` found in parsed flags."""
    given = vars(args)
    out = {n: given[n] for n in names(cls) if n in given}
    for f in dataclasses.fields(cls):
        if f.metadata.get("append") and f.name in out and out[f.name] is None:
            out[f.name] = default_of(f)  # a repeatable flag not given: the field's (empty) default
    return out


# -- renamed settings: the one alias table and rule ------------------------------------------
def renamed(*groups) -> dict[str, str]:
    """The alias table: old name -> new name of every renamed setting of `groups` (dataclasses,
    or mappings of name -> field), from the old flags its `aliases` list."""
    return {old.lstrip("-").replace("-", "_"): f.name for f in known_fields(*groups).values() if f is not None
            for old in f.metadata.get("aliases", ())}


def warn_renamed(old: str, new: str, at: str = "") -> None:
    """The one warning line of an old name read as its new one (a flag, a key, a keyword)."""
    warn(f"{at + ': ' if at else ''}{old} is deprecated; use {new}")


def new_name(name: str, renames: Mapping[str, str], given: Iterable[str] = (), known: Iterable[str] = (),
             at: str = "") -> str:
    """The alias rule for a key or keyword: an old name of a renamed setting (`renames`, see
    `renamed`) is read as its new name, with one warning line, unless it is a `known` name
    itself or the new name is `given` too (then it stays, and is refused as unknown)."""
    new = renames.get(name)
    if new is None or name in known or new in given:
        return name
    warn_renamed(repr(name), repr(new), at)
    return new


def new_names(data: Mapping[str, Any], *groups, at: str = "") -> dict[str, Any]:
    """`data` with the old names of renamed settings of `groups` read as the new ones (`new_name`)."""
    renames = renamed(*groups)
    return {new_name(key, renames, data, at=at): value for key, value in data.items()}


def closest(name: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name most like `name` (difflib's ratio at least `cutoff`), or None."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def suggest(name: str, known: Iterable[str]) -> str:
    """" (did you mean 'CLOSE'?)" when a known name is close to `name`, else ""."""
    close = closest(name, known)
    return f" (did you mean {close!r}?)" if close else ""


def unknown_name(name: str, known: Iterable[str], what: str = "setting", *, of: str = "",
                 also: Iterable[str] = (), says: str | None = None, then: str = "") -> str:
    """The one line that refuses a name: "unknown WHAT 'NAME'OF (did you mean 'CLOSE'?)", the
    closest of `known` suggested (else the closest of `also`); `says` stands for "unknown WHAT
    'NAME'" where a check words it otherwise, `then` follows the suggestion."""
    return f"{says or f'unknown {what} {name!r}'}{of}{suggest(name, known) or suggest(name, also)}{then}"


def check_name(name: str, known: Iterable[str], what: str = "setting", *, of: str = "", at: str = "",
               fail: Callable[[str], None] | None = None) -> str:
    """The one check of a name against the `known` ones: `name` back when it is known, else
    `unknown_name`'s line given to `fail`, or raised as a UserError prefixed `at`."""
    known = list(known)
    if name in known:
        return name
    message = unknown_name(name, known, what, of=of)
    if fail is not None:
        fail(message)
    raise UserError(f"{at}: {message}" if at else message)


def known_fields(*groups) -> dict[str, dataclasses.Field | None]:
    """name -> field of every setting of `groups` (dataclasses, or mappings of name -> field;
    None for a name that is no setting but may be given, like a config's `tasks`)."""
    out: dict[str, dataclasses.Field] = {}
    for group in groups:
        out.update(group if isinstance(group, Mapping) else settings_of(group))
    return out


def check_given(given: Mapping[str, Any], *groups, what: str = "setting", of: str = "", at: str = "",
                fail: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """The one check of a mapping of setting names (keyword arguments, a config section, a
    command line's values) against the settings of `groups`: old names of renamed settings
    replaced (with a warning), a name no group declares refused with the closest known one
    suggested (`of`: whose, " for a tag task"; `fail(name, message)` reports it where given,
    else a UserError prefixed `at`)."""
    fields = known_fields(*groups)
    renames = renamed(*groups)
    out = {}
    for key, value in given.items():
        key = new_name(key, renames, given, fields, at)
        check_name(key, fields, what, of=of, at=at, fail=None if fail is None else lambda m, key=key: fail(key, m))
        out[key] = value
    return out


def check_names(given: Iterable[str], known: Iterable[str], what: str = "setting", at: str = "") -> None:
    """Refuse any name of `given` that is not `known`, suggesting the closest known one."""
    known = list(known)
    for name in given:
        check_name(name, known, what, at=at)


def convert(f: dataclasses.Field, value: Any, fail: Callable[[str], None]) -> Any:
    """A config or keyword value checked and converted like the flag it stands for."""
    if value is None:
        return None
    meta = f.metadata
    if meta.get("coerce") is not None:
        value = meta["coerce"](value)
    if meta.get("append"):
        values = value if isinstance(value, (list, tuple)) else [value]
        return [convert_value(meta, False, v, fail) for v in values]
    return convert_value(meta, is_bool(f) or is_optional_bool(f), value, fail)


def convert_value(meta: Mapping[str, Any], boolean: bool, value: Any, fail: Callable[[str], None]) -> Any:
    if boolean:
        if not isinstance(value, bool):
            fail(f"expected true or false, got {value!r}")
        return value
    kind = meta.get("type")
    if kind is not None:
        if isinstance(value, (dict, list, bool)):
            fail(f"expected a single value, got {value!r}")
        try:
            value = kind(value)
        except argparse.ArgumentTypeError as exc:
            fail(str(exc))
        except (TypeError, ValueError):
            fail(f"expected {getattr(kind, '__name__', 'a value')}, got {value!r}")
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        fail(f"expected one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def from_mapping(cls, data: Mapping[str, Any], at: str = "", base: Any = None):
    """An instance of `cls` from a config section or keyword arguments: unknown names refused
    (with a suggestion), values converted like their flags; fields not given keep `base`'s
    values (or the defaults)."""
    check_names(data, names(cls), at=at)
    fields = {f.name: f for f in dataclasses.fields(cls)}

    def value(name: str, raw: Any) -> Any:
        def fail(message: str) -> None:
            raise UserError(f"{at + ': ' if at else ''}{name}: {message}")
        return convert(fields[name], raw, fail)

    converted = {k: value(k, v) for k, v in data.items()}
    if base is not None:
        return dataclasses.replace(base, **converted)
    return cls(**converted)


def to_dict(obj) -> dict[str, Any]:
    """The settings as plain values (what a saved model and its config file hold)."""
    return dataclasses.asdict(obj)
