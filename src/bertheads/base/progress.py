"""Where progress shows: a bar (tqdm's notebook-aware `tqdm.auto`) in Jupyter and on a terminal;
in a script whose stderr is a file, log lines with an ETA instead; and, from the Python API,
bertheads' log lines on stderr at INFO unless the caller set up logging or asked for quiet."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm

log = logging.getLogger("bertheads")


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where stderr is no terminal, yet a bar shows)."""
    shell = sys.modules.get("IPython")
    try:
        kernel = shell.get_ipython() if shell is not None else None
    except Exception:  # an IPython without a running shell
        return False
    return kernel is not None and type(kernel).__name__ == "ZMQInteractiveShell"


def bars_shown() -> bool:
    """A progress bar is drawn here: in a notebook, or when stderr is a terminal."""
    try:
        return in_notebook() or sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


def progress_bar(total: int | None = None, desc: str | None = None, unit: str = "it", show: bool = True,
                 **options) -> tqdm:
    """A bar where one is drawn (`bars_shown`) and `show` asks for it; a silent one otherwise."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not (show and bars_shown()), dynamic_ncols=True,
                **options)


def eta(done: int, total: int, seconds: float) -> str:
    """The time left at this rate, for a log line: `ETA 1 min 20 s`."""
    if done <= 0 or total <= done:
        return "ETA 0 s"
    left = seconds / done * (total - done)
    return f"ETA {int(left // 60)} min {int(left % 60)} s" if left >= 60 else f"ETA {left:.0f} s"


class OneLine(logging.Formatter):
    """`bertheads: MESSAGE` (`bertheads: warning: MESSAGE` above INFO)."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"bertheads: {prefix}{record.getMessage()}"


@contextmanager
def api_logging(verbose: bool = True) -> Iterator[None]:
    """For one call of the Python API: bertheads' lines on stderr, at INFO (`verbose=False`:
    warnings only), unless logging is already set up (the command line's handler, or the
    caller's own root handlers): then nothing changes."""
    if log.handlers or logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine())
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
