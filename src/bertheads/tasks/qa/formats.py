"""Question-answering readers: SQuAD JSON documents and JSON lines."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from bertheads.base.errors import UserError, where
from bertheads.base.schema import said
from bertheads.text.readers import BadLine, open_lines, parse_json, read_jsonl, required_text, source_name
from bertheads.text.rows import Rows


@dataclass
class QAExample:
    question: str
    context: str
    id: str
    answers: list[str] = field(default_factory=list)  # gold texts; empty: no answer
    starts: list[int] = field(default_factory=list)  # their character offsets (-1: not given)
    has_id: bool = False  # the input named its id (predictions then carry it)
    record: str = ""  # "FILE:LINE" or "FILE: question ID", for messages
    extra: dict = field(default_factory=dict)  # --keep-fields carried into the prediction


def check_text(value, name: str, record: str) -> str:
    return required_text(value, record, name)


def read_examples(path: str | None, need_labels: bool = True, strict: bool = True,
                  fmt: str | None = None) -> list[QAExample]:
    """SQuAD JSON or JSON lines. `strict=False` (training data): a question whose
    answer_start does not match its text is skipped and counted, with one warning at the end."""
    skipped: list[str] = []
    examples = list(iter_examples(path, need_labels, strict, fmt, skipped=skipped))
    if skipped:
        print(f"bertheads: warning: skipped {len(skipped)} training question(s) whose answer_start does not "
              f"match the answer text (first: {skipped[0]})", file=sys.stderr)
    if not examples:
        raise UserError(f"{where(source_name(path))}: no questions")
    return examples


def iter_examples(path, need_labels: bool = True, strict: bool = True, fmt: str | None = None,
                  keep: tuple[str, ...] = (), bad: BadLine | None = None,
                  skipped: list[str] | None = None) -> Iterator[QAExample]:
    """`read_examples` one question at a time: JSON lines are read as needed; a SQuAD JSON
    document is one JSON value, so its text is read and parsed whole first (its questions are
    then encoded and predicted a chunk at a time). Records carry the `keep` fields."""
    if fmt not in (None, "auto", "json", "jsonl", "squad"):
        raise UserError(f"{said('format', fmt)}: the qa task reads SQuAD JSON or JSON lines")
    name = source_name(path)
    if isinstance(path, Rows):
        yield from question_examples(jsonl_records(path, name, bad), need_labels, strict, keep, bad, skipped)
        return
    lines = open_lines(path)
    head: list[str] = []
    for line in lines:
        head.append(line)
        if line.strip():
            break
    if not any(line.strip() for line in head):
        raise UserError(f"{where(name)}: file is empty")
    if is_squad_document(head[-1], fmt):
        if keep:
            raise UserError(f"{said('keep_fields')}: SQuAD JSON questions have only their id; use JSON lines")
        records = squad_records("".join(head) + "".join(lines), name)
    else:
        records = jsonl_records(itertools.chain(head, lines), name, bad)
    yield from question_examples(records, need_labels, strict, keep, bad, skipped)


def question_examples(records, need_labels: bool, strict: bool, keep: tuple[str, ...], bad: BadLine | None,
                      skipped: list[str] | None) -> Iterator[QAExample]:
    for record, qid, has_id, obj, context in records:
        try:
            ex = make_example(record, qid, has_id, obj, context, need_labels, strict)
        except UserError as exc:
            if bad is None:
                raise
            bad(exc)
            continue
        if ex is None:
            if skipped is not None:
                skipped.append(record)
            continue
        if keep:
            ex.extra = {k: obj.get(k) for k in keep}
        yield ex


def is_squad_document(text: str, fmt: str | None) -> bool:
    """A whole-file JSON document (SQuAD) rather than one JSON object per line (`text`: the
    file's first line that is not blank, or more)."""
    if fmt in ("json", "squad"):
        return True
    if fmt == "jsonl":
        return False
    first = next(line for line in text.splitlines() if line.strip())
    try:
        obj = json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        return not first.lstrip().startswith("[")  # a JSON document over several lines
    return isinstance(obj, dict) and "data" in obj


def squad_records(text: str, path):
    """(record name, id, question object, context) for each question of a SQuAD document."""
    doc = parse_json(text, path)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise UserError(f"{where(path)}: expected SQuAD JSON with a 'data' list (or JSON lines)")
    for a, article in enumerate(doc["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise UserError(f"{where(path)}: data[{a}]: expected a 'paragraphs' list")
        for p, para in enumerate(paragraphs):
            if not isinstance(para, dict) or not isinstance(para.get("qas"), list):
                raise UserError(f"{where(path)}: data[{a}].paragraphs[{p}]: expected a 'qas' list")
            context = para.get("context")
            for q, qa in enumerate(para["qas"]):
                qid = qa.get("id") if isinstance(qa, dict) else None
                name = f"question {qid}" if qid is not None else f"data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict):
                    raise UserError(f"{where(path)}: {name}: expected a JSON object")
                yield f"{where(path)}: {name}", qid if qid is not None else f"{a}.{p}.{q}", qid is not None, qa, context


def jsonl_records(path, name: str | None = None, bad: BadLine | None = None):
    name = name or source_name(path)
    for line, obj in path.rows() if isinstance(path, Rows) else read_jsonl(path, bad, name):
        yield where(name, line), obj.get("id", line), "id" in obj, obj, obj.get("context")


def make_example(record: str, qid, has_id: bool, obj: dict, context, need_labels: bool,
                 strict: bool) -> QAExample | None:
    question = check_text(obj.get("question"), "question", record)
    if context is None:
        raise UserError(f"{record}: question without a context")
    context = check_text(context, "context", record)
    ex = QAExample(question, context, str(qid), has_id=has_id, record=record)
    if not need_labels:
        return ex
    answers = obj.get("answers")
    impossible = bool(obj.get("is_impossible", False))
    if answers is None and not impossible:
        raise UserError(f"{record}: missing 'answers' (or is_impossible: true)")
    if answers is None or impossible:
        return ex
    texts, starts = answer_lists(answers, record)
    for t, s in zip(texts, starts):
        if s == -1:
            if t not in context:
                raise UserError(f"{record}: answer {t!r} is not in its context")
            continue
        if not 0 <= s <= len(context) - len(t):
            if not strict:
                return None
            raise UserError(f"{record}: answer {t!r} at {s} is outside its context ({len(context)} characters)")
        if context[s:s + len(t)] != t:
            if not strict:
                return None
            if t not in context:
                raise UserError(f"{record}: answer {t!r} is not in its context")
    ex.answers, ex.starts = texts, starts
    return ex


def answer_lists(answers, record: str) -> tuple[list[str], list[int]]:
    """Answer texts and starts from `{"text": [...], "answer_start": [...]}` or a list of
    `{"text", "answer_start"}` objects (a missing start is -1)."""
    if isinstance(answers, dict):
        texts, starts = answers.get("text", []), answers.get("answer_start")
        if starts is None:
            starts = [-1] * len(texts) if isinstance(texts, list) else None
        if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            raise UserError(f"{record}: 'answers' needs 'text' and 'answer_start' lists of the same length")
    elif isinstance(answers, list):
        if not all(isinstance(a, dict) for a in answers):
            raise UserError(f"{record}: 'answers' items must be objects with 'text' and 'answer_start'")
        texts = [a.get("text") for a in answers]
        starts = [a.get("answer_start", -1) for a in answers]
    else:
        raise UserError(f"{record}: 'answers' must be a list or a {{'text', 'answer_start'}} object")
    for t, s in zip(texts, starts):
        if not isinstance(t, str) or not t:
            raise UserError(f"{record}: answer text must be a non-empty string, got {t!r}")
        if isinstance(s, bool) or not isinstance(s, int):
            raise UserError(f"{record}: answer_start must be an integer, got {s!r}")
    return list(texts), list(starts)
