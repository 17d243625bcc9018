"""The `MLmodel` file of every saved model directory: MLflow's `python_function` flavour, loaded
by `bertheads.serve.pyfunc`, so a model directory, or its copy logged to an MLflow run, is
an MLflow model (`mlflow.pyfunc.load_model`, `mlflow models serve`, the model registry).
Its signature declares the `params` a prediction takes (`head`, `text_column`, and the options
`bertheads serve` takes for the model's heads): MLflow drops any parameter a signature does not declare.
Written as plain YAML: saving a model needs no MLflow."""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Mapping
from typing import Any

import yaml

MLMODEL = "MLmodel"
LOADER = "bertheads.serve.pyfunc"  # its `_load_pyfunc(path)` (named, not imported: it loads models)
PARAM_TYPES = {"str": "string", "float": "double", "int": "long", "bool": "boolean"}  # MLflow's names


def params_of(tasks: Mapping[str, Any]) -> list[dict]:
    """MLflow's parameter specs: `head`, `text_column` (an input's text column, `serve/pyfunc.py`),
    then every option a served head of `tasks` takes, each with no default (so only what a
    caller gives reaches `Model.predict`)."""
    params = {"head": "string", "text_column": "string"}
    for task in tasks.values():
        for name, f in task.options.declared().items():
            kind = str(f.type).split("|")[0].strip()
            if "serve" in f.metadata.get("at", ()) and kind in PARAM_TYPES:
                params.setdefault(name, PARAM_TYPES[kind])
    return [{"name": name, "type": kind, "default": None, "shape": None} for name, kind in params.items()]


def mlmodel_text(tasks: Mapping[str, Any]) -> str:
    version = getattr(sys.modules.get("bertheads"), "__version__", "unknown")
    return yaml.safe_dump({"flavors": {"python_function": {"loader_module": LOADER,
                                                            "python_version": platform.python_version()},
                                       "bertheads": {"bertheads_version": version}},
                           "signature": {"inputs": None, "outputs": None, "params": json.dumps(params_of(tasks))}},
                          sort_keys=False)
