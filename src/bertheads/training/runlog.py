"""A training run's log: `OUT/log.jsonl`, one JSON object a line, and the trackers the run
asked for (`--track`: MLflow, TensorBoard; see `bertheads.training.trackers`).

```
{"type": "train", "step": 20, "epoch": 0.5, "loss": 0.41, "lr": 4.9e-05, "examples_per_second": 61.2}
{"type": "eval", "step": 40, "epoch": 1.0, "dev": {"classify": {"accuracy": 0.9, ..., "loss": 0.3}}, "kept": true}
```
A train line holds the mean loss of the steps since the previous line (this process's share
of the batches), the learning rate after the step and the examples per second of all processes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bertheads.store.atomic import atomic_write_text
from bertheads.training.trackers import Tracker, open_trackers

LOG = "log.jsonl"


class RunLog:
    """Appends to `OUT/log.jsonl` (main process only) and tells the trackers the same figures.
    `after_step`: a resumed run first drops the lines of steps after its checkpoint's (they are
    run again)."""

    def __init__(self, out: Path, settings=None, after_step: int | None = None) -> None:
        self.path = Path(out) / LOG
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if after_step is not None and self.path.is_file():
            kept = [line for line in self.path.read_text().splitlines(keepends=True) if line_step(line) <= after_step]
            atomic_write_text(self.path, "".join(kept))
        self.losses: list[float] = []
        self.examples = 0
        self.since = time.perf_counter()
        self.trackers: list[Tracker] = open_trackers(Path(out), settings, after_step) if settings is not None else []

    def write(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    def params(self, settings: dict) -> None:
        """The run's resolved settings (what config.yaml holds), for the trackers."""
        for tracker in self.trackers:
            tracker.params(settings)

    def train(self, step: int, epoch: float, loss, lr: float, examples: int, every: int) -> None:
        self.losses.append(loss)
        self.examples += examples
        if step % every:
            return
        now = time.perf_counter()
        loss = sum(float(value) for value in self.losses) / len(self.losses)  # (device tensors read here only)
        record = {"type": "train", "step": step, "epoch": round(epoch, 6), "loss": loss,
                  "lr": float(lr), "examples_per_second": round(self.examples / max(now - self.since, 1e-9), 3)}
        self.write(record)
        for tracker in self.trackers:
            tracker.train(step, {key: record[key] for key in ("loss", "lr", "examples_per_second")})
        self.losses, self.examples, self.since = [], 0, now

    def evaluation(self, step: int, epoch: float, dev: dict, kept: bool) -> None:
        self.write({"type": "eval", "step": step, "epoch": round(float(epoch), 6), "dev": dev, "kept": kept})
        for tracker in self.trackers:
            tracker.evaluation(step, dev, kept)
        self.since = time.perf_counter()  # evaluation time is not training speed

    def close(self, status: str = "FINISHED", result: dict | None = None, out: Path | None = None) -> None:
        """The run ended (FINISHED with its `result` and saved model `out`, FAILED or KILLED)."""
        trackers, self.trackers = self.trackers, []  # closed once
        for tracker in trackers:
            tracker.finish(status, result, out)


def line_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 1 << 62  # an unreadable (half-written) line goes
