"""The GPU recipe (bench/gpu.sh): for each task kind, bertheads fine-tuning and prediction in bf16
(`--precision bf16`, the encoder's SDPA attention) against the Hugging Face Trainer with
`bf16=True` and a transformers prediction peer in bf16, on the same GPU, checkpoint (`--model`),
data and hyperparameters (1 epoch, batch 32, lr 5e-5, warm-up 10%, weight decay 0.01, seed 42),
in one run:

- classify: SST-2 (first 20,000 training sentences; the 872 dev sentences). Trainer:
  AutoModelForSequenceClassification, max length 128. Peer: `pipeline("text-classification",
  dtype=torch.bfloat16)` on our model's transformers export. Metric: accuracy.
- tag: CoNLL-2003 (all 14,041 training sentences; the 3,250 dev sentences). Trainer:
  AutoModelForTokenClassification with each word's label on its first piece (run_ner), max
  length 128. Peer: `pipeline("token-classification", aggregation_strategy="first",
  dtype=torch.bfloat16)` on our export, on the dev words joined by spaces, as ours predicts.
  Metric: entity F1 (seqeval's default mode). Ours and the Trainer are scored on the dev words
  (`f1`); ours and the pipeline also on the raw-text route (`raw_text_f1`: each entity's
  character span tags the words it overlaps).
- qa: SQuAD v1.1 `squad/train-split.json` (all 7,235 questions) to train, the first 1,000
  questions of `eval-split.json` to predict. Trainer: AutoModelForQuestionAnswering with run_qa's
  preprocessing (windows of 384 tokens, stride 128, answer offsets; bench/qa.py `hf_windows`),
  its logits decoded by our span decoding. Peer: transformers 5 has no question-answering
  pipeline, so the peer is our export loaded as AutoModelForQuestionAnswering in bf16 with the
  simple decoding: every window of 384 tokens (stride 128), the best start + end logit sum over
  spans of at most 30 tokens inside the passage, the best window's span. Metric: SQuAD F1 and EM
  (`bertheads.tasks.qa.metrics`).

Training time is the training loop only on both sides (ours: `training.loop.train_epoch`,
timed from outside; the Trainer: its own `train_runtime`), so loading, tokenising and saving are
left out; examples per second are training sentences or questions per loop second. The whole
calls are kept too (`train_call_seconds`: ours `bertheads.train`, with loading, encoding and
saving; the Trainer's `Trainer.train`). Prediction
time is end to end: inputs in, predictions out (ours: `Model.predict`; the Trainer: tokenising,
`Trainer.predict` and decoding; the peer: the pipeline or the model and its decoding), after a
warm-up on the first 16 inputs of each freshly loaded predictor. Each ratio is the other side's
seconds over ours.

Size: with the defaults the whole run is estimated (not measured) at 3-5 minutes on one H200:
about 2 x 15-25 s of training per kind, seconds of prediction, and loading. `--limit N` takes the
first N training examples of every kind, `--kinds` a subset.

Each side runs in a fresh Python process (ours first: the peer predicts with our model's
transformers export), so none inherits the kernels and cuDNN plans an earlier side warmed
(`--one-process` runs them all in this one).

On a CUDA device every side runs there; without one they run on the CPU (ours in what
`--precision auto` gives there, the Trainer and the peers in fp32), which is only a check that
the script works. Results: bench/out/gpu.json (or `--out`), and with `--results FILE` one
Markdown row per kind appended to that file, each naming the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import DATA, OUT, environment  # noqa: E402
from gpu_sides import (  # noqa: E402
    MAX_ANSWER,
    MAX_LENGTH,
    QA_LENGTH,
    QA_QUESTION,
    QA_STRIDE,
    WARM_UP,
    export,
    hf_model,
    log,
    ours_side,
    peer_dtype,
    peer_pipeline,
    read_tsv,
    release,
    timed,
    trainer_classify,
    trainer_qa,
    trainer_tag,
)

KINDS = ("classify", "tag", "qa")
SIDES = ("ours", "trainer", "peer")  # in this order: the peer predicts with our model's transformers export
TRAIN_LIMIT = {"classify": 20000, "tag": None, "qa": None}  # the default sizes (None: all)
DEV_LIMIT = {"classify": None, "tag": None, "qa": 1000}
FILES = {"classify": ("sst2/train.tsv", "sst2/dev.tsv"), "tag": ("conll2003/train.txt", "conll2003/dev.txt"),
         "qa": ("squad/train-split.json", "squad/eval-split.json")}
STEPS = {
    "classify": "classify (SST-2): bertheads train --precision bf16 and predict; Trainer bf16=True "
                "(AutoModelForSequenceClassification); pipeline text-classification dtype=bfloat16",
    "tag": "tag (CoNLL-2003): bertheads train --precision bf16 and predict on raw text; Trainer bf16=True "
           "(AutoModelForTokenClassification, first-piece labels); pipeline token-classification "
           "aggregation_strategy=first dtype=bfloat16; entity F1",
    "qa": "qa (SQuAD train-split -> eval-split): bertheads train --precision bf16 and predict; Trainer bf16=True "
          "(AutoModelForQuestionAnswering, run_qa windows 384/128); AutoModelForQuestionAnswering bf16 with "
          "best start/end decoding; SQuAD F1/EM",
}
MAIN_METRIC = {"classify": "accuracy", "tag": "f1", "qa": "f1"}
PEER_METRIC = {"classify": "accuracy", "tag": "raw_text_f1", "qa": "f1"}  # the pipeline reads raw text
POINTS = {"classify": 100.0, "tag": 100.0, "qa": 1.0}  # metric -> points (SQuAD's are percent already)


# -- classify -------------------------------------------------------------------------------------
def run_classify(args, device: str, work: Path, train_path: Path, dev_path: Path, limit, dev_limit,
                 sides=SIDES) -> dict:
    texts, gold = read_tsv(train_path, limit)
    dev_texts, dev_gold = read_tsv(dev_path, dev_limit)
    result = {"train_examples": len(texts), "dev_examples": len(dev_texts)}
    got: dict = {}

    def accuracy(labels) -> float:
        return float(np.mean([str(a) == str(b) for a, b in zip(labels, dev_gold)]))

    if "ours" in sides:
        log("classify: ours")
        got["ours"] = ours_side("classify", args, device, train_path, limit, work, dev_texts,
                                lambda model, out: {"accuracy": accuracy([p["label"] for p in out])},
                                max_length=MAX_LENGTH)
    if "trainer" in sides:
        log("classify: Trainer")
        peer, predicted = trainer_classify(args, device, work, (texts, gold), (dev_texts, dev_gold),
                                           max(gold + dev_gold) + 1)
        peer["accuracy"] = accuracy(predicted)
        got["trainer"] = peer
    if "peer" in sides:
        log("classify: pipeline")
        pipe = peer_pipeline("text-classification", export(work), device)
        pipe_result: dict = {"name": f"pipeline text-classification {pipe.model.dtype}".replace("torch.", "")}
        pipe(dev_texts[:WARM_UP], batch_size=64)
        with timed(device, pipe_result, "predict_seconds"):
            out = pipe(dev_texts, batch_size=64, truncation=True, max_length=MAX_LENGTH)
        pipe_result["accuracy"] = accuracy([o["label"] for o in out])  # the export names its labels
        del pipe
        release(device)
        got["peer"] = pipe_result
    return {**result, **got}


# -- tag ------------------------------------------------------------------------------------------
def word_tags(words: list[str], entities: list[tuple[str, int, int]]) -> list[str]:
    """The tags of `words` (joined by single spaces) from entities given as (type, start, end)
    in characters: an entity tags the words it overlaps, B- the first, I- the rest."""
    spans, at = [], 0
    for w in words:
        spans.append((at, at + len(w)))
        at += len(w) + 1
    tags = ["O"] * len(words)
    for kind, start, end in entities:
        hit = [i for i, (a, b) in enumerate(spans) if a < end and start < b and tags[i] == "O"]
        for n, i in enumerate(hit):
            tags[i] = ("B-" if n == 0 else "I-") + kind
    return tags


def run_tag(args, device: str, work: Path, train_path: Path, dev_path: Path, limit, dev_limit,
            sides=SIDES) -> dict:
    from tag import read_conll

    from bertheads.tasks.tag.scheme import entity_metrics

    train = read_conll(train_path, limit)
    dev = read_conll(dev_path, dev_limit)
    gold = [t for _, t in dev]
    texts = [" ".join(w) for w, _ in dev]
    result = {"train_examples": len(train), "dev_examples": len(dev)}
    got: dict = {}

    def scores(pred: list[list[str]], prefix: str = "") -> dict:
        got = entity_metrics(gold, pred)
        return {f"{prefix}{k}": got[k] for k in ("f1", "precision", "recall")}

    if "ours" in sides:
        log("tag: ours")
        def tag_scores(model, found) -> dict:  # on the dev words, and on the raw text's entity spans
            raw = [word_tags(w, [(e["type"], e["start"], e["end"]) for e in f["entities"]])
                   for (w, _), f in zip(dev, found)]
            return {**scores([p["tags"] for p in model.predict([w for w, _ in dev])]), **scores(raw, "raw_text_")}

        got["ours"] = ours_side("tag", args, device, train_path, limit, work, texts, tag_scores, max_length=MAX_LENGTH)
    if "trainer" in sides:
        log("tag: Trainer")
        peer, pred = trainer_tag(args, device, work, train, dev)
        peer.update(scores(pred))
        got["trainer"] = peer
    if "peer" in sides:
        log("tag: pipeline")
        pipe = peer_pipeline("token-classification", export(work), device, aggregation_strategy="first")
        pipe_result: dict = {"name": f"pipeline token-classification first {pipe.model.dtype}".replace("torch.", "")}
        pipe(texts[:WARM_UP], batch_size=64)
        with timed(device, pipe_result, "predict_seconds"):
            out = pipe(texts, batch_size=64)
        raw = [word_tags(w, [(e["entity_group"], int(e["start"]), int(e["end"])) for e in f])
               for (w, _), f in zip(dev, out)]
        pipe_result.update(scores(raw, "raw_text_"))
        del pipe
        release(device)
        got["peer"] = pipe_result
    return {**result, **got}


# -- qa -------------------------------------------------------------------------------------------
def answer_windows(model, tokenizer, device: str, questions: list[dict], batch: int = 64) -> list[str]:
    """The qa prediction peer's answers (transformers 5 has no question-answering pipeline): an
    AutoModelForQuestionAnswering (our export, bf16 on a GPU) on every window of 384 tokens
    (stride 128), per window the span of at most 30 tokens inside the passage with the best
    start + end logit sum, and of a question's windows the best one's span."""
    import torch

    enc = tokenizer([q["question"].lstrip() for q in questions], [q["context"] for q in questions],
                    truncation="only_second", max_length=QA_LENGTH, stride=QA_STRIDE,
                    return_overflowing_tokens=True, return_offsets_mapping=True)
    owner = enc["overflow_to_sample_mapping"]
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
    best: list[tuple[float, str]] = [(-np.inf, "")] * len(questions)
    start, end = np.indices((QA_LENGTH, QA_LENGTH))
    band = (end >= start) & (end - start < MAX_ANSWER)  # spans of 1 to 30 tokens
    for first in range(0, len(owner), batch):
        rows = range(first, min(first + batch, len(owner)))
        inputs = tokenizer.pad({k: [enc[k][i] for i in rows] for k in keys}, return_tensors="pt").to(device)
        with torch.inference_mode():
            out = model(**inputs)
        starts, ends = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
        for n, i in enumerate(rows):
            context = [j for j, s in enumerate(enc.sequence_ids(i)) if s == 1]
            a, b = context[0], context[-1] + 1
            pair = starts[n, a:b, None] + ends[n, None, a:b]
            pair = np.where(band[: b - a, : b - a], pair, -np.inf)
            s, e = np.unravel_index(int(np.argmax(pair)), pair.shape)
            if pair[s, e] > best[owner[i]][0]:
                offsets = enc["offset_mapping"][i]
                best[owner[i]] = (float(pair[s, e]), questions[owner[i]]["context"][offsets[a + s][0]:offsets[a + e][1]])
    return [answer for _, answer in best]


def run_qa(args, device: str, work: Path, train_path: Path, dev_path: Path, limit, dev_limit,
           sides=SIDES) -> dict:
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from bertheads.tasks.qa.formats import read_examples
    from bertheads.tasks.qa.metrics import squad_v1_scores

    train = read_examples(str(train_path))[:limit]
    dev = read_examples(str(dev_path))[:dev_limit]
    questions = [{"question": e.question, "context": e.context} for e in dev]
    result = {"train_examples": len(train), "dev_examples": len(dev)}
    got: dict = {}

    def scores(answers: list[str]) -> dict:
        got = squad_v1_scores(answers, dev)
        return {"f1": got["f1"], "exact_match": got["exact_match"]}

    if "ours" in sides:
        log("qa: ours")
        got["ours"] = ours_side("qa", args, device, train_path, limit, work, questions,
                                lambda model, out: scores([p["answer"] for p in out]), max_length=QA_LENGTH,
                                stride=QA_STRIDE, max_question_length=QA_QUESTION)
    if "trainer" in sides:
        log("qa: Trainer")
        peer, answers = trainer_qa(args, device, work, train, dev)
        peer.update(scores(answers))
        got["trainer"] = peer
    if "peer" in sides:
        log("qa: AutoModelForQuestionAnswering")
        hf_dir = export(work)
        pipe_result: dict = {"name": f"AutoModelForQuestionAnswering {str(peer_dtype(device)).replace('torch.', '')}, "
                                     "best start/end"}
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
        model = hf_model(AutoModelForQuestionAnswering, str(hf_dir), dtype=peer_dtype(device)).to(device).eval()
        answer_windows(model, tokenizer, device, questions[:WARM_UP])
        with timed(device, pipe_result, "predict_seconds"):
            answers = answer_windows(model, tokenizer, device, questions)
        pipe_result.update(scores(answers))
        del model
        release(device)
        got["peer"] = pipe_result
    return {**result, **got}


RUNS = {"classify": run_classify, "tag": run_tag, "qa": run_qa}


def run_sides(kind: str, argv: list[str] | None, work: Path) -> dict:
    """One kind's sides, each in a fresh Python process (ours, then the Trainer, then the peer on our
    export in `work`): on a GPU the first process to meet a shape pays for its kernels' loading and
    plans (cuDNN builds one per attention shape), which a later side in the same process would
    inherit. Each child gets this run's arguments with `--kinds KIND --side SIDE`."""
    import subprocess

    argv = list(sys.argv[1:] if argv is None else argv)
    got: dict = {}
    for side in SIDES:
        out = work / f"{side}.json"
        subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--kinds", kind, "--side", side,
                        "--work", str(work), "--side-out", str(out)], check=True)
        got.update(json.loads(out.read_text()))
    return got


