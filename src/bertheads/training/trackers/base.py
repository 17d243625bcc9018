"""The tracker interface and the registry of trackers by name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from bertheads.base.errors import UserError
from bertheads.base.schema import said

TRACKERS: dict[str, type[Tracker]] = {}
NONE = "none"  # `--track none`: only OUT/log.jsonl


class Tracker:
    """One place a run's figures go. The loop calls, on the main process: `params` once with the
    run's resolved settings, `train` every `--log-every` steps, `evaluation` after each dev
    evaluation, and `finish` once at the end (`status` FINISHED, FAILED or KILLED; `result`, what
    metrics.json holds, and `out`, the saved model's directory, when the run finished)."""

    name: ClassVar[str] = ""

    @classmethod
    def check(cls) -> None:
        """Refuse, in one line, a tracker whose library is not installed (before the run starts)."""

    def __init__(self, out: Path, settings: Any, after_step: int | None) -> None:
        """`after_step`: a resumed run's checkpoint step (None for a fresh run)."""

    def params(self, settings: dict) -> None: ...

    def train(self, step: int, values: dict[str, float]) -> None: ...

    def evaluation(self, step: int, dev: dict[str, dict], kept: bool) -> None: ...

    def finish(self, status: str, result: dict | None = None, out: Path | None = None) -> None: ...


def register(cls: type[Tracker]) -> type[Tracker]:
    """Make a tracker known to `--track` by its `name`."""
    TRACKERS[cls.name] = cls
    return cls


def chosen(settings: Any) -> list[str]:
    """The trackers a run's settings ask for (`track`, and `tensorboard`, the older switch)."""
    names = settings.track if isinstance(settings.track, (list, tuple)) else [settings.track] if settings.track else []
    if NONE in names and len(names) > 1:
        raise UserError(f"{said('track')}: 'none' and {', '.join(n for n in names if n != NONE)} exclude each other")
    names = [n for n in names if n != NONE]
    if getattr(settings, "tensorboard", False) and "tensorboard" not in names:
        names.append("tensorboard")
    for n in names:
        if n not in TRACKERS:
            raise UserError(f"{said('track')}: unknown tracker {n!r} (known: {', '.join(TRACKERS)}, none)")
    return list(dict.fromkeys(names))


def check_trackers(settings: Any) -> list[str]:
    """The chosen trackers, each checked to be usable (see `Tracker.check`)."""
    names = chosen(settings)
    for name in names:
        TRACKERS[name].check()
    return names


def open_trackers(out: Path, settings: Any, after_step: int | None) -> list[Tracker]:
    return [TRACKERS[name](out, settings, after_step) for name in chosen(settings)]


def numbers(metrics: dict, prefix: str) -> dict[str, float]:
    """The finite numbers of a (nested) metrics dict, keyed `prefix/name[/inner]`."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}"
        if isinstance(value, dict):
            out.update(numbers(value, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
                and abs(value) != float("inf"):
            out[name] = float(value)
    return out


def flat(settings: dict, prefix: str = "") -> dict[str, str]:
    """Nested settings as `a.b` keys and text values (what parameter stores keep)."""
    out: dict[str, str] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, name + "."))
        else:
            out[name] = "" if value is None else str(value)
    return out


def safe_key(name: str) -> str:
    """A metric or parameter name with only the characters trackers accept."""
    return re.sub(r"[^\w\-. /]", "_", name)
