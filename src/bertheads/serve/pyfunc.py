"""MLflow's `python_function` flavour of a saved model: every model directory holds an
`MLmodel` file naming this module, so `mlflow.pyfunc.load_model(DIR or runs:/ID/model)` and
`mlflow models serve -m ... --env-manager local` load it with `load` and answer with `predict`
(the file is written by `saved/mlmodel.py`):

```
model = mlflow.pyfunc.load_model("runs:/<run id>/model")
model.predict(["a warm film"])                        # one head: its predictions
model.predict(pd.DataFrame({"text": [...]}))          # a DataFrame back, as Model.predict gives
model.predict(["..."], params={"head": "ner"})        # a model of several heads: name one
model.predict(frame, params={"text_column": "review"}) # the text in another column
```
It refuses what `bertheads predict` refuses, in the words of `params` (the one way MLflow passes
a setting): a model of several heads without `head`, a frame without its text column, nulls and
values that are not texts; an empty input gives no predictions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertheads.api import Model, load
from bertheads.base.errors import UserError
from bertheads.base.schema import said, speaking


class PyfuncModel:
    """What `mlflow.pyfunc.load_model` wraps: `predict(model_input, params)`."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def predict(self, model_input: Any, params: dict | None = None) -> Any:
        """Predictions for MLflow's inputs: a DataFrame (its columns found as a file's are), a
        list (or array) of inputs, one input, or a dict of columns (`mlflow models serve`'s
        `inputs`), as `Model.predict` reads them.
        `params`: `head` (default: the only head; a model of several heads refuses without
        one), `text_column` (the column of the text, else found by its name) and the head's
        inference options; its messages name them as `params` entries."""
        with speaking("mlflow"):
            params = {k: v for k, v in dict(params or {}).items() if v is not None}  # MLflow's defaults: None
            head = self.model.head_name(params.pop("head", None))
            text_column = params.pop(TEXT_COLUMN, None)
            if hasattr(model_input, "tolist") and not hasattr(model_input, "columns"):  # an array, a Series
                model_input = model_input.tolist()
            if isinstance(model_input, dict) and model_input and all(isinstance(v, list) for v in model_input.values()):
                model_input = [dict(zip(model_input, row)) for row in zip(*model_input.values())]
            if text_column is not None:
                model_input = with_text_column(model_input, text_column)
            return self.model.predict(model_input, head, **params)


TEXT_COLUMN = "text_column"  # the param naming the input's text column (declared by saved/mlmodel.py)


def with_text_column(model_input: Any, column: str) -> Any:
    """A DataFrame's (or records') column `column` as `text`, the name every kind reads."""
    columns = getattr(model_input, "columns", None)
    if columns is None:
        rows = model_input if isinstance(model_input, list) else []
        if not rows or not all(isinstance(r, dict) for r in rows):
            raise UserError(f"{said(TEXT_COLUMN, column)}: only for a DataFrame or records (the input is "
                            f"{type(model_input).__name__})")
        columns = list(dict.fromkeys(k for r in rows for k in r))
    if column not in list(columns):
        raise UserError(f"{said(TEXT_COLUMN, column)}: no such column (columns: "
                        f"{', '.join(map(str, columns)) or 'none'})")
    if column == "text":
        return model_input
    if hasattr(model_input, "rename"):
        return model_input.drop(columns=[c for c in ("text",) if c in columns]).rename(columns={column: "text"})
    return [{**{k: v for k, v in r.items() if k not in ("text", column)}, "text": r.get(column)} for r in model_input]


def _load_pyfunc(path: str) -> PyfuncModel:
    """MLflow's entry point: the model directory (or an artifact copy of it) loaded."""
    return PyfuncModel(load(Path(path)))
