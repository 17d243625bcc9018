"""`bertheads calibrate MODEL --data FILE --out NEW`: each head's temperature fitted again on
other labelled data, written as a new model folder (the model read is left as it is)."""

from __future__ import annotations

from pathlib import Path

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.inference.path import head_outputs
from bertheads.model import pick_head
from bertheads.saved import bundle
from bertheads.saved.card import read_metrics
from bertheads.tasks.calibration import calibrate_head

MANIFEST_OWN = ("format_version", "heads", "encoder_hash", "encoder")  # what `bundle.save` writes itself


def recalibrate(directory: str | Path, data: str, out: str | Path, head: str | None = None,
                batch_size: int = INFERENCE_BATCH) -> dict:
    """Fit the temperature of `head` (default: every head that reads `data`'s format) on the
    labelled file `data` and save the model with it at `out`, a new folder (never the model's
    own nor one inside it). `metrics.json` there gains `calibration`: per head, what
    `calibration.calibrate_head` measured (ECE and Brier before and after, on cross-fitted halves of
    `data`) and the file. Returns that."""
    directory = Path(directory)
    out = bundle.check_writable_out(out, [data], bundle.model_folders(directory))
    if not Path(data).is_file():
        raise UserError(f"{said('data', data)}: no such file")
    net = bundle.load(directory)
    names = [pick_head(net, head)] if head is not None or len(net.tasks) == 1 else list(net.tasks)
    results = {}
    for name in names:
        task = net.tasks[name]
        examples = task.reading.read(data, need_labels=True)
        if not examples:
            raise UserError(f"{data}: no examples")
        task.spec.calibrate = True  # (a head trained with --no-calibrate gets one now)
        outputs = head_outputs(net, name, examples, batch_size, progress=f"calibrate {name}")
        results[name] = {**calibrate_head(task, outputs, examples, data), "fitted_on": str(data)}
    metrics = read_metrics(directory) or {}
    metrics["calibration"] = {**metrics.get("calibration", {}), **results}
    extra = {k: v for k, v in (getattr(net, "manifest", None) or {}).items() if k not in MANIFEST_OWN}
    bundle.save(net, out, metrics, extra)
    return results
