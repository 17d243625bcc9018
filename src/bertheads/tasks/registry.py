"""The task kinds by name: `TASKS` is what the command line, the bundle and `extract` read;
`register` adds a kind (a `Task` subclass), `unregister` takes one away."""

from __future__ import annotations

from typing import Any

TASKS: dict[str, Any] = {}  # kind -> its Task class


def register(cls):
    """Add a task kind to the registry (its `kind` must be new); returns the class."""
    if cls.kind in TASKS and TASKS[cls.kind] is not cls:
        raise ValueError(f"a task kind {cls.kind!r} is registered already")
    TASKS[cls.kind] = cls
    return cls


def unregister(kind: str) -> None:
    """Take a task kind out of the registry."""
    TASKS.pop(kind, None)