def compare(kind: str, got: dict) -> dict:
    """Examples per second and the ratios (the peer's seconds over ours) of one kind's result."""
    ours, trainer, peer = got["ours"], got["trainer"], got["peer"]
    ours["train_examples_per_second"] = got["train_examples"] / ours["train_seconds"]
    metric = MAIN_METRIC[kind]
    return {**got, "kind": kind, "metric": metric, "peer_metric": PEER_METRIC[kind],
            "training_speedup": trainer["train_seconds"] / ours["train_seconds"],
            "prediction_speedup": trainer["predict_seconds"] / ours["predict_seconds"],
            "peer_prediction_speedup": peer["predict_seconds"] / ours["predict_seconds"],
            "metric_difference_points": POINTS[kind] * (ours[metric] - trainer[metric])}


# -- results --------------------------------------------------------------------------------------
SECTION = "## GPU recipe (bench/gpu.sh): every task kind"
HEADER = (f"\n{SECTION}\n\nbf16 training and prediction against the Trainer (`bf16=True`) and a transformers "
          "prediction peer in bf16 (classify, tag: the pipeline; qa: AutoModelForQuestionAnswering with best "
          "start/end decoding), 1 epoch; training seconds are the training loop's; ratios are the other side's "
          "seconds over ours.\n\n"
          "| date | kind | device | machine | train examples | train s ours / Trainer (ex/s) | train ratio | "
          "dev metric ours / Trainer / peer | predict s ours / Trainer / peer | predict ratio Trainer / peer |\n"
          "|---|---|---|---|---|---|---|---|---|---|\n")


