"""Answer spans benchmark (issue 4), in one run on SQuAD v1.1 (`squad/train-split.json` to train,
`squad/eval-split.json` to evaluate) with the default checkpoint:

- bertheads: `bertheads.train("qa", ...)`, then `Model.predict` on the eval questions;
- the Hugging Face Trainer following the `run_qa` recipe: AutoModelForQuestionAnswering from
  the same checkpoint directory, every window padded to 384 tokens, the same windows (stride
  128) and hyperparameters (1 epoch, lr 5e-5, batch 16, seed 42, warmup 10%, weight decay
  0.01); its eval logits go through the same decoding as ours (n-best 20, at most 30 tokens);
- `pipeline("question-answering")` with transformers 4.57 in bench/.venv-qa-peer (made by
  bench/setup_peer.sh; transformers 5 dropped the pipeline), on the Trainer's fine-tuned model
  and the same eval questions, in a subprocess.

    nice -n 10 .venv/bin/python bench/qa.py --limit 2000 --eval-limit 1500

Training throughput is the wall time of the training epoch only (no tokenisation, evaluation
or saving) on both sides: windows/s and training questions/s. Prediction throughput is end to
end (questions and passages in, answer spans out) for us and the pipeline, the median of
`--rounds` rounds that alternate the two. Results: bench/out/qa.json; Markdown on stdout.

`--profile N` adds where our prediction time goes (one core, N questions: linear layers,
attention, other ops, and the speed-up bound if the other ops were free).
`--predict-again RUN` trains nothing: it times prediction again on bench/out/RUN's two models.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, environment, matmul_peak_gflops, median, require_data, save_json  # noqa: E402

PEER_VENV = HERE / ".venv-qa-peer"
MAX_LENGTH, STRIDE, MAX_QUESTION, N_BEST, MAX_ANSWER = 384, 128, 64, 20, 30
EPOCHS, BATCH, LR, SEED, WARMUP, DECAY = 1, 16, 5e-5, 42, 0.1, 0.01


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def scores(answers: list[str], examples) -> dict:
    from bertheads.tasks.qa.metrics import squad_v1_scores

    got = squad_v1_scores(answers, examples)
    return {"exact_match": round(got["exact_match"], 2), "f1": round(got["f1"], 2)}


# -- ours --------------------------------------------------------------------------------------
def train_ours(train_path: Path, limit: int | None, out: Path, model: str = "default") -> dict:
    import bertheads

    started = time.perf_counter()
    settings = bertheads.TrainSettings(epochs=EPOCHS, batch_size=BATCH, lr=LR, seed=SEED, warmup_ratio=WARMUP,
                                       weight_decay=DECAY, progress=False)
    bertheads.train("qa", str(train_path), None, out, model=model, settings=settings, limit=limit,
                    max_length=MAX_LENGTH, stride=STRIDE, max_question_length=MAX_QUESTION)
    history = json.loads((out / "metrics.json").read_text())["history"][0]
    return {"windows_per_second": history["train_examples_per_second"], "call_seconds": time.perf_counter() - started}


def predict_ours(model, inputs: list[dict]) -> tuple[float, list[str]]:
    start = time.perf_counter()
    got = model.predict(inputs)  # our default batching (length-sorted, up to 2048 tokens)
    return time.perf_counter() - start, [g["answer"] for g in got]


# -- the Hugging Face Trainer (run_qa recipe) ----------------------------------------------------
def hf_windows(tokenizer, examples, train: bool) -> tuple[dict, list[int], list]:
    """run_qa's prepare_train_features / prepare_validation_features: padded to max length."""
    enc = tokenizer([e.question.lstrip() for e in examples], [e.context for e in examples],
                    truncation="only_second", max_length=MAX_LENGTH, stride=STRIDE,
                    return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
    owner = list(enc["overflow_to_sample_mapping"])
    if not train:
        return enc, owner, [enc.sequence_ids(i) for i in range(len(owner))]
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        seq = enc.sequence_ids(i)
        e = examples[owner[i]]
        first = e.starts[0]
        last = first + len(e.answers[0])
        c0 = seq.index(1)
        c1 = len(seq) - 1 - seq[::-1].index(1)
        if not (offsets[c0][0] <= first and offsets[c1][1] >= last):
            starts.append(0)
            ends.append(0)
            continue
        s = c0
        while s <= c1 and offsets[s][0] <= first:
            s += 1
        t = c1
        while t >= c0 and offsets[t][1] >= last:
            t -= 1
        starts.append(s - 1)
        ends.append(t + 1)
    enc["start_positions"], enc["end_positions"] = starts, ends
    return enc, owner, []


class Windows:
    """A torch Dataset over tokenizer output columns."""

    def __init__(self, enc, keys) -> None:
        self.columns = {k: enc[k] for k in keys}
        self.n = len(enc["input_ids"])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.columns.items()}


