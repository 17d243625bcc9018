"""What `predict`, `evaluate` and the server may give a head besides its inputs: the spec
settings a command may override (declared with `at`), and the call options of the kind
(`Parts.options`). A task's `options` (an `Options`) checks and applies them."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from bertheads.base import schema
from bertheads.base.errors import UserError
from bertheads.base.values import fraction
from bertheads.tasks.registry import TASKS


def option(default: Any = None, help: str = "", *, at: tuple[str, ...] = schema.INFERENCE_COMMANDS, **kwargs) -> Any:
    """A call option of a kind's heads (a `schema.setting` of its `Parts.options`): the commands
    whose flag it is (`at`); the parts read it from `task.options.values`. (A spec field with
    `at` is an override of the saved value instead.)"""
    return schema.setting(default, help, at=at, **kwargs)


@dataclass
class NoOptions:
    """The call options of a kind that has none."""


@dataclass
class ScoreOptions:
    """The call options every kind takes, about what its scores mean (`Judging`)."""

    min_confidence: float | None = option(None, "abstain below this confidence: a prediction whose top score "
                                                "(after calibration) is below P says \"abstained\": true beside "
                                                "its label and scores", type=fraction, metavar="P",
                                          at=("predict", "analyze", "serve"))
    target_accuracy: float | None = option(None, "also print the confidence threshold at which the head reaches "
                                                 "accuracy A on the data, and the share of inputs it then answers",
                                           type=fraction, metavar="A", at=("evaluate",))


def option_fields(kind: type) -> dict[str, dataclasses.Field]:
    """name -> field of what predict, evaluate and serve may give a kind's heads: the spec's
    settings that such a command may override (`at`), then the call options (`parts.options`)."""
    overrides = {n: f for n, f in schema.settings_of(kind.spec_type).items() if f.metadata.get("at")}
    return {**overrides, **schema.settings_of(ScoreOptions), **schema.settings_of(kind.parts.options)}


def overrides(kind: type, name: str) -> bool:
    """Whether option `name` of `kind` overrides the saved spec value (else it is a call's keyword)."""
    return name in {f.name for f in fields(kind.spec_type)}


@functools.cache
def values_type(kind: type) -> type:
    """The typed object a kind's heads read their call options from: its `Parts.options`
    dataclass with `ScoreOptions`' fields beside its own."""
    own = kind.parts.options
    if issubclass(own, ScoreOptions):
        return own
    return dataclasses.make_dataclass(f"{kind.__name__}Options", [], bases=(own, ScoreOptions))


class Options:
    """A head's inference options, bound to it: the spec settings a command overrides live in
    its spec, the call options in `values` (typed: `values_type`), which the parts read
    (`self.task.options.values.min_confidence`). `set` binds options for every later call;
    `bind` gives a task for one call, the head shared, nothing of this one changed."""

    def __init__(self, task, values: Any = None) -> None:
        self.task = task
        self.values = values if values is not None else values_type(type(task))()

    def declared(self) -> dict[str, dataclasses.Field]:
        """The inference options of this head's kind (as registered)."""
        return option_fields(TASKS.get(self.task.kind, type(self.task)))

    def check(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """`given` (None values dropped) checked and converted like their flags; a name another
        kind declares is refused as "FLAG is for KIND heads", any other unknown name with the
        closest known one suggested."""
        own = self.declared()
        out = {}
        for name, value in given.items():
            if value is None:
                continue
            if name not in own:
                raise UserError(self.unknown(name, own))
            f = own[name]

            def fail(message: str, f=f, value=value) -> None:  # named as the caller wrote it
                shown = f"{schema.flag_of(f)} {value}" if schema.FACE.get() == "cli" else schema.said(f.name, value)
                raise UserError(f"{shown}: {message}")
            out[name] = schema.convert(f, value, fail)
        return out

    def unknown(self, name: str, own: Mapping[str, Any]) -> str:
        """Why `name` is no option of this head: another kind's, or a misspelling."""
        kind = self.task.kind
        others = {k: option_fields(cls) for k, cls in TASKS.items() if k != kind}
        takers = [k for k, fs in others.items() if name in fs]
        if takers:
            shown = schema.said(name, flag=schema.flag_of(others[takers[0]][name]))
            return f"{shown} is for {' or '.join(takers)} heads, not {kind}"
        known = list(own) or [n for fs in others.values() for n in fs]
        return schema.unknown_name(name, own, "option", also=known)

    def split(self, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """`given` checked, as (spec overrides, call options)."""
        checked = self.check(given)
        kind = type(self.task)
        return ({n: v for n, v in checked.items() if overrides(kind, n)},
                {n: v for n, v in checked.items() if not overrides(kind, n)})

    def set(self, **given: Any) -> None:
        """Options for every later prediction of this head: spec overrides replace the saved
        values, call options the bound ones (a call's own options win over both)."""
        overrides, calls = self.split(given)
        for name, value in overrides.items():
            setattr(self.task.spec, name, value)
        self.values = dataclasses.replace(self.values, **calls)

    def bind(self, given: Mapping[str, Any] | None = None, quiet: bool = False):
        """This head's task for one call with `given` bound over the options set: the spec a
        copy with the overrides, the call options typed; the head is shared. `quiet`: call
        options that write files of their own (`option(..., writes=True)`) left unset."""
        overrides, calls = self.split(given or {})
        values = dataclasses.replace(self.values, **calls)
        if quiet:
            values = dataclasses.replace(values, **{f.name: f.default for f in fields(values)
                                                    if f.metadata.get("writes")})
        if not overrides and values == self.values:
            return self.task
        spec = copy.copy(self.task.spec)
        for name, value in overrides.items():
            setattr(spec, name, value)
        bound = type(self.task)(spec, self.task.head)
        bound.options.values = values
        return bound
