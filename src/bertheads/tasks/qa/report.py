"""The report page's qa section: EM and F1 by answer length and by question word, and for
SQuAD v2.0 the has-answer / no-answer trade-off against the null threshold."""

from __future__ import annotations

import re

import numpy as np

from bertheads.tasks.figures import WORST, Figure, Section, grouped_scores, pyplot, to_png, worst_table
from bertheads.tasks.qa.metrics import exact, f1_v1, f1_v2, gold_v2, max_over, normalize_answer
from bertheads.tasks.qa.spans import null_minus_best

QUESTION_WORDS = ("what", "who", "when", "where", "which", "why", "how")
LENGTH_BINS = ((1, 1, "1"), (2, 2, "2"), (3, 3, "3"), (4, 5, "4-5"), (6, 10, "6-10"), (11, 10 ** 9, "11+"))


def answer_length(answers: list[str]) -> int:
    return min(len(normalize_answer(a).split()) or 1 for a in answers)


def question_word(question: str) -> str:
    words = re.findall(r"[a-z]+", question.lower())
    return next((w for w in words if w in QUESTION_WORDS), "other")


def qa_section(task, outputs, examples, metrics: dict, section: Section) -> None:
    v2 = any(not e.answers for e in examples)
    preds = [p["answer"] for p in task.judging.decode(outputs, examples)]
    f1_fn = f1_v2 if v2 else f1_v1
    golds = [gold_v2(e.answers) if v2 else e.answers for e in examples]
    em = np.array([max_over(exact, p, g) for p, g in zip(preds, golds)]) * 100
    f1 = np.array([max_over(f1_fn, p, g) for p, g in zip(preds, golds)]) * 100
    by_len: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        if e.answers:
            n = answer_length(e.answers)
            label = next(name for lo, hi, name in LENGTH_BINS if lo <= n <= hi)
            by_len.setdefault(label, []).append(i)
    order = [name for _, _, name in LENGTH_BINS if name in by_len]
    if order:
        groups = {n: (em[by_len[n]].mean(), f1[by_len[n]].mean(), len(by_len[n])) for n in order}
        section.figures.append(Figure("by-length", "by answer length", grouped_scores(
            groups, "EM / F1 by gold answer length (questions with an answer)", "answer words")))
    by_word: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        by_word.setdefault(question_word(e.question), []).append(i)
    names = [w for w in (*QUESTION_WORDS, "other") if w in by_word]
    groups = {w: (em[by_word[w]].mean(), f1[by_word[w]].mean(), len(by_word[w])) for w in names}
    section.figures.append(Figure("by-question-word", "by question word",
                                  grouped_scores(groups, "EM / F1 by question word", "question word")))
    if v2:
        section.figures.append(Figure("null-threshold", "no-answer trade-off", null_tradeoff(
            outputs, examples, preds, task, null_minus_best)))
    order = np.lexsort((-np.array([float(o.scores[0]) if len(o.scores) else -np.inf for o in outputs]), f1))[:WORST]
    rows = [[examples[i].question, snippet(examples[i]), preds[i] or "(no answer)",
             " | ".join(examples[i].answers) or "(no answer)", f"{f1[i]:.1f}"] for i in order]
    section.tables.append(worst_table(["question", "passage", "predicted", "gold", "F1"], rows))


def null_tradeoff(outputs, examples, preds, task, null_minus_best) -> bytes:
    """HasAns F1, NoAns accuracy and overall F1 as the null threshold moves."""
    plt = pyplot()
    diffs = np.array([null_minus_best(o) for o in outputs])
    has = np.array([bool(e.answers) for e in examples])
    best_text = [e.context[int(o.spans[0][0]):int(o.spans[0][1])] if len(o.scores) else ""
                 for o, e in zip(outputs, examples)]
    span_f1 = np.array([max_over(f1_v2, t, gold_v2(e.answers)) if e.answers else 0.0
                        for t, e in zip(best_text, examples)])
    finite = diffs[np.isfinite(diffs)]
    lo, hi = (float(finite.min()) - 1, float(finite.max()) + 1) if len(finite) else (-1.0, 1.0)
    grid = np.linspace(lo, hi, 200)
    answered = diffs[None, :] <= grid[:, None]  # answer when null - best <= threshold
    has_f1 = (answered & has) @ span_f1 / max(has.sum(), 1) * 100
    no_acc = (~answered & ~has).sum(1) / max((~has).sum(), 1) * 100
    overall = ((answered & has) @ span_f1 + (~answered & ~has).sum(1)) / len(has) * 100
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(grid, has_f1, label="HasAns F1")
    ax.plot(grid, no_acc, label="NoAns accuracy")
    ax.plot(grid, overall, label="overall F1", linewidth=2)
    saved = task.spec.null_threshold
    if saved is not None:
        ax.axvline(saved, color="gray", linestyle=":", label=f"saved threshold {saved:.2f}")
    ax.set_xlabel("null threshold (answer when null - best span score <= it)")
    ax.set_ylabel("%")
    ax.set_title("has-answer / no-answer trade-off")
    ax.legend(fontsize=8)
    return to_png(fig)


def snippet(example, width: int = 160) -> str:
    context = example.context
    if example.answers and example.starts and example.starts[0] >= 0:
        start = max(0, example.starts[0] - width // 2)
        return ("…" if start else "") + context[start:start + width] + ("…" if start + width < len(context) else "")
    return context[:width] + ("…" if len(context) > width else "")
