"""Long passages in QA: does the answer come from the right window?

Three versions of the first N questions of `squad/eval-split.json` (and `squad2/eval-split.json`):

- plain: the question's own paragraph, as in SQuAD;
- filler: about 700 tokens of neutral filler text before the paragraph;
- article: the three other paragraphs of the same article nearest it (those before it first)
  before the paragraph, one per line;
- filler flat, article flat: the same texts joined by single spaces, without any line break
  (text extracted from HTML or PDFs, flattened datasets).

The answers' character offsets move with the paragraph. Each model's window logits are
computed once per version (cached under bench/out/NAME/) and decoded with every
`--window-choice` of `bertheads.tasks.qa.task`; SQuAD v2.0 models get their null threshold tuned
per choice on the plain versions of eval questions N..2N-1 (never the scored ones), then
applied unchanged to the long versions. The Hugging Face Trainer's model (trained by
`bench/qa.py`'s `run_trainer`, the `run_qa` recipe) gets `run_qa`'s windows (`bench/qa.py`'s
`hf_windows`) and its decoding (`decode_like_ours`: best raw start + end over all windows).

    # the models (1 epoch, default checkpoint, bench/qa.py's hyperparameters)
    bertheads train qa --train ../shared/data/squad/train-split.json --out bench/out/qalong/ours-v1 ...
    python bench/qa_long.py --train-trainer bench/out/qalong/trainer-v1
    # the table
    python bench/qa_long.py --ours v1=bench/out/qalong/ours-v1 --trainer bench/out/qalong/trainer-v1 \\
        --ours-v2 v2=bench/out/qalong/ours-v2
    # the paragraph-match weight, chosen on held-out long versions (eval questions N..2N-1)
    python bench/qa_long.py --ours v1=bench/out/qalong/ours-v1 --paragraph-windows-only --match-weights 0,2,4,6,8
    # prediction speed: before (raw, token windows), paragraph windows and the match without topic
    # segments, and the defaults (rounds alternate)
    python bench/qa_long.py --speed bench/out/qalong/ours-v1 --speed-limit 300

Results: bench/out/qa-long.json (or --name); Markdown on stdout.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, environment, median, require_data, save_json  # noqa: E402

VERSIONS = ("plain", "filler", "article", "filler flat", "article flat")
FILLER_SENTENCE = "This sentence is only filler text and it says nothing about anything in particular."
FILLER_TOKENS = 700
CHOICES = ("raw", "context", "relative", "relative+context")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the three versions ---------------------------------------------------------------------------
def filler_text(tokenizer, tokens: int = FILLER_TOKENS) -> str:
    per = len(tokenizer(FILLER_SENTENCE, add_special_tokens=False)["input_ids"])
    return " ".join([FILLER_SENTENCE] * max(1, round(tokens / per)))


def article_paragraphs(path: Path) -> tuple[dict[str, tuple[int, int]], list[list[str]]]:
    """Question id -> (article, paragraph), and every article's paragraph texts."""
    doc = json.loads(path.read_text())
    where, texts = {}, []
    for a, article in enumerate(doc["data"]):
        texts.append([p["context"] for p in article["paragraphs"]])
        for p, para in enumerate(article["paragraphs"]):
            for qa in para["qas"]:
                where[str(qa["id"])] = (a, p)
    return where, texts


def with_prefix(e, prefix: str):
    moved = copy.copy(e)
    moved.context = prefix + e.context
    moved.starts = [s + len(prefix) if s >= 0 else s for s in e.starts]
    return moved


def build_versions(path: Path, examples: list, tokenizer) -> dict[str, list]:
    where, texts = article_paragraphs(path)
    filler = filler_text(tokenizer) + "\n"
    article = []
    for e in examples:
        a, p = where[e.id]
        paragraphs = texts[a]
        others = [q for q in sorted(range(len(paragraphs)), key=lambda q: (abs(q - p), q > p)) if q != p][:3]
        article.append(with_prefix(e, "\n".join(paragraphs[q] for q in sorted(others)) + "\n"))
    versions = {"plain": examples, "filler": [with_prefix(e, filler) for e in examples], "article": article}
    for name in ("filler", "article"):  # one space where the line breaks were
        versions[f"{name} flat"] = [copy.copy(e) for e in versions[name]]
        for e in versions[f"{name} flat"]:
            e.context = e.context.replace("\n", " ")
    return versions


