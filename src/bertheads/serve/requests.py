"""The request models of `POST /analyze` and `POST /predict/{head}`, built from the input forms
of the served model's heads (`tasks/forms.py`), so the OpenAPI schema shows the fields this
model reads, and a head of a new form needs no change here."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from bertheads.tasks.forms import Extra, InputForm


def analyze_body(extras: dict[str, Extra]) -> type[BaseModel]:
    """`{"texts": [...]}` and, for each head form's extra input, its list (one per text)."""
    fields: dict[str, Any] = {"texts": (list[str], Field(description="the texts (the passages, for question "
                                                                      "heads)"))}
    for name, extra in extras.items():
        fields[name] = (list[extra.value] | None, Field(None, description=f"one per text: {extra.label}"))
    config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"texts": ["Angela Merkel visited Paris last week.", "A warm, funny film."]}]})
    return create_model("AnalyzeRequest", __config__=config,
                        __doc__="Texts to run through every head that reads them (a head whose form needs more "
                                "answers when that is given too).", **fields)


def predict_body(forms: list[InputForm]) -> type[BaseModel]:
    """Every field of the heads' forms, each optional; a head takes exactly its form's."""
    fields: dict[str, Any] = {}
    for form in forms:
        for f in form.fields:
            fields.setdefault(f.name, (list[f.value] | None, Field(None, description=f"one {f.noun} per input")))
    first = forms[0].wanted() if forms else '{"texts": ["..."]}'
    config = ConfigDict(extra="forbid", json_schema_extra={"examples": [json.loads(first)]})
    return create_model("PredictRequest", __config__=config,
                        __doc__="Inputs for one head, in the fields of its input form (see GET /heads).", **fields)


def given_fields(body: BaseModel) -> dict[str, Any]:
    """The body's fields that were given (not None)."""
    return {name: value for name, value in body.model_dump().items() if value is not None}
