"""`bertheads report`: one HTML page of figures for a saved model.

The page (`PAGE_DIR/index.html`, its PNG figures embedded, and written beside it too) shows
the training curves from the model's training log (`log.jsonl`, else the per-epoch history in
`metrics.json`), the trials of a `bertheads tune` search, and, for a labelled data file, per
head: classify, the confusion matrix, per-class precision, recall and F1 and a reliability
diagram; tag, per-type scores, the type confusion and the span errors; qa, EM and F1 by answer
length and by question word, and for SQuAD v2.0 the has-answer / no-answer trade-off against
the null threshold. Each head lists its 10 worst-scored examples with their text.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertheads.base.errors import UserError
from bertheads.model import head_outputs
from bertheads.saved import bundle
from bertheads.store.atomic import atomic_directory
from bertheads.tasks.qa.metrics import exact, f1_v1, f1_v2, gold_v2, max_over, normalize_answer
from bertheads.tasks.qa.spans import null_minus_best
from bertheads.text.batching import INFERENCE_BATCH

WORST = 10
QUESTION_WORDS = ("what", "who", "when", "where", "which", "why", "how")
LENGTH_BINS = ((1, 1, "1"), (2, 2, "2"), (3, 3, "3"), (4, 5, "4-5"), (6, 10, "6-10"), (11, 10 ** 9, "11+"))


@dataclass
class Figure:
    name: str  # file name stem
    title: str
    png: bytes


@dataclass
class Section:
    title: str
    figures: list[Figure] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # HTML fragments
    notes: list[str] = field(default_factory=list)


# -- figures ---------------------------------------------------------------------------------
def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def to_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    pyplot().close(fig)
    return buf.getvalue()


def heatmap(matrix, rows: list[str], cols: list[str], title: str, xlabel: str, ylabel: str) -> bytes:
    plt = pyplot()
    m = np.asarray(matrix, dtype=float)
    size = max(3.5, 0.5 * max(len(rows), len(cols)) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    shown = m / np.maximum(m.sum(1, keepdims=True), 1)  # colour: share of the row
    im = ax.imshow(shown, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(cols)), [short(c) for c in cols], rotation=45, ha="right")
    ax.set_yticks(range(len(rows)), [short(r) for r in rows])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(rows) * len(cols) <= 400:
        for i in range(len(rows)):
            for j in range(len(cols)):
                ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=8,
                        color="white" if shown[i, j] > 0.5 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, label="share of the row")
    return to_png(fig)


def prf_bars(per: dict, title: str) -> bytes:
    plt = pyplot()
    names = list(per)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(names) + 2), 3.5))
    for k, (metric, colour) in enumerate((("precision", "#4c72b0"), ("recall", "#dd8452"), ("f1", "#55a868"))):
        ax.bar(x + (k - 1) * 0.27, [per[n][metric] for n in names], 0.27, label=metric, color=colour)
    ax.set_xticks(x, [f"{short(n)}\n({per[n]['support']})" for n in names], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title(title + " (support below each name)")
    ax.legend(loc="lower right", fontsize=8)
    return to_png(fig)


def reliability(confidence: np.ndarray, correct: np.ndarray, bins: int = 10) -> tuple[bytes, float]:
    """Accuracy against confidence in equal-width bins, and the expected calibration error."""
    plt = pyplot()
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1]), 0, bins - 1)
    acc, conf, count = np.zeros(bins), np.zeros(bins), np.zeros(bins)
    for b in range(bins):
        mask = which == b
        count[b] = mask.sum()
        if count[b]:
            acc[b], conf[b] = correct[mask].mean(), confidence[mask].mean()
    ece = float(np.sum(count / max(len(confidence), 1) * np.abs(acc - conf)))
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(4.5, 5), height_ratios=[3, 1], sharex=True)
    centers = (edges[:-1] + edges[1:]) / 2
    ax.bar(centers, acc, width=1 / bins, edgecolor="black", color="#4c72b0", label="accuracy")
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax.set_ylabel("accuracy")
    ax.set_title(f"reliability (ECE {ece:.3f})")
    ax.legend(fontsize=8, loc="upper left")
    ax2.bar(centers, count, width=1 / bins, color="#999999")
    ax2.set_xlabel("confidence (top score)")
    ax2.set_ylabel("examples")
    return to_png(fig), ece


def grouped_scores(groups: dict[str, tuple[float, float, int]], title: str, xlabel: str) -> bytes:
    """EM and F1 (percent) per group, the count under each name."""
    plt = pyplot()
    names = list(groups)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(names) + 2), 3.5))
    ax.bar(x - 0.2, [groups[n][0] for n in names], 0.4, label="EM", color="#4c72b0")
    ax.bar(x + 0.2, [groups[n][1] for n in names], 0.4, label="F1", color="#55a868")
    ax.set_xticks(x, [f"{n}\n({groups[n][2]})" for n in names], fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return to_png(fig)


def short(text, limit: int = 18) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- training curves ---------------------------------------------------------------------------
def read_log(directory: Path) -> tuple[list[dict], list[dict]] | None:
    """Train and eval records of `log.jsonl` (None when the model has none)."""
    path = directory / "log.jsonl"
    if not path.is_file():
        return None
    train, evals = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{n}: malformed JSON ({exc.msg})") from None
        if record.get("type") == "train":
            train.append(record)
        elif record.get("type") == "eval":
            evals.append(record)
    return train, evals


def dev_series(evals: list[dict], head: str, x_key: str) -> dict[str, list[tuple[float, float]]]:
    """metric -> [(x, value)] of one head's numeric dev metrics."""
    out: dict[str, list] = {}
    for record in evals:
        metrics = record.get("dev", {}).get(head)
        if not isinstance(metrics, dict):
            continue
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "examples":
                out.setdefault(name, []).append((record.get(x_key), float(value)))
    return out