# -- ours -----------------------------------------------------------------------------------------
SEEN: dict[tuple[int, bytes], np.ndarray] = {}  # (model, window's token ids) -> its logits, this run


def window_logits(model, examples, cache: Path):
    """Our windows of `examples` and the head's logits for each (cached; a window this run has
    already read with the same model, under another setting, is not read again)."""
    from bertheads.compute.runner import run_heads

    name = next(iter(model.net.tasks))
    task = model.net.tasks[name]
    features, owner = task.modeling.encode_for_inference(examples, model.net.encoder.tokenizer)
    keys = [(model.weights_key, np.asarray(f["input_ids"], dtype=np.int32).tobytes()) for f in features]
    if cache.exists():
        data = np.load(cache)
        if data["lengths"].tolist() != [len(f["input_ids"]) for f in features]:
            raise SystemExit(f"{cache} holds other windows than these settings give; delete it or match them")
        logits = np.split(data["logits"], np.cumsum(data["lengths"])[:-1])
    else:
        todo = [i for i, k in enumerate(keys) if k not in SEEN]
        started = time.perf_counter()
        for i, x in zip(todo, run_heads(model.net, [features[i] for i in todo], [name])[name] if todo else []):
            SEEN[keys[i]] = x
        seconds = time.perf_counter() - started
        logits = [SEEN[k] for k in keys]
        log(f"  {len(features)} windows, {len(todo)} read in {seconds:.0f} s")
        np.savez(cache, logits=np.concatenate(logits), lengths=np.array([len(x) for x in logits]),
                 encoder_seconds=seconds, windows_read=len(todo))
    for k, x in zip(keys, logits):
        SEEN.setdefault(k, x)
    return task, features, owner, logits


def decode_seconds(task, features, owner, logits, examples, rounds: int = 3, match: float | None = None) -> dict:
    """`collect` (all decoding after the encoder) timed per choice (and `relative` with paragraph
    match `match`), rounds alternating."""
    decodings = [(c, c, 0.0) for c in CHOICES] + ([(f"relative+match {match:g}", "relative", match)] if match else [])
    times: dict[str, list[float]] = {name: [] for name, _, _ in decodings}
    for _ in range(rounds):
        for name, choice, weight in decodings:
            task.spec.window_choice, task.spec.paragraph_match = choice, weight
            start = time.perf_counter()
            task.judging.collect(logits, owner, examples, features)
            times[name].append(time.perf_counter() - start)
    task.spec.paragraph_match = 0.0
    return {c: round(median(t), 4) for c, t in times.items()}


def our_scores(task, features, owner, logits, examples, choice: str, threshold: float | None,
               match: float = 0.0) -> dict:
    task.spec.window_choice, task.spec.paragraph_match = choice, match
    outputs = task.judging.collect(logits, owner, examples, features)
    task.spec.paragraph_match = 0.0
    result = task.options.bind({"null_threshold": threshold}).judging.metrics(outputs, examples)
    keep = ("exact_match", "f1", "HasAns_f1", "NoAns_f1")
    return {k.replace("exact_match", "exact"): round(float(result[k]), 2) for k in keep if k in result}


def oracle_scores(task, features, owner, logits, examples) -> dict | None:
    """F1 when only the windows holding a question's whole (first) answer are decoded (raw
    choice): what a perfect choice of window would give, so the rest of a long passage's cost is
    how each window is read. None when some question has no such window (SQuAD v2.0)."""
    from bertheads.tasks.qa.passages import answer_tokens

    keep = [i for i, (f, o) in enumerate(zip(features, owner)) if answer_tokens(f, examples[o]) != (0, 0)]
    if len({owner[i] for i in keep}) != len(examples):
        return None
    task.spec.window_choice = "raw"
    outputs = task.judging.collect([logits[i] for i in keep], [owner[i] for i in keep], examples, [features[i] for i in keep])
    result = task.judging.metrics(outputs, examples)
    return {"exact": round(float(result["exact_match"]), 2), "f1": round(float(result["f1"]), 2)}


