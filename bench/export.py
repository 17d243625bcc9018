"""Export, runtime and precision benchmark: our modes (torch fp32/bf16, ONNX Runtime fp32/int8,
OpenVINO fp32/bf16/int8, and `auto`) against the Hugging Face pipeline on the model exported with
`bertheads export --to hf`, in fp32 and in bf16 (`dtype=torch.bfloat16`), on real data, in one run.

    nice -n 10 .venv/bin/python bench/export.py --task classify --model runs/sst2
    nice -n 10 .venv/bin/python bench/export.py --task tag --model runs/conll
    nice -n 10 .venv/bin/python bench/export.py --task qa --model runs/squad
    .venv/bin/python bench/export.py --task classify --model runs/sst2 \
        --modes torch-fp32,torch-bf16,onnx-int8,openvino-bf16,openvino-int8,auto,pipeline,pipeline-bf16

Data: classify = SST-2 dev (872 sentences), tag = CoNLL-2003 dev (3,250 sentences; the speed
runs give the words joined by spaces as raw text, the quality runs the words with their gold
tags), qa = the first 1,000 questions of squad/eval-split.json for speed (and, with
`--qa-quality-all`, all 3,335 for quality). The model must have been exported before
(`bertheads export DIR --to onnx --quantize int8`, `bertheads export DIR --to hf --out DIR/hf`);
`--export` does both first.

1. Quality and parity (not timed): every dev example through torch fp32 and each of our other
   modes asked for (the same encoding, batching and decoding); the largest difference of the raw
   head outputs from torch's, identical labels / entities / answers, and the task's metrics per mode.
   A lower precision is loaded by name, so the gate runs first and a mode it refuses is reported
   as refused.
2. Speed: each mode runs in a process of its own, loaded once; the modes take turns, round by
   round (`--rounds`), so load from elsewhere on the shared CPU falls on all of them alike. Each
   round is end to end (inputs in, predictions out). Medians and ratios to the pipeline; each
   process's peak RSS; each pipeline round's predictions are compared with torch's.
The pipeline for qa runs with transformers 4.57 from bench/.venv-qa-peer (bench/setup_peer.sh):
transformers 5 dropped pipeline("question-answering").
Results: bench/out/export-TASK.json and a Markdown summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODES = ("torch-fp32", "onnx-fp32", "onnx-int8", "pipeline")
EXTRA_MODES = ("torch-bf16", "openvino-fp32", "openvino-bf16", "openvino-int8", "auto", "pipeline-bf16",
               "onnx-fp32-1x2", "onnx-int8-1x2")  # 1x2: one session with two threads, batches in turn
PIPELINE = {"classify": "text-classification", "tag": "token-classification", "qa": "question-answering"}
QA_OPTIONS = {"max_answer_len": 30, "doc_stride": 128, "max_seq_len": 384, "max_question_len": 64}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss it does not carry the
    coordinator's peak over into a worker it started)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the worker: one mode, loaded once, timed on request ------------------------------------------
def compact(task: str, predictions: list) -> list:
    """Predictions in one comparable shape for ours and the pipeline."""
    if task == "classify":
        return [str(p["label"]) for p in predictions]
    if task == "tag":
        return [[[e["type"], e["start"], e["end"]] for e in p["entities"]] for p in predictions]
    return [[p["answer"], p["start"], p["end"]] for p in predictions]


def pipeline_runner(task: str, hf_dir: str, bf16: bool = False):
    import torch
    import transformers
    from transformers import pipeline

    transformers.logging.set_verbosity_error()
    pipe = pipeline(PIPELINE[task], model=hf_dir, tokenizer=hf_dir, device=-1,
                    **({"aggregation_strategy": "first"} if task == "tag" else {}),
                    **({"dtype": torch.bfloat16} if bf16 else {}))

    def run(inputs: list) -> list:
        if task == "classify":
            return [str(p["label"]) for p in pipe(inputs, batch_size=32, truncation=True, max_length=128)]
        if task == "tag":
            return [[[e["entity_group"], int(e["start"]), int(e["end"])] for e in found] for found in pipe(inputs)]
        got = pipe(question=[q["question"] for q in inputs], context=[q["context"] for q in inputs], **QA_OPTIONS)
        got = [got] if isinstance(got, dict) else got
        return [[g["answer"], int(g["start"]), int(g["end"])] for g in got]

    return run, {"transformers": transformers.__version__}


def load_mode(model_dir, mode: str):
    """Our model in `mode` (RUNTIME-PRECISION, `auto`, or ONNX's -1x2 variants)."""
    import bertheads
    from bertheads.export.onnx_runtime import OnnxSettings, load_onnx

    if mode == "auto":
        return bertheads.load(model_dir)
    if mode.endswith("1x2"):
        return bertheads.Model(load_onnx(model_dir, mode.split("-")[1], OnnxSettings(workers=1, threads=2)), model_dir)
    runtime, precision = mode.split("-")[:2]
    return bertheads.load(model_dir, runtime=runtime, precision=precision)


def ours_runner(task: str, model_dir: str, mode: str):
    import bertheads

    model = load_mode(model_dir, mode)

    def run(inputs: list) -> list:
        return compact(task, model.predict(inputs))

    return run, {"bertheads": bertheads.__version__, "ran": f"{model.mode.runtime} {model.mode.precision}"
                 if getattr(model, "mode", None) else mode}


def worker(mode: str, job_path: str) -> None:
    """Answer `run` lines with one timed round each (JSON on the original stdout); `quit` ends."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr
    job = json.loads(Path(job_path).read_text())
    task, inputs = job["task"], job["inputs"]
    if job.get("threads"):
        import torch

        torch.set_num_threads(job["threads"])  # ours: that many workers; the pipeline: that many threads
    started = time.perf_counter()
    if mode.startswith("pipeline"):
        run, versions = pipeline_runner(task, job["hf"], bf16=mode.endswith("bf16"))
    else:
        run, versions = ours_runner(task, job["model"], mode)
    run(inputs[:16])  # warm-up
    out.write(json.dumps({"ready": True, "load_seconds": time.perf_counter() - started,
                          "rss_after_load_mb": peak_rss_mb(), **versions}) + "\n")
    out.flush()
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start, cpu = time.perf_counter(), time.process_time()
        predictions = run(inputs)
        out.write(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                              "predictions": predictions, "peak_rss_mb": peak_rss_mb()}) + "\n")
        out.flush()


# -- the coordinator ------------------------------------------------------------------------------------
def read_inputs(task: str, limit: int | None) -> tuple[list, str]:
    from common import require_data

    if task == "classify":
        path = require_data("sst2", "dev.tsv")
        lines = path.read_text(encoding="utf-8").splitlines()[1:]
        texts = [line.rsplit("\t", 1)[0] for line in lines if line.strip()]
        return texts[:limit], str(path)
    if task == "tag":
        path = require_data("conll2003", "dev.txt")
        sentences, words = [], []
        for line in path.read_text(encoding="utf-8").splitlines() + [""]:
            if not line.strip():
                if words:
                    sentences.append(" ".join(words))
                words = []
            elif not line.startswith("-DOCSTART-"):
                words.append(line.split()[0])
        return sentences[:limit], str(path)
    path = require_data("squad", "eval-split.json")
    doc = json.loads(path.read_text(encoding="utf-8"))
    questions = [{"question": qa["question"], "context": p["context"]}
                 for article in doc["data"] for p in article["paragraphs"] for qa in p["qas"]]
    return questions[: limit or 1000], str(path)


def quality(task: str, model_dir: Path, dev_path: str, limit: int | None, qa_all: bool, modes: list[str]) -> dict:
    """Every dev example through torch fp32 and our other `modes`: metrics, raw-output
    differences from torch and identical decisions (a mode the gate refuses: its reason)."""
    import numpy as np

    from bertheads.base.errors import UserError
    from bertheads.compute.runner import run_heads

    result: dict = {}
    raw: dict = {}
    decided: dict = {}
    ours = ["torch-fp32"] + [m for m in modes if not m.startswith("pipeline") and not m.endswith("1x2")
                             and m != "torch-fp32"]
    for mode in ours:
        try:
            model = load_mode(model_dir, mode)
        except UserError as exc:
            result[mode] = {"refused": str(exc)}
            log(f"quality {mode}: refused: {exc}")
            continue
        name = model.head_name(None)
        task_obj = model.task()
        examples = task_obj.reading.read(dev_path, need_labels=True)
        if task == "qa" and not qa_all:
            examples = examples[:1000]
        examples = examples[:limit] if limit else examples
        start = time.perf_counter()
        features, owner = task_obj.modeling.encode_for_inference(examples, model.net.encoder.tokenizer)
        outputs = run_heads(model.net, features, [name])[name]
        collected = task_obj.judging.collect(outputs, owner, examples, features)
        metrics = task_obj.judging.metrics(collected, examples, dev_path)
        decided[mode] = compact_decisions(task, task_obj.judging.decode(collected, examples))
        raw[mode] = outputs
        result[mode] = {"metrics": {k: v for k, v in metrics.items() if not isinstance(v, dict)},
                        "seconds": round(time.perf_counter() - start, 2), "examples": len(examples)}
        log(f"quality {mode}: {result[mode]['metrics']}")
    for mode in (m for m in ours[1:] if m in raw):
        diffs = [float(np.abs(a - b).max()) for a, b in zip(raw["torch-fp32"], raw[mode])]
        same = [a == b for a, b in zip(decided["torch-fp32"], decided[mode])]
        result[mode]["max_abs_diff_vs_torch"] = max(diffs)
        result[mode]["identical_decisions"] = f"{sum(same)}/{len(same)}"
    return result


def compact_decisions(task: str, predictions: list) -> list:
    if task == "tag":
        return [p.get("tags") or p["entities"] for p in predictions]
    return compact(task, predictions)


def start_worker(mode: str, job: Path, peer_python: Path | None) -> tuple[subprocess.Popen, dict]:
    python = str(peer_python) if mode.startswith("pipeline") and peer_python else sys.executable
    env = dict(os.environ)
    if mode.startswith("pipeline") and peer_python:
        env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([python, __file__, "--worker", mode, "--job", str(job)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    ready = json.loads(proc.stdout.readline())
    return proc, ready


def speed(task: str, inputs: list, model_dir: Path, hf_dir: Path, modes: list[str], rounds: int,
          peer_python: Path | None, work: Path, threads: int | None = None) -> dict:
    import statistics

    job = work / f"job-{task}.json"
    job.write_text(json.dumps({"task": task, "inputs": inputs, "model": str(model_dir), "hf": str(hf_dir),
                               "threads": threads}))
    procs, info = {}, {}
    for mode in modes:
        log(f"loading {mode}")
        procs[mode], info[mode] = start_worker(mode, job, peer_python)
    times: dict[str, list] = {m: [] for m in modes}
    cpu: dict[str, list] = {m: [] for m in modes}
    predictions: dict[str, list] = {}
    try:
        for r in range(rounds):
            for mode in modes:
                proc = procs[mode]
                proc.stdin.write("run\n")
                proc.stdin.flush()
                got = json.loads(proc.stdout.readline())
                times[mode].append(round(got["seconds"], 3))
                cpu[mode].append(round(got["cpu_seconds"], 3))
                predictions[mode] = got["predictions"]
                info[mode]["peak_rss_mb"] = round(got["peak_rss_mb"], 1)
                log(f"round {r + 1} {mode}: {len(inputs) / got['seconds']:.1f}/s  (load {os.getloadavg()[0]:.2f})")
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait(timeout=60)
    result = {"inputs": len(inputs), "rounds": rounds, "threads": threads, "loadavg_end": os.getloadavg()}
    pipe_rate = len(inputs) / statistics.median(times["pipeline"]) if "pipeline" in times else None
    bf16_rate = len(inputs) / statistics.median(times["pipeline-bf16"]) if "pipeline-bf16" in times else None
    for mode in modes:
        rate = len(inputs) / statistics.median(times[mode])
        agree = sum(a == b for a, b in zip(predictions[mode], predictions["torch-fp32"]))
        result[mode] = {"per_second": round(rate, 2), "seconds": times[mode], "cpu_seconds": cpu[mode],
                        "per_cpu_second": round(len(inputs) / statistics.median(cpu[mode]), 2),
                        "vs_pipeline": round(rate / pipe_rate, 3) if pipe_rate else None,
                        "vs_pipeline_bf16": round(rate / bf16_rate, 3) if bf16_rate else None,
                        "same_as_torch": f"{agree}/{len(inputs)}", **info[mode]}
    return result


def disk_sizes(model_dir: Path, hf_dir: Path) -> dict:
    def size(paths) -> float:
        return round(sum(p.stat().st_size for p in paths if p.is_file()) / 1e6, 1)

    onnx = model_dir / "onnx"
    return {"torch-fp32": size([*(model_dir / "encoder").glob("*.safetensors"), *(model_dir / "heads").glob("*")]),
            "onnx-fp32": size([onnx / "model.onnx"]), "onnx-int8": size([onnx / "model.int8.onnx"]),
            "pipeline": size(hf_dir.glob("*.safetensors")), "tokenizer": size((model_dir / "encoder").glob("tok*"))}


def markdown(task: str, r: dict) -> str:
    unit = {"classify": "sentences", "tag": "sentences", "qa": "questions"}[task]
    lines = [f"| {task} mode | {unit}/s (median) | x pipeline | x pipeline bf16 | {unit}/CPU-s | same as torch | "
             f"quality | max diff vs torch | size MB | peak RSS MB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, s in r["speed"].items():
        if not isinstance(s, dict):
            continue
        q = r["quality"].get(mode, {})
        mode = f"{mode} ({s['ran']})" if mode == "auto" and s.get("ran") else mode
        metrics = q.get("metrics", {})
        main = {k: round(v * (100 if k in ("accuracy", "f1") and task != "qa" else 1), 2)
                for k, v in metrics.items() if k in ("accuracy", "f1", "exact_match")}
        lines.append(f"| {mode} | {s['per_second']} | {s['vs_pipeline']} | {s.get('vs_pipeline_bf16') or '-'} | "
                     f"{s.get('per_cpu_second')} | "
                     f"{s['same_as_torch']} | {main or '-'} | "
                     f"{q.get('max_abs_diff_vs_torch', '-')} | {r['sizes'].get(mode.replace('-1x2', ''), '-')} | "
                     f"{s.get('peak_rss_mb')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=("classify", "tag", "qa"))
    parser.add_argument("--model", help="a trained single-head model directory")
    parser.add_argument("--hf", help="its transformers export (default MODEL/../NAME-hf)")
    parser.add_argument("--export", action="store_true", help="export to ONNX (fp32 + int8) and hf first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, help="only the first N inputs (a quick check)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES + EXTRA_MODES)}")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--threads", type=int, help="torch threads in each mode's process (1: every side on one "
                        "core, so inputs per CPU-second compare the work whatever else loads the machine)")
    parser.add_argument("--speed-limit", type=int, help="only the first N inputs for the speed rounds")
    parser.add_argument("--qa-quality-all", action="store_true", help="qa quality on all 3,335 questions")
    parser.add_argument("--worker")
    parser.add_argument("--job")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.job)
        return 0
    from common import OUT, cpu_line, environment, save_json

    model_dir = Path(args.model)
    hf_dir = Path(args.hf) if args.hf else model_dir.parent / f"{model_dir.name}-hf"
    if args.export:
        from bertheads.export.gate import export_checked
        from bertheads.export.hf import export_hf

        log("exporting")
        export_checked(model_dir, quantize_to="int8", say=log)  # the graphs, then the gate on this machine
        export_hf(model_dir, hf_dir)
    modes = args.modes.split(",")
    peer = None
    if args.task == "qa" and any(m.startswith("pipeline") for m in modes) and args.rounds:
        subprocess.run(["bash", str(HERE / "setup_peer.sh")], check=True)
        peer = HERE / ".venv-qa-peer" / "bin" / "python"
    inputs, dev_path = read_inputs(args.task, args.limit)
    record = {"task": args.task, "model": str(model_dir), "environment": environment(), "machine": cpu_line(),
              "loadavg_start": os.getloadavg(), "modes": modes,
              "command": " ".join([Path(sys.executable).name, *sys.argv])}
    record["sizes"] = disk_sizes(model_dir, hf_dir)
    meta = json.loads((model_dir / "onnx" / "export.json").read_text())
    record["fusions"] = meta["graphs"]["fp32"]["fusions"]
    record["int8"] = meta["graphs"].get("int8", {}).get("quantization")
    record["quality"] = {} if args.skip_quality else quality(args.task, model_dir, dev_path, args.limit,
                                                             args.qa_quality_all, modes)
    modes = [m for m in modes if "refused" not in record["quality"].get(m, {})]
    OUT.mkdir(parents=True, exist_ok=True)
    record["speed"] = speed(args.task, inputs[: args.speed_limit], model_dir, hf_dir, modes, args.rounds, peer, OUT,
                            args.threads) if args.rounds else {}
    save_json(f"export-{args.task}" + (f"-limit{args.limit}" if args.limit else "")
              + (f"-threads{args.threads}" if args.threads else ""), record)
    print(f"<!-- {record['machine']}; load average {record['loadavg_start'][0]:.1f} at the start -->")
    print(markdown(args.task, record))
    for mode, q in record["quality"].items():
        if "refused" in q:
            print(f"| {mode} | refused by the gate: {q['refused']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
