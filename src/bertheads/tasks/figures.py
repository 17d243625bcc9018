"""What the report page is made of, for every kind's section: figures (PNG, drawn with
matplotlib, loaded only when one is drawn), sections and HTML tables."""

from __future__ import annotations

import html
import io
from dataclasses import dataclass, field

import numpy as np

from bertheads.tasks.calibration import ECE_BINS, ece
from bertheads.tasks.calibration import curve as coverage_curve
from bertheads.tasks.calibration import reliability as bin_cells

WORST = 10  # worst-scored examples listed per head


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


def reliability(raw: tuple[np.ndarray, np.ndarray], calibrated: tuple[np.ndarray, np.ndarray], temperature: float,
                bins: int = ECE_BINS) -> bytes:
    """Accuracy against confidence in equal-width bins for the scores in use (bars) and the raw
    softmax (dots), each with its expected calibration error; the rows per bin below."""
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(4.8, 5.2), height_ratios=[3, 1], sharex=True)
    width = 1 / bins
    for (conf, right), label, raw_side in ((calibrated, f"T = {temperature:.3g}", False), (raw, "raw (T = 1)", True)):
        cells = bin_cells(conf, right, bins)
        centres = [(c["low"] + c["high"]) / 2 for c in cells]
        text = f"{label}: ECE {ece(conf, right, bins):.3f}"
        if raw_side:
            ax.plot(centres, [c["accuracy"] for c in cells], "o", color="#dd8452", label=text)
        else:
            ax.bar(centres, [c["accuracy"] for c in cells], width=width, edgecolor="black", color="#4c72b0",
                   label=text)
            ax2.bar(centres, [c["count"] for c in cells], width=width, color="#999999")
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title("reliability")
    ax.legend(fontsize=8, loc="upper left")
    ax2.set_xlabel("confidence (top score)")
    ax2.set_ylabel("decisions")
    return to_png(fig)


def risk_coverage(raw: tuple[np.ndarray, np.ndarray], calibrated: tuple[np.ndarray, np.ndarray]) -> bytes:
    """Accuracy of the answered decisions against the share answered (the most confident first)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    for (conf, right), label, style in ((calibrated, "calibrated scores", "-"), (raw, "raw scores", ":")):
        x, y = coverage_curve(conf, right)
        ax.plot(x, y, style, label=label)
    ax.set_xlabel("coverage (share answered, most confident first)")
    ax.set_ylabel("accuracy of the answered")
    ax.set_xlim(0, 1.0)
    ax.set_title("risk-coverage")
    ax.legend(fontsize=8, loc="lower left")
    return to_png(fig)


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


def html_table(head: list, rows: list[list], escaped: bool = False) -> str:
    def cell(value) -> str:
        if isinstance(value, float):
            value = f"{value:.4g}"
        return str(value) if escaped else html.escape("" if value is None else str(value))

    return ("<table><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows) + "</table>")


def worst_table(head: list, rows: list[list], escaped: bool = False) -> str:
    return f"<h4>The {len(rows)} worst-scored examples</h4>" + html_table(head, rows, escaped)
