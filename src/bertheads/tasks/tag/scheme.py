"""Tag schemes: IOB1/IOB2/IOBES/BILOU recognition, entity decoding by the conlleval rules,
and entity-level metrics as seqeval's default mode computes them."""

from __future__ import annotations

import re

from bertheads.base.errors import UserError, where

TAG_RE = re.compile(r"^(?:O|([BIESLU])-(.+))$")
PREFIX_ORDER = "BIESLU"
SCHEME_PREFIXES = {"IOB1": "BI", "IOB2": "BI", "IOBES": "BIES", "BILOU": "BILU"}  # the tags each type has


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


def tag_list(examples: list, with_inside: bool, scheme: str | None = None) -> list[str]:
    """"O" first, then by type and prefix (B, I, E, S, L, U). With `scheme`, every tag of that
    scheme for each type the examples have (a few sentences whose locations are all one word
    still give I-LOC, which a dev file may hold)."""
    seen = {t for e in examples for t in e.tags}
    if with_inside:
        seen |= {inside(t) for t in seen}
    if scheme in SCHEME_PREFIXES:
        seen |= {f"{p}-{split_tag(t)[1]}" for t in seen if t != "O" for p in SCHEME_PREFIXES[scheme]}
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


def sentence_entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first word, end word exclusive) of one sentence's tags by the conlleval rules."""
    codes, types = scheme_codes(tags)
    return entity_spans(codes, types)


def entity_counts(sentences: list[list[str]], tags: list[str]) -> dict[str, int]:
    """Entities per type in `sentences` (each a list of tags), every type of `tags` counted."""
    counts = dict.fromkeys(sorted({kind for kind in scheme_codes(tags)[1] if kind}), 0)
    for sentence in sentences:
        for kind, _, _ in sentence_entities(sentence):
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def entity_errors(gold: list[list[str]], pred: list[list[str]]) -> dict:
    """How predicted entities miss the gold ones, and the confusion between entity types.

    Each gold entity is matched with the predicted entity that overlaps it most (ties: the
    first); it is `correct` (same span and type), a `type` error (same span, other type), a
    `boundary` error (overlapping, other span, same type), `type_and_boundary` (both), or
    `missed` (no overlap). A predicted entity that overlaps no gold one is `spurious`.
    `type_confusion` counts gold type (rows) against predicted type (columns) for every
    matched pair; the "O" row holds the spurious predictions, the "O" column the missed ones.
    """
    counts = {"correct": 0, "type": 0, "boundary": 0, "type_and_boundary": 0, "missed": 0, "spurious": 0}
    pairs: list[tuple[str, str]] = []
    for g_tags, p_tags in zip(gold, pred):
        g_ents, p_ents = sentence_entities(g_tags), sentence_entities(p_tags)
        touched = [False] * len(p_ents)
        for g_type, g0, g1 in g_ents:
            best, overlap = -1, 0
            for i, (_, p0, p1) in enumerate(p_ents):
                size = min(g1, p1) - max(g0, p0)
                if size > overlap:
                    best, overlap = i, size
            if best < 0:
                counts["missed"] += 1
                pairs.append((g_type, "O"))
                continue
            p_type, p0, p1 = p_ents[best]
            touched[best] = True
            same_span, same_type = (p0, p1) == (g0, g1), p_type == g_type
            key = "correct" if same_span and same_type else "type" if same_span else \
                "boundary" if same_type else "type_and_boundary"
            counts[key] += 1
            pairs.append((g_type, p_type))
        for (p_type, p0, p1), seen in zip(p_ents, touched):
            if not seen and not any(min(g1, p1) > max(g0, p0) for _, g0, g1 in g_ents):
                counts["spurious"] += 1
                pairs.append(("O", p_type))
    types = sorted({t for pair in pairs for t in pair} - {"O"}) + ["O"]
    index = {t: i for i, t in enumerate(types)}
    matrix = [[0] * len(types) for _ in types]
    for g_type, p_type in pairs:
        matrix[index[g_type]][index[p_type]] += 1
    return {"errors": counts, "type_confusion": {"types": types, "matrix": matrix}}
