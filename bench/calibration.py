"""What the scores mean: each case trains a head (small: `--limit` training rows), and reads
the calibration bertheads fitted at the end of training (ECE and Brier before and after the
temperature, on cross-fitted halves of dev); then, on the whole dev set, it compares the raw
scores, the calibrated ones, and the transformers `pipeline`'s on the same head exported
before folding (the peer: what a user of the export gets today) and after folding (they must
equal ours). It checks that the labels do not move.

    python bench/calibration.py --cases sst2-ft1,sst2-feat3 --limit 2000
    python bench/calibration.py --cases conll-feat1 --limit 1000
    python bench/calibration.py --cases sst2-ft1 --limit 8000 --holdout 7000   # also on 7,000 held-out sentences
    python bench/calibration.py --cases sst2-ft3 --limit 800 --holdout 7000 --seeds 42,1,2   # a model per seed
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from common import OUT, cpu_line, environment, require_data, save_json

CASES = {  # name: (kind, train, dev, settings)
    "sst2-ft1": ("classify", ("sst2", "train.tsv"), ("sst2", "dev.tsv"), {"epochs": 1}),
    "sst2-ft3": ("classify", ("sst2", "train.tsv"), ("sst2", "dev.tsv"), {"epochs": 3}),
    "sst2-feat3": ("classify", ("sst2", "train.tsv"), ("sst2", "dev.tsv"), {"epochs": 3, "mode": "features"}),
    "mrpc-feat3": ("classify", ("glue", "MRPC", "train.tsv"), ("glue", "MRPC", "dev.tsv"),
                   {"epochs": 3, "mode": "features"}),
    "mrpc-ft3": ("classify", ("glue", "MRPC", "train.tsv"), ("glue", "MRPC", "dev.tsv"), {"epochs": 3}),
    "conll-feat1": ("tag", ("conll2003", "train.txt"), ("conll2003", "dev.txt"), {"epochs": 1, "mode": "features"}),
    "conll-feat5": ("tag", ("conll2003", "train.txt"), ("conll2003", "dev.txt"), {"epochs": 5, "mode": "features"}),
    "conll-ft1": ("tag", ("conll2003", "train.txt"), ("conll2003", "dev.txt"), {"epochs": 1}),
    "squad-ft1": ("qa", ("squad", "train-split.json"), ("squad", "eval-split.json"), {"epochs": 1}),
    "squad2-ft1": ("qa", ("squad2", "train-split.json"), ("squad2", "eval-split.json"), {"epochs": 1}),
    "squad2-ft3": ("qa", ("squad2", "train-split.json"), ("squad2", "eval-split.json"), {}),  # qa's defaults here
    "squad2-feat2": ("qa", ("squad2", "train-split.json"), ("squad2", "eval-split.json"),
                     {"epochs": 2, "mode": "features"}),
}


def pipeline_scores(model_dir: Path, texts: list[str], fold: bool) -> np.ndarray:
    """The transformers text-classification pipeline's scores (label order of the head) for the
    head exported with (`fold`) or without its temperature folded into the last layer."""
    from transformers import pipeline

    from bertheads.export.hf import to_transformers
    from bertheads.saved import bundle

    net = bundle.load(model_dir)
    name = next(iter(net.tasks))
    task = net.tasks[name]
    model = to_transformers(net, name, Path(bundle.encoder_location(model_dir)))
    if fold:
        task.exporting.fold_temperature(model)
    pipe = pipeline("text-classification", model=model, tokenizer=net.encoder.tokenizer, top_k=None)
    names = [str(x) for x in task.spec.shown_labels()]
    rows = pipe(texts, batch_size=32, truncation=True, max_length=task.spec.max_length)
    return np.array([[{r["label"]: r["score"] for r in row}[n] for n in names] for row in rows])


def run_case(case: str, limit: int, out: Path, model: str, reuse: bool = False, dev_limit: int | None = None,
             holdout: int = 0, seed: int | None = None) -> dict:
    import bertheads
    from bertheads.base.errors import UserError
    from bertheads.export.hf import check_equivalent
    from bertheads.inference.path import head_outputs
    from bertheads.tasks import calibration
    from bertheads.tasks.calibration import confidence_pairs

    kind, train, dev, settings = CASES[case]
    train_path, dev_path = require_data(*train), require_data(*dev)
    name, target = case, out / case
    if seed is not None:
        name, target, settings = f"{case} (seed {seed})", out / f"{case}-seed{seed}", {**settings, "seed": seed}
    start = time.perf_counter()
    if reuse and (target / "metrics.json").is_file():
        trained = bertheads.load(target, runtime="torch", precision="fp32")
    else:
        shutil.rmtree(target, ignore_errors=True)
        trained = bertheads.train(kind, str(train_path), str(dev_path), target, model=model, limit=limit,
                                  cache_dir=str(out / "cache"), progress=False, **settings)
    seconds = time.perf_counter() - start
    metrics = json.loads((target / "metrics.json").read_text())
    c = metrics["dev"]["calibration"]
    row = {"case": name, "kind": kind, "limit": limit, **settings, "train_seconds": round(seconds, 1),
           "temperature": c.get("temperature"), "cross_fitted": c}
    task = trained.task()
    name = trained.head_name(None)
    # one pass over dev (its first `dev_limit` examples): the raw and the calibrated scores of the
    # same outputs (the temperature was fitted on all of dev: in-sample here)
    examples = task.reading.read(str(dev_path), need_labels=True)[:dev_limit]
    outputs = head_outputs(trained.net, name, examples)
    rows = task.scoring.calibration_rows(outputs, examples, str(dev_path))
    raw, used = confidence_pairs(*rows), task.scoring.confidence_part(outputs, examples, str(dev_path))  # (the kind's calibration)
    row["dev_rows"] = len(rows[1])
    row["dev_accuracy_raw"] = round(float(raw[1].mean()), 6)
    row["dev_accuracy_calibrated"] = round(float(used[1].mean()), 6)
    row["dev_ece_raw"] = round(calibration.ece(*raw), 6)
    row["dev_ece_calibrated_in_sample"] = round(calibration.ece(*used), 6)
    row["risk_coverage"] = calibration.risk_coverage(*used)
    row["main_metric"] = {k: v for k, v in metrics["dev"].items() if k == task.judging.main_metric}
    row["dev_metrics"] = {k: v for k, v in metrics["dev"].items() if isinstance(v, (int, float))}
    row["cross_fitted_floor"] = c.get("ece_floor")
    if holdout:  # the training file's last rows, never trained on: T (fitted on all of dev) measured there
        held = task.reading.read(str(train_path), need_labels=True)
        if limit + holdout > len(held):
            raise SystemExit(f"--holdout {holdout}: the training file has {len(held)} rows, {limit} are trained on")
        held = held[-holdout:]
        logits, gold = task.scoring.calibration_rows(head_outputs(trained.net, name, held), held, str(train_path))
        before, after = calibration.measured(logits, gold), calibration.measured(logits, gold, task.scoring.temperature())
        row["holdout"] = {"rows": len(gold), "before": before, "after": after,
                          "own_halves": calibration.cross_fitted(logits, gold),
                          "floor": round(calibration.ece_floor(calibration.confidence_pairs(logits, gold, task.scoring.temperature())[0],
                                                               len(gold)), 6)}
    if kind == "classify":
        texts = [e.text for e in examples]
        gold = np.array([task.reading.label_target(e) for e in examples])
        if task.spec.pair:
            texts = [{"text": e.text, "text_pair": e.pair} for e in examples]
        preds_on = task.judging.decode(outputs, examples)
        preds_off = task.options.bind({"calibrate": False}).judging.decode(outputs, examples)
        row["same_labels"] = sum(a["label"] == b["label"] for a, b in zip(preds_on, preds_off))
        row["dev_examples"] = len(examples)
        names = [str(x) for x in task.spec.shown_labels()]
        ours_scores = np.array([[p["scores"][n] for n in names] for p in preds_on])
        try:  # the head as `export --to hf` would write it (refused where no transformers class computes it)
            check_equivalent(trained.head_name(None), task, trained.net.encoder.info.num_layers)
        except UserError as exc:
            row["pipeline"] = f"no transformers export: {exc}"
            return row
        peer = pipeline_scores(target, texts, fold=False)
        folded = pipeline_scores(target, texts, fold=True)
        for label, scores in (("pipeline_raw", peer), ("pipeline_folded", folded)):
            conf, right = scores.max(-1), scores.argmax(-1) == gold
            row[f"{label}_ece"] = round(calibration.ece(conf, right), 6)
            row[f"{label}_accuracy"] = round(float(right.mean()), 6)
        row["folded_vs_ours_max_abs_diff"] = float(np.abs(folded - ours_scores).max())
    return row


def table(rows: list[dict]) -> str:
    head = ("| case | T | acc. | ECE before → after (cross-fitted) | Brier before → after | ECE full dev raw / "
            "calibrated, in-sample (decisions) | pipeline ECE before / after folding | folded − ours | labels kept |\n"
            "|---|---|---|---|---|---|---|---|---|")
    lines, nan = [head], float("nan")  # (nan: dev too little evidence to fit on)
    for r in rows:
        c = r["cross_fitted"]
        peer = (f"{r['pipeline_raw_ece']:.4f} / {r['pipeline_folded_ece']:.4f}" if "pipeline_raw_ece" in r else "-")
        diff = f"{r['folded_vs_ours_max_abs_diff']:.1e}" if "folded_vs_ours_max_abs_diff" in r else "-"
        kept = (f"{r['same_labels']}/{r['dev_examples']}" if "same_labels" in r
                else "same acc." if r["dev_accuracy_raw"] == r["dev_accuracy_calibrated"] else "acc. moved")
        t = "none" if r["temperature"] is None else f"{r['temperature']:.3f}"  # (too little evidence, or a fit that raised the ECE)
        lines.append(f"| {r['case']} | {t} | {r['dev_accuracy_raw']:.4f} | "
                     f"{c.get('ece_before', nan):.4f} → {c.get('ece_after', nan):.4f} | "
                     f"{c.get('brier_before', nan):.4f} → {c.get('brier_after', nan):.4f} | "
                     f"{r['dev_ece_raw']:.4f} / {r['dev_ece_calibrated_in_sample']:.4f} | {peer} | {diff} | {kept} |")
    held = [r for r in rows if "holdout" in r]
    if held:
        lines += ["", "| case | held-out rows | acc. | ECE before → after (T from dev) | floor there | Brier before → after | "
                      "cross-fitted ECE after / its floor (dev halves) | T fitted on the held-out halves: ECE before → "
                      "after |", "|---|---|---|---|---|---|---|---|"]
        for r in held:
            h, c = r["holdout"], r["cross_fitted"]
            lines.append(f"| {r['case']} | {h['rows']:,} | {h['before']['accuracy']:.4f} | {h['before']['ece']:.4f} → "
                         f"{h['after']['ece']:.4f} | {h['floor']:.4f} | {h['before']['brier']:.4f} → {h['after']['brier']:.4f} | "
                         f"{c['ece_after']:.4f} / {c.get('ece_floor', float('nan')):.4f} | "
                         f"{h['own_halves']['ece_before']:.4f} → {h['own_halves']['ece_after']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="sst2-ft1", help=f"comma-separated: {', '.join(CASES)}")
    p.add_argument("--limit", type=int, default=2000, help="training rows (the first N)")
    p.add_argument("--model", default="default")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reuse", action="store_true", help="measure the models already trained in bench/out")
    p.add_argument("--seeds", default=None, help="comma-separated training seeds, a model each (default: one model, train's default seed)")
    p.add_argument("--dev-limit", type=int, default=None, help="the full-dev pass on the first N dev examples only")
    p.add_argument("--holdout", type=int, default=0,
                   help="also measure on the training file's last N rows (not trained on; more rows than dev's halves)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    out = OUT / "calibration"
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [None]
    rows = [run_case(case, args.limit, out, args.model, args.reuse, args.dev_limit, args.holdout, seed)
            for case in args.cases.split(",") for seed in seeds]
    path = save_json("calibration-" + args.cases.replace(",", "-"), {"environment": environment(), "cpu": cpu_line(), "argv": sys.argv, "rows": rows})
    print(cpu_line())
    print(table(rows))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