def run_trainer(model_dir: str, train_examples, eval_examples, out: Path) -> dict:
    import torch
    import transformers
    from transformers import (
        AutoModelForQuestionAnswering,
        AutoTokenizer,
        Trainer,
        TrainingArguments,
        default_data_collator,
    )

    transformers.logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    enc, _, _ = hf_windows(tokenizer, train_examples, train=True)
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions")
            if k in enc]  # token_type_ids only where the tokenizer gives them
    train_set = Windows(enc, keys)
    torch.manual_seed(SEED)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir)
    args = TrainingArguments(output_dir=str(out / "trainer-tmp"), per_device_train_batch_size=BATCH,
                             per_device_eval_batch_size=64, learning_rate=LR, num_train_epochs=EPOCHS,
                             warmup_steps=WARMUP, weight_decay=DECAY, seed=SEED, save_strategy="no",
                             eval_strategy="no", report_to="none", disable_tqdm=True, logging_strategy="no",
                             use_cpu=True)
    trainer = Trainer(model=model, args=args, train_dataset=train_set, data_collator=default_data_collator)
    result = trainer.train()
    train_seconds = result.metrics["train_runtime"]
    trainer.save_model(str(out / "trainer-model"))
    tokenizer.save_pretrained(str(out / "trainer-model"))

    enc, owner, seqs = hf_windows(tokenizer, eval_examples, train=False)
    eval_set = Windows(enc, [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc])
    started = time.perf_counter()
    logits = trainer.predict(eval_set).predictions
    predict_seconds = time.perf_counter() - started
    answers = decode_like_ours(logits, enc, owner, seqs, eval_examples)
    return {"windows": len(train_set), "train_seconds": train_seconds,
            "eval_windows": len(eval_set), "eval_predict_seconds": predict_seconds,
            "answers": answers}


def decode_like_ours(logits, enc, owner, seqs, examples) -> list[str]:
    """The Trainer's start/end logits through our decoding (n-best starts and ends per window,
    spans inside the passage, best over windows)."""
    from bertheads.tasks.qa.spans import best_spans, merge_windows

    start, end = logits
    per_window, context = [], []
    for i, seq in enumerate(seqs):
        length = int(sum(enc["attention_mask"][i]))
        per_window.append(np.stack([start[i, :length], end[i, :length]], axis=1))
        context.append((seq.index(1), length - 1 - seq[:length][::-1].index(1)))
    sc, st, en, null = best_spans(per_window, np.array(context), N_BEST, MAX_ANSWER)
    parts: list[list] = [[] for _ in examples]
    for i in range(len(per_window)):
        keep = np.isfinite(sc[i])
        offsets = np.asarray(enc["offset_mapping"][i])
        chars = np.stack([offsets[st[i][keep], 0], offsets[en[i][keep], 1]], axis=1)
        parts[owner[i]].append((sc[i][keep], chars, float(null[i])))
    answers = []
    for e, p in zip(examples, parts):
        o = merge_windows(p, N_BEST)
        answers.append(e.context[int(o.spans[0][0]):int(o.spans[0][1])] if len(o.scores) else "")
    return answers


