"""What one input of a head is, its form: the texts it holds and how each face carries them.
A kind names its heads' form (`Task.form`); the server, the page, `analyze`, the streams and
the model card ask the form and never branch on which one it is. `TEXT` and `PAIR` are here
because more than one kind reads them; a kind with a form of its own defines it beside itself
(qa's `QUESTION`).

```
                 /predict/{head} body            analyze record / request   Model.predict
TEXT             {"texts": [t]}                  {"text": t}                "t"
PAIR             {"pairs": [[a, b]]}             + "second_text" / "second_texts"   ("a", "b")
```
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bertheads.base.errors import UserError


@dataclass(frozen=True)
class Field:
    """One field of a `/predict/{head}` body: a list with one value per input."""

    name: str  # the body's key, e.g. "texts"
    value: Any  # the type of one value (`str`, `tuple[str, str]`, `list[str]`): the request schema's
    noun: str  # what one text of it is, for messages: "text", "question", "passage"


@dataclass(frozen=True)
class Extra:
    """What `analyze` needs beside the shared text for heads of a form (a pair's second text, a
    question for the text as its passage)."""

    key: str  # its field in an analyze record (JSON Lines), e.g. "second_text"
    request: str  # its list in an analyze request and keyword of `Model.analyze`, e.g. "second_texts"
    value: Any  # the type of one value
    noun: str  # what it is, for messages
    label: str  # the page's label for its box
    placeholder: str = ""
    many: bool = False  # several texts per input (the page takes one a line)
    tab: bool = False  # a plain line's text after a TAB is this value (`analyze`'s plain lines)

    def fits(self, value: Any) -> bool:
        """Whether a record's value has this extra's type (a string, or a list of strings)."""
        if self.many:
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        return isinstance(value, str)

    def says(self) -> str:
        return "a list of strings" if self.many else "a string"


class InputForm:
    """One form of input. Subclasses set the class attributes and `from_fields`."""

    name: str  # what `/heads` calls it
    says: str  # what one input is, in the model card's words ("one text")
    fields: tuple[Field, ...]  # the `/predict/{head}` body
    extra: Extra | None = None  # `analyze`'s input besides the shared text (None: the text alone)
    example: Any = "A sample text."  # one input as `Model.predict` takes it

    def from_fields(self, values: Sequence[Sequence]) -> list:
        """Inputs (as `Model.predict` takes them) from the body's lists, in `fields` order."""
        raise NotImplementedError

    def with_text(self, text: str, extra: Any) -> Any:
        """An input from `analyze`'s shared text and this form's extra value."""
        return text

    def is_one(self, value: Any) -> bool:
        """Whether `Model.predict` was given one input of this form (answered with one
        prediction), not a collection of inputs."""
        return isinstance(value, str)

    def texts(self, value: Any) -> tuple[str, ...]:
        """The texts of one input, for counting its tokens (see `Task.encoder_cost`)."""
        return (value,)

    def wanted(self) -> str:
        """The body this form expects, as a one-line JSON example."""
        return json.dumps({f.name: [sample(f.value)] for f in self.fields})

    def describe(self) -> dict:
        """What `/heads` says of the form: its name, and the extra input `analyze` takes for it."""
        extra = self.extra
        return {"inputs": self.name, **({"extra": {"field": extra.request, "key": extra.key, "label": extra.label,
                                                    "placeholder": extra.placeholder, "many": extra.many}}
                                         if extra else {})}

    def request_inputs(self, body: Mapping[str, Any], head: str, kind: str) -> list:
        """The inputs of a `/predict/{head}` body (its given fields in `body`): exactly this form's
        fields, of equal lengths; a UserError naming the field otherwise."""
        given = [name for name, value in body.items() if value is not None]
        expected = [f.name for f in self.fields]
        missing = [n for n in expected if n not in given]
        unexpected = [n for n in given if n not in expected]
        if missing or unexpected:
            reason = f"missing field {missing[0]!r}" if missing else f"unexpected field {unexpected[0]!r}"
            raise UserError(f"{reason}: head {head!r} ({kind}) reads {self.wanted()}")
        lists = [body[n] for n in expected]
        for f, values in zip(self.fields[1:], lists[1:]):
            if len(values) != len(lists[0]):
                raise UserError(f"{f.name}: {len(values)} items, expected one per {self.fields[0].noun} "
                                f"({len(lists[0])})")
        return self.from_fields(lists)


def sample(value_type: Any) -> Any:
    """A placeholder value of a field's type, for messages."""
    if value_type is str:
        return "..."
    args = getattr(value_type, "__args__", ())
    if getattr(value_type, "__origin__", None) is tuple:
        return [sample(a) for a in args]
    return [sample(args[0] if args else str)]


class Text(InputForm):
    name = "text"
    says = "one text"
    fields = (Field("texts", str, "text"),)

    def from_fields(self, values: Sequence[Sequence]) -> list:
        return list(values[0])


class Pair(InputForm):
    name = "pair"
    says = "a pair of texts"
    fields = (Field("pairs", tuple[str, str], "text"),)
    extra = Extra("second_text", "second_texts", str, "text", "Second text (for pair heads)",
                  "Optional: the second text of a pair", tab=True)
    example = ("A first text.", "A second text.")

    def from_fields(self, values: Sequence[Sequence]) -> list:
        return [tuple(p) for p in values[0]]

    def with_text(self, text: str, extra: Any) -> Any:
        return (text, extra)

    def is_one(self, value: Any) -> bool:
        """A text, or a (text, text) tuple (a list stays a list of inputs)."""
        return isinstance(value, str) or is_text_tuple(value)

    def texts(self, value: Any) -> tuple[str, ...]:
        return tuple(value)


def is_text_tuple(value: Any) -> bool:
    """A tuple of two strings: one input of a two-text form."""
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


TEXT, PAIR = Text(), Pair()
