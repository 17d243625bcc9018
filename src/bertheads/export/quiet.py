"""The exporting tools' own chatter (torch's exporter, onnxscript, ONNX Runtime's quantizer,
which logs through the root logger) kept off stderr: each of their warnings becomes one
bertheads debug line (`-v` shows them), so `export` prints bertheads' lines only."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("bertheads")
TOOL_LOGGERS = ("torch", "onnxscript", "onnx_ir", "onnxruntime", "openvino")


class ToDebug(logging.Handler):
    """Passes a tool's log record on as one bertheads debug line."""

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(record.getMessage().split())
        log.debug(f"{record.name}: {record.levelname.lower()}: {text[:500]}")


@contextmanager
def tools_quiet() -> Iterator[None]:
    """While exporting: Python warnings and the tools' log records go to bertheads' debug log."""
    handler = ToDebug()
    root = logging.getLogger()
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate,
                    logging.getLogger(name).level) for name in TOOL_LOGGERS}
    root_handlers = root.handlers[:]
    root.handlers[:] = [handler]  # a root logger with a handler: logging.warning() sets up no stderr handler
    for name in TOOL_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        # torch's exporter sets up its own stderr handlers again while it runs: only errors pass
        logger.setLevel(logging.ERROR if name == "torch" else logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        for w in caught:
            log.debug(f"warning: {w.category.__name__}: {' '.join(str(w.message).split())[:500]}")
    finally:
        root.handlers[:] = root_handlers
        for name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.propagate = propagate
            logger.setLevel(level)
