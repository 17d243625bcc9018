"""The obvious baseline: TF-IDF + logistic regression (scikit-learn) beside bertheads' defaults on
the same small samples of two public sets no one here wrote (`bench/public_sets.py`): GLUE SST-2
(binary; scored on its dev split, 872 rows) and TREC-6 question classification (6 classes;
scored on its 500-row test split).

Arms:
- `tfidf`: word 1-2 grams, sublinear tf, lowercased (`TfidfVectorizer(ngram_range=(1, 2),
  sublinear_tf=True)`), then `LogisticRegression` (lbfgs, multinomial) with C chosen among
  `C_GRID` by 5-fold stratified cross-validation (accuracy) on the training rows only.
- `features` (not a default arm): `mode="features"`, the head alone on the frozen encoder (the
  fast alternative the docs name), with the recipe's batch and epochs.
- `defaults`: `bertheads.train("classify", train, dev)` with no training setting (the kind's
  recipe table picks, as `bertheads train classify --train F --dev D` does) on the default
  checkpoint. Its dev file is the scored split, as bench/small_data.py does (it chooses its
  kept epoch there: a small advantage the baseline does not get).

Each seed draws its own N training rows (`small_data_tasks.sample`: seed 0 the first N, seed s
N at random with seed s), the same rows for both arms. Both arms are scored on the same
predictions by the same code: accuracy and macro-F1 over the scored split's classes (a class
the sample lacks counts with F1 0). Seconds: fitting (TF-IDF: the grid search and the final
fit; bertheads: `bertheads.train`, from loading the checkpoint to the trained model, its dev
evaluations included).

One JSON line per (set, size, seed, arm) is appended to `--out` (default
bench/out/baseline.jsonl); a line already there is not run again. `--table` prints the Markdown
table: per seed and the mean over seeds. Commands:

```
python bench/public_sets.py --setup                    # TREC, once
python bench/baseline.py --sets trec,sst2 --sizes 100,300 --seeds 0,1,2
python bench/baseline.py --sets trec,sst2 --sizes 1000 --seeds 0
python bench/baseline.py --table
```
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, cpu_line  # noqa: E402
from public_sets import path, read  # noqa: E402
from small_data_tasks import sample  # noqa: E402

C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
ARMS = ("tfidf", "defaults")
SETTINGS = {"defaults": {}, "features": {"mode": "features"}}  # bertheads' arms: what each gives bertheads.train


def tfidf(texts: list[str], labels: list[str], test: list[str], seed: int) -> tuple[list[str], dict]:
    """TF-IDF + logistic regression, C chosen by cross-validation on the training rows only."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.pipeline import make_pipeline

    pipe = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
                         LogisticRegression(max_iter=2000))
    with warnings.catch_warnings():  # a class with fewer rows than folds: sklearn warns, and folds anyway
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        search = GridSearchCV(pipe, {"logisticregression__C": C_GRID}, scoring="accuracy",
                              cv=StratifiedKFold(5, shuffle=True, random_state=seed), n_jobs=1)
        search.fit(texts, labels)
    return list(search.predict(test)), {"C": search.best_params_["logisticregression__C"],
                                        "cv_accuracy": float(search.best_score_)}


def ours(train: Path, test: Path, test_texts: list[str], seed: int, model: str, settings: dict,
         verbose: bool = False) -> tuple[list[str], dict]:
    """bertheads with `settings` (none: the recipe table picks)."""
    import bertheads

    trained = bertheads.train("classify", str(train), str(test), None, model=model, seed=seed,
                              progress=False, verbose=verbose, **settings)
    m = trained.metrics
    predicted = [p["label"] if isinstance(p, dict) else p for p in trained.predict(test_texts)]
    return [str(p) for p in predicted], {"chosen": m.get("chosen"), "kept_epoch": m.get("best_epoch"),
                                         **({"pairs": m["contrastive"]["pair_count"],
                                             "pair_seconds": m["contrastive"]["seconds"]}
                                            if m.get("contrastive") else {})}


def scores(predicted: list[str], gold: list[str]) -> dict:
    from sklearn.metrics import accuracy_score, f1_score

    classes = sorted(set(gold))
    return {"accuracy": float(accuracy_score(gold, predicted)),
            "macro_f1": float(f1_score(gold, predicted, labels=classes, average="macro", zero_division=0))}


