"""Prediction at any size: peak memory and lines/s of `bertheads predict` (streamed) against
the whole-file path, torchrun shards against one process, and long documents (windows vs
truncation).

    python bench/stream.py --work /tmp/bench-stream --parts rss,shards,long [--sizes 10000,100000,1000000]

rss     one process per run (peak RSS from the kernel's accounting of the child, wait4): the
        streamed CLI and the whole-file API path (`predict_file` + `render`, the pre-streaming
        `bertheads predict`), rounds alternating; SST-2 sentences repeated (classify) and CoNLL
        dev sentences as raw text (tag). The model is a SMALL one so that a million lines fit in
        the session: a randomly initialised 2-layer, hidden-128 BERT (the default checkpoint's
        vocabulary) whose head is trained for one epoch on 2,000 examples; memory scaling and
        the streamed/whole ratio do not depend on the accuracy.
shards  100k SST-2 lines: `torchrun --standalone --nproc_per_node 2` against one process with 2
        torch threads (same small classify model); outputs compared byte for byte.
long    documents of 400+ word pieces (consecutive paragraphs of a SQuAD article), each with an
        SST-2 sentence inserted; its sentiment is the label. Test: squad/eval-split articles, dev
        sentences inserted at word piece 160-240, past the first 128 tokens. The default
        checkpoint is fine-tuned on SST-2 train (--limit, one epoch), then trained one epoch on
        squad/train-split documents (train sentences at any place) with --long-input truncate and
        again with windows; each predicts the test documents its own way (windows: mean and max
        pooling), and so does the SST-2-only model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if not DATA.is_dir():
    DATA = Path("/work/shared/data")
SRC = Path(__file__).resolve().parents[1] / "src"
PY = sys.executable

WHOLE = """
import sys
from bertheads import api
from bertheads.store.atomic import atomic_write_text
model = api.load(sys.argv[1])
examples, preds = model.predict_file(sys.argv[2])
atomic_write_text(sys.argv[3], model.render(preds, examples))
"""


def env(threads: int | None = None) -> dict:
    e = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
         "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        e["OMP_NUM_THREADS"] = str(threads)
    return e


def timed(cmd: list[str], threads: int | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env=env(threads), stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        log.seek(0)
        err = log.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024


def small_models(work: Path) -> dict[str, Path]:
    """A random 2-layer hidden-128 BERT and classify/tag heads trained briefly on it."""
    out = {"classify": work / "small-classify", "tag": work / "small-tag"}
    if all((p / "bertheads.json").exists() for p in out.values()):
        return out
    enc = work / "small-bert"
    if not (enc / "config.json").exists():
        code = f"""
