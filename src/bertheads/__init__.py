"""bertheads: one pretrained BERT-family encoder, many task heads."""

__version__ = "0.1.0"

from bertheads.api import Model, combine, load, train, train_multi  # noqa: E402
from bertheads.errors import UserError  # noqa: E402
from bertheads.train import TrainSettings  # noqa: E402

__all__ = ["Model", "TrainSettings", "UserError", "__version__", "combine", "load", "train", "train_multi"]
