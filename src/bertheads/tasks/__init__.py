"""Task kinds: each module owns its formats, encoding, head, loss, decoding and metrics.
`TASKS` is the registry the command line, the bundle and `extract` read: one line per kind;
`register` adds a kind (a `Task` subclass), `unregister` takes one away."""

from __future__ import annotations

import dataclasses

from bertheads.tasks.base import COMMANDS, TASKS, Task
from bertheads.tasks.classify.task import ClassifyTask
from bertheads.tasks.qa.task import QATask
from bertheads.tasks.tag.task import TagTask

__all__ = ["COMMANDS", "TASKS", "inference_options", "register", "unregister"]


def register(cls: type[Task]) -> type[Task]:
    """Add a task kind to the registry (its `kind` must be new); returns the class."""
    if cls.kind in TASKS and TASKS[cls.kind] is not cls:
        raise ValueError(f"a task kind {cls.kind!r} is registered already")
    TASKS[cls.kind] = cls
    return cls


def unregister(kind: str) -> None:
    """Take a task kind out of the registry."""
    TASKS.pop(kind, None)


def inference_options(command: str) -> dict[str, dataclasses.Field]:
    """name -> field of the kinds' inference options that `command` takes as flags (a name two
    kinds declare: the first kind's)."""
    out: dict[str, dataclasses.Field] = {}
    for cls in TASKS.values():
        for name, f in cls.option_fields().items():
            if command in f.metadata.get("commands", COMMANDS) and f.metadata.get("cli", True):
                out.setdefault(name, f)
    return out


for _cls in (ClassifyTask, TagTask, QATask):
    register(_cls)