# -- the pipeline peer ----------------------------------------------------------------------------
def ensure_peer() -> Path:
    python = PEER_VENV / "bin" / "python"
    log("peer virtualenv: bench/setup_peer.sh")
    subprocess.run(["bash", str(HERE / "setup_peer.sh")], check=True)
    return python


def time_prediction(model, python: Path, trainer_dir: Path, inputs: list[dict], examples, rounds: int,
                    work: Path) -> tuple[list[float], list[str], dict]:
    """`rounds` rounds alternating ours and the pipeline on `inputs`: our times and answers, and
    the pipeline's every round's time, median questions/s, versions and EM/F1 on `examples`."""
    ours_times, pipe_times, pipe = [], [], None
    for r in range(rounds):
        seconds, answers = predict_ours(model, inputs)
        ours_times.append(seconds)
        log(f"round {r + 1}: ours {len(inputs) / seconds:.1f} questions/s")
        got = run_pipeline(python, trainer_dir, inputs, work)
        pipe_times.append(got["seconds"])
        pipe = pipe or got
        log(f"round {r + 1}: pipeline {len(inputs) / got['seconds']:.1f} questions/s")
    return ours_times, answers, {"questions_per_second": len(inputs) / median(pipe_times), "predict_seconds": pipe_times,
                                 "transformers": pipe["transformers"], "torch": pipe["torch"],
                                 "threads": pipe["threads"], **scores([a["answer"] for a in pipe["answers"]], examples)}


