"""The `MLmodel` file of every saved model directory: MLflow's `python_function` flavour, loaded
by `bertheads.inference.pyfunc`, so a model directory, or its copy logged to an MLflow run, is
an MLflow model (`mlflow.pyfunc.load_model`, `mlflow models serve`, the model registry).
Written as plain YAML: saving a model needs no MLflow."""

from __future__ import annotations

import platform
import sys

import yaml

MLMODEL = "MLmodel"
LOADER = "bertheads.inference.pyfunc"  # its `_load_pyfunc(path)` (named, not imported: it loads models)


def mlmodel_text() -> str:
    version = getattr(sys.modules.get("bertheads"), "__version__", "unknown")
    return yaml.safe_dump({"flavors": {"python_function": {"loader_module": LOADER,
                                                            "python_version": platform.python_version()},
                                       "bertheads": {"bertheads_version": version}}}, sort_keys=False)
