"""Where a training run's figures go besides `OUT/log.jsonl`: one module per tracker, each a
`Tracker` registered by name (`--track NAME`). A new tracker is a module here and one import
line below."""

from bertheads.training.trackers import mlflow, tensorboard  # noqa: F401  (they register themselves)
from bertheads.training.trackers.base import (
    TRACKERS,
    Tracker,
    check_trackers,
    chosen,
    open_trackers,
    register,
)

__all__ = ["TRACKERS", "Tracker", "check_trackers", "chosen", "open_trackers", "register"]
