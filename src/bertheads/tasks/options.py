"""What `predict`, `evaluate` and the server may give a head besides its inputs: the spec
settings a command may override (declared with `at`), and the call options of the kind
(`Parts.options`). A task's `options` (an `Options`) checks and applies them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from bertheads.base import schema
from bertheads.base.errors import UserError
from bertheads.base.values import fraction
from bertheads.tasks.registry import TASKS


def option(default: Any = None, help: str = "", *, at: tuple[str, ...] = schema.INFERENCE_COMMANDS, **kwargs) -> Any:
    """A call option of a kind's heads (a `schema.setting` of its `options_type`): the commands
    whose flag it is (`at`); it is passed on to `read`, `from_inputs`, `decode` and `metrics` as
    a keyword. (A spec field with `at` is an override of the saved value instead.)"""
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


class Options:
    """A head's inference options: checked like their flags, applied for good (`set`) or for
    one call (`using`)."""

    def __init__(self, task) -> None:
        self.task = task
        self.fixed: dict[str, Any] = {}  # call options set for good (`set`)

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

    def overrides(self, name: str) -> bool:
        return overrides(type(self.task), name)

    def set(self, **given: Any) -> None:
        """Options for every later prediction of this head: spec overrides replace the saved
        values, the others are passed to each call (a call's own keywords win)."""
        for name, value in self.check(given).items():
            if self.overrides(name):
                setattr(self.task.spec, name, value)
            else:
                self.fixed[name] = value

    @contextmanager
    def using(self, given: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """For one call: the spec overrides among `given` applied (the saved values come back
        after), the keyword options to pass on (the fixed ones, then `given`'s) yielded."""
        options = self.check(given)
        changed = {n: v for n, v in options.items() if self.overrides(n)}
        spec = self.task.spec
        saved = {n: getattr(spec, n) for n in changed}
        for name, value in changed.items():
            setattr(spec, name, value)
        try:
            yield {**self.fixed, **{n: v for n, v in options.items() if n not in changed}}
        finally:
            for name, value in saved.items():
                setattr(spec, name, value)
