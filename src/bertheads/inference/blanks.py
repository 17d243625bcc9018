"""Blank lines of plain-text input kept in the output of `predict` and `analyze`: each gets a
record `{"line": N, "skipped": "blank"}` in its place, so output line k answers input line k.

The plain-line reader (`text/readers.py` `read_lines`) tells the blank lines it passes over; the
blank lines written before an input are the run of them right above its line (every other line
of plain text is an input, or a bad one that was skipped), and those after the last input end
the output. Each process of a torchrun job reads every line, so each writes the blank lines of
its own chunks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from bertheads.text.readers import BLANK_LINES


def blank_record(line: int) -> str:
    """The output line that stands for blank input line `line`."""
    return json.dumps({"line": line, "skipped": "blank"}) + "\n"


class BlankLines:
    """The blank lines read so far, and the records that put them in place."""

    def __init__(self) -> None:
        self.pending: set[int] = set()

    @contextmanager
    def active(self) -> Iterator[BlankLines]:
        """Collect the blank lines the plain-line reader passes over in this block."""
        token = BLANK_LINES.set(self.pending.add)
        try:
            yield self
        finally:
            BLANK_LINES.reset(token)

    def before(self, line: int) -> str:
        """Records of the blank lines right above input line `line`."""
        run = []
        n = line - 1
        while n in self.pending:
            run.append(n)
            n -= 1
        self.pending.difference_update(run)
        if len(self.pending) > 4096:  # blank lines of other processes' chunks, or above a skipped bad line
            self.pending = {b for b in self.pending if b > line}
        return "".join(blank_record(b) for b in reversed(run))

    def after(self, line: int) -> str:
        """Records of the blank lines right below input line `line` (the end of the input)."""
        run = []
        n = line + 1
        while n in self.pending:
            run.append(n)
            n += 1
        return "".join(blank_record(b) for b in run)

    def render(self, task, predictions: list, examples: list, fmt: str | None = None) -> str:
        """`task.judging.render` of a chunk, with the records of its blank lines in place."""
        if not self.pending:
            return task.judging.render(predictions, examples, fmt)
        out, start = [], 0
        for i, example in enumerate(examples):
            line = getattr(example, "line", None)
            gap = self.before(line) if isinstance(line, int) else ""
            if gap:
                if i > start:
                    out.append(task.judging.render(predictions[start:i], examples[start:i], fmt))
                out.append(gap)
                start = i
        out.append(task.judging.render(predictions[start:], examples[start:], fmt))
        return "".join(out)

    def lines(self, records: list[tuple[int, str]]) -> str:
        """`(line, text)` output lines of one chunk, with the records of its blank lines in place."""
        return "".join(self.before(line) + text for line, text in records)
