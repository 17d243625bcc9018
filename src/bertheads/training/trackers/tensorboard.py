"""TensorBoard event files in `OUT/tensorboard/` (`--track tensorboard`, or `--tensorboard`)."""

from __future__ import annotations

from pathlib import Path

from bertheads.base.extras import require
from bertheads.base.schema import said
from bertheads.training.trackers.base import Tracker, numbers, register


@register
class TensorBoardTracker(Tracker):
    name = "tensorboard"

    @classmethod
    def check(cls) -> None:
        require("track", said("track", "tensorboard"))

    def __init__(self, out: Path, settings, after_step: int | None) -> None:
        self.check()
        from torch.utils.tensorboard import SummaryWriter

        purge = after_step + 1 if after_step is not None else None  # events of steps run again go
        self.writer = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=purge)

    def train(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"train/{key}", value, step)

    def evaluation(self, step: int, dev: dict[str, dict], kept: bool) -> None:
        for key, value in numbers(dev, "dev").items():
            self.writer.add_scalar(key, value, step)

    def finish(self, status: str, result: dict | None = None, out: Path | None = None) -> None:
        self.writer.close()