def tuned_threshold(task, features, owner, logits, examples, choice: str) -> float:
    """The v2.0 null threshold for `choice`, tuned on (held-out) plain questions."""
    from bertheads.tasks.qa.metrics import best_threshold, f1_v2, gold_v2, max_over
    from bertheads.tasks.qa.spans import null_minus_best

    task.spec.window_choice = choice
    outputs = task.judging.collect(logits, owner, examples, features)
    text = [e.context[int(o.spans[0][0]):int(o.spans[0][1])] if len(o.scores) else "" for o, e in zip(outputs, examples)]
    diffs = np.array([null_minus_best(o) for o in outputs])
    has = np.array([bool(e.answers) for e in examples])
    span_f1 = np.array([max_over(f1_v2, t, gold_v2(e.answers)) if e.answers else 0.0 for t, e in zip(text, examples)])
    return float(best_threshold(diffs, has, span_f1))


def tuned_match(model, label: str, versions: dict, work: Path, weights: list[float]) -> dict:
    """F1 of `relative` decoding with each paragraph-match weight on held-out long versions
    (`versions`: filler and article of questions the table does not score), and the weight with
    the best mean of the two."""
    tried = {}
    got = {v: window_logits(model, versions[v], work / f"{label}-tune-{v.replace(' ', '-')}.npz")
           for v in versions if v != "plain"}
    for w in weights:
        tried[w] = {v: our_scores(*got[v], versions[v], "relative", None, w)["f1"] for v in got}
    best = max(weights, key=lambda w: (sum(tried[w].values()), -w))
    return {"weights": {str(w): f for w, f in tried.items()}, "chosen": best}


def run_ours(label: str, directory: Path, versions: dict, tune: list | None, work: Path,
             paragraphs: bool = False, match_versions: dict | None = None, weights: list[float] = (),
             fixed_match: float | None = None, segments: bool = False) -> dict:
    import bertheads

    model = bertheads.load(directory)
    model.weights_key = hash(str(Path(directory).resolve()))
    for task in model.net.tasks.values():
        task.spec.paragraph_windows = paragraphs
        task.spec.topic_segments = segments
        task.spec.paragraph_match = 0.0
    rows: dict = {}
    match = fixed_match if paragraphs else None
    if weights and paragraphs and match_versions:
        log(f"{label}: paragraph-match weights on held-out long versions")
        rows["paragraph_match"] = tuned_match(model, label, match_versions, work, list(weights))
        match = rows["paragraph_match"]["chosen"]
    thresholds = {}
    if tune is not None:
        log(f"{label}: tuning set ({len(tune)} plain questions)")
        got = window_logits(model, tune, work / f"{label}-tune.npz")
        thresholds = {c: tuned_threshold(*got, tune, c) for c in CHOICES}
        rows["thresholds"] = {c: round(t, 4) for c, t in thresholds.items()}
    for version, examples in versions.items():
        log(f"{label}: {version}")
        got = window_logits(model, examples, work / f"{label}-{version.replace(' ', '-')}.npz")
        rows[version] = {"windows": len(got[1]),
                         **{c: our_scores(*got, examples, c, thresholds.get(c)) for c in CHOICES}}
        if match is not None:
            rows[version][f"relative+match {match:g}"] = our_scores(*got, examples, "relative",
                                                                    thresholds.get("relative"), match)
        oracle = oracle_scores(*got, examples) if tune is None else None
        if oracle:
            rows[version]["oracle window"] = oracle
        data = np.load(work / f"{label}-{version.replace(' ', '-')}.npz")
        if "encoder_seconds" in data:
            rows[version]["encoder_seconds"] = round(float(data["encoder_seconds"]), 2)
        rows[version]["decode_seconds"] = decode_seconds(*got, examples, match=match)
    return rows


def read_with_ours(spec: str, versions: dict, tune: list | None, work: Path, windows: str,
                   match_versions: dict | None = None, weights: list[float] = (),
                   fixed_match: float | None = None, segments: str = "on") -> dict:
    """`LABEL=DIR`'s rows, read with windows across paragraphs (`windows` "across" or "both")
    and with paragraph windows ("para" or "both"): with topic segments as `LABEL+para`
    (`segments` "on" or "both"), without as `LABEL+para-noseg` ("off" or "both"); with
    `weights`, also the paragraph-match weight tuned on `match_versions`."""
    label, directory = spec.split("=", 1)
    reads = [(label, False, False)] if windows != "para" else []
    if windows != "across":
        reads += [(f"{label}+para", True, True)] if segments != "off" else []
        reads += [(f"{label}+para-noseg", True, False)] if segments != "on" else []
    return {name: run_ours(name, Path(directory), versions, tune, work, para, match_versions, weights, fixed_match,
                           seg)
            for name, para, seg in reads}