import torch
from transformers import AutoTokenizer, BertConfig, BertModel
from bertheads.encoder.pretrained import default_model_path
torch.manual_seed(0)
cfg = BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=512, max_position_embeddings=512)
BertModel(cfg).save_pretrained({str(enc)!r})
AutoTokenizer.from_pretrained(default_model_path()).save_pretrained({str(enc)!r})
"""
        subprocess.run([PY, "-c", code], env=env(), check=True)
    common = ["--model", str(enc), "--epochs", "1", "--limit", "2000", "--no-progress", "-q"]
    subprocess.run([PY, "-m", "bertheads", "train", "classify", "--train", str(DATA / "sst2/train.tsv"),
                    "--out", str(out["classify"]), *common], env=env(), check=True, stdout=subprocess.DEVNULL)
    subprocess.run([PY, "-m", "bertheads", "train", "tag", "--train", str(DATA / "conll2003/train.txt"),
                    "--out", str(out["tag"]), *common], env=env(), check=True, stdout=subprocess.DEVNULL)
    return out


def inputs(work: Path, kind: str, n: int) -> Path:
    path = work / f"{kind}-{n}.txt"
    if path.exists():
        return path
    if kind == "classify":
        rows = (DATA / "sst2/train.tsv").read_text().splitlines()[1:]
        lines = [r.split("\t")[0] for r in rows]
    else:
        lines = [" ".join(line.split(" ")[0] for line in block.splitlines())
                 for block in (DATA / "conll2003/dev.txt").read_text().split("\n\n") if block.strip()]
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(lines[i % len(lines)] + "\n")
    return path


def part_rss(work: Path, sizes: list[int], rounds: int, kinds: list[str], whole_max: int) -> list[dict]:
    models = small_models(work)
    results = []
    for kind in kinds:
        for n in sizes:
            src = inputs(work, kind, n)
            sides = {"streamed": [PY, "-m", "bertheads", "predict", str(models[kind]), "--input", str(src),
                                  "--output", str(work / f"out-streamed-{kind}-{n}.jsonl"), "--no-progress", "-q"]}
            if n <= whole_max:
                sides["whole"] = [PY, "-c", WHOLE, str(models[kind]), str(src), str(work / f"out-whole-{kind}-{n}.jsonl")]
            runs: dict[str, list] = {s: [] for s in sides}
            for _ in range(rounds):
                for side, cmd in sides.items():
                    runs[side].append(timed(cmd))
            same = (compare(work / f"out-streamed-{kind}-{n}.jsonl", work / f"out-whole-{kind}-{n}.jsonl")
                    if "whole" in sides else None)
            row = {"kind": kind, "lines": n, "same_output": same, "load": open("/proc/loadavg").read().split()[:3]}
            for side, values in runs.items():
                row[side] = {"lines_per_s": round(n / statistics.median(w for w, _ in values), 1),
                             "peak_rss_mib": round(max(r for _, r in values), 1)}
            print(json.dumps(row), flush=True)
            results.append(row)
    return results


def compare(a: Path, b: Path) -> dict:
    """How two prediction files differ: lines, decisions (label / tags) and the largest score gap.
    The streamed path batches each chunk by length, the whole-file path the whole input, so
    batches differ in shape, and float sums in their last bits."""
    if a.read_bytes() == b.read_bytes():
        return {"identical": True}
    lines = decisions = 0
    gap = 0.0
    for x, y in zip(a.read_text().splitlines(), b.read_text().splitlines()):
        if x == y:
            continue
        lines += 1
        p, q = json.loads(x), json.loads(y)
        decisions += p.get("label", p.get("tags", p.get("entities"))) != q.get("label", q.get("tags", q.get("entities")))
        for k, v in p.get("scores", {}).items():
            gap = max(gap, abs(v - q["scores"][k]))
    return {"identical": False, "lines_differing": lines, "decisions_differing": decisions, "max_score_gap": gap}


def part_shards(work: Path, n: int, rounds: int) -> dict:
    model = small_models(work)["classify"]
    src = inputs(work, "classify", n)
    one = [PY, "-m", "bertheads", "predict", str(model), "--input", str(src), "--output", str(work / "one.jsonl"),
           "--no-progress", "-q"]
    two = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "bertheads", "predict",
           str(model), "--input", str(src), "--output", str(work / "two.jsonl"), "--no-progress", "-q"]
    times: dict[str, list[float]] = {"one_process_2_threads": [], "torchrun_2_processes": []}
    for _ in range(rounds):
        times["one_process_2_threads"].append(timed(one, threads=2)[0])
        times["torchrun_2_processes"].append(timed(two, threads=1)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {"lines": n, "seconds": {k: round(v, 1) for k, v in med.items()},
           "speedup_torchrun": round(med["one_process_2_threads"] / med["torchrun_2_processes"], 3),
           "byte_identical": (work / "one.jsonl").read_bytes() == (work / "two.jsonl").read_bytes(),
           "load": open("/proc/loadavg").read().split()[:3]}
    print(json.dumps(row), flush=True)
    return row


def long_documents(work: Path, source: str, name: str, insert_at: tuple[int, int] = (160, 160),
                   min_pieces: int = 400, seed: int = 0, sst2_split: str = "dev") -> Path:
    """JSONL of long documents, each with a labelled SST-2 sentence (of `sst2_split`) inserted at
    a word piece drawn from `insert_at`: consecutive paragraphs of one article of `source` (a
    SQuAD file) joined until the document has at least `min_pieces` word pieces; each document
    is written twice, once with a positive and once with a negative sentence."""
    from transformers import AutoTokenizer

    from bertheads.encoder.pretrained import default_model_path

    path = work / f"{name}.jsonl"
    if path.exists():
        return path
    tok = AutoTokenizer.from_pretrained(default_model_path())
    documents = []
    for article in json.loads((DATA / source).read_text())["data"]:
        parts, pieces = [], 0
        for paragraph in article["paragraphs"]:
            parts.append(paragraph["context"].strip())
            pieces += len(tok(paragraph["context"], add_special_tokens=False)["input_ids"])
            if pieces >= min_pieces:
                documents.append(" ".join(parts))
                parts, pieces = [], 0
    rows = [r.split("\t") for r in (DATA / f"sst2/{sst2_split}.tsv").read_text().splitlines()[1:]]
    rng = random.Random(seed)
    pos = [s for s, label in rows if label == "1" and len(s.split()) >= 6]
    neg = [s for s, label in rows if label == "0" and len(s.split()) >= 6]
    with open(path, "w") as fh:
        for i, document in enumerate(documents):
            enc = tok(document, return_offsets_mapping=True, add_special_tokens=False)
            for label, pool in ((1, pos), (0, neg)):
                sentence = rng.choice(pool)
                cut = enc["offset_mapping"][rng.randint(*insert_at)][0]
                cut = document.rfind(" ", 0, cut) + 1 or cut  # at a word boundary at or before the piece
                text = document[:cut] + sentence.strip().capitalize() + ". " + document[cut:]
                fh.write(json.dumps({"id": f"{i}-{label}", "sentence": text, "label": label}) + "\n")
    return path


def part_long(work: Path, limit: int) -> dict:
    """A model fine-tuned on SST-2 sentences, then trained on long documents (SQuAD train-split
    articles) twice, once per --long-input; each predicts the test documents (eval-split
    articles, the sentence past word piece 128) its own way, the windows one with both pools."""
    base = work / "sst2-default"
    if not (base / "bertheads.json").exists():
        subprocess.run([PY, "-m", "bertheads", "train", "classify", "--train", str(DATA / "sst2/train.tsv"),
                        "--out", str(base), "--epochs", "1", "--limit", str(limit), "--no-progress", "-q"],
                       env=env(), check=True, stdout=subprocess.DEVNULL)
    train = long_documents(work, "squad/train-split.json", "long-train", insert_at=(0, 380), sst2_split="train")
    docs = long_documents(work, "squad/eval-split.json", "long-test", insert_at=(160, 240))
    gold = {}
    for line in docs.read_text().splitlines():
        r = json.loads(line)
        gold[r["id"]] = r["label"]
    row = {"documents": len(gold), "train_documents": len(train.read_text().splitlines()),
           "load": open("/proc/loadavg").read().split()[:3]}
    runs = (("truncate", "truncate", ["--long-input", "truncate"]),
            ("windows_mean", "windows", ["--long-input", "windows", "--pool", "mean"]),
            ("windows_max", "windows", ["--long-input", "windows", "--pool", "max"]))
    for mode in ("truncate", "windows"):
        tuned = work / f"long-{mode}"
        if not (tuned / "bertheads.json").exists():
            start = time.perf_counter()
            subprocess.run([PY, "-m", "bertheads", "train", "classify", "--train", str(train), "--out", str(tuned),
                            "--model", str(base / "encoder"), "--epochs", "1", "--batch-size", "16",
                            "--long-input", mode, "--pool", "mean", "--no-progress", "-q"],
                           env=env(), check=True, stdout=subprocess.DEVNULL)
            row[f"train_seconds_{mode}"] = round(time.perf_counter() - start, 1)
    runs += tuple((f"sst2_only_{name}", "", flags) for name, _, flags in runs)
    for name, mode, flags in runs:
        model = work / f"long-{mode}" if mode else base
        out = work / f"long-out-{name}.jsonl"
        start = time.perf_counter()
        subprocess.run([PY, "-m", "bertheads", "predict", str(model), "--input", str(docs), "--output", str(out),
                        "--no-progress", "-q", *flags], env=env(), check=True)
        preds = [json.loads(line) for line in out.read_text().splitlines()]
        accuracy = sum(p["label"] == gold[p["id"]] for p in preds) / len(preds)
        row[name] = {"accuracy": round(accuracy, 4), "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/bench-stream")
    ap.add_argument("--parts", default="rss,shards,long")
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--kinds", default="classify,tag")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--whole-max", type=int, default=100000, help="largest input the whole-file path runs on")
    ap.add_argument("--shard-lines", type=int, default=100000)
    ap.add_argument("--long-limit", type=int, default=4000, help="SST-2 training sentences for the long part")
    ap.add_argument("--results", default=None, help="append the JSON rows to this file")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    results: dict = {}
    if "rss" in parts:
        results["rss"] = part_rss(work, [int(x) for x in args.sizes.split(",")], args.rounds, args.kinds.split(","),
                                  args.whole_max)
    if "shards" in parts:
        results["shards"] = part_shards(work, args.shard_lines, args.rounds)
    if "long" in parts:
        results["long"] = part_long(work, args.long_limit)
    if args.results:
        with open(args.results, "a") as fh:
            fh.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
