"""Reading qa data (`formats.py` holds the readers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.tasks.base import TextInput
from bertheads.tasks.parts import Reading
from bertheads.tasks.qa.form import QUESTION
from bertheads.tasks.qa.formats import QAExample, check_text, iter_examples, read_examples
from bertheads.text.readers import read_text


class QAReading(Reading):
    """A qa head's data: SQuAD JSON and JSON lines (a question at a time), rows in memory, Python
    `{question, context}` dicts or pairs, and `--question/--context`."""

    form = QUESTION
    formats = ("json", "squad", "jsonl")
    text_formats = ("squad", "jsonl")
    counts_lines = False  # records are questions, many to a SQuAD line

    def blank_record(self, example) -> dict:
        """A JSON line of the question and its passage with no answers yet."""
        return {"question": example.question, "context": example.context, "answers": []}

    def read(self, path: str | None, need_labels: bool = True, fmt: str | None = None) -> list[QAExample]:
        """The file's questions, or the one `--question`/`--context` give (the call options)."""
        options = self.task.options.values
        question, context = options.question, options.context
        if question is not None or context is not None:
            if path is not None:
                raise UserError(f"give either {said('input')} or {said('question')} and {said('context')}, not both")
            return self.from_inputs([{"question": question, "context": context}], source="--question/--context")
        return read_examples(path, need_labels, fmt=fmt)

    def iter_read(self, path, need_labels: bool = True, fmt: str | None = None, keep: tuple[str, ...] = (),
                  bad=None) -> Iterator[QAExample]:
        """`read`, a question at a time (see `formats.iter_examples` for SQuAD JSON)."""
        options = self.task.options.values
        if options.question is not None or options.context is not None:
            yield from self.read(path, need_labels, fmt)
            return
        yield from iter_examples(path, need_labels, fmt=fmt, keep=keep, bad=bad)

    def from_inputs(self, inputs: list, source: str = "input") -> list[QAExample]:
        """Examples from `{"question", "context"}` dicts or `(question, context)` tuples."""
        out = []
        for i, item in enumerate(inputs):
            label = f"{source} {i}" if source == "input" else source
            if isinstance(item, dict):
                question, context, qid = item.get("question"), item.get("context"), item.get("id", i)
                has_id = "id" in item
            elif isinstance(item, (tuple, list)) and len(item) == 2:
                (question, context), qid, has_id = item, i, False
            else:
                raise UserError(f"{label}: expected a {{'question', 'context'}} dict or a (question, context) "
                                f"pair, got {type(item).__name__}")
            out.append(QAExample(check_text(question, "question", label), check_text(context, "context", label),
                                 str(qid), has_id=has_id, record=label))
        return out

    @classmethod
    def sniff_format(cls, path: str) -> str | None:
        if Path(path).suffix.lower() == ".json" and read_text(path).lstrip().startswith("{"):
            return "squad"
        return None

    @classmethod
    def claims_records(cls, keys: set[str]) -> bool:
        return {"question", "context"} <= keys

    @classmethod
    def read_texts(cls, path: str | None, fmt: str) -> list[TextInput]:
        """Each question with its passage as a pair (and its id)."""
        return [TextInput(e.question, e.context, line_of(e.record), {"id": e.id} if e.has_id or fmt == "squad" else {})
                for e in read_examples(path, need_labels=False, fmt=fmt)]


# -- windows ---------------------------------------------------------------------------------
def line_of(record: str) -> int | None:
    """The line number in a "FILE:LINE" record name, if it has one."""
    tail = record.rpartition(":")[2]
    return int(tail) if tail.isdigit() else None

