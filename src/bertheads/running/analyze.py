"""Every head of a model on the same texts, one encoder pass for the heads whose inputs
encode alike (`analyze`)."""

from __future__ import annotations

from bertheads.base.errors import UserError
from bertheads.model import BertHeads, run_heads
from bertheads.text.batching import INFERENCE_BATCH


def analyze(net: BertHeads, texts: list[str], second_texts: list[str] | None = None, questions: list[str] | None = None,
            batch_size: int = INFERENCE_BATCH, **options) -> list[dict]:
    """`{head: prediction}` per text for every head that reads a single text; pair heads
    when `second_texts` are given, qa heads (the text as the passage) when `questions` are.

    Heads whose encoded inputs are identical (the same token ids, windows and segments)
    share one encoder pass; the rest get a pass of their own.
    """
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UserError(f"text {i}: expected a string, got {type(text).__name__}")
    for label, extra in (("second_texts", second_texts), ("questions", questions)):
        if extra is not None and len(extra) != len(texts):
            raise UserError(f"{label}: expected one per text ({len(texts)}), got {len(extra)}")
    tokenizer = net.encoder.tokenizer
    jobs = []
    for name, task in net.tasks.items():
        form = task.input_form
        if form == "pair":
            if second_texts is None:
                continue
            inputs = [(t, s) for t, s in zip(texts, second_texts)]
        elif form == "question":
            if questions is None:
                continue
            inputs = [{"question": q, "context": t} for t, q in zip(texts, questions)]
        else:
            inputs = texts
        examples = task.from_inputs(inputs, **{**task.fixed_options, **options})
        features, owner = task.encode_for_inference(examples, tokenizer)
        key = (tuple(owner), tuple(tuple(f["input_ids"]) for f in features),
               tuple(tuple(f.get("token_type_ids") or ()) for f in features))
        jobs.append((name, task, examples, features, owner, key))
    groups: dict[tuple, list] = {}
    for job in jobs:
        groups.setdefault(job[-1], []).append(job)
    results: list[dict] = [{} for _ in texts]
    outputs: dict[str, list] = {}
    for group in groups.values():
        features = group[0][3]
        outputs.update(run_heads(net, features, [job[0] for job in group], batch_size) if features else
                       {job[0]: [] for job in group})
    for name, task, examples, features, owner, _ in jobs:
        collected = task.collect(outputs[name], owner, examples, features)
        for i, prediction in enumerate(task.decode(collected, examples, **{**task.fixed_options, **options})):
            results[i][name] = prediction
    return results
