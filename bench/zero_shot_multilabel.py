"""The multi-label cut of a zero-label head (`descriptions.MULTI_LABEL_CUT`): the cosine
similarity from which a described label is on, measured on two multi-label sets (`--set`):

- `goemotions-ekman`: GoEmotions' Reddit comments in Ekman's 7 emotion groups (a public set,
  bench/public_sets.py); the cut is chosen on its dev split, reported on its test split;
- `conll-types`: each CoNLL-2003 sentence (five tokens or more) labelled with the entity types
  its gold tags mention (PER, LOC, ORG, MISC; none for a sentence without entities); chosen on
  (the first `--limit` sentences of) train, reported on dev.

A zero-label multi-label head is trained from `DESCRIPTIONS` (`--style about`: what each label
means; `like`: a text like the label's; each written once, not tuned on either split); its probabilities are read back as cosines (probability = sigmoid(SCALE (cos - cut)));
a sweep of cuts is scored on one split (where the cut is chosen) and on another
(where the chosen cut is reported), with micro-F1, macro-F1 over the labels and exact-set
accuracy. The head's own cut is the row marked `(the head's)`.

    PYTHONPATH=src python bench/zero_shot_multilabel.py --set goemotions-ekman [--threads 2]
    PYTHONPATH=src python bench/zero_shot_multilabel.py --set conll-types --style about
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, cpu_line  # noqa: E402
from public_sets import read as read_public  # noqa: E402

DATA = Path(os.environ.get("BERTHEADS_DATA", "/work/shared/data")) / "conll2003"
DESCRIPTIONS = {  # each written once, before any run on the set
    ("goemotions-ekman", "like"): {
        "anger": "I am so angry about this, it makes me furious and mad.",
        "disgust": "That is disgusting and gross, it makes me sick.",
        "fear": "I am scared and afraid of what might happen to me.",
        "joy": "I am so happy, this is wonderful, thank you so much!",
        "neutral": "The next meeting is on Tuesday at the usual place.",
        "sadness": "I am so sad and sorry about your loss, it hurts.",
        "surprise": "Wow, I did not expect that at all, what a surprise!"},
    # CoNLL in two styles: what the label means, and a text like the label's
    ("conll-types", "about"): {"PER": "The text names a person, someone called by their name.",
              "LOC": "The text names a place: a country, a city, a region or a river.",
              "ORG": "The text names an organisation: a company, a club, a party or a government body.",
              "MISC": "The text names a nationality, a language, an event or a title of something."},
    ("conll-types", "like"): {"PER": "John Smith told reporters that Maria Lopez would stay.",
             "LOC": "Heavy rain fell in Germany, near Berlin and along the Rhine.",
             "ORG": "Shares of Siemens rose after the United Nations and Chelsea reported.",
             "MISC": "The French and Italian fans cheered at the World Cup."}}


def sentences(path: Path, limit: int | None) -> list[tuple[str, set[str]]]:
    """(sentence, the entity types its gold tags mention) for sentences of five tokens or more."""
    out, words, types = [], [], set()
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if len(words) >= 5:
                out.append((" ".join(words), types))
            words, types = [], set()
            continue
        words.append(parts[0])
        if parts[-1] != "O":
            types.add(parts[-1].split("-", 1)[1])
    return out[:limit] if limit else out


def splits(name: str, limit: int | None) -> dict[str, list[tuple[str, set[str]]]]:
    """{"choose": rows, "report": rows}: (text, its set of labels)."""
    if name == "conll-types":
        return {"choose": sentences(DATA / "train.txt", limit), "report": sentences(DATA / "dev.txt", limit)}
    out = {}
    for role, split in (("choose", "dev"), ("report", "test")):
        texts, labels = read_public(name, split)
        out[role] = list(zip(texts, map(set, labels)))[:limit]
    return out


def scores(rows: list[tuple[str, set[str]]], cosines: list[dict], cut: float, margin: float | None = None) -> dict:
    """Micro-F1, macro-F1 over the labels and exact-set accuracy at a cut (with `margin`: the
    labels within it of the text's most similar one, instead)."""
    labels = sorted(cosines[0])
    counts = {t: [0, 0, 0] for t in labels}  # true positives, false positives, false negatives
    exact = 0
    for (_, gold), cos in zip(rows, cosines):
        top = max(cos.values())
        chosen = {t for t in labels if (cos[t] >= top - margin if margin is not None else cos[t] >= cut)}
        exact += chosen == gold
        for t in labels:
            counts[t][0] += t in chosen and t in gold
            counts[t][1] += t in chosen and t not in gold
            counts[t][2] += t not in chosen and t in gold

    def f1(tp, fp, fn):
        return 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    total = [sum(c[i] for c in counts.values()) for i in range(3)]
    return {"micro_f1": f1(*total), "macro_f1": sum(f1(*c) for c in counts.values()) / len(labels),
            "exact": exact / len(rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--set", default="goemotions-ekman", choices=sorted({n for n, _ in DESCRIPTIONS}))
    p.add_argument("--limit", type=int, default=4000, help="rows of each split (0: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--style", default="like", choices=("like", "about"), help="which descriptions")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    import torch

    import bertheads
    from bertheads.tasks.classify.descriptions import MULTI_LABEL_CUT, SCALE

    torch.set_num_threads(args.threads)
    described = DESCRIPTIONS.get((args.set, args.style))
    if described is None:
        raise SystemExit(f"no {args.style!r} descriptions for {args.set}")
    data = splits(args.set, args.limit or None)
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        model = bertheads.train("classify", None, out=Path(work) / "zero", model=args.model, verbose=False,
                                problem="multi_label", label_descriptions=[f"{k}: {v}" for k, v in described.items()])
        cosines = {}
        for name, rows in data.items():
            got = model.predict([text for text, _ in rows])
            cosines[name] = [{t: MULTI_LABEL_CUT + math.log(max(s, 1e-12) / max(1 - s, 1e-12)) / SCALE
                              for t, s in g["scores"].items()} for g in got]
        seconds = time.perf_counter() - start
    cuts = sorted({round(-0.10 + 0.02 * i, 2) for i in range(26)} | {MULTI_LABEL_CUT, -1.0})  # -1: every label on
    table = {name: {cut: scores(data[name], cosines[name], cut) for cut in cuts} for name in data}
    best = max(cuts, key=lambda c: table["choose"][c]["micro_f1"])
    print(cpu_line())
    print(f"{args.set}, descriptions {args.style!r}; {', '.join(f'{n}: {len(r)} rows' for n, r in data.items())}; "
          f"{seconds:.0f} s (training the zero-label head and scoring both splits)")
    print("\n| cut | choose: micro-F1 | choose: macro-F1 | report: micro-F1 | report: macro-F1 | report: exact set |"
          "\n|---|---|---|---|---|---|")
    for cut in cuts:
        mark = " (the head's)" if cut == MULTI_LABEL_CUT else " (every label on)" if cut == -1.0 else ""
        mark += " (best where chosen)" if cut == best else ""
        t, d = table["choose"][cut], table["report"][cut]
        print(f"| {cut:.2f}{mark} | {t['micro_f1']:.3f} | {t['macro_f1']:.3f} | {d['micro_f1']:.3f} | "
              f"{d['macro_f1']:.3f} | {d['exact']:.3f} |")
    margins = (0.0, 0.01, 0.02, 0.03, 0.05, 0.08)
    print("\nThe labels within a margin of the most similar one (the top label always on):\n\n| margin | choose: micro-F1 "
          "| choose: macro-F1 | report: micro-F1 | report: macro-F1 | report: exact set |\n|---|---|---|---|---|---|")
    relative = {m: {n: scores(data[n], cosines[n], 0.0, m) for n in data} for m in margins}
    for m, got in relative.items():
        t, d = got["choose"], got["report"]
        print(f"| {m:.2f} | {t['micro_f1']:.3f} | {t['macro_f1']:.3f} | {d['micro_f1']:.3f} | {d['macro_f1']:.3f} | "
              f"{d['exact']:.3f} |")
    args.out = args.out or OUT / f"zero_shot_multilabel_{args.set}_{args.style}.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpu": cpu_line(), "set": args.set, "style": args.style, "best_where_chosen": best, "head_cut": MULTI_LABEL_CUT,
                                    "table": {n: {str(c): v for c, v in t.items()} for n, t in table.items()},
                                    "margins": {str(m): v for m, v in relative.items()}}, indent=1))


if __name__ == "__main__":
    main()
