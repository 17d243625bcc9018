"""What one input of a qa head is: a question and the passage that answers it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bertheads.tasks.forms import Extra, Field, InputForm, is_text_tuple


class Question(InputForm):
    name = "question"
    says = "a question and a passage"
    fields = (Field("questions", str, "question"), Field("contexts", str, "passage"))
    # in `analyze` the shared text is the passage
    extra = Extra("question", "questions", str, "question", "Question (for question heads; the text above is the "
                                                            "passage)", "Optional: ask a question about the text")
    example = {"question": "Where does the tower stand?",
               "context": "The tower was finished in 1889 and stands in Paris."}

    def from_fields(self, values: Sequence[Sequence]) -> list:
        return [{"question": q, "context": c} for q, c in zip(*values)]

    def with_text(self, text: str, extra: Any) -> Any:
        return {"question": extra, "context": text}

    def is_one(self, value: Any) -> bool:
        """A `{"question", "context"}` dict or a (question, context) tuple."""
        return isinstance(value, Mapping) or is_text_tuple(value)

    def texts(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, dict):
            return (value.get("question") or "", value.get("context") or "")
        return tuple(value)


QUESTION = Question()
