"""The optional parts of bertheads and the packages each needs: a command whose extra is not
installed says so in one line instead of failing on an import deep inside it."""

from __future__ import annotations

import importlib.util

from bertheads.base.errors import UserError

# extra -> the modules it brings (pyproject.toml's [project.optional-dependencies] install them)
EXTRAS = {
    "serve": ("fastapi", "uvicorn", "prometheus_client"),
    "export": ("onnx", "onnxruntime", "onnxscript"),
    "tune": ("optuna",),
    "report": ("matplotlib",),
    "track": ("tensorboard", "mlflow", "sqlalchemy", "alembic"),
    "audit": ("cleanlab",),
    "parquet": ("pyarrow",),
    "ray": ("ray", "pyarrow", "pandas"),
    "spark": ("pyspark", "pyarrow", "pandas"),
    "dask": ("dask", "pyarrow", "pandas"),
}


def require(extra: str, what: str) -> None:
    """Refuse `what` (a command or an option) at once when a module of `extra` is missing."""
    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{what} needs the {extra!r} extra (missing: {', '.join(missing)}); "
                        f"install it with: pip install 'bertheads[{extra}]'")
