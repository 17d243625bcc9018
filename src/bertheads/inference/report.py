"""`bertheads report`: one HTML page of figures for a saved model.

The page (`PAGE_DIR/index.html`, its PNG figures embedded, and written beside it too) shows
the training curves from the model's training log (`log.jsonl`, else the per-epoch history in
`metrics.json`), the trials of a `bertheads tune` search, and, for a labelled data file, per
head: its metrics, its reliability diagram and risk-coverage curve (the scores in use against
the raw softmax), and its kind's own figures and tables (`Task.report_section`: classify, the
confusion matrix and per-class scores; tag, per-type scores and span
errors; qa, EM and F1 by answer length and question word, ...), with its worst-scored examples.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np

from bertheads.base.bounded import parse_json, read_json
from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.inference.path import head_outputs
from bertheads.saved import bundle
from bertheads.saved.card import read_metrics
from bertheads.store.atomic import atomic_directory
from bertheads.store.guard import check_target
from bertheads.tasks.calibration import confidence_pairs, coverage_part, ece, metric_coverage
from bertheads.tasks.figures import Figure, Section, html_table, pyplot, reliability, risk_coverage, to_png


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
        record = parse_json(line, f"{path}:{n}")
        if not isinstance(record, dict):
            raise UserError(f"{path}:{n}: expected a JSON object")
        if record.get("type") == "train":
            train.append(record)
        elif record.get("type") == "eval":
            evals.append(record)
    return train, evals


def dev_series(evals: list[dict], head: str, x_key: str) -> dict[str, list[tuple[float, float]]]:
    """metric -> [(x, value)] of one head's numeric dev metrics."""
    out: dict[str, list] = {}
    for record in evals:
        dev = record.get("dev")
        metrics = dev.get(head) if isinstance(dev, dict) else None
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
    saved = read_metrics(directory) or {}  # its shape checked when the folder was opened
    history = saved.get("history") or []
    train = [{"epoch": h["epoch"], "loss": h.get("train_loss")} for h in history if h.get("train_loss") is not None]
    best = saved.get("best_epoch")
    for head in heads:
        evals = [{"epoch": h["epoch"], "dev": h.get("dev", {})} for h in history]
        series = dev_series(evals, head, "epoch")
        out[head] = Figure(f"curves-{head}", "training curves by epoch (metrics.json history)",
                           curves_figure(train, series, "epoch", [best] if best is not None else None)) \
            if train or series else None
    return out