def profile_ours(model, inputs: list[dict]) -> dict:
    """Where our prediction time goes, on one core (torch.profiler, self time per op).

    Matrix products of the linear layers (`addmm`, FLOPs from their shapes) and attention
    (`scaled_dot_product_attention`, 4 * length^2 * hidden FLOPs a sequence and layer) are
    the work the encoder cannot skip; every other op (GELU, layer norm, additions, copies) is
    overhead. Shares are of the ops' total self time (tokenising and decoding are outside it:
    compare `wall_seconds_profiled`). `bound_speedup` is how much faster that op time could get
    if the overhead cost nothing and the linear layers ran at the 1024x1024 matmul rate.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        peak_one_core = matmul_peak_gflops()
        model.predict(inputs[:20])
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            model.predict(inputs)
        wall = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    seconds = {"linear": 0.0, "attention": 0.0}
    flops = {"linear": 0.0, "attention": 0.0}
    for e in prof.events():
        if e.name == "aten::addmm":
            (m, k), (_, n) = e.input_shapes[1], e.input_shapes[2]
            seconds["linear"] += e.self_cpu_time_total / 1e6
            flops["linear"] += 2 * m * k * n
        elif e.name.startswith("aten::_scaled_dot_product"):
            (b, h, queries, d), keys = e.input_shapes[0], e.input_shapes[1][2]
            seconds["attention"] += e.self_cpu_time_total / 1e6
            flops["attention"] += 4 * b * h * queries * keys * d
    total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
    other = total - seconds["linear"] - seconds["attention"]
    linear_rate = flops["linear"] / seconds["linear"] / 1e9
    best = flops["linear"] / (peak_one_core * 1e9) + seconds["attention"]
    return {
        "questions": len(inputs), "wall_seconds_profiled": round(wall, 2), "op_seconds": round(total, 2),
        "share": {"linear": round(seconds["linear"] / total, 3), "attention": round(seconds["attention"] / total, 3),
                  "other": round(other / total, 3)},
        "linear_gflops": round(linear_rate, 1), "attention_gflops": round(flops["attention"] / seconds["attention"] / 1e9, 1),
        "matmul_peak_one_core_gflops": round(peak_one_core, 1),
        "bound_speedup": round(total / best, 3),
        "top_ops": [(a.key, round(a.self_cpu_time_total / 1e6, 3)) for a in
                    sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:8]],
    }


def run_pipeline(python: Path, model_dir: Path, inputs: list[dict], work: Path) -> dict:
    job, result = work / "pipeline-job.json", work / "pipeline-result.json"
    job.write_text(json.dumps({"model": str(model_dir), "questions": inputs, "max_answer_len": MAX_ANSWER,
                               "stride": STRIDE, "max_length": MAX_LENGTH, "max_question_length": MAX_QUESTION}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(python), str(HERE / "qa_pipeline_peer.py"), str(job), str(result)], check=True, env=env)
    return json.loads(result.read_text())


# -- the run --------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N training questions (both sides)")
    parser.add_argument("--eval-limit", type=int, default=None, help="first N eval questions (all three)")
    parser.add_argument("--speed-limit", type=int, default=1000,
                        help="time prediction (ours, pipeline) on the first N eval questions (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="prediction timing rounds (ours, pipeline)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile our prediction on one core over the first N speed questions")
    parser.add_argument("--predict-again", metavar="RUN",
                        help="no training: time prediction again (and --profile) on bench/out/RUN's two "
                             "trained models, after a change to prediction")
    parser.add_argument("--name", default="qa")
    args = parser.parse_args()

    import bertheads
    from bertheads.encoder.pretrained import default_model_path
    from bertheads.tasks.qa.formats import read_examples

    train_path = require_data("squad", "train-split.json")
    eval_path = require_data("squad", "eval-split.json")
    work = OUT / args.name
    work.mkdir(parents=True, exist_ok=True)
    python = ensure_peer()
    record: dict = {"command": " ".join(["python", "bench/qa.py", *sys.argv[1:]]), "environment": environment(),
                    "load_average_start": os.getloadavg(), "peak_gflops": round(matmul_peak_gflops(), 1)}
    train_examples = read_examples(str(train_path))[: args.limit]
    eval_examples = read_examples(str(eval_path))[: args.eval_limit]
    inputs = [{"question": e.question, "context": e.context} for e in eval_examples]
    speed_examples = eval_examples[: args.speed_limit]
    speed_inputs = inputs[: args.speed_limit]
    record["train_questions"], record["eval_questions"] = len(train_examples), len(eval_examples)
    record["speed_questions"] = len(speed_inputs)
    log(f"{len(train_examples)} training questions, {len(eval_examples)} eval questions")
    if args.predict_again:
        if args.name == args.predict_again:
            parser.error("--predict-again RUN needs a --name other than RUN (RUN's results would be overwritten)")
        return predict_again(args, record, python, speed_inputs, speed_examples)

    log("ours: training")
    ours = train_ours(train_path, args.limit, work / "ours-model")
    model = bertheads.load(work / "ours-model")
    windows = len(model.task().modeling.encode(train_examples, model.net.encoder.tokenizer, with_labels=True))
    ours.update(windows=windows, train_seconds=windows / ours["windows_per_second"])
    log(f"ours: {windows} windows, {ours['windows_per_second']:.2f} windows/s")

    log("Trainer: training (windows padded to 384)")
    hf = run_trainer(default_model_path(), train_examples, eval_examples, work)
    hf["windows_per_second"] = hf["windows"] / hf["train_seconds"]
    log(f"Trainer: {hf['windows']} windows, {hf['windows_per_second']:.2f} windows/s")
    hf_answers = hf.pop("answers")
    hf.update(scores(hf_answers, eval_examples))

    log("ours: answering the eval questions")
    seconds, answers = predict_ours(model, inputs)
    ours.update(scores(answers, eval_examples), eval_predict_seconds=seconds)
    ours_times, _, pipe_result = time_prediction(model, python, work / "trainer-model", speed_inputs, speed_examples,
                                              args.rounds, work)
    ours["predict_seconds"] = ours_times
    ours["questions_per_second"] = len(speed_inputs) / median(ours_times)
    pipe_result["trainer_on_same_questions"] = scores(hf_answers[: len(speed_inputs)], speed_examples)
    n_train = len(train_examples)
    for side in (ours, hf):
        side["train_questions_per_second"] = n_train / side["train_seconds"]
    hf["eval_questions_per_second"] = len(inputs) / hf["eval_predict_seconds"]
    if args.profile:
        record["profile"] = profile_ours(model, speed_inputs[: args.profile])
    record.update(ours=ours, trainer=hf, pipeline=pipe_result, load_average_end=os.getloadavg())
    record["ratios"] = {
        "train_windows_per_second_vs_trainer": ours["windows_per_second"] / hf["windows_per_second"],
        "train_questions_per_second_vs_trainer": ours["train_questions_per_second"] / hf["train_questions_per_second"],
        "predict_questions_per_second_vs_pipeline": ours["questions_per_second"] / pipe_result["questions_per_second"],
        "exact_match_minus_trainer": ours["exact_match"] - hf["exact_match"],
        "f1_minus_trainer": ours["f1"] - hf["f1"],
    }
    path = save_json(args.name, record)
    print(markdown(record))
    log(f"wrote {path}")


def predict_again(args, record: dict, python: Path, speed_inputs: list[dict], speed_examples) -> None:
    """`--predict-again RUN`: prediction timed again on RUN's models, nothing trained."""
    import bertheads

    done, work = OUT / args.predict_again, OUT / args.name
    work.mkdir(parents=True, exist_ok=True)
    before = json.loads((OUT / f"{args.predict_again}.json").read_text())
    model = bertheads.load(done / "ours-model")
    ours_times, answers, piped = time_prediction(model, python, done / "trainer-model", speed_inputs,
                                                 speed_examples, args.rounds, work)
    ours = {"predict_seconds": ours_times, "questions_per_second": len(speed_inputs) / median(ours_times),
            **scores(answers, speed_examples)}
    record.update(training_from={"run": args.predict_again, "command": before["command"]}, ours=ours,
                  pipeline=piped, ratio=ours["questions_per_second"] / piped["questions_per_second"])
    if args.profile:
        record["profile"] = profile_ours(model, speed_inputs[: args.profile])
    record["load_average_end"] = os.getloadavg()
    path = save_json(args.name, record)
    print(json.dumps({k: record[k] for k in ("ours", "pipeline", "ratio", "profile") if k in record}, indent=1))
    log(f"wrote {path}")


