"""Trackers: an MLflow run in a real local store (no server) gets the settings as parameters,
the train and dev figures by step, the kept epoch and the saved model as an artifact; a killed
and resumed run continues its MLflow run; a tracker is a small class registered by name."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from forkserver import ForkServer
from test_resume import argv, data, run_cli  # noqa: F401  (data: the fixture)

import bertheads
from bertheads.base.errors import UserError
from bertheads.training.trackers import TRACKERS, Tracker, chosen, register

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    """Children forked from one process that imported everything, mlflow too (tests/forkserver.py)."""
    server = ForkServer(tmp_path_factory.mktemp("forks"), preload=("mlflow",))
    yield server
    server.close()


def runs_of(uri: str, experiment: str = "bertheads"):
    client = mlflow.tracking.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id]) if exp else []


def history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}  # the last value of each step


def test_mlflow_run_has_params_metrics_kept_epoch_and_model(tiny_bert, data, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)  # MLflow keeps artifacts in ./mlruns beside a sqlite store
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "model"
    model = bertheads.train("classify", str(data / "train.tsv"), str(data / "train.tsv"), out, model=tiny_bert,
                            epochs=2, batch_size=8, lr=1e-3, log_every=2, progress=False, track=["mlflow"],
                            track_uri=uri, track_experiment="bertheads")
    client, runs = runs_of(uri)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "model"
    assert json.loads((out / "tracking" / "mlflow.json").read_text())["run_id"] == run.info.run_id
    params = run.data.params
    assert params["epochs"] == "2" and params["lr"] == "0.001" and params["kind"] == "classify"
    assert params["train"].endswith("train.tsv")
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in log if r["type"] == "train"}
    assert history(client, run.info.run_id, "train/loss") == pytest.approx(losses)
    evals = [r for r in log if r["type"] == "eval"]
    assert history(client, run.info.run_id, "dev/classify/accuracy") == pytest.approx(
        {r["step"]: r["dev"]["classify"]["accuracy"] for r in evals})
    metrics = json.loads((out / "metrics.json").read_text())
    assert run.data.tags["kept_epoch"] == str(metrics["kept"]["epoch"])
    assert run.data.metrics["kept/accuracy"] == pytest.approx(metrics["dev"]["accuracy"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/bertheads.json", "model/config.yaml", "model/metrics.json"} <= artifacts
    local = Path(client.download_artifacts(run.info.run_id, "model", str(tmp_path / "back")))
    assert bertheads.load(local).predict(["a great movie"]) == model.predict(["a great movie"])


@pytest.mark.slow  # runs extra processes (a SIGKILL, then --resume)
def test_killed_then_resumed_run_continues_its_mlflow_run(tiny_bert, data, tmp_path, forks):  # noqa: F811
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "run"
    extra = ["--track", "mlflow", "--track-uri", uri]
    killed = run_cli(forks, argv(tiny_bert, data, out, *extra), crash_at="train:step:5", cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL
    client, runs = runs_of(uri)
    assert [r.info.status for r in runs] == ["RUNNING"]  # killed: nobody could say otherwise
    resumed = run_cli(forks, argv(tiny_bert, data, out, *extra, "--resume"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    client, again = runs_of(uri)
    assert [r.info.run_id for r in again] == [runs[0].info.run_id]  # the same run, continued
    assert again[0].info.status == "FINISHED"
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in log if r["type"] == "train"}
    assert sorted(losses) == list(range(1, 13))
    assert history(client, runs[0].info.run_id, "train/loss") == pytest.approx(losses)


def test_choosing_trackers():
    class Settings:
        track, tensorboard = ["mlflow"], True
    assert chosen(Settings) == ["mlflow", "tensorboard"]  # --tensorboard is --track tensorboard
    Settings.track, Settings.tensorboard = ["none"], False
    assert chosen(Settings) == []
    Settings.track = ["none", "mlflow"]
    with pytest.raises(UserError, match="'none' and mlflow exclude each other"):
        chosen(Settings)
    with pytest.raises(UserError, match=r"^track=: unknown tracker 'wandb' \(known: mlflow, tensorboard, none\)$"):
        bertheads.train("classify", "x.tsv", track="wandb")


def test_a_third_tracker_is_one_class(tiny_bert, data, tmp_path):  # noqa: F811
    seen: list = []

    @register
    class Recorder(Tracker):
        name = "recorder"

        def params(self, settings):
            seen.append(("params", settings["epochs"]))

        def evaluation(self, step, dev, kept):
            seen.append(("eval", step, round(dev["classify"]["accuracy"], 6)))

        def finish(self, status, result=None, out=None):
            seen.append(("finish", status, out))

    try:
        out = tmp_path / "m"
        bertheads.train("classify", str(data / "train.tsv"), str(data / "train.tsv"), out, model=tiny_bert,
                        epochs=1, batch_size=8, progress=False, track="recorder")
    finally:
        TRACKERS.pop("recorder", None)
    accuracy = json.loads((out / "metrics.json").read_text())["dev"]["accuracy"]
    assert seen == [("params", 1), ("eval", 6, round(accuracy, 6)), ("finish", "FINISHED", out)]
