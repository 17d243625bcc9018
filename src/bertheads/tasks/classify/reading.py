"""Reading classify data (`formats.py` holds the readers)."""

from __future__ import annotations

from collections.abc import Iterator

from bertheads.base.errors import UserError, where
from bertheads.tasks.classify.formats import (
    ClassifyExample,
    iter_file,
    normalise_label,
    read_file,
    report,
    to_float,
)
from bertheads.tasks.classify.spec import ClassifySpec
from bertheads.tasks.forms import PAIR, TEXT, InputForm
from bertheads.tasks.parts import Reading, TextInput
from bertheads.text.readers import BadLine, source_name


class ClassifyReading(Reading):
    """A classify head's data: tables (TSV, CSV), JSON lines and plain lines, columns found by
    their names, rows in memory, Python texts and pairs; the labels checked against the head's."""

    formats = ("tsv", "csv", "jsonl", "lines")
    text_formats = ("tsv", "csv", "jsonl")  # (for `extract`: classify's tables are the generic reader)
    generic_reader = True

    @property
    def form(self) -> InputForm:  # type: ignore[override]
        """A head trained on pairs reads pairs."""
        return PAIR if self.spec.pair else TEXT

    def read(self, path: str | None, need_labels: bool = True, fmt: str | None = None) -> list[ClassifyExample]:
        examples = read_file(path, self.spec, fmt, need_labels)
        if need_labels:
            for e in examples:
                self.label_target(e, path)  # fail early on unseen or non-numeric labels
        return examples

    def iter_read(self, path, need_labels: bool = True, fmt: str | None = None, keep: tuple[str, ...] = (),
                  bad: BadLine | None = None) -> Iterator[ClassifyExample]:
        """`read`, one example at a time (see `iter_file`)."""
        name = source_name(path)
        for e in iter_file(path, self.spec, fmt, need_labels, keep, bad):
            if need_labels:
                try:
                    self.label_target(e, name)
                except UserError as exc:
                    report(exc, bad)
                    continue
            yield e

    def from_inputs(self, inputs: list) -> list[ClassifyExample]:
        """Examples from Python values: a string, or a (text, pair) tuple."""
        out = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                text, pair = item, None
            elif isinstance(item, (tuple, list)) and len(item) == 2:
                text, pair = item
            else:
                raise UserError(f"input {i}: expected a text or a (text, text) pair, got {type(item).__name__}")
            if not text or not str(text).strip():
                raise UserError(f"input {i}: empty text")
            out.append(ClassifyExample(str(text), None if pair is None else str(pair)))
        return out

    def label_target(self, example: ClassifyExample, path=None):
        """The loss's target for an example's label (UserError naming the line for one the head
        does not know)."""
        spec = self.spec
        label = example.label
        if spec.problem == "regression":
            value = to_float(label)
            if value is None:
                raise UserError(f"{where(path, example.line)}: label {label!r} is not a number")
            return value
        if spec.problem == "multi_label":
            if not isinstance(label, list):
                raise UserError(f"{where(path, example.line)}: expected a list of labels, got {label!r}")
            vec = [0.0] * len(spec.labels)
            for item in label:
                key = normalise_label(item)
                if key not in spec.labels:
                    raise UserError(f"{where(path, example.line)}: label {item!r} was not seen in training "
                                    f"(known: {', '.join(map(str, spec.labels))})")
                vec[spec.labels.index(key)] = 1.0
            return vec
        key = normalise_label(label)
        if key not in spec.labels and spec.label_names and str(key) in spec.label_names:
            return spec.label_names.index(str(key))
        if key not in spec.labels:
            raise UserError(f"{where(path, example.line)}: label {label!r} was not seen in training "
                            f"(known: {', '.join(map(str, spec.labels))})")
        return spec.labels.index(key)

    def blank_record(self, example: ClassifyExample) -> dict:
        """A JSON line of the training columns (as the training file named them), label null."""
        spec = self.spec
        record = {spec.text_column or "text": example.text}
        if example.pair is not None:
            record[spec.pair_column or "sentence2"] = example.pair
        return {**record, spec.label_column or "label": None}

    @classmethod
    def read_texts(cls, path: str | None, fmt: str) -> list[TextInput]:
        return [TextInput(e.text, e.pair, e.line) for e in read_file(path, ClassifySpec(), fmt, need_labels=False)]
