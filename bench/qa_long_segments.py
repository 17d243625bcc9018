"""Choose the topic-segment settings on held-out questions: F1 of each setting on the plain, flat
filler and flat article versions (bench/qa_long.py's) of eval questions LO..HI-1, decoded with
`relative` and paragraph match 6; each distinct window is read once (cached in
bench/out/qa-long-segments-LO-HI.npz).

    python bench/qa_long_segments.py bench/out/qalong/ours-v1 1000 1400 3,0.5,80,0 2,0.5,80,0 3,1,80,0

Each setting is BLOCK,CUT,MIN_TOKENS,FIT (`tasks/qa/segments.py` `topic_spans`).
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import qa_long  # noqa: E402
from common import OUT, require_data  # noqa: E402


def main() -> None:
    import bertheads
    from bertheads.model import run_heads
    from bertheads.tasks.qa import segments
    from bertheads.tasks.qa.task import read_examples

    model = bertheads.load(sys.argv[1])
    lo, hi = int(sys.argv[2]), int(sys.argv[3])
    settings = [tuple(float(x) for x in c.split(",")) for c in sys.argv[4:]]
    name = next(iter(model.net.tasks))
    task = model.net.tasks[name]
    tokenizer = model.net.encoder.tokenizer
    path = require_data("squad", "eval-split.json")
    versions = qa_long.build_versions(path, read_examples(str(path))[lo:hi], tokenizer)
    cache_file = OUT / f"qa-long-segments-{lo}-{hi}.npz"
    cache = np.load(cache_file, allow_pickle=True)["cache"].item() if cache_file.exists() else {}

    def logits_for(features):
        keys = [hashlib.sha1(np.asarray(f["input_ids"], np.int32).tobytes()).hexdigest() for f in features]
        todo = [i for i, k in enumerate(keys) if k not in cache]
        if todo:
            started = time.time()
            for i, x in zip(todo, run_heads(model.net, [features[i] for i in todo], [name])[name]):
                cache[keys[i]] = x
            print(f"  read {len(todo)} windows in {time.time() - started:.0f} s", flush=True)
        return [cache[k] for k in keys]

    task.spec.paragraph_windows, task.spec.window_choice, task.spec.paragraph_match = True, "relative", 6.0
    for setting in [None, *settings]:
        task.spec.topic_segments = setting is not None
        if setting is not None:
            segments.topic_spans.__defaults__ = (int(setting[0]), setting[1], int(setting[2]), bool(setting[3]))
        row = {}
        for version, examples in versions.items():
            if setting is not None and version in ("filler", "article"):  # no long paragraph: as with "off"
                continue
            features, owner = task.encode_for_inference(examples, tokenizer)
            outputs = task.collect(logits_for(features), owner, examples, features)
            row[version] = (round(task.metrics(outputs, examples)["f1"], 2), len(features))
        print("off" if setting is None else setting, row, flush=True)
        np.savez(cache_file, cache=np.array(cache, dtype=object))


if __name__ == "__main__":
    main()
