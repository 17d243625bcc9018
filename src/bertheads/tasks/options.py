"""What `predict`, `evaluate` and the server may give a head besides its inputs: the spec
settings a command may override (declared with `at`), and the call options of the kind's
`options_type`. `Options` is the part of every `Task` that checks and applies them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from bertheads.base import schema
from bertheads.base.errors import UserError
from bertheads.base.values import fraction
from bertheads.tasks.registry import COMMANDS, TASKS


def option(default: Any = None, help: str = "", *, at: tuple[str, ...] = COMMANDS, **kwargs) -> Any:
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


class Options:
    """A head's inference options: checked like their flags, applied for good or for one call."""

    kind: ClassVar[str]
    spec_type: ClassVar[type]
    options_type: ClassVar[type] = NoOptions  # the call options (predict/evaluate/serve flags)
    spec: Any

    @classmethod
    def option_fields(cls) -> dict[str, dataclasses.Field]:
        """name -> field of what predict, evaluate and serve may give this kind's heads: the spec's
        settings that such a command may override (`at`), then the call options (`options_type`)."""
        overrides = {n: f for n, f in schema.settings_of(cls.spec_type).items() if f.metadata.get("at")}
        return {**overrides, **schema.settings_of(ScoreOptions), **schema.settings_of(cls.options_type)}

    @classmethod
    def overrides(cls, name: str) -> bool:
        """Whether option `name` overrides the saved spec value (else it is a call's keyword)."""
        return name in {f.name for f in fields(cls.spec_type)}

    def declared_options(self) -> dict[str, dataclasses.Field]:
        """The inference options of this head's kind (as registered)."""
        return TASKS.get(self.kind, type(self)).option_fields()

    def check_options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """`given` (None values dropped) checked and converted like their flags; a name another
        kind declares is refused as "FLAG is for KIND heads", any other unknown name with the
        closest known one suggested."""
        own = self.declared_options()
        out = {}
        for name, value in given.items():
            if value is None:
                continue
            if name not in own:
                raise UserError(self.unknown_option(name, own))
            f = own[name]

            def fail(message: str, f=f, value=value) -> None:  # named as the caller wrote it
                shown = f"{schema.flag_of(f)} {value}" if schema.FACE.get() == "cli" else schema.said(f.name, value)
                raise UserError(f"{shown}: {message}")
            out[name] = schema.convert(f, value, fail)
        return out

    def unknown_option(self, name: str, own: Mapping[str, Any]) -> str:
        """Why `name` is no option of this head: another kind's, or a misspelling."""
        others = {kind: cls.option_fields() for kind, cls in TASKS.items() if kind != self.kind}
        takers = [kind for kind, fs in others.items() if name in fs]
        if takers:
            shown = schema.said(name, flag=schema.flag_of(others[takers[0]][name]))
            return f"{shown} is for {' or '.join(takers)} heads, not {self.kind}"
        known = list(own) or [n for fs in others.values() for n in fs]
        close = schema.suggest(name, own) or schema.suggest(name, known)
        return f"unknown option {name!r}{close}"

    def set_options(self, **given: Any) -> None:
        """Options for every later prediction of this head: spec overrides replace the saved
        values, the others are passed to each call (a call's own keywords win)."""
        for name, value in self.check_options(given).items():
            if self.overrides(name):
                setattr(self.spec, name, value)
            else:
                self.fixed_options[name] = value

    @contextmanager
    def using_options(self, given: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """For one call: the spec overrides among `given` applied (the saved values come back
        after), the keyword options to pass on (the fixed ones, then `given`'s) yielded."""
        options = self.check_options(given)
        overrides = {n: v for n, v in options.items() if self.overrides(n)}
        saved = {n: getattr(self.spec, n) for n in overrides}
        for name, value in overrides.items():
            setattr(self.spec, name, value)
        try:
            yield {**self.fixed_options, **{n: v for n, v in options.items() if n not in overrides}}
        finally:
            for name, value in saved.items():
                setattr(self.spec, name, value)
