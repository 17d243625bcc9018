"""The sides of bench/gpu.py: ours (`bertheads.train`, then `Model.predict`, timed), the Hugging
Face Trainer's (`trainer_for`, `train_trainer`) and the transformers prediction peers on our
model's transformers export (`export`, `peer_pipeline`), with the timing and clean-up helpers
they share. bench/gpu.py runs them per task kind and compares."""

from __future__ import annotations

import gc
import sys
import time
from contextlib import contextmanager
from pathlib import Path

WARM_UP = 16  # inputs each freshly loaded predictor runs once before it is timed (the Trainer's is warm)
SEED, WARMUP, DECAY, MAX_LENGTH, QA_LENGTH, QA_STRIDE, QA_QUESTION, MAX_ANSWER = 42, 0.1, 0.01, 128, 384, 128, 64, 30


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def release(device: str) -> None:
    """Free what the side before left on the device."""
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


@contextmanager
def timed(device: str, record: dict, key: str):
    sync(device)
    start = time.perf_counter()
    yield
    sync(device)
    record[key] = time.perf_counter() - start


def read_tsv(path: Path, limit: int | None = None) -> tuple[list[str], list[int]]:
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    rows = [line.rsplit("\t", 1) for line in lines if line.strip()][:limit]
    return [r[0] for r in rows], [int(r[1]) for r in rows]


# -- ours -----------------------------------------------------------------------------------------
@contextmanager
def loop_seconds(device: str, record: dict):
    """record["train_seconds"]: the seconds spent in bertheads' epoch loop (`train_epoch`, which
    `fit` looks up at each epoch), without loading, encoding, evaluation or saving."""
    from bertheads.training import loop

    original, spent = loop.train_epoch, []

    def counted(*args, **kwargs):
        sync(device)
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sync(device)
            spent.append(time.perf_counter() - start)

    loop.train_epoch = counted
    try:
        yield
    finally:
        loop.train_epoch = original
        record["train_seconds"] = sum(spent)


def train_ours(kind: str, args, device: str, train: Path, limit: int | None, out: Path, **options) -> dict:
    import bertheads

    # bf16 on a GPU; on a CPU what --precision auto gives there (bf16 only with AMX/AVX512_BF16)
    settings = bertheads.TrainSettings(epochs=1, batch_size=args.batch_size, holdout=0, lr=args.lr, seed=SEED,
                                       warmup_ratio=WARMUP, weight_decay=DECAY, progress=False, device=device,
                                       precision=ours_precision(device))
    record: dict = {}
    start = time.perf_counter()
    with loop_seconds(device, record):
        bertheads.train(kind, str(train), None, out, model=args.model, settings=settings, limit=limit,
                        **{"mode": "finetune", **options})  # fine-tuning whatever the size (--limit)
    record["train_call_seconds"] = time.perf_counter() - start
    release(device)
    return record


def ours_precision(device: str) -> str:
    return "bf16" if device == "cuda" else "auto"


def load_ours(out: Path, device: str):
    import bertheads

    return bertheads.load(out, device=device, runtime="torch", precision=ours_precision(device))


def ours_side(kind: str, args, device: str, train_path: Path, limit, work: Path, inputs: list, score,
              **options) -> dict:
    """Our side of a kind: trained into `work/ours` (`train_ours`), loaded, warmed up on the first
    inputs, then `inputs` predicted, timed; the record with `score(model, predictions)` added."""
    record = train_ours(kind, args, device, train_path, limit, work / "ours", **options)
    model = load_ours(work / "ours", device)
    model.predict(inputs[:WARM_UP])
    with timed(device, record, "predict_seconds"):
        predictions = model.predict(inputs)
    record.update(score(model, predictions), mode=mode_of(model))
    del model
    release(device)
    return record


def mode_of(model) -> str:
    return f"{model.mode.runtime} {model.mode.precision} on {model.mode.device}"


