"""Every `bertheads` command: its parser and its handler.

```
bertheads train KIND --train F [--dev F] --out DIR    KIND: classify, tag, qa, or multi --config F
bertheads evaluate DIR --data F                        metrics of a saved model
bertheads predict DIR [--input F] [--output F]         predictions as JSON lines, in input order
bertheads extract --input F --out DIR                  frozen-encoder vectors for other tools
bertheads tune KIND --train F --dev F --out DIR       search training settings, keep the best model
bertheads report DIR [--data F] [--out PAGE_DIR]       an HTML page of figures for a saved model
bertheads combine DIR DIR ... --out DIR                one model from several sharing an encoder
bertheads serve DIR                                    HTTP API and web page
```
Bad input ends with one line `bertheads: error: ...` naming the file and line (or the option),
exit status 2; `-v` shows more of what happens, `-q` only warnings and errors.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

from bertheads.base.errors import SystemFault, UserError, one_line
from bertheads.base.progress import OneLine
from bertheads.base.schema import FACE
from bertheads.cli.parser import build_parser
from bertheads.store.faults import is_disk_full, system_fault

log = logging.getLogger("bertheads")



# -- running ---------------------------------------------------------------------------
def set_up_logging(verbose: bool = False, quiet: bool = False) -> None:
    """bertheads' messages on stderr, one line each (`-v`: debug too; `-q`: warnings and errors)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine())
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)


@contextlib.contextmanager
def others_quiet(quiet: bool) -> Iterator[None]:
    """With `-q`, other libraries' chatter off too: their Python warnings, their log records
    below errors, and transformers' and huggingface_hub's progress bars (put back after)."""
    if not quiet:
        yield
        return
    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    root = logging.getLogger()
    level, bars, hub_bars, hf_level = root.level, hf_logging.is_progress_bar_enabled(), \
        not hub.are_progress_bars_disabled(), hf_logging.get_verbosity()
    root.setLevel(logging.ERROR)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)
        hf_logging.set_verbosity(hf_level)
        if bars:
            hf_logging.enable_progress_bar()
        if hub_bars:
            hub.enable_progress_bars()


def main(argv: list[str] | None = None) -> int:
    """Run one command; its messages name settings by their flags (`schema.FACE`), and every
    failure is one line on stderr with its exit code."""
    face = FACE.set("cli")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        args = build_parser().parse_args(argv)
        set_up_logging(getattr(args, "verbose", False), getattr(args, "quiet", False))
        with others_quiet(getattr(args, "quiet", False)):
            return args.handler(args)
    except UserError as exc:
        print(f"bertheads: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"bertheads: interrupted{': ' + str(exc) if str(exc) else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except SystemFault as exc:
        print(f"bertheads: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"bertheads: error: out of memory ({available_memory()} available); try a smaller --batch-size, "
              "--max-length or --chunk-size", file=sys.stderr)
        return 1
    except Exception as exc:  # an internal fault: still one line, the traceback on request
        if os.environ.get("BERTHEADS_DEBUG"):
            raise
        fault = environment_fault(exc)
        if fault is not None:
            print(f"bertheads: error: {fault}", file=sys.stderr)
            return 1
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"bertheads: internal error: {type(exc).__name__}: {msg} (BERTHEADS_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1
    finally:
        FACE.reset(face)


def environment_fault(exc: Exception) -> str | None:
    """The one line for an error of the machine met outside the atomic writers (which name their
    target themselves): a full disk, permission denied, a read-only file system, memory."""
    if isinstance(exc, RuntimeError) and ("can't allocate memory" in str(exc) or "not enough memory" in str(exc)):
        return f"out of memory ({available_memory()} available); try a smaller --batch-size or --max-length"
    if not isinstance(exc, OSError) and not is_disk_full(exc):
        return None
    target = Path(getattr(exc, "filename", None) or Path.cwd())
    fault = system_fault(exc, target, "output", kept=False)
    return None if fault is None else str(fault)


def available_memory() -> str:
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        return f"{int(info['MemAvailable'].split()[0]) / 1e6:.1f} GB"
    except (OSError, KeyError, ValueError):
        return "unknown"


def command() -> None:
    """The `bertheads` command: main(), then a quick exit.

    When the command is done (its files are written and renamed into place), the exit handlers
    run and the standard streams are flushed, and then the process ends without Python tearing
    down every imported module one by one, which takes most of a second once torch is loaded.
    The usual exit is kept under torchrun and while a non-daemon thread still runs."""
    code = main()
    alone = "WORLD_SIZE" not in os.environ
    workers = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if not alone or workers:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that went away, a stream already closed
            pass
    os._exit(code)


if __name__ == "__main__":
    command()
