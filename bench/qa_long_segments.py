"""Choose the topic-segment settings on held-out questions: F1 of each setting on the plain, flat
filler and flat article versions (bench/qa_long.py's) of eval questions LO..HI-1, decoded with
`relative` and paragraph match 6; each distinct window is read once (`qa_long.window_logits`,
cached under bench/out/qa-long-segments-LO-HI/).

    python bench/qa_long_segments.py bench/out/qalong/ours-v1 1000 1400 3,0.5,80,0 2,0.5,80,0 3,1,80,0

Each setting is BLOCK,CUT,MIN_TOKENS,FIT (`tasks/qa/segments.py` `topic_spans`).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import qa_long  # noqa: E402
from common import OUT, require_data  # noqa: E402


def main() -> None:
    import bertheads
    from bertheads.tasks.qa import segments
    from bertheads.tasks.qa.formats import read_examples

    model = bertheads.load(sys.argv[1])
    model.weights_key = hash(str(Path(sys.argv[1]).resolve()))
    lo, hi = int(sys.argv[2]), int(sys.argv[3])
    settings = [tuple(float(x) for x in c.split(",")) for c in sys.argv[4:]]
    task = model.task()
    path = require_data("squad", "eval-split.json")
    versions = qa_long.build_versions(path, read_examples(str(path))[lo:hi], model.net.encoder.tokenizer)
    work = OUT / f"qa-long-segments-{lo}-{hi}"
    work.mkdir(parents=True, exist_ok=True)
    task.spec.paragraph_windows, task.spec.window_choice, task.spec.paragraph_match = True, "relative", 6.0
    for setting in [None, *settings]:
        task.spec.topic_segments = setting is not None
        if setting is not None:
            segments.topic_spans.__defaults__ = (int(setting[0]), setting[1], int(setting[2]), bool(setting[3]))
        label = "off" if setting is None else "-".join(f"{x:g}" for x in setting)
        row = {}
        for version, examples in versions.items():
            if setting is not None and version in ("filler", "article"):  # no long paragraph: as with "off"
                continue
            _, features, owner, logits = qa_long.window_logits(model, examples,
                                                               work / f"{label}-{version.replace(' ', '-')}.npz")
            outputs = task.judging.collect(logits, owner, examples, features)
            row[version] = (round(task.judging.metrics(outputs, examples)["f1"], 2), len(features))
        print(label, row, flush=True)


if __name__ == "__main__":
    main()
