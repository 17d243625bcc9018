"""Where progress shows: a bar (tqdm's notebook-aware `tqdm.auto`) in Jupyter and on a terminal;
in a script whose stderr is a file, log lines with an ETA instead; and, from the Python API,
bertheads' log lines on stderr at INFO unless the caller set up logging or asked for quiet."""

from __future__ import annotations

import logging
import sys
import time
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


LOG_LINE_SECONDS = 60.0  # where no bar is drawn: a progress line this often
LOG_FIRST_SECONDS = 10.0  # ... the first one this soon


class LogLines:
    """A stage's progress as log lines where no bar is drawn (`show` and not `bars_shown`): `due`
    says when the next one is (the first `LOG_FIRST_SECONDS` in, then every `LOG_LINE_SECONDS`),
    `line` gives `NAME: 40/120 UNIT, 3.1 UNIT/s, 31.0 s, ETA 1 min 2 s` and counts it as shown
    (`total` None, a stream of unknown length: `NAME: 40 UNIT, 3.1 UNIT/s, 31.0 s`). `tick(done)`
    logs that line when it is due."""

    def __init__(self, name: str, total: int | None, unit: str = "batches", show: bool = True, start: int = 0) -> None:
        self.name, self.total, self.unit, self.start = name, total, unit, start
        self.on = show and not bars_shown()
        self.started = time.perf_counter()
        self.last = self.started - (LOG_LINE_SECONDS - LOG_FIRST_SECONDS)

    def due(self) -> bool:
        return self.on and time.perf_counter() - self.last >= LOG_LINE_SECONDS

    def mark(self) -> float:
        """A line was shown now (the next is due `LOG_LINE_SECONDS` on); the time."""
        self.last = time.perf_counter()
        return self.last

    def line(self, done: int, figures: str = "") -> str:
        """The line at `done` of `total` (`figures`, such as `loss=0.21`, after the count)."""
        seconds = self.mark() - self.started
        rate = f"{(done - self.start) / max(seconds, 1e-9):.1f} {self.unit}/s"
        if self.total is None:
            return f"{self.name}: {done} {self.unit}, {figures + ', ' if figures else ''}{rate}, {seconds:.1f} s"
        left = eta(done - self.start, self.total - self.start, seconds)
        return f"{self.name}: {done}/{self.total} {self.unit}, {figures + ', ' if figures else ''}{rate}, {seconds:.1f} s, {left}"

    def tick(self, done: int, figures: str = "") -> None:
        """Log the line at `done` when one is due."""
        if self.due():
            log.info(self.line(done, figures))


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