def row(result: dict, got: dict) -> str:
    ours, trainer, peer = got["ours"], got["trainer"], got["peer"]
    metric = got["metric"]
    shown = {"classify": "accuracy", "tag": "entity F1", "qa": "SQuAD F1"}[got["kind"]]

    def value(side: dict, key: str = metric) -> str:
        return f"{POINTS[got['kind']] * side[key]:.2f}"

    raw = f" (raw text: ours {value(ours, 'raw_text_f1')})" if "raw_text_f1" in ours else ""

    return (f"| {time.strftime('%Y-%m-%d')} | {got['kind']} | {result['device']} | "
            f"{result['environment'].get('machine', '')} | {got['train_examples']} | "
            f"{ours['train_seconds']:.1f} ({ours['train_examples_per_second']:.0f}) / {trainer['train_seconds']:.1f} "
            f"({trainer['train_examples_per_second']:.0f}) | {got['training_speedup']:.2f}x | "
            f"{shown} {value(ours)} / {value(trainer)} / {value(peer, got['peer_metric'])}{raw} | {ours['predict_seconds']:.2f} / "
            f"{trainer['predict_seconds']:.2f} / {peer['predict_seconds']:.2f} | {got['prediction_speedup']:.2f}x / "
            f"{got['peer_prediction_speedup']:.2f}x |\n")


