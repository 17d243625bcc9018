"""Tag schemes: IOB1/IOB2/IOBES/BILOU recognition, entity decoding by the conlleval rules,
and entity-level metrics as seqeval's default mode computes them."""

from __future__ import annotations

import re

from bertheads.errors import UserError, where

TAG_RE = re.compile(r"^(?:O|([BIESLU])-(.+))$")
PREFIX_ORDER = "BIESLU"


def check_tag(tag: str, path, line_no: int) -> None:
    if not TAG_RE.match(tag):
        raise UserError(f"{where(path, line_no)}: tag {tag!r} is outside the tagging scheme "
                        f"(expected O or B-, I-, E-, S-, L-, U- followed by a type)")


def split_tag(tag: str) -> tuple[str, str]:
    return ("O", "") if tag == "O" else (tag[0], tag[2:])


def detect_scheme(examples: list, path) -> str:
    """BILOU, IOBES, IOB1 (an I- tag may begin an entity) or IOB2."""
    prefixes = {split_tag(t)[0] for e in examples for t in e.tags}
    if prefixes & set("LU") and prefixes & set("ES"):
        raise UserError(f"{where(path)}: tags mix IOBES (E-, S-) and BILOU (L-, U-) prefixes")
    if prefixes & set("LU"):
        return "BILOU"
    if prefixes & set("ES"):
        return "IOBES"
    for e in examples:
        prev = ("O", "")
        for t in e.tags:
            p, kind = split_tag(t)
            if p == "I" and (prev[0] == "O" or prev[1] != kind):
                return "IOB1"
            prev = (p, kind)
    return "IOB2"


def inside(tag: str) -> str:
    """The tag a word's continuation pieces learn under `--label-subwords all`."""
    return "O" if tag == "O" else "I-" + tag[2:]


def tag_list(examples: list, with_inside: bool) -> list[str]:
    """"O" first, then by type and prefix (B, I, E, S, L, U)."""
    seen = {t for e in examples for t in e.tags}
    if with_inside:
        seen |= {inside(t) for t in seen}
    rest = sorted((t for t in seen if t != "O"), key=lambda t: (t[2:], PREFIX_ORDER.index(t[0])))
    return ["O", *rest]


def scheme_codes(tags: list[str]) -> tuple[list[str], list[str]]:
    """Each tag's conlleval role (O, B, I, E, S; L reads as E and U as S) and its type."""
    roles = {"L": "E", "U": "S"}
    codes, types = [], []
    for t in tags:
        p, kind = split_tag(t)
        codes.append(roles.get(p, p))
        types.append(kind)
    return codes, types


def entity_spans(codes: list[str], types: list[str]) -> list[tuple[str, int, int]]:
    """(type, first word, end word exclusive) by the conlleval rules of seqeval's default
    mode: an entity ends after E or S, before B, S or O, or when the type changes; it starts
    at B or S, at I or E after O, E or S, or when the type changes."""
    out = []
    prev, prev_type, begin = "O", "", 0
    for i, (code, kind) in enumerate(zip([*codes, "O"], [*types, ""])):
        ends = prev in ("E", "S") or (prev in ("B", "I") and code in ("B", "S", "O")) or (
            prev != "O" and prev_type != kind)
        starts = code in ("B", "S") or (code in ("I", "E") and prev in ("O", "E", "S")) or (
            code != "O" and prev_type != kind)
        if ends:
            out.append((prev_type, begin, i))
        if starts:
            begin = i
        prev, prev_type = code, kind
    return out


def seqeval_form(tags: list[str]) -> list[str]:
    """BILOU written as IOBES (seqeval knows E- and S-, not L- and U-)."""
    return [("E" + t[1:] if t[0] == "L" else "S" + t[1:] if t[0] == "U" else t) for t in tags]


def entity_metrics(gold: list[list[str]], pred: list[list[str]]) -> dict:
    """seqeval's default-mode entity scores (micro and per type) and word accuracy."""
    from seqeval.metrics.sequence_labeling import get_entities, precision_recall_fscore_support

    y_true = [seqeval_form(t) for t in gold]
    y_pred = [seqeval_form(t) for t in pred]
    words = sum(len(t) for t in gold)
    correct = sum(a == b for g, p in zip(gold, pred) for a, b in zip(g, p))
    names = sorted({e[0] for e in get_entities(y_true)} | {e[0] for e in get_entities(y_pred)})
    if names:
        p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, average="micro", zero_division=0)
        pt, rt, ft, st = precision_recall_fscore_support(y_true, y_pred, average=None, zero_division=0)
    else:
        p = r = f = 0.0
        pt = rt = ft = st = []
    per_type = {n: {"precision": float(a), "recall": float(b), "f1": float(c), "support": int(d)}
                for n, a, b, c, d in zip(names, pt, rt, ft, st)}
    return {"f1": float(f), "precision": float(p), "recall": float(r), "per_type": per_type,
            "accuracy": correct / words if words else 0.0}
