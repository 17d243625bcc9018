"""The two exception types whose message is shown to the user as it is: `UserError` (the input or
settings are wrong, exit 2) and `SystemFault` (the machine failed the run: disk full, permission
denied, out of memory; exit 1), and the helpers that word their messages."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or settings: the CLI prints the message on one line and exits with status 2."""


class SystemFault(Exception):
    """A fault of the environment, not of the input: the CLI prints the message on one line and
    exits with status 1; what the user had before the run is left as it was."""


class RowsName(str):
    """The name of rows held in memory (a DataFrame, a Dataset): `where` says `NAME row N`."""


def where(path: str | None, line: int | None = None, field: str | None = None) -> str:
    """`file:line` (or `file: field`; `NAME row N` for rows in memory) prefix for error messages."""
    text = str(path) if path else "<stdin>"
    if line is not None:
        text += f" row {line}" if isinstance(path, RowsName) else f":{line}"
    if field:
        text += f": {field}"
    return text


def header(path: str | None) -> str:
    """The prefix of an error in a table's column names: its first line (or, in memory, the table)."""
    return where(path) if isinstance(path, RowsName) else where(path, 1)


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (its type's name when it has none), for one-line messages."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def one_line(exc: BaseException) -> str:
    """An exception's message on one line: line breaks that reached it (a name, a value quoted
    from the input) are shown as `\\n`, so a message never spans lines."""
    return str(exc).replace("\r", "\\r").replace("\n", "\\n")
