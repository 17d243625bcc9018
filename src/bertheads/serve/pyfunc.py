"""MLflow's `python_function` flavour of a saved model: every model directory holds an
`MLmodel` file naming this module, so `mlflow.pyfunc.load_model(DIR or runs:/ID/model)` and
`mlflow models serve -m ... --env-manager local` load it with `load` and answer with `predict`
(the file is written by `saved/mlmodel.py`):

```
model = mlflow.pyfunc.load_model("runs:/<run id>/model")
model.predict(["a warm film"])                        # one head: its predictions
model.predict(pd.DataFrame({"text": [...]}))          # a DataFrame back, as Model.predict gives
model.predict(["..."], params={"head": "ner"})        # a head of several; without one, analyze
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertheads.api import Model, load


class PyfuncModel:
    """What `mlflow.pyfunc.load_model` wraps: `predict(model_input, params)`."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def predict(self, model_input: Any, params: dict | None = None) -> Any:
        """Predictions for MLflow's inputs: a DataFrame (its columns found as a file's are), a
        list (or array) of inputs, one input, or a dict of columns (`mlflow models serve`'s
        `inputs`).
        `params`: `head` (default: the only head; a model of several heads without one runs
        every head, `Model.analyze`, on the text column) and the head's inference options."""
        params = dict(params or {})
        head = params.pop("head", None)
        if hasattr(model_input, "tolist") and not hasattr(model_input, "columns"):  # an array, a Series
            model_input = model_input.tolist()
        if isinstance(model_input, dict) and model_input and all(isinstance(v, list) for v in model_input.values()):
            model_input = [dict(zip(model_input, row)) for row in zip(*model_input.values())]
        if head is None and len(self.model.heads) > 1:
            return self.model.analyze(texts_of(model_input), **params)
        return self.model.predict(model_input, head, **params)


def texts_of(model_input: Any) -> list[str]:
    """The texts of an input for `analyze`: a DataFrame's or records' `text` column (else the
    first), or the strings given."""
    if isinstance(model_input, str):
        return [model_input]
    columns = getattr(model_input, "columns", None)
    if columns is not None:
        column = "text" if "text" in columns else columns[0]
        return [str(v) for v in model_input[column]]
    rows = list(model_input)
    if rows and isinstance(rows[0], dict):
        key = "text" if "text" in rows[0] else next(iter(rows[0]))
        return [str(r[key]) for r in rows]
    return [str(r) for r in rows]


def _load_pyfunc(path: str) -> PyfuncModel:
    """MLflow's entry point: the model directory (or an artifact copy of it) loaded."""
    return PyfuncModel(load(Path(path)))