def curves_figure(train: list[dict], series: dict, x_label: str, kept: list | None = None) -> bytes:
    plt = pyplot()
    panels = 1 + (bool(train) and any("lr" in r for r in train)) + bool(series)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.3))
    axes = np.atleast_1d(axes)
    i = 0
    if train:
        ax = axes[i]
        xs = [r.get("step", r.get("epoch")) for r in train]
        ax.plot(xs, [r.get("loss") for r in train], color="#4c72b0", label="training loss")
        losses = [(x, v) for x, v in series.get("loss", [])]
        if losses:
            ax.plot(*zip(*losses), "o-", color="#dd8452", label="dev loss")
        ax.set_xlabel(x_label)
        ax.set_title("loss")
        ax.legend(fontsize=8)
        i += 1
        if panels > 1 + bool(series):
            ax = axes[i]
            ax.plot(xs, [r.get("lr") for r in train], color="#8172b3")
            ax.set_xlabel(x_label)
            ax.set_title("learning rate")
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
            i += 1
    if series:
        ax = axes[i] if i < len(axes) else axes[-1]
        for name, points in series.items():
            if name == "loss" or name.startswith(("HasAns_total", "NoAns_total")):
                continue
            xs, ys = zip(*points)
            ax.plot(xs, ys, "o-", label=name, markersize=4)
        if kept:
            for x in kept:
                ax.axvline(x, color="gray", linestyle=":", linewidth=1)
        ax.set_xlabel(x_label)
        ax.set_title("dev metrics" + (" (dotted: kept)" if kept else ""))
        ax.legend(fontsize=7)
    return to_png(fig)


def training_figures(directory: Path, heads: list[str]) -> dict[str, Figure | None]:
    """Per head, its training-curve figure (None when there is nothing to draw)."""
    logged = read_log(directory)
    out: dict[str, Figure | None] = {}
    if logged is not None:
        train, evals = logged
        kept = [r.get("step") for r in evals if r.get("kept")]
        for head in heads:
            series = dev_series(evals, head, "step")
            out[head] = Figure(f"curves-{head}", "training curves (log.jsonl)",
                               curves_figure(train, series, "step", kept)) if train or series else None
        return out
    metrics_path = directory / "metrics.json"
    history = json.loads(metrics_path.read_text()).get("history", []) if metrics_path.is_file() else []
    train = [{"epoch": h["epoch"], "loss": h.get("train_loss")} for h in history if h.get("train_loss") is not None]
    best = json.loads(metrics_path.read_text()).get("best_epoch") if metrics_path.is_file() else None
    for head in heads:
        evals = [{"epoch": h["epoch"], "dev": h.get("dev", {})} for h in history]
        series = dev_series(evals, head, "epoch")
        out[head] = Figure(f"curves-{head}", "training curves by epoch (metrics.json history)",
                           curves_figure(train, series, "epoch", [best] if best else None)) \
            if train or series else None
    return out