def append_rows(path: Path, result: dict) -> None:
    """One Markdown row per kind for RESULTS.md (the section's header first when it is not there yet)."""
    text = path.read_text() if path.exists() else ""
    if SECTION not in text:
        text += HEADER
    text += "".join(row(result, got) for got in result["kinds"].values())
    path.write_text(text)


def first(n: int | None) -> str:
    return f"first {n}" if n else "all"


def kinds_of(value: str) -> list[str]:
    chosen = [k.strip() for k in value.split(",") if k.strip()]
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"expected kinds among {','.join(KINDS)}, got {value!r}")
    return [k for k in KINDS if k in chosen]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Data: " + ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in FILES.items()))
    parser.add_argument("--kinds", type=kinds_of, default=list(KINDS), help="which kinds, comma-separated "
                                                                            "(default classify,tag,qa)")
    parser.add_argument("--data", type=Path, default=DATA, help="the data folder (default: ../shared/data)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--limit", type=int, help="first N training examples of every kind (default: SST-2 "
                                                  "20000, CoNLL and SQuAD all)")
    parser.add_argument("--dev-limit", type=int, help="first N dev examples of every kind (default: all; "
                                                      "SQuAD 1000)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--out", type=Path, default=OUT / "gpu.json")
    parser.add_argument("--results", type=Path, help="append one row per kind to this Markdown file "
                                                     "(bench/RESULTS.md)")
    parser.add_argument("--plan", action="store_true", help="print the steps and the sizes, run nothing")
    parser.add_argument("--one-process", action="store_true",
                        help="every side in this process (default: each side in a fresh process, so no side "
                             "runs on the kernels, plans and caches an earlier side warmed)")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # run_sides' child: one side of one kind
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--side-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    limits = {k: args.limit or TRAIN_LIMIT[k] for k in args.kinds}
    dev_limits = {k: args.dev_limit or DEV_LIMIT[k] for k in args.kinds}
    if args.plan:
        for kind in args.kinds:
            train, dev = (args.data / f for f in FILES[kind])
            print(f"step: {STEPS[kind]}\n      train {train} ({first(limits[kind])}), "
                  f"predict {dev} ({first(dev_limits[kind])})")
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.side:  # one side of one kind, in this process: its record to --side-out
        kind = args.kinds[0]
        train, dev = (args.data / f for f in FILES[kind])
        got = RUNS[kind](args, device, args.work, train, dev, limits[kind], dev_limits[kind], sides=(args.side,))
        args.side_out.write_text(json.dumps(got) + "\n")
        return 0
    kinds = {}
    for kind in args.kinds:
        with tempfile.TemporaryDirectory(prefix=f"bertheads-gpu-{kind}-") as tmp:
            log(f"{kind} on {device}")
            kinds[kind] = compare(kind, run_sides(kind, argv, Path(tmp)) if not args.one_process else
                                  RUNS[kind](args, device, Path(tmp), *(args.data / f for f in FILES[kind]),
                                             limits[kind], dev_limits[kind]))
            log(f"{kind}: " + json.dumps({k: v for k, v in kinds[kind].items() if k.endswith(("speedup", "points"))}))
    result = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "kinds": kinds,
              "batch_size": args.batch_size, "lr": args.lr, "environment": environment(),
              "command": " ".join(sys.argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.results:
        append_rows(args.results, result)
    print(json.dumps({"device": result["device"], **{k: {n: v for n, v in got.items()
                                                         if n.endswith(("speedup", "points")) or n == "train_examples"}
                                                     for k, got in kinds.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
