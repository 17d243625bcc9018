"""The training flags, derived from the settings dataclasses (`training.settings`) and each
kind's spec (its fields declared with `setting`): `bertheads train KIND`, `train multi` and
`tune KIND` build their parsers from here, and config files and keyword arguments are checked
and converted against the same fields."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from bertheads.base.errors import UserError
from bertheads.base.schema import add_flags, check_given, convert, default_of, names, settings_of, vars_for
from bertheads.saved.bundle import task_class
from bertheads.tasks import TASKS
from bertheads.training.settings import HeadOptions, RunSettings, TrainSettings, spec_name

# the groups of settings every `bertheads train` command takes, in the order of their flags
SETTING_GROUPS = (RunSettings, TrainSettings, HeadOptions)
# training flags that are head settings: on the command line they apply to every task
HEAD_FLAGS = tuple(names(HeadOptions))


def accept_layer_lists(parser: argparse.ArgumentParser) -> None:
    """Let `--layers -1,-2,-3,-4` parse: argparse reads only plain negative numbers as values."""
    parser._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+(,\s*-?\d+)+$")


def add_training_flags(p: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None, *,
                       suppress: bool = False, **more) -> None:
    """The flags every `bertheads train` command takes, from `SETTING_GROUPS` (`defaults`: a
    kind's). With `suppress`, flags not given leave no value."""
    add_flags(p, SETTING_GROUPS, {**(defaults or {}), **more}, suppress=suppress)
    accept_layer_lists(p)


def add_kind_flags(p: argparse.ArgumentParser, kind: str, *, suppress: bool = False) -> None:
    """A kind's own flags (its spec's settings) and the training flags with the kind's defaults.
    With `suppress`, flags not given leave no value (`--help` still shows the defaults)."""
    add_flags(p, task_class(kind).spec_type, suppress=suppress)
    add_training_flags(p, training_defaults(kind), suppress=suppress)


def settings_from(args: argparse.Namespace, base: TrainSettings | None = None) -> TrainSettings:
    """The training settings given on a command line (over `base`, or the defaults)."""
    return dataclasses.replace(base or TrainSettings(), **vars_for(TrainSettings, args))


def own_options(kind: str) -> dict[str, dataclasses.Field]:
    """name -> field of a kind's own settings (its spec's)."""
    return settings_of(task_class(kind).spec_type)


def kind_options(kind: str) -> dict[str, dataclasses.Field]:
    """name -> field of what one task of `kind` takes: the head options and its own settings."""
    return {**settings_of(HeadOptions), **own_options(kind)}


def kind_defaults(kind: str) -> dict:
    """The defaults of a kind's per-task options: a head option's is the kind's spec value of
    that setting where the spec has one (qa's max_length 384), else the option's own."""
    spec = {f.name: default_of(f) for f in dataclasses.fields(task_class(kind).spec_type)}
    held = {n: spec[spec_name(n)] for n in names(HeadOptions)
            if spec_name(n) in spec and n not in ("layers", "mode")}
    # (the spec holds layers parsed, the flag their text; a run's mode is auto until the data is read)
    return {**{n: default_of(f) for n, f in kind_options(kind).items()}, **held}


def training_defaults(kind: str) -> dict:
    """What `bertheads train KIND`'s flags default to: the kind's per-task defaults and its own
    training defaults (qa: batches of 16)."""
    return {**kind_defaults(kind), **task_class(kind).parts.modeling.training_defaults}


def task_options(args: argparse.Namespace, kind: str) -> dict:
    """The task's settings given on a command line: the kind's own flags and the head options."""
    known = set(kind_options(kind))
    return {k: v for k, v in vars(args).items() if k in known}


def convert_options(kind: str, options: Mapping[str, Any], at: str = "", fail=None) -> dict:
    """A task's options checked (old names replaced, unknown ones refused with a suggestion) and
    each value converted like its flag; `fail(name, message)` reports a problem (default: a
    UserError prefixed `at`)."""
    fields = kind_options(kind)
    options = check_given(options, fields, of=f" for a {kind} task", at=at, fail=fail)

    def report(name: str, message: str) -> None:
        if fail is not None:
            fail(name, message)
        raise UserError(f"{at + ': ' if at else ''}{name}: {message}")

    return {k: convert(fields[k], v, lambda msg, k=k: report(k, msg)) for k, v in options.items()}


FIELDS = {f.name: f for cls in SETTING_GROUPS for f in dataclasses.fields(cls)}


def given_settings(args: argparse.Namespace, kind: str | None = None) -> dict:
    """The settings a command line gave (its flags built with `suppress`): training, run and
    head settings, and the kind's own options."""
    known = {n for cls in SETTING_GROUPS for n in names(cls)}
    if kind in TASKS:
        known |= set(own_options(kind))
    return {k: v for k, v in vars(args).items() if k in known}