def tune_section(directory: Path) -> Section | None:
    """The trials of a `bertheads tune` search in this directory."""
    path = directory / "trials.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return None
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    colours = {"complete": "#55a868", "pruned": "#dd8452", "fail": "#c44e52"}
    for state, colour in colours.items():
        pts = [(r["number"], r["epoch_scores"][-1] if r["epoch_scores"] else None) for r in rows if r["state"] == state]
        pts = [p for p in pts if p[1] is not None]
        if pts:
            ax.scatter(*zip(*pts), color=colour, label=state)
    ax.set_xlabel("trial")
    ax.set_ylabel("best dev score")
    ax.set_title("trials")
    ax.legend(fontsize=8)
    for r in rows:
        if r["epoch_scores"]:
            ax2.plot(range(1, len(r["epoch_scores"]) + 1), r["epoch_scores"], "o-", markersize=3,
                     color=colours.get(r["state"], "gray"), alpha=0.7)
    ax2.set_xlabel("epoch")
    ax2.set_title("best-so-far dev score per epoch")
    section = Section("Hyperparameter search", [Figure("tune-trials", "tune trials", to_png(fig))])
    names = list(dict.fromkeys(k for r in rows for k in r["params"]))
    head = ["trial", "phase", *names, "seed", "state", "score", "best epoch", "seconds"]
    body = [[r["number"], r.get("phase"), *(r["params"].get(n) for n in names), r.get("seed"), r["state"],
             r.get("score"), r.get("best_epoch"), r.get("seconds")] for r in rows]
    section.tables.append(html_table(head, body))
    return section


# -- per head evaluation -------------------------------------------------------------------------
def classify_section(task, outputs, examples, metrics: dict, section: Section) -> None:
    spec = task.spec
    arr = np.stack(outputs)
    names = [str(x) for x in spec.labels]
    if spec.problem == "single_label":
        section.figures.append(Figure("confusion", "confusion matrix", heatmap(
            metrics["confusion"]["matrix"], names, names, "confusion matrix", "predicted", "gold")))
        section.figures.append(Figure("per-class", "per class", prf_bars(metrics["per_class"], "per class")))
        z = np.exp(arr - arr.max(-1, keepdims=True))
        probs = z / z.sum(-1, keepdims=True)
        gold = np.array([task.label_target(e) for e in examples])
        png, ece = reliability(probs.max(-1), probs.argmax(-1) == gold)
        section.figures.append(Figure("reliability", "reliability diagram", png))
        section.notes.append(f"expected calibration error: {ece:.4f}")
        gold_prob = probs[np.arange(len(gold)), gold]
        order = np.argsort(gold_prob, kind="stable")[:WORST]
        rows = [[example_text(examples[i]), spec.labels[gold[i]], spec.labels[int(probs[i].argmax())],
                 f"{gold_prob[i]:.4f}"] for i in order]
        section.tables.append(worst_table(["text", "gold", "predicted", "score of gold"], rows))
    elif spec.problem == "multi_label":
        section.figures.append(Figure("per-label", "per label", prf_bars(metrics["per_label"], "per label")))
        probs = 1 / (1 + np.exp(-arr))
        gold = np.array([task.label_target(e) for e in examples], dtype=float)
        eps = 1e-7
        loss = -(gold * np.log(probs + eps) + (1 - gold) * np.log(1 - probs + eps)).mean(1)
        cut = task.label_thresholds()
        order = np.argsort(-loss, kind="stable")[:WORST]
        rows = [[example_text(examples[i]), ", ".join(n for n, g in zip(names, gold[i]) if g) or "(none)",
                 ", ".join(n for n, p, c in zip(names, probs[i], cut) if p >= c) or "(none)",
                 f"{loss[i]:.4f}"] for i in order]
        section.tables.append(worst_table(["text", "gold", "predicted", "loss"], rows))
    else:
        plt = pyplot()
        gold = np.array([task.label_target(e) for e in examples], dtype=float)
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


def answer_length(answers: list[str]) -> int:
    return min(len(normalize_answer(a).split()) or 1 for a in answers)


def question_word(question: str) -> str:
    words = re.findall(r"[a-z]+", question.lower())
    return next((w for w in words if w in QUESTION_WORDS), "other")


def qa_section(task, outputs, examples, metrics: dict, section: Section) -> None:
    v2 = any(not e.answers for e in examples)
    preds = [p["answer"] for p in task.decode(outputs, examples)]
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


def example_text(example) -> str:
    return example.text if example.pair is None else f"{example.text}  ‖  {example.pair}"


SECTIONS = {"classify": classify_section, "tag": tag_section, "qa": qa_section}


