"""The training flags, derived from the settings dataclasses (`training.settings`) and each
kind's `add_arguments`: `bertheads train KIND`, `train multi` and `tune KIND` build their
parsers from here, and config files and keyword arguments are checked against the same
definitions."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
from collections.abc import Mapping
from typing import Any

from bertheads.base.schema import (
    DeprecatedFlag,
    add_flags,
    check_names,
    convert,
    convert_value,
    names,
    new_names,
    vars_for,
)
from bertheads.base.values import fraction, non_negative_float, positive_float, positive_int  # noqa: F401 (re-exported)
from bertheads.saved.bundle import task_class
from bertheads.tasks import TASKS
from bertheads.training.settings import HeadOptions, RunSettings, TrainSettings

# the groups of settings every `bertheads train` command takes, in the order of their flags
SETTING_GROUPS = (RunSettings, TrainSettings, HeadOptions)
# training flags that are head settings: on the command line they apply to every task
HEAD_FLAGS = tuple(names(HeadOptions))


class ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """`(default: X)` after each flag's help, except where there is no default to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        default = action.default
        if default is argparse.SUPPRESS:  # a flag whose value is left unset unless given (see add_flags)
            default = getattr(action, "shown_default", None)
        if default in (None, False) or action.nargs == 0 or "default" in (action.help or ""):
            return action.help or ""
        if default is action.default:
            return super()._get_help_string(action)
        return f"{action.help} (default: {str(default).replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """argparse with defaults in `--help` and one-line errors (`bertheads: error: ...`, exit 2)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", ShowDefaults)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if message.startswith("unrecognized arguments:"):
            unknown = [word.split("=")[0] for word in message.split(":", 1)[1].split() if word.startswith("--")]
            known = all_flags(self)
            message += "".join(f" ({flag}: did you mean {close}?)" for flag in unknown
                               if (close := suggest_flag(flag, known)))
        self.exit(2, f"bertheads: error: {message} (see {self.prog} --help)\n")


def all_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its commands' parsers, all the way down."""
    flags: set[str] = set()
    for action in parser._actions:
        flags.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                flags |= all_flags(sub)
    return flags


def suggest_flag(flag: str, known: set[str]) -> str | None:
    close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.75)
    return close[0] if close else None


def accept_layer_lists(parser: argparse.ArgumentParser) -> None:
    """Let `--layers -1,-2,-3,-4` parse: argparse reads only plain negative numbers as values."""
    parser._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+(,\s*-?\d+)+$")


def add_training_flags(p: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None, *,
                       suppress: bool = False, **more) -> None:
    """The flags every `bertheads train` command takes, from `SETTING_GROUPS` (`defaults`: a
    kind's `training_defaults`). With `suppress`, flags not given leave no value."""
    add_flags(p, SETTING_GROUPS, {**(defaults or {}), **more}, suppress=suppress)
    accept_layer_lists(p)


def settings_from(args: argparse.Namespace, base: TrainSettings | None = None) -> TrainSettings:
    """The training settings given on a command line (over `base`, or the defaults)."""
    return dataclasses.replace(base or TrainSettings(), **vars_for(TrainSettings, args))


def task_options(args: argparse.Namespace, kind: str) -> dict:
    """The task's settings given on a command line: the kind's own flags and the head options."""
    known = set(kind_options(kind))
    return {k: v for k, v in vars(args).items() if k in known}


def kind_parser(kind: str | None = None) -> argparse.ArgumentParser:
    """The flags of `bertheads train KIND` (their defaults are the kind's defaults); the generic
    training flags alone for None."""
    parser = argparse.ArgumentParser(add_help=False)
    if kind is None:
        add_training_flags(parser)
        return parser
    cls = task_class(kind)
    cls.add_arguments(parser)
    add_training_flags(parser, cls.training_defaults)
    return parser


def actions_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """dest -> action of a parser's flags (deprecated spellings left out)."""
    return {a.dest: a for a in parser._actions if a.dest != "help" and not isinstance(a, DeprecatedFlag)}


def own_options(kind: str) -> dict[str, argparse.Action]:
    """dest -> action of the flags a kind's `add_arguments` declares."""
    parser = argparse.ArgumentParser(add_help=False)
    task_class(kind).add_arguments(parser)
    return actions_of(parser)


def kind_options(kind: str) -> dict[str, argparse.Action]:
    """Per-task option name -> its argparse action (type, choices): the kind's own flags and
    the head options."""
    actions = actions_of(kind_parser(kind))
    allowed = set(own_options(kind)) | set(HEAD_FLAGS)
    return {dest: a for dest, a in actions.items() if dest in allowed}


def kind_defaults(kind: str) -> dict:
    """The defaults of a kind's per-task options."""
    options = kind_options(kind)
    return {k: v for k, v in vars(kind_parser(kind).parse_args([])).items() if k in options}


def check_options(kind: str, options: Mapping[str, Any], at: str = "", what: str | None = None) -> dict:
    """A task's options with old names replaced (with a warning); unknown ones refused with the
    closest known one suggested."""
    options = new_names(options, HeadOptions, at)
    check_names(options, kind_options(kind), what or f"setting for a {kind} task", at)
    return dict(options)


FIELDS = {f.name: f for cls in SETTING_GROUPS for f in dataclasses.fields(cls)}


def option_value(action: argparse.Action, value, fail):
    """A config value checked and converted like the command-line flag it stands for."""
    if value is None:
        return None
    if action.dest in FIELDS:
        return convert(FIELDS[action.dest], value, fail)
    boolean = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                  argparse.BooleanOptionalAction))
    return convert_value({"type": action.type or str, "choices": action.choices}, boolean, value, fail)


def add_kind_flags(p: argparse.ArgumentParser, kind: str, *, suppress: bool = False) -> None:
    """A kind's own flags (its `add_arguments`) and the training flags with the kind's defaults.
    With `suppress`, flags not given leave no value (`--help` still shows the defaults)."""
    cls = task_class(kind)
    before = len(p._actions)
    cls.add_arguments(p)
    if suppress:
        for action in p._actions[before:]:
            action.shown_default = action.default
            if action.help and "%(default)" in action.help:
                action.help = action.help.replace("%(default)s", str(action.default))
            action.default = argparse.SUPPRESS
    add_training_flags(p, cls.training_defaults, suppress=suppress)


def given_settings(args: argparse.Namespace, kind: str | None = None) -> dict:
    """The settings a command line gave (its flags built with `suppress`): training, run and
    head settings, and the kind's own options."""
    known = {n for cls in SETTING_GROUPS for n in names(cls)}
    if kind in TASKS:
        known |= set(own_options(kind))
    return {k: v for k, v in vars(args).items() if k in known}