def tune_section(directory: Path) -> Section | None:
    """The trials of a `bertheads tune` search in this directory."""
    path = directory / "trials.jsonl"
    if not path.is_file():
        return None
    rows = [parse_json(line, f"{path}:{n}") for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    if not all(isinstance(row, dict) for row in rows):
        raise UserError(f"{path}: expected a JSON object on each line")
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


def calibration_figures(task, outputs: list, examples: list, data: str, section: Section) -> None:
    """Every head's reliability diagram and risk-coverage curve, the scores in use against the
    raw softmax (the kind says what its decisions are: `Judging.calibration_rows`)."""
    rows = task.scoring.calibration_rows(outputs, examples, data)
    if rows is None or not len(rows[1]):
        section.notes.append(f"no reliability diagram: {task.scoring.no_calibration()}")
        return
    t = task.scoring.temperature()
    raw, used = confidence_pairs(*rows), task.scoring.confidence_part(outputs, examples, data)  # (the kind's calibration)
    section.figures.append(Figure("reliability", "reliability diagram", reliability(raw, used, t)))
    section.figures.append(Figure("risk-coverage", "risk-coverage curve", risk_coverage(raw, used)))
    section.notes.append(f"expected calibration error over {len(rows[1])} decisions: {ece(*used):.4f} at the "
                         f"temperature in use ({t:.4g}), {ece(*raw):.4f} raw")
    by_metric = metric_coverage(task, [coverage_part(task, outputs, examples, None, data)], data)
    if by_metric:
        section.tables.append(html_table(["answering the most confident inputs", by_metric[0]["metric"],
                                          "input confidence from"],
                                         [[f"{r['coverage']:.0%}", r["value"], r["threshold"]] for r in by_metric]))


# -- the page ----------------------------------------------------------------------------------
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


AUDIT_HIDDEN = ("file", "row", "flagged", "record", "gold_answers")  # columns the audit table leaves out


def audit_section(audit: str | Path) -> Section:
    """The top suspects of a `bertheads audit` folder (its summary.json) as a table: where each
    row is, what it says, the given and the suggested label with their probabilities, the score."""
    path = Path(audit) / "summary.json"
    if not path.is_file():
        raise UserError(f"{said('audit', audit)}: no summary.json (write one with `bertheads audit`)")
    summary = read_json(path)
    if not isinstance(summary, dict):
        raise UserError(f"{path}: expected a JSON object")
    section = Section(f"Label audit: {summary.get('train')}")
    unit = summary.get("unit", "row")
    section.notes.append(f"{summary.get('flagged')} of {summary.get('units')} {unit}s flagged as label issues "
                         f"({summary.get('ranking')}); out-of-fold agreement with the given labels: "
                         f"{summary.get('out_of_fold_agreement')}")
    noise = summary.get("noise_rate") or {}
    if noise:
        section.tables.append(html_table(["class", "rows", "estimated noise rate"],
                                         [[k, (summary.get("classes") or {}).get(k), v] for k, v in noise.items()]))
    top = summary.get("top") or []
    if top:
        keys = list(dict.fromkeys(k for r in top for k in r if k not in AUDIT_HIDDEN))
        shown = [[v if isinstance(v, (str, int, float)) or v is None else json.dumps(v, ensure_ascii=False)
                  for v in (r.get(k) for k in keys)] for r in top]
        section.tables.append(html_table(keys, shown))
    else:
        section.notes.append("no suspects")
    return section


def report(model_dir: str | Path, data: str | None = None, out: str | Path | None = None, head: str | None = None,
           batch_size: int = INFERENCE_BATCH, audit: str | Path | None = None) -> Path:
    """Write the report page of a saved model (with `audit`, a `bertheads audit` folder's top
    suspects too); returns the page's path."""
    directory = Path(model_dir)
    bundle.read_manifest(directory)  # a clear error for a directory that is not a model
    page_dir = check_target(Path(out) if out else directory / "report", "index.html", inputs=[data, audit],
                            models=bundle.model_folders(directory), home=directory, what="a report page directory")
    net = bundle.load(directory)
    names = list(net.tasks)
    if head is not None:
        if head not in net.tasks:
            raise UserError(f"{said('head', head)}: no such head (heads: {', '.join(names)})")
        names = [head]
    curves = training_figures(directory, names)
    evaluated: dict[str, tuple] = {}
    skipped: dict[str, str] = {}
    if data is not None:
        for name in names:
            task = net.tasks[name]
            try:
                examples = task.reading.read(data, need_labels=True)
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
    trained_nothing = (read_metrics(directory) or {}).get("learned_nothing") or {}
    for name in names:
        task = net.tasks[name]
        section = Section(f"Head {name} ({task.kind})" if len(net.tasks) > 1 else f"{task.kind} head")
        if name in trained_nothing:
            section.notes.append(f"WARNING: this head learned nothing: {trained_nothing[name]} on the dev set at "
                                 f"the end of training; its outputs are no better than a guess")
        if curves.get(name) is not None:
            section.figures.append(curves[name])
        else:
            section.notes.append("no training log or history to draw")
        if name in evaluated:
            task, examples = evaluated[name]
            outputs = head_outputs(net, name, examples, batch_size)
            metrics = task.judging.metrics(outputs, examples, data)
            section.notes.append(f"{data}: {len(examples)} examples")
            why = task.judging.learned_nothing(metrics)
            if why:
                section.notes.append(f"WARNING: on this data the head learned nothing: {why}")
            section.tables.append(metrics_table(metrics))
            task.publishing.report_section(outputs, examples, metrics, section)
            calibration_figures(task, outputs, examples, data, section)
            for f in section.figures:  # file names unique across heads
                if not f.name.startswith("curves-"):
                    f.name = f"{name}-{f.name}"
        elif name in skipped:
            section.notes.append(f"the data does not fit this head: {skipped[name]}")
        sections.append(section)
    if tuned is not None:
        sections.append(tuned)
    if audit is not None:
        sections.append(audit_section(audit))
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