# -- the page ----------------------------------------------------------------------------------
def html_table(head: list, rows: list[list], escaped: bool = False) -> str:
    def cell(value) -> str:
        if isinstance(value, float):
            value = f"{value:.4g}"
        return str(value) if escaped else html.escape("" if value is None else str(value))

    return ("<table><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows) + "</table>")


def worst_table(head: list, rows: list[list], escaped: bool = False) -> str:
    return f"<h4>The {len(rows)} worst-scored examples</h4>" + html_table(head, rows, escaped)


def metrics_table(metrics: dict) -> str:
    rows = [[k, v] for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return html_table(["metric", "value"], rows)


STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
figure{display:inline-block;margin:.5em 1em .5em 0;vertical-align:top}figure img{max-width:100%}
figcaption{font-size:.85em;color:#555}table{border-collapse:collapse;margin:.5em 0;font-size:.85em}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}th{background:#f4f4f4}
mark{background:#ffd6d6}.note{color:#555;font-size:.9em}"""


def render_page(title: str, intro: list[str], sections: list[Section]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    parts += [f"<p class='note'>{html.escape(line)}</p>" for line in intro]
    for s in sections:
        parts.append(f"<section><h2>{html.escape(s.title)}</h2>")
        parts += [f"<p class='note'>{html.escape(n)}</p>" for n in s.notes]
        for f in s.figures:
            data = base64.b64encode(f.png).decode("ascii")
            parts.append(f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(f.title)}' "
                         f"data-file='{html.escape(f.name)}.png'><figcaption>{html.escape(f.title)}</figcaption></figure>")
        parts += s.tables
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def report(model_dir: str | Path, data: str | None = None, out: str | Path | None = None, head: str | None = None,
           batch_size: int = INFERENCE_BATCH) -> Path:
    """Write the report page of a saved model; returns the page's path."""
    directory = Path(model_dir)
    bundle.read_manifest(directory)  # a clear error for a directory that is not a model
    net = bundle.load(directory)
    names = list(net.tasks)
    if head is not None:
        if head not in net.tasks:
            raise UserError(f"--head {head}: no such head (heads: {', '.join(names)})")
        names = [head]
    curves = training_figures(directory, names)
    evaluated: dict[str, tuple] = {}
    skipped: dict[str, str] = {}
    if data is not None:
        for name in names:
            task = net.tasks[name]
            try:
                examples = task.read(data, need_labels=True)
            except UserError as exc:
                if len(names) == 1:
                    raise
                skipped[name] = str(exc)
                continue
            evaluated[name] = (task, examples)
        if not evaluated:
            raise UserError(f"{data}: fits none of the heads ({'; '.join(f'{n}: {m}' for n, m in skipped.items())})")
    sections = []
    tuned = tune_section(directory)
    for name in names:
        task = net.tasks[name]
        section = Section(f"Head {name} ({task.kind})" if len(net.tasks) > 1 else f"{task.kind} head")
        if curves.get(name) is not None:
            section.figures.append(curves[name])
        else:
            section.notes.append("no training log or history to draw")
        if name in evaluated:
            task, examples = evaluated[name]
            outputs = head_outputs(net, name, examples, batch_size)
            metrics = task.metrics(outputs, examples, data)
            section.notes.append(f"{data}: {len(examples)} examples")
            section.tables.append(metrics_table(metrics))
            SECTIONS[task.kind](task, outputs, examples, metrics, section)
            for f in section.figures:  # file names unique across heads
                if not f.name.startswith("curves-"):
                    f.name = f"{name}-{f.name}"
        elif name in skipped:
            section.notes.append(f"the data does not fit this head: {skipped[name]}")
        sections.append(section)
    if tuned is not None:
        sections.append(tuned)
    page_dir = Path(out) if out else directory / "report"
    if page_dir.exists() and (not page_dir.is_dir() or (any(page_dir.iterdir())
                                                        and not (page_dir / "index.html").is_file())):
        raise UserError(f"--out {page_dir}: exists and is not a report page directory; choose another")
    intro = [f"model: {directory.resolve()}", f"heads: {', '.join(f'{n} ({t.kind})' for n, t in net.tasks.items())}"]
    if data:
        intro.append(f"data: {Path(data).resolve()}")
    text = render_page(f"bertheads report: {directory.name}", intro, sections)
    with atomic_directory(page_dir) as tmp:
        (tmp / "index.html").write_text(text, encoding="utf-8")
        for s in sections:
            for f in s.figures:
                (tmp / f"{f.name}.png").write_bytes(f.png)
    return page_dir / "index.html"