def markdown(r: dict) -> str:
    o, h, p, q = r["ours"], r["trainer"], r["pipeline"], r["ratios"]
    return "\n".join([
        f"`{r['command']}`: {r['train_questions']} training questions ({o['windows']} windows), "
        f"{r['eval_questions']} eval questions (prediction speed on the first {r['speed_questions']}); load average {r['load_average_start'][0]:.1f} -> "
        f"{r['load_average_end'][0]:.1f}; matmul peak {r['peak_gflops']} GFLOP/s",
        "",
        "| | EM | F1 | train windows/s | train questions/s | predict questions/s |",
        "|---|---|---|---|---|---|",
        f"| bertheads | {o['exact_match']:.2f} | {o['f1']:.2f} | {o['windows_per_second']:.2f} | "
        f"{o['train_questions_per_second']:.2f} | {o['questions_per_second']:.1f} |",
        f"| HF Trainer (run_qa) | {h['exact_match']:.2f} | {h['f1']:.2f} | {h['windows_per_second']:.2f} | "
        f"{h['train_questions_per_second']:.2f} | ({h['eval_questions_per_second']:.1f}, Trainer.predict) |",
        f"| pipeline 4.57 (Trainer's model; first {r['speed_questions']} questions) | {p['exact_match']:.2f} | "
        f"{p['f1']:.2f} | | | {p['questions_per_second']:.1f} |",
        "",
        f"Ratios: training windows/s {q['train_windows_per_second_vs_trainer']:.2f}x the Trainer "
        f"(questions/s {q['train_questions_per_second_vs_trainer']:.2f}x); prediction "
        f"{q['predict_questions_per_second_vs_pipeline']:.2f}x the pipeline; EM {q['exact_match_minus_trainer']:+.2f}, "
        f"F1 {q['f1_minus_trainer']:+.2f} points vs the Trainer.",
    ])


if __name__ == "__main__":
    main()
