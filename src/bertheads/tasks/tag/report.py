"""The report page's tag section: per-type scores, the type confusion and the span errors."""

from __future__ import annotations

import html
import math

import numpy as np

from bertheads.tasks.figures import WORST, Figure, Section, heatmap, html_table, prf_bars, worst_table


def tag_section(task, outputs, examples, metrics: dict, section: Section) -> None:
    if metrics.get("per_type"):
        section.figures.append(Figure("per-type", "per entity type", prf_bars(metrics["per_type"], "per entity type")))
    confusion = metrics["type_confusion"]
    if len(confusion["types"]) > 1:
        section.figures.append(Figure("type-confusion", "entity type confusion", heatmap(
            confusion["matrix"], confusion["types"], confusion["types"],
            "entity types (O: missed / spurious)", "predicted type", "gold type")))
    errors = metrics["errors"]
    section.tables.append(html_table(list(errors), [list(errors.values())]))
    tags = task.spec.tags
    index = {t: i for i, t in enumerate(tags)}
    scored = []
    for o, e in zip(outputs, examples):
        gold = np.array([index[t] for t in e.tags])
        scored.append(float(np.log(o.probs[np.arange(len(gold)), gold] + 1e-9).mean()) if len(gold) else 0.0)
    order = np.argsort(scored, kind="stable")[:WORST]
    rows = []
    for i in order:
        e, o = examples[i], outputs[i]
        pred = [tags[j] for j in o.probs.argmax(-1)]
        words = []
        for w, g, p in zip(e.words or [], e.tags, pred):
            words.append(html.escape(w) if g == p else
                         f"<mark title='gold {html.escape(g)}, predicted {html.escape(p)}'>{html.escape(w)}"
                         f" <small>{html.escape(g)}→{html.escape(p)}</small></mark>")
        rows.append([" ".join(words), f"{math.exp(scored[i]):.4f}"])
    section.tables.append(worst_table(["sentence (marked: wrong tag, gold→predicted)", "mean gold tag score"],
                                      rows, escaped=True))
