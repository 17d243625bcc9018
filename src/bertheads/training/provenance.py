"""What a saved model records of how it was made: the line that says what the run settled and
why (`chosen`, logged once and kept in config.yaml and the manifest), the versions it was made
with (`made_with`) and its full settings as a config file holds them (`made_from`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from bertheads.base.schema import said, tagged
from bertheads.text.rows import Rows
from bertheads.training.config import MultiConfig
from bertheads.training.resolve import SettledRun
from bertheads.training.settings import TrainSettings


def chosen_line(run: SettledRun, data: list) -> str:
    """The one line that says what the run settled:
    `200 training examples: --mode features ..., batch 8, up to 38 epochs, keeping the best on dev`."""
    given, settings, recipe = run.given, run.settings, run.recipe
    fixed = settings.recipe == "fixed"
    tuned = sorted({d.task.spec.tune_layers for d in data if getattr(d.task.spec, "tune_layers", None)})
    branches = [f"each head with its own top {'/'.join(map(str, tuned))} layers ({said('tune_layers')}), "
                f"lr {settings.lr:g}"] if tuned else []
    parts = [mode_line(run.mode) + ("" if run.mode_left else " (given)"), *branches,
             *([f"{settings.pairs:,} pairs ({recipe.pairs_each} an example)"] if settings.pairs and not given.pairs
               else []),
             f"batch {settings.batch_size}" + ("" if given.batch_size is None else " (given)")]
    parts.append(epochs_part(given, settings.epochs, data, fixed))
    how = f" ({said('recipe')} fixed)" if fixed else ""
    return f"{sum(d.examples for d in data)} training examples{how}: {', '.join(parts)}"


def mode_line(mode: str) -> str:
    """How the chosen line names a mode."""
    if mode == "features":
        return f"{said('mode', 'features')} (the head alone, on the frozen encoder's states)"
    if mode == "contrastive":
        return (f"{said('mode', 'contrastive')} (the encoder tuned on pairs of training texts, SetFit's recipe; "
                "then the head alone on it)")
    return "fine-tuning"


def epochs_part(given: TrainSettings, epochs: int, data: list, fixed: bool) -> str:
    """The chosen line's epochs and which of them is kept, on what."""
    count = f"{epochs} epoch{'' if epochs == 1 else 's'}{'' if given.epochs is None else ' (given)'}"
    held = sum(d.held_out for d in data)
    dev = any(d.dev_path for d in data)
    if given.keep == "last":
        return f"{count}, keeping the last ({said('keep')} last)"
    if dev or held:
        where = "dev" if dev else f"{held} held-out training examples (no {said('dev')}; {said('holdout')} 0 for none)"
        return f"{'' if epochs == 1 else 'up to '}{count}, keeping the best on {where}"
    why = (f"{said('holdout')} 0" if given.holdout == 0 else "none held out with a fixed recipe"
           if fixed else "too few examples to hold some out")
    return f"{count}, keeping the last (no {said('dev')}; {why})"


def made_with() -> dict:
    """The versions of bertheads, Python, torch and transformers."""
    import transformers

    version = getattr(sys.modules.get("bertheads"), "__version__", "unknown")
    return plain({"bertheads": version, "python": sys.version.split()[0], "torch": torch.__version__,
                  "transformers": transformers.__version__})


def plain(value):
    """A value as YAML writes it safely (tuples as lists, paths as text)."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, str):
        return str(value)  # a str subclass (torch's version) as plain text
    if value is None or isinstance(value, (int, float, bool)):
        return value
    return str(value)


def made_from(config: MultiConfig, model: str, settings: TrainSettings, limit: int | None,
              options: dict[str, dict]) -> dict:
    """A run's full settings as a config file holds them (what `read_config` reads back): the
    start model, every training setting but those that only steer the run, and each task's
    kind, data and options (one task at the top level, several under `tasks`)."""
    source = str(Path(model).resolve()) if model not in (None, "", "default") and Path(model).exists() else model
    left_out = set(tagged(TrainSettings, "not-recorded"))
    training = {k: v for k, v in dataclasses.asdict(settings).items() if k not in left_out}
    tasks = {}
    for t in config.tasks:
        entry = {"kind": t.kind, "train": data_name(t.train), **({"dev": data_name(t.dev)} if t.dev else {}),
                 **({"limit": t.limit or limit} if (t.limit or limit) else {}),
                 **{k: v for k, v in options[t.name].items() if v is not None}}
        tasks[t.name] = plain(entry)
    record = {"model": source, **plain(training)}
    if config.single and len(tasks) == 1:
        return {**next(iter(tasks.values())), **record}
    return {"tasks": tasks, **record}


def data_name(data) -> str:
    """A task's data as a config records it: a path, or a description of rows given in memory."""
    return data.description() if isinstance(data, Rows) else str(data)