# -- the Trainer ----------------------------------------------------------------------------------
def trainer_for(args, device: str, work: Path, model, train_set, collator, epochs: int = 1, warmup: float = WARMUP,
                decay: float = DECAY, seed: int = SEED, bf16: bool | None = None):
    """A Trainer with the run's hyperparameters (`args.batch_size`, `args.lr`; 1 epoch, warm-up
    and weight decay as bench/gpu.py runs them unless given): bf16=True on a GPU, fp32 on the CPU
    (`bf16` given: that)."""
    from transformers import PrinterCallback, Trainer, TrainingArguments

    targs = TrainingArguments(output_dir=str(work / "trainer"), num_train_epochs=epochs,
                              per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
                              learning_rate=args.lr, warmup_steps=warmup, weight_decay=decay,
                              bf16=device == "cuda" if bf16 is None else bf16,
                              use_cpu=device == "cpu", eval_strategy="no", save_strategy="no",
                              logging_strategy="no", report_to="none", disable_tqdm=True, seed=seed, data_seed=seed,
                              dataloader_num_workers=0)
    trainer = Trainer(model=model, args=targs, train_dataset=train_set, data_collator=collator)
    trainer.remove_callback(PrinterCallback)  # no metrics printed on stdout, whose last line is the summary
    return trainer


def hf_model(auto_class, source: str, seed: int = SEED, **kwargs):
    """`auto_class.from_pretrained` with SDPA attention, seeded, load reports silenced."""
    import torch

    from bertheads.encoder.pretrained import quiet_transformers

    torch.manual_seed(seed)
    with quiet_transformers():
        return auto_class.from_pretrained(source, attn_implementation="sdpa", **kwargs)


def train_trainer(trainer, device: str, examples: int) -> dict:
    """`train_seconds`: the Trainer's own timing of its training loop (`train_runtime`), as ours is
    of our epoch loop; `train_call_seconds`: the whole `Trainer.train` call."""
    record: dict = {}
    with timed(device, record, "train_call_seconds"):
        got = trainer.train()
    record["train_seconds"] = got.metrics["train_runtime"]
    record["train_examples_per_second"] = examples / record["train_seconds"]
    return record


# -- the Trainer's side of each kind (bench/gpu.py, bench/small_data.py) --------------------------
# Each trains a fresh transformers model of the kind on `args.model` with `trainer_for` (`hyper`:
# its keyword arguments), times it (`train_trainer`), predicts the dev inputs (timed) and returns
# the record and the predictions.
def trainer_classify(args, device: str, work: Path, train: tuple[list, list[int]], dev: tuple[list, list[int]],
                     num_labels: int, **hyper) -> tuple[dict, list[int]]:
    """AutoModelForSequenceClassification, max length 128; `train`, `dev`: (texts, label indices),
    a text a string or a (text, pair) tuple (cut longest first). The predicted label indices."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    from bertheads.encoder.pretrained import resolve_model

    source = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(source)

    def dataset(texts: list, labels: list[int]) -> list[dict]:
        pairs = not all(isinstance(t, str) for t in texts)
        enc = tokenizer([t[0] for t in texts] if pairs else texts, [t[1] for t in texts] if pairs else None,
                        truncation=True, max_length=MAX_LENGTH)
        return [{**{k: enc[k][i] for k in enc}, "labels": labels[i]} for i in range(len(texts))]

    model = hf_model(AutoModelForSequenceClassification, source, seed=hyper.get("seed", SEED), num_labels=num_labels)
    trainer = trainer_for(args, device, work, model, dataset(*train), DataCollatorWithPadding(tokenizer), **hyper)
    record = train_trainer(trainer, device, len(train[0]))
    with timed(device, record, "predict_seconds"):
        logits = trainer.predict(dataset(*dev)).predictions
    del trainer, model
    release(device)
    return record, [int(i) for i in logits.argmax(-1)]


def trainer_tag(args, device: str, work: Path, train: list, dev: list, **hyper) -> tuple[dict, list[list[str]]]:
    """AutoModelForTokenClassification with each word's label on its first piece (run_ner), max
    length 128, its labels the training data's tags; `train`, `dev`: (words, tags) sentences
    (the dev tags unused). Each dev sentence's predicted tags."""
    from collections import defaultdict

    from tag import encode_for_trainer, first_piece_tags
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
    )

    from bertheads.encoder.pretrained import resolve_model
    from bertheads.tasks.tag.scheme import tag_list

    source = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(source)
    labels = tag_list([type("S", (), {"tags": t})() for _, t in train], with_inside=False)
    label2id = {t: i for i, t in enumerate(labels)}
    rows, _ = encode_for_trainer(tokenizer, train, label2id)
    model = hf_model(AutoModelForTokenClassification, source, seed=hyper.get("seed", SEED), num_labels=len(labels),
                     id2label=dict(enumerate(labels)), label2id=label2id)
    trainer = trainer_for(args, device, work, model, rows, DataCollatorForTokenClassification(tokenizer), **hyper)
    record = train_trainer(trainer, device, len(train))
    with timed(device, record, "predict_seconds"):
        dev_rows, enc = encode_for_trainer(tokenizer, dev, defaultdict(int, label2id))  # dev tags unused
        logits = trainer.predict([{k: v for k, v in r.items() if k != "labels"} for r in dev_rows]).predictions
        predicted = first_piece_tags(dev, enc, logits, labels)
    del trainer, model
    release(device)
    return record, predicted


