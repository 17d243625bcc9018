"""The one inference path: a head's outputs, predictions and metrics for examples, from any
runner (`compute.runner.Runner`: the torch model, an ONNX or OpenVINO session, cached states).
`predict`, streaming, Parquet output, the server, analyze, audit, select, the gate, the report
and training's dev evaluation all go through it:

```
examples --task.modeling.encode_for_inference--> features --run_heads--> outputs per feature
         --task.judging.collect--> one output per example (head_outputs)
         --task.judging.decode--> predictions (predict_examples)
         --task.judging.metric_part / metrics_from_parts--> metrics (Evaluation, evaluate_head)
```
`task` is the head's task, bound to a call's options (`task.options.bind`) where a call gives any.
"""

from __future__ import annotations

from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.compute.runner import Runner, run_heads
from bertheads.tasks.calibration import calibrate_head, coverage_part, head_summary, metric_coverage


def head_outputs(model: Runner, name: str, examples: list, batch_size: int = INFERENCE_BATCH,
                 progress: str | None = None, task=None, losses: dict | None = None) -> list:
    """One head's outputs for each example, from any runner: encode, run, merge windows. `task`:
    the head's task bound to a call's options (default: the model's); with `losses` the loss's
    targets are encoded and each head's summed loss is added there (`run_heads`)."""
    task = task or model.tasks[name]
    features, owner = task.modeling.encode_for_inference(examples, model.tokenizer, with_labels=losses is not None)
    outputs = run_heads(model, features, [name], batch_size, progress=progress, losses=losses)[name]
    return task.judging.collect(outputs, owner, examples, features)


def predict_examples(model: Runner, name: str, examples: list, batch_size: int = INFERENCE_BATCH,
                     task=None) -> list[dict]:
    """One head's predictions for examples, as every face writes them (`task`: see `head_outputs`)."""
    task = task or model.tasks[name]
    return task.judging.decode(head_outputs(model, name, examples, batch_size, task=task), examples)


class Evaluation:
    """A head's metrics on labelled examples given a chunk at a time (`add`): each chunk's
    outputs are reduced to what the metrics, the scores' summary and the metric-coverage table
    need before the next comes; `result` reports them with the mean loss."""

    def __init__(self, task, path: str | None = None) -> None:
        self.task, self.path = task, path
        self.parts: list = []
        self.scores: list = []
        self.covered: list = []

    def add(self, outputs: list, examples: list) -> None:
        task, path = self.task, self.path
        self.parts.append(task.judging.metric_part(outputs, examples, path))
        self.scores.append(task.scoring.confidence_part(outputs, examples, path))
        self.covered.append(coverage_part(task, outputs, examples, self.parts[-1], path))

    def result(self, loss: tuple[float, float] = (0.0, 0.0)) -> dict:
        """The metrics, what the scores mean (`calibration`) and, when the runtime gave one, the
        mean `loss` from `loss` (sum, count)."""
        task, path = self.task, self.path
        metrics = task.judging.metrics_from_parts(self.parts, path)
        metrics["calibration"] = head_summary(task, self.scores, task.options.values.target_accuracy,
                                              metric_coverage(task, self.covered, path))
        total, count = loss
        if count:  # a runtime that gives outputs only (ONNX): no loss then
            metrics["loss"] = total / count
        return metrics


def dev_metrics(task, outputs: list, examples: list, path: str | None = None) -> dict:
    """A head's metrics on the dev set after an epoch, what they settle (thresholds) settled,
    and its temperature fitted on them when they are evidence enough (`calibration`;
    `calibration.cross_fitted`)."""
    metrics = task.judging.metrics(outputs, examples, path, during_training=True)
    metrics["calibration"] = calibrate_head(task, outputs, examples, path)
    return metrics


def evaluate_head(model: Runner, name: str, examples: list, path: str | None = None,
                  batch_size: int = INFERENCE_BATCH, progress: str | None = None, during_training: bool = False,
                  task=None) -> dict:
    """One head's metrics on labelled examples, with its mean `loss` (from the same pass) and what
    its scores mean (`calibration`); after an epoch (`during_training`, `dev_metrics`) the
    head's temperature is fitted on them. `progress` names a bar (drawn where bars are)."""
    task = task or model.tasks[name]
    losses: dict[str, list[float]] = {}
    outputs = head_outputs(model, name, examples, batch_size, progress, task, losses)
    if during_training:
        metrics = dev_metrics(task, outputs, examples, path)
        total, count = losses[name]
        if count:
            metrics["loss"] = total / count
        return metrics
    evaluation = Evaluation(task, path)
    evaluation.add(outputs, examples)
    return evaluation.result(tuple(losses[name]))
