"""Multi-head benchmark (issue 6): one model holding a sentiment head (classify, SST-2) and an
NER head (tag, CoNLL-2003) on the default checkpoint.

1. `Model.analyze` (one encoder pass feeds both heads) against the two Hugging Face pipelines
   run one after the other on the same texts: `pipeline("text-classification")` and
   `pipeline("token-classification", aggregation_strategy="simple")`, on our two heads exported
   as `BertForSequenceClassification` / `BertForTokenClassification` (the same weights: the
   encoder, the classify head's pooler and output layer, the tag head's output layer), batch
   size 32 on both sides. Texts: the first 500 SST-2 dev sentences and the first 500 CoNLL-2003
   dev sentences (words joined by spaces), interleaved. Times are end to end (texts in,
   labels and entities out), the median of `--repeats`; the repeats alternate between sides.
2. A bounded load test of `bertheads serve` on 127.0.0.1: `--requests` POST /analyze requests
   (one text each) from `--clients` concurrent clients, with batching (the defaults) and with
   it turned off (`--max-batch 1`); requests per second, p50/p99 latency, failed requests.

    nice -n 10 .venv/bin/python bench/multi.py                  # trains the model first (--limit 2000), once
    nice -n 10 .venv/bin/python bench/multi.py --model-dir DIR  # a model with `sentiment` and `ner` heads

The model is trained jointly with `bertheads train multi` (1 epoch, `--limit` examples per task).
Results: bench/out/multi.json; a Markdown summary on stdout.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, environment, median, require_data, save_json  # noqa: E402

BATCH = 32


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- data and model --------------------------------------------------------------------------
def sst2_sentences(n: int) -> list[str]:
    with open(require_data("sst2", "dev.tsv"), encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"].strip() for r in rows[:n]]


def conll_sentences(n: int) -> list[str]:
    sentences, words = [], []
    for line in require_data("conll2003", "dev.txt").read_text(encoding="utf-8").splitlines() + [""]:
        if not line.strip():
            if words:
                sentences.append(" ".join(words))
                words = []
            continue
        if not line.startswith("-DOCSTART-"):
            words.append(line.split()[0])
    return sentences[:n]


def bench_texts(n: int) -> list[str]:
    sst, conll = sst2_sentences(n // 2), conll_sentences(n - n // 2)
    mixed = [t for pair in zip(sst, conll) for t in pair]
    return mixed + sst[len(conll):] + conll[len(sst):]


def train_model(out: Path, limit: int, epochs: int) -> Path:
    """Both heads trained jointly on the default checkpoint with `train multi`."""
    import bertheads
    from bertheads.api import train_multi

    config = OUT / "multi-config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        "tasks:\n"
        f"  sentiment: {{kind: classify, train: {require_data('sst2', 'train.tsv')}, "
        f"dev: {require_data('sst2', 'dev.tsv')}}}\n"
        f"  ner: {{kind: tag, train: {require_data('conll2003', 'train.txt')}, "
        f"dev: {require_data('conll2003', 'dev.txt')}}}\n"
        "sampling: proportional\n")
    log(f"training {out} (train multi, {epochs} epoch(s), --limit {limit} per task)")
    settings = bertheads.TrainSettings(epochs=epochs, batch_size=32, lr=5e-5, progress=False)
    train_multi(config, out, model="default", settings=settings, limit=limit)
    return out


def export_to_transformers(model_dir: Path, dest: Path) -> tuple[Path, Path]:
    """The sentiment head as BertForSequenceClassification, the NER head as
    BertForTokenClassification: the same encoder weights and head weights as ours."""
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    import bertheads

    model = bertheads.load(model_dir)
    sentiment, ner = model.task("sentiment"), model.task("ner")
    assert tuple(sentiment.spec.layers) == (-1,) and tuple(ner.spec.layers) == (-1,), "export needs layer -1"
    assert getattr(ner.spec, "head_type", "linear") == "linear", "export needs the linear tag head"
    encoder = str(model_dir / "encoder")
    tokenizer = AutoTokenizer.from_pretrained(encoder)
    labels = [str(x) for x in sentiment.spec.labels]
    seq = AutoModelForSequenceClassification.from_pretrained(
        encoder, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={v: i for i, v in enumerate(labels)})
    tags = list(ner.spec.tags)
    tok = AutoModelForTokenClassification.from_pretrained(
        encoder, num_labels=len(tags), id2label=dict(enumerate(tags)), label2id={v: i for i, v in enumerate(tags)})
    with torch.no_grad():
        seq.bert.pooler.dense.load_state_dict(sentiment.head.pooler.state_dict())
        seq.classifier.load_state_dict(sentiment.head.out.state_dict())
        tok.classifier.load_state_dict(ner.head.out.state_dict())
    paths = dest / "sentiment", dest / "ner"
    for hf, path in zip((seq, tok), paths):
        hf.save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))
    return paths


# -- analyze vs pipelines ----------------------------------------------------------------------
def bench_analyze(model_dir: Path, texts: list[str], repeats: int) -> dict:
    from transformers import pipeline

    import bertheads

    model = bertheads.load(model_dir)
    seq_dir, tok_dir = export_to_transformers(model_dir, OUT / "multi-hf")
    classify = pipeline("text-classification", model=str(seq_dir), device="cpu")
    tagger = pipeline("token-classification", model=str(tok_dir), aggregation_strategy="simple", device="cpu")

    def ours(batch: list[str]):
        return model.analyze(batch, batch_size=BATCH)

    def ours_two_passes(batch: list[str]):  # the same heads asked one after the other: two encoder passes
        return (model.predict(batch, head="sentiment", batch_size=BATCH),
                model.predict(batch, head="ner", batch_size=BATCH))

    def peers(batch: list[str]):
        return (classify(batch, batch_size=BATCH, truncation=True, max_length=128),
                tagger(batch, batch_size=BATCH))

    runners = {"ours_analyze": ours, "ours_two_passes": ours_two_passes, "pipelines": peers}
    for run in runners.values():  # warm-up
        run(texts[:BATCH])
    times: dict[str, list[float]] = {k: [] for k in runners}
    outputs = {}
    for r in range(repeats):
        for key, run in runners.items():
            start = time.perf_counter()
            outputs[key] = run(texts)
            times[key].append(round(time.perf_counter() - start, 3))
            log(f"{key} repeat {r + 1}/{repeats}: {times[key][-1]:.2f} s ({len(texts) / times[key][-1]:.1f} texts/s)")
    ours_out = outputs["ours_analyze"]
    pipe_labels, pipe_entities = outputs["pipelines"]
    same_label = sum(o["sentiment"]["label"] == p["label"] or str(o["sentiment"]["label"]) == p["label"]
                     for o, p in zip(ours_out, pipe_labels)) / len(texts)
    ours_spans = [{(e["type"], e["start"], e["end"]) for e in o["ner"]["entities"]} for o in ours_out]
    pipe_spans = [{(e["entity_group"], int(e["start"]), int(e["end"])) for e in p} for p in pipe_entities]
    same_entities = sum(a == b for a, b in zip(ours_spans, pipe_spans)) / len(texts)
    tokens = sum(len(x) for x in model.net.encoder.tokenizer(texts, truncation=True, max_length=128)["input_ids"])
    med = {k: median(v) for k, v in times.items()}
    return {
        "texts": len(texts), "tokens": tokens, "batch_size": BATCH, "seconds": times, "median_seconds": med,
        "texts_per_second": {k: round(len(texts) / v, 1) for k, v in med.items()},
        "speedup_vs_pipelines": round(med["pipelines"] / med["ours_analyze"], 2),
        "speedup_vs_ours_two_passes": round(med["ours_two_passes"] / med["ours_analyze"], 2),
        "agreement_with_pipelines": {"sentiment_label": round(same_label, 4),
                                     "ner_entity_sets_identical": round(same_entities, 4)},
        "entities_found": {"ours": sum(map(len, ours_spans)), "pipeline": sum(map(len, pipe_spans))},
    }


# -- load test ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_test(model_dir: Path, texts: list[str], requests: int, clients: int, extra: list[str]) -> dict:
    """`requests` POST /analyze (one text each) from `clients` threads against a fresh server."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "bertheads", "serve", str(model_dir), "--port", str(port),
                               *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise SystemExit(f"server exited: {server.stdout.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("server did not start in 120 s")
            time.sleep(0.25)
        with httpx.Client(base_url=url, timeout=60) as warm:
            for t in texts[:4]:
                warm.post("/analyze", json={"texts": [t]})
        latencies: list[float] = []
        failures: list[str] = []
        lock = threading.Lock()
        counter = iter(range(requests))

        def client() -> None:
            with httpx.Client(base_url=url, timeout=60) as http:
                while True:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        return
                    start = time.perf_counter()
                    try:
                        r = http.post("/analyze", json={"texts": [texts[i % len(texts)]]})
                        ok = r.status_code == 200 and len(r.json()["results"]) == 1
                        problem = None if ok else f"HTTP {r.status_code}: {r.text[:200]}"
                    except httpx.HTTPError as exc:
                        problem = f"{type(exc).__name__}: {exc}"
                    elapsed = time.perf_counter() - start
                    with lock:
                        latencies.append(elapsed)
                        if problem:
                            failures.append(problem)

        threads = [threading.Thread(target=client) for _ in range(clients)]
        before = httpx.get(f"{url}/health").json()
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        wall = time.perf_counter() - start
        health = httpx.get(f"{url}/health").json()
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
    latencies.sort()
    batches = health["batches"] - before["batches"]
    return {
        "server_flags": extra, "requests": requests, "clients": clients, "completed": len(latencies),
        "failed": len(failures), "failures": failures[:5], "seconds": round(wall, 2),
        "requests_per_second": round(len(latencies) / wall, 1),
        "latency_ms": {"p50": round(1000 * percentile(latencies, 50), 1), "p99": round(1000 * percentile(latencies, 99), 1),
                       "mean": round(1000 * statistics.fmean(latencies), 1), "max": round(1000 * latencies[-1], 1)},
        "model_calls": batches, "mean_texts_per_call": round((health["requests"] - before["requests"]) / max(batches, 1), 2),
    }


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


# -- main -----------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", help="a model with 'sentiment' (classify) and 'ner' (tag) heads")
    parser.add_argument("--limit", type=int, default=2000, help="training examples per task when training")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--skip-load-test", action="store_true")
    args = parser.parse_args()

    model_dir = Path(args.model_dir) if args.model_dir else OUT / f"multi-model-limit{args.limit}-epochs{args.epochs}"
    if not (model_dir / "bertheads.json").is_file():
        train_model(model_dir, args.limit, args.epochs)
    metrics = json.loads((model_dir / "metrics.json").read_text()).get("dev") if (model_dir / "metrics.json").is_file() \
        else None
    texts = bench_texts(args.texts)
    result = {"environment": environment(), "model_dir": str(model_dir), "dev_metrics": metrics,
              "limit": args.limit, "epochs": args.epochs}
    result["analyze"] = bench_analyze(model_dir, texts, args.repeats)
    save_json("multi", result)
    if not args.skip_load_test:
        result["serve"] = {
            "batched": load_test(model_dir, texts, args.requests, args.clients, []),
            "unbatched": load_test(model_dir, texts, args.requests, args.clients,
                                   ["--max-batch", "1", "--batch-window-ms", "0"]),
        }
    path = save_json("multi", result)
    a = result["analyze"]
    print(f"\n## Multi-head analyze and serving ({path})\n")
    print("| run | seconds (median) | texts/s |\n|---|---|---|")
    for key in ("ours_analyze", "ours_two_passes", "pipelines"):
        print(f"| {key} | {a['median_seconds'][key]:.2f} | {a['texts_per_second'][key]} |")
    print(f"\nanalyze vs the two pipelines: {a['speedup_vs_pipelines']}x; vs our two passes: "
          f"{a['speedup_vs_ours_two_passes']}x; agreement {a['agreement_with_pipelines']}")
    for name, s in result.get("serve", {}).items():
        print(f"serve ({name}): {s['requests_per_second']} req/s, p50 {s['latency_ms']['p50']} ms, "
              f"p99 {s['latency_ms']['p99']} ms, failed {s['failed']}/{s['requests']}, "
              f"{s['mean_texts_per_call']} texts per model call")


if __name__ == "__main__":
    main()