# -- the Trainer's model, run_qa way --------------------------------------------------------------
def train_trainer(out: Path, limit: int | None) -> dict:
    """bench/qa.py's Trainer run (run_qa recipe) on squad/train-split.json; its model is saved
    in OUT/trainer-model."""
    from qa import run_trainer

    from bertheads.encoder.pretrained import default_model_path
    from bertheads.tasks.qa.formats import read_examples

    train = read_examples(str(require_data("squad", "train-split.json")))[:limit]
    probe = read_examples(str(require_data("squad", "eval-split.json")))[:16]
    out.mkdir(parents=True, exist_ok=True)
    got = run_trainer(default_model_path(), train, probe, out)
    got.pop("answers")
    (out / "trainer-train.json").write_text(json.dumps(got, indent=1) + "\n")
    return got


def trainer_answers(model_dir: Path, examples: list, cache: Path) -> tuple[list[str], int]:
    """run_qa's windows (padded to 384 there; here each runs at its own length, same logits)
    and run_qa's decoding of them."""
    import torch
    from qa import decode_like_ours, hf_windows
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    enc, owner, seqs = hf_windows(tokenizer, examples, train=False)
    n = len(owner)
    lengths = np.array([int(sum(m)) for m in enc["attention_mask"]])
    width = len(enc["input_ids"][0])
    if cache.exists():
        data = np.load(cache)
        start, end = data["start"], data["end"]
    else:
        model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
        start, end = np.zeros((n, width), np.float32), np.zeros((n, width), np.float32)
        order = np.argsort(-lengths, kind="stable")
        started = time.perf_counter()
        with torch.inference_mode():
            i = 0
            while i < n:
                size = max(1, 2048 // int(lengths[order[i]]))
                idx = order[i:i + size]
                longest = int(lengths[idx].max())
                batch = {k: torch.tensor([enc[k][j][:longest] for j in idx])
                         for k in ("input_ids", "token_type_ids", "attention_mask")}
                out = model(**batch)
                start[idx, :longest] = out.start_logits.float().numpy()
                end[idx, :longest] = out.end_logits.float().numpy()
                i += size
        log(f"  {n} windows in {time.perf_counter() - started:.0f} s")
        np.savez(cache, start=start, end=end)
    return decode_like_ours((start, end), enc, owner, seqs, examples), n


def run_trainer_model(model_dir: Path, versions: dict, work: Path) -> dict:
    from qa import scores

    rows = {}
    for version, examples in versions.items():
        log(f"trainer: {version}")
        answers, n = trainer_answers(model_dir, examples, work / f"trainer-{version}.npz")
        got = scores(answers, examples)
        rows[version] = {"windows": n, "run_qa": {"exact": got["exact_match"], "f1": got["f1"]}}
    return rows


# -- prediction speed -----------------------------------------------------------------------------
def speed(directory: Path, inputs: list[dict], rounds: int) -> dict:
    """`Model.predict` end to end, rounds alternating: the decoding before long passages were
    handled (raw scores, windows across paragraph ends), paragraph windows with relative scores
    and the paragraph match but no topic segments, and today's defaults (with topic segments)."""
    import bertheads
    from bertheads.tasks.qa.spec import QASpec

    model = bertheads.load(directory)
    task = model.task()
    match = QASpec.paragraph_match
    configs = {"raw, token windows": ("raw", False, 0.0, False),
               f"paragraph windows, match {match:g}, no topic segments": ("relative", True, match, False),
               f"defaults (match {match:g}, topic segments)": ("relative", True, match, True)}
    times: dict[str, list[float]] = {c: [] for c in configs}
    model.predict(inputs[:20])
    for r in range(rounds):
        for name in list(configs)[:: 1 if r % 2 == 0 else -1]:  # the order alternates too
            (task.spec.window_choice, task.spec.paragraph_windows, task.spec.paragraph_match,
             task.spec.topic_segments) = configs[name]
            start = time.perf_counter()
            model.predict(inputs)
            times[name].append(time.perf_counter() - start)
        log(f"round {r + 1}: " + ", ".join(f"{c} {len(inputs) / t[-1]:.1f} q/s" for c, t in times.items()))
    before, no_segments, default = (median(times[c]) for c in configs)
    return {"questions": len(inputs), "seconds": times, "time_ratio_default_over_before": default / before,
            "time_ratio_default_over_no_segments": default / no_segments}


# -- the run --------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=1000, help="first N eval questions (1000)")
    parser.add_argument("--ours", action="append", default=[], metavar="LABEL=DIR",
                        help="a bertheads SQuAD v1.1 model (repeatable)")
    parser.add_argument("--v2-limit", type=int, default=None, help="first N squad2 eval questions (--limit)")
    parser.add_argument("--ours-v2", action="append", default=[], metavar="LABEL=DIR",
                        help="a bertheads SQuAD v2.0 model (squad2 eval split; repeatable)")
    parser.add_argument("--trainer", type=Path, help="the Trainer's model directory (--train-trainer's output)")
    parser.add_argument("--train-trainer", type=Path, metavar="OUT", help="train the Trainer peer into OUT, then stop")
    parser.add_argument("--train-limit", type=int, default=None, help="with --train-trainer: first N questions")
    parser.add_argument("--speed", type=Path, metavar="DIR", help="time prediction of this model (see --speed-version)")
    parser.add_argument("--speed-version", choices=VERSIONS, action="append",
                        help="versions timed by --speed (repeatable; default plain and filler)")
    parser.add_argument("--speed-limit", type=int, default=None, help="--speed: first N questions (--limit)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paragraph-windows", action="store_true",
                        help="also read each model with --paragraph-windows (rows 'LABEL+para')")
    parser.add_argument("--paragraph-windows-only", action="store_true",
                        help="read each model with --paragraph-windows only (rows 'LABEL+para')")
    parser.add_argument("--topic-segments", choices=("on", "off", "both"), default="on",
                        help="with paragraph windows: cut paragraphs longer than a window at their topic "
                             "shifts (on, the default for new models), not (off), or both (rows 'LABEL+para-seg')")
    parser.add_argument("--match-weights", type=lambda t: [float(x) for x in t.split(",")], default=[],
                        help="paragraph-match weights to try (comma-separated): chosen on the filler and "
                             "article versions of eval questions N..2N-1, reported as 'relative+match W'")
    parser.add_argument("--match", type=float, default=None, metavar="W",
                        help="also decode every model with paragraph-match weight W (row 'relative+match W'; "
                             "--match-weights chooses it instead for v1.1 models)")
    parser.add_argument("--versions", type=lambda t: t.split(","), default=list(VERSIONS),
                        help="comma-separated versions to read (default: all; 'plain' is always read)")
    parser.add_argument("--name", default="qa-long")
    args = parser.parse_args()
    reads = "para" if args.paragraph_windows_only else "both" if args.paragraph_windows else "across"
    args.speed_version = args.speed_version or ["plain", "filler"]

    from bertheads.encoder.pretrained import Encoder
    from bertheads.tasks.qa.formats import read_examples

    if args.train_trainer:
        log("Trainer: training")
        print(json.dumps(train_trainer(args.train_trainer, args.train_limit), indent=1))
        return
    tokenizer = Encoder.load("default").tokenizer
    work = OUT / args.name
    work.mkdir(parents=True, exist_ok=True)
    record: dict = {"command": " ".join(["python", "bench/qa_long.py", *sys.argv[1:]]),
                    "environment": environment(), "load_average_start": os.getloadavg()}
    v1_path = require_data("squad", "eval-split.json")
    wanted = ["plain", *(v for v in args.versions if v != "plain")]

    def only(versions: dict) -> dict:
        return {v: versions[v] for v in wanted}

    every_v1 = build_versions(v1_path, read_examples(str(v1_path))[: args.limit], tokenizer)
    v1 = only(every_v1)
    if args.speed:
        record["speed"] = {}
        for version in args.speed_version:
            examples = every_v1[version][: args.speed_limit]
            inputs = [{"question": e.question, "context": e.context} for e in examples]
            log(f"speed: {version}, {len(inputs)} questions")
            record["speed"][version] = speed(args.speed, inputs, args.rounds)
    held_out = None
    if args.match_weights:
        all_v1 = read_examples(str(v1_path))
        held_out = only(build_versions(v1_path, all_v1[args.limit: 2 * args.limit], tokenizer))
    for spec in args.ours:
        record.update(read_with_ours(spec, v1, None, work, reads, held_out, args.match_weights, args.match,
                                     args.topic_segments))
    if args.trainer:
        record["trainer"] = run_trainer_model(args.trainer, v1, work)
    if args.ours_v2:
        v2_path = require_data("squad2", "eval-split.json")
        all_v2 = read_examples(str(v2_path))
        n = args.v2_limit or args.limit
        v2 = only(build_versions(v2_path, all_v2[:n], tokenizer))
        tune = all_v2[n: 2 * n]
        for spec in args.ours_v2:
            record.update(read_with_ours(spec, v2, tune, work, reads, fixed_match=args.match,
                                         segments=args.topic_segments))
    record["load_average_end"] = os.getloadavg()
    path = save_json(args.name, record)
    print(markdown(record))
    log(f"wrote {path}")


def model_rows(r: dict) -> dict:
    """The record's models (label -> rows by version), not its speed or run details."""
    return {k: v for k, v in r.items() if isinstance(v, dict) and "windows" in v.get("plain", {})}


def markdown(r: dict) -> str:
    versions = [v for v in VERSIONS if all(v in rows for rows in model_rows(r).values())]
    lines = [f"`{r['command']}`; load average {r['load_average_start'][0]:.1f} -> {r['load_average_end'][0]:.1f}", "",
             "| model | decoding | " + " | ".join(f"{v} F1 (EM)" for v in versions) + " | "
             + " | ".join(f"{v} cost" for v in versions[1:]) + " |",
             "|---|---|" + "---|" * (2 * len(versions) - 1)]
    for label, rows in model_rows(r).items():
        for choice in rows["plain"]:
            if choice not in CHOICES and choice not in ("run_qa", "oracle window") and "+match" not in choice:
                continue
            if any(choice not in rows[v] for v in versions):
                continue
            cells = [rows[v][choice] for v in versions]
            f1 = [c["f1"] for c in cells]
            lines.append(f"| {label} | {choice} | " + " | ".join(f"{c['f1']:.2f} ({c['exact']:.2f})" for c in cells)
                         + " | " + " | ".join(f"{f1[0] - f:.2f}" for f in f1[1:]) + " |")
    lines.append("")
    for label, rows in model_rows(r).items():
        lines.append(f"{label} windows: " + ", ".join(f"{v} {rows[v]['windows']}" for v in versions))
        for v in versions:
            if "decode_seconds" in rows[v]:
                lines.append(f"{label} {v}: encoder {rows[v].get('encoder_seconds', '?')} s (this run or the "
                             f"cached one), decoding {rows[v]['decode_seconds']} s")
        if "paragraph_match" in rows:
            lines.append(f"{label} paragraph-match weights, held-out F1 ({', '.join(versions[1:])}): " + ", ".join(
                f"{w}: " + "/".join(f"{f[v]:.2f}" for v in versions[1:] if v in f)
                for w, f in rows["paragraph_match"]["weights"].items())
                + f"; chosen {rows['paragraph_match']['chosen']:g}")
        if "thresholds" in rows:
            lines.append(f"{label} null thresholds (tuned on held-out plain questions): {rows['thresholds']}")
            for v in versions:
                lines.append(f"{label} {v} HasAns/NoAns F1: " + ", ".join(
                    f"{c} {got['HasAns_f1']:.1f}/{got['NoAns_f1']:.1f}" for c, got in rows[v].items()
                    if isinstance(got, dict) and "HasAns_f1" in got))
    for version, s in r.get("speed", {}).items():
        lines.append(f"speed ({s['questions']} {version} questions, median of rounds): " + ", ".join(
            f"{c} {s['questions'] / median(t):.1f} q/s" for c, t in s["seconds"].items())
            + f"; time of the defaults / before {s['time_ratio_default_over_before']:.3f}"
            + "".join(f", / {k.split('_over_')[1].replace('_', ' ')} {v:.3f}" for k, v in s.items()
                      if k.startswith("time_ratio_default_over_no_")))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
