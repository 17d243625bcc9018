"""Task kinds: each module owns its formats, encoding, head, loss, decoding and metrics.
`TASKS` is the registry the command line, the bundle and `extract` read: one line per kind;
`register` adds a kind (a `Task` subclass), `unregister` takes one away."""

from __future__ import annotations

import dataclasses

from bertheads.tasks.classify.task import ClassifyTask
from bertheads.tasks.options import option_fields, overrides
from bertheads.tasks.qa.task import QATask
from bertheads.tasks.registry import TASKS, register, unregister
from bertheads.tasks.tag.task import TagTask

__all__ = ["TASKS", "inference_flags", "inference_options", "input_formats", "register", "unregister"]


def input_formats() -> tuple[str, ...]:
    """Every format some kind's `read` takes, in registry order."""
    return tuple(dict.fromkeys(fmt for cls in TASKS.values() for fmt in cls.parts.reading.formats))


def inference_options(command: str) -> dict[str, dataclasses.Field]:
    """name -> field of the kinds' inference options that `command` takes as flags (a name two
    kinds declare: the first kind's)."""
    return {name: f for name, (f, _) in inference_flags(command).items()}


def inference_flags(command: str) -> dict[str, tuple[dataclasses.Field, str]]:
    """name -> (field, help) of `command`'s flags for the kinds' inference options (a name two
    kinds declare: the first kind's field): the help names the kinds that take it, and says
    when it overrides a saved head's setting."""
    found: dict[str, tuple[dataclasses.Field, bool, list[str]]] = {}
    for kind, cls in TASKS.items():
        for name, f in option_fields(cls).items():
            if command in f.metadata.get("at", ()) and f.metadata.get("cli", True):
                found.setdefault(name, (f, overrides(cls, name), []))[2].append(kind)
    saved = "override the saved head's setting: "
    return {name: (f, f"{', '.join(kinds)}: {saved if override else ''}{f.metadata.get('help', '')}")
            for name, (f, override, kinds) in found.items()}


for _cls in (ClassifyTask, TagTask, QATask):
    register(_cls)
