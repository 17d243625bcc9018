"""An MLflow run per training run (`--track mlflow`): the resolved settings as parameters, the
train and dev figures as metrics by step, the kept epoch's figures, and the saved model
directory as the run's `model` artifact. `--track-uri` (default: `$MLFLOW_TRACKING_URI`, else
MLflow's own default, `sqlite:///mlflow.db` in the current directory) says where; a resumed run
(`--resume`) continues the MLflow run it started, whose id is kept in `OUT/tracking/mlflow.json`.

MlflowClient rather than `mlflow.start_run`: no process-wide active run is left behind for the
code that called `train`."""

from __future__ import annotations

import json
import time
from pathlib import Path

from bertheads.base.errors import UserError, first_line
from bertheads.base.extras import require
from bertheads.base.schema import said
from bertheads.store.atomic import atomic_write_text
from bertheads.training.trackers.base import Tracker, flat, numbers, register, safe_key

STATE = "tracking/mlflow.json"  # under OUT: kept across saves, removed by a fresh run
BATCH = 100  # parameters per log_batch call (MLflow's limit)


@register
class MLflowTracker(Tracker):
    name = "mlflow"

    @classmethod
    def check(cls) -> None:
        require("track", said("track", "mlflow"))

    def __init__(self, out: Path, settings, after_step: int | None) -> None:
        self.check()
        import mlflow
        from mlflow.tracking import MlflowClient

        self.out = Path(out)
        self.uri = settings.track_uri or mlflow.get_tracking_uri()
        try:
            self.client = MlflowClient(self.uri)
            state = self.out / STATE
            self.resumed = after_step is not None and state.is_file()
            if self.resumed:
                self.run_id = json.loads(state.read_text())["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                experiment = self.client.get_experiment_by_name(settings.track_experiment)
                experiment_id = (experiment.experiment_id if experiment is not None
                                 else self.client.create_experiment(settings.track_experiment))
                run = self.client.create_run(experiment_id, run_name=self.out.name,
                                             tags={"bertheads.out": str(self.out.resolve())})
                self.run_id = run.info.run_id
                state.parent.mkdir(exist_ok=True)
                atomic_write_text(state, json.dumps({"run_id": self.run_id, "tracking_uri": self.uri,
                                                     "experiment": settings.track_experiment}) + "\n")
        except Exception as exc:  # a tracking store that cannot be opened is the user's to fix
            if isinstance(exc, UserError):
                raise
            raise UserError(f"{said('track', 'mlflow')}: {self.uri}: {first_line(exc)}") from None

    def metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(safe_key(k), v, now, step) for k, v in values.items()])

    def params(self, settings: dict) -> None:
        if self.resumed:  # logged when the run started (a parameter cannot change)
            return
        from mlflow.entities import Param

        items = [Param(safe_key(k), v[:6000]) for k, v in flat(settings).items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + BATCH])

    def train(self, step: int, values: dict[str, float]) -> None:
        self.metrics({f"train/{k}": v for k, v in values.items()}, step)

    def evaluation(self, step: int, dev: dict[str, dict], kept: bool) -> None:
        self.metrics(numbers(dev, "dev"), step)

    def finish(self, status: str, result: dict | None = None, out: Path | None = None) -> None:
        if result is not None:
            kept = result.get("kept", {})
            dev = result.get("dev") or {}
            self.metrics(numbers(dev, "kept"), 0)
            self.client.set_tag(self.run_id, "kept_epoch", str(kept.get("epoch")))
            self.client.set_tag(self.run_id, "kept_by", str(kept.get("by")))
        if out is not None and Path(out).is_dir():
            self.client.log_artifacts(self.run_id, str(out), artifact_path="model")
        self.client.set_terminated(self.run_id, status=status)
