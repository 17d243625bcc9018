"""The report page's classify section: confusion matrix and per-class scores
(single-label; the reliability diagram is every head's: `inference/report.py`), per-label scores (multi-label), predicted against gold (regression)."""

from __future__ import annotations

import numpy as np

from bertheads.tasks.base import softmax
from bertheads.tasks.figures import (
    WORST,
    Figure,
    Section,
    heatmap,
    prf_bars,
    pyplot,
    to_png,
    worst_table,
)


def classify_section(task, outputs, examples, metrics: dict, section: Section) -> None:
    spec = task.spec
    arr = np.stack(outputs)
    names = [str(x) for x in spec.labels]
    if spec.problem == "single_label":
        section.figures.append(Figure("confusion", "confusion matrix", heatmap(
            metrics["confusion"]["matrix"], names, names, "confusion matrix", "predicted", "gold")))
        section.figures.append(Figure("per-class", "per class", prf_bars(metrics["per_class"], "per class")))
        probs = softmax(arr / task.scoring.temperature())
        gold = np.array([task.reading.label_target(e) for e in examples])
        gold_prob = probs[np.arange(len(gold)), gold]
        order = np.argsort(gold_prob, kind="stable")[:WORST]
        rows = [[example_text(examples[i]), spec.labels[gold[i]], spec.labels[int(probs[i].argmax())],
                 f"{gold_prob[i]:.4f}"] for i in order]
        section.tables.append(worst_table(["text", "gold", "predicted", "score of gold"], rows))
    elif spec.problem == "multi_label":
        section.figures.append(Figure("per-label", "per label", prf_bars(metrics["per_label"], "per label")))
        probs = 1 / (1 + np.exp(-arr))
        gold = np.array([task.reading.label_target(e) for e in examples], dtype=float)
        eps = 1e-7
        loss = -(gold * np.log(probs + eps) + (1 - gold) * np.log(1 - probs + eps)).mean(1)
        cut = task.judging.label_thresholds()
        order = np.argsort(-loss, kind="stable")[:WORST]
        rows = [[example_text(examples[i]), ", ".join(n for n, g in zip(names, gold[i]) if g) or "(none)",
                 ", ".join(n for n, p, c in zip(names, probs[i], cut) if p >= c) or "(none)",
                 f"{loss[i]:.4f}"] for i in order]
        section.tables.append(worst_table(["text", "gold", "predicted", "loss"], rows))
    else:
        plt = pyplot()
        gold = np.array([task.reading.label_target(e) for e in examples], dtype=float)
        fig, ax = plt.subplots(figsize=(4.5, 4))
        ax.scatter(gold, arr[:, 0], s=8, alpha=0.6)
        lo, hi = float(min(gold.min(), arr.min())), float(max(gold.max(), arr.max()))
        ax.plot([lo, hi], [lo, hi], "--", color="gray")
        ax.set_xlabel("gold")
        ax.set_ylabel("predicted")
        ax.set_title("predicted against gold")
        section.figures.append(Figure("scatter", "predicted against gold", to_png(fig)))
        error = np.abs(arr[:, 0] - gold)
        order = np.argsort(-error, kind="stable")[:WORST]
        rows = [[example_text(examples[i]), f"{gold[i]:.4g}", f"{arr[i, 0]:.4g}", f"{error[i]:.4g}"] for i in order]
        section.tables.append(worst_table(["text", "gold", "predicted", "error"], rows))


def example_text(example) -> str:
    return example.text if example.pair is None else f"{example.text}  ‖  {example.pair}"
