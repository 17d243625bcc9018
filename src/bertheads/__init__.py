"""bertheads: one pretrained BERT-family encoder, many task heads."""

from bertheads.api import Model, load, train
from bertheads.errors import UserError
from bertheads.train import TrainSettings

__all__ = ["Model", "TrainSettings", "UserError", "load", "train"]
__version__ = "0.1.0"
