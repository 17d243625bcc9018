"""The one exception type whose message is shown to the user as it is, and the helpers that
word its messages."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or settings: the CLI prints the message on one line and exits with status 2."""


def where(path: str | None, line: int | None = None, field: str | None = None) -> str:
    """`file:line` (or `file: field`) prefix for error messages."""
    text = str(path) if path else "<stdin>"
    if line is not None:
        text += f":{line}"
    if field:
        text += f": {field}"
    return text


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (its type's name when it has none), for one-line messages."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