def read_results(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []


def run(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    done = {(r["set"], r["size"], r["seed"], r["arm"]) for r in read_results(args.out)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = cpu_line()
    for name in args.sets:
        source = path(name, "train")
        header = source.read_text(encoding="utf-8").split("\n", 1)[0]
        rows = [line for line in source.read_text(encoding="utf-8").split("\n")[1:] if line.strip()]
        test_texts, test_gold = read(name, "test")
        for size in args.sizes:
            for seed in args.seeds:
                chosen = sample(rows, size, seed)
                texts, labels = [r.split("\t")[0] for r in chosen], [r.split("\t")[1] for r in chosen]
                for arm in args.arms:
                    if (name, size, seed, arm) in done:
                        continue
                    with tempfile.TemporaryDirectory() as work:
                        train = Path(work) / "train.tsv"
                        train.write_text("\n".join([header, *chosen]) + "\n", encoding="utf-8")
                        start = time.perf_counter()
                        if arm == "tfidf":
                            predicted, extra = tfidf(texts, labels, test_texts, seed)
                        else:
                            predicted, extra = ours(train, path(name, "test"), test_texts, seed, args.model,
                                                    SETTINGS[arm], args.verbose)
                        seconds = time.perf_counter() - start
                    record = {"set": name, "size": size, "seed": seed, "arm": arm, **scores(predicted, test_gold),
                              "seconds": seconds, "classes_in_sample": len(set(labels)), **extra,
                              "machine": machine, "load": os.getloadavg()[0]}
                    with open(args.out, "a") as f:
                        f.write(json.dumps(record) + "\n")
                    print(f"{name} {size} seed {seed} {arm}: accuracy {record['accuracy']:.3f} macro-F1 "
                          f"{record['macro_f1']:.3f} {seconds:.0f} s", flush=True)


def table(args) -> str:
    """Per set and size: each arm's mean over its seeds (accuracy, macro-F1, median seconds), the
    defaults' gap to TF-IDF on the seeds both ran, and each seed's accuracy."""
    by: dict = {}
    for r in read_results(args.out):
        by.setdefault((r["set"], r["size"]), {}).setdefault(r["arm"], {})[r["seed"]] = r
    arms = [a for a in ("tfidf", "features", "defaults") if any(a in v for v in by.values())]
    names = {"tfidf": "TF-IDF + LR", "features": "--mode features", "defaults": "defaults"}
    lines = ["| set | rows | " + " | ".join(f"{names[a]}: accuracy / macro-F1 (seeds; s)" for a in arms)
             + " | defaults - TF-IDF, same seeds (points) | accuracy per seed (" + " / ".join(names[a] for a in arms)
             + ") |", "|---|---|" + "---|" * (len(arms) + 2)]
    for (name, size), got in sorted(by.items(), key=lambda kv: (kv[0][0] != "sst2", kv[0][1])):
        cells = []
        for a in arms:
            runs = list(got.get(a, {}).values())
            cells.append(f"{statistics.mean(r['accuracy'] for r in runs):.3f} / "
                         f"{statistics.mean(r['macro_f1'] for r in runs):.3f} ({len(runs)}; "
                         f"{statistics.median(r['seconds'] for r in runs):.0f})" if runs else "")
        both = sorted(set(got.get("tfidf", {})) & set(got.get("defaults", {})))
        gap = (f"{100 * statistics.mean(got['defaults'][s]['accuracy'] - got['tfidf'][s]['accuracy'] for s in both):+.1f}"
               f" ({len(both)})" if both else "")
        seeds = sorted({s for a in arms for s in got.get(a, {})})
        per_seed = ", ".join(f"{s}: " + " / ".join(f"{got[a][s]['accuracy']:.3f}" if s in got.get(a, {}) else "-"
                                                    for a in arms) for s in seeds)
        lines.append(f"| {name} | {size} | " + " | ".join(cells) + f" | {gap} | {per_seed} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="sst2,trec", type=lambda s: s.split(","))
    p.add_argument("--sizes", default="100,300,1000", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--seeds", default="0,1,2", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--arms", default=",".join(ARMS), type=lambda s: s.split(","))
    p.add_argument("--model", default="default", help="the checkpoint (default: the installed default)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--out", type=Path, default=OUT / "baseline.jsonl")
    p.add_argument("--verbose", action="store_true", help="bertheads' progress lines on stderr")
    p.add_argument("--table", action="store_true", help="print the table of what --out holds")
    args = p.parse_args()
    if args.table:
        print(table(args))
    else:
        run(args)


if __name__ == "__main__":
    main()
