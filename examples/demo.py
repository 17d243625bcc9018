"""What `make demo` prints after training runs/demo: each head's predictions on inputs it did
not see in training, then one `analyze` call where one encoder pass feeds two heads.

usage: python examples/demo.py [MODEL_DIR]   (default runs/demo)
"""

from __future__ import annotations

import json
import sys

import bertheads

REVIEWS = [
    "A warm, funny and wonderfully acted film.",
    "Tedious, overlong and badly written.",
    "One of the best movies I have seen this year.",
    "A complete waste of a rainy afternoon.",
]
NEWS = [
    "Anna Berg flew from Helsinki to Madrid to meet engineers at Polar Dynamics.",
    "Carlos Vega runs a small bakery in Seville.",
]
PASSAGE = ("The Blue Finch cafe in Galway was opened by Niamh Byrne in 2012. It serves breakfast all day "
           "and is famous for its apple pie.")
QUESTIONS = ["Who opened the Blue Finch cafe?", "When was the cafe opened?", "Where is the Blue Finch cafe?"]
BOTH = ["Maria Lopez loved the new film from Redwood Press.", "The hotel in Lisbon was dirty and the staff rude."]


def main() -> None:
    directory = sys.argv[1] if len(sys.argv) > 1 else "runs/demo"
    model = bertheads.load(directory)
    print(f"\n{directory}: one encoder, heads {', '.join(f'{n} ({k})' for n, k in model.heads.items())}")

    print("\nsentiment   (bertheads predict runs/demo --head sentiment)")
    for text, p in zip(REVIEWS, model.predict(REVIEWS, head="sentiment")):
        print(f"  {p['label']:<8} {p['scores'][p['label']]:.2f}  {text}")

    print("\nner         (bertheads predict runs/demo --head ner)")
    for text, p in zip(NEWS, model.predict(NEWS, head="ner")):
        found = ", ".join(f"{e['text']} ({e['type']})" for e in p["entities"]) or "none"
        print(f"  {text}\n    -> {found}")

    print("\nqa          (bertheads predict runs/demo --head qa --question Q --context PASSAGE)")
    print(f"  passage: {PASSAGE}")
    for question, p in zip(QUESTIONS, model.predict([(q, PASSAGE) for q in QUESTIONS], head="qa")):
        print(f"  {question:<34} -> {p['answer']!r}")

    # one call, every single-text head; sentiment and ner encode these texts alike: one pass
    encoder = model.net.encoder
    passes = []
    forward = encoder.forward
    encoder.forward = lambda *a, **k: passes.append(1) or forward(*a, **k)
    results = model.analyze(BOTH)
    del encoder.forward
    print(f"\nanalyze     (model.analyze(texts): {len(passes)} encoder pass for {len(BOTH)} texts, heads "
          f"{' + '.join(results[0])})")
    for text, r in zip(BOTH, results):
        entities = [f"{e['text']} ({e['type']})" for e in r["ner"]["entities"]]
        print(f"  {text}\n    -> {json.dumps({'sentiment': r['sentiment']['label'], 'ner': entities})}")


if __name__ == "__main__":
    main()