def trainer_qa(args, device: str, work: Path, train: list, dev: list, **hyper) -> tuple[dict, list[str]]:
    """AutoModelForQuestionAnswering with run_qa's preprocessing (windows of 384 tokens, stride
    128, answer offsets; bench/qa.py `hf_windows`), its logits decoded by our span decoding;
    `train`, `dev`: `QAExample`s. Each dev question's answer."""
    from qa import Windows, decode_like_ours, hf_windows
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, default_data_collator

    from bertheads.encoder.pretrained import resolve_model

    source = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(source)
    enc, _, _ = hf_windows(tokenizer, train, train=True)
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
    train_set = Windows(enc, [*keys, "start_positions", "end_positions"])
    model = hf_model(AutoModelForQuestionAnswering, source, seed=hyper.get("seed", SEED))
    trainer = trainer_for(args, device, work, model, train_set, default_data_collator, **hyper)
    record = train_trainer(trainer, device, len(train))
    record["train_windows"] = len(train_set)
    with timed(device, record, "predict_seconds"):
        enc, owner, seqs = hf_windows(tokenizer, dev, train=False)
        logits = trainer.predict(Windows(enc, keys)).predictions
        answers = decode_like_ours(logits, enc, owner, seqs, dev)
    del trainer, model
    release(device)
    return record, answers


def export(work: Path) -> Path:
    """Our model (work/ours) as a transformers directory (work/hf), the prediction peers' model."""
    from bertheads.encoder.pretrained import quiet_transformers
    from bertheads.export.hf import export_hf

    with quiet_transformers():
        export_hf(work / "ours", work / "hf")
    return work / "hf"


def peer_pipeline(task: str, hf_dir: Path, device: str, **options):
    """`pipeline(task)` on `hf_dir` with SDPA attention, in bf16 on a GPU (fp32 on the CPU)."""
    from transformers import pipeline

    from bertheads.encoder.pretrained import quiet_transformers

    with quiet_transformers():
        return pipeline(task, model=str(hf_dir), device=0 if device == "cuda" else -1, dtype=peer_dtype(device),
                        model_kwargs={"attn_implementation": "sdpa"}, **options)


def peer_dtype(device: str):
    import torch

    return torch.bfloat16 if device == "cuda" else torch.float32
