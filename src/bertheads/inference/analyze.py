"""Every head of a model on the same texts, one encoder pass for the heads whose inputs
encode alike (`analyze`). A head reads the shared text alone, or with the extra value its
input form asks for (`tasks/forms.py` `Extra`: a pair's second text, a question for the text
as its passage); heads whose extra is not given do not answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bertheads.base.errors import UserError
from bertheads.base.schema import closest, unknown_name
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.compute.runner import run_heads
from bertheads.model import BertHeads


def extras_of(net) -> dict:
    """request name -> `Extra` of the input forms of `net`'s heads (what `analyze` may be given)."""
    return {task.reading.form.extra.request: task.reading.form.extra for task in net.tasks.values() if task.reading.form.extra}


def split_extras(net, given: Mapping) -> tuple[dict, dict]:
    """Keyword arguments of `analyze` split into the heads' extra inputs and their options."""
    known = extras_of(net)
    return {k: v for k, v in given.items() if k in known}, {k: v for k, v in given.items() if k not in known}


def analyze_inputs(net, texts: Sequence[str], extras: Mapping[str, Sequence] | None = None,
                   heads: Sequence[str] | None = None) -> dict[str, list]:
    """head -> its inputs (as `Model.predict` takes them) for the heads that answer: every head
    whose form needs nothing beyond the text, and those whose extra values are given (of
    `heads` alone when given)."""
    extras = dict(extras or {})
    for name, values in extras.items():
        if values is not None and len(values) != len(texts):
            raise UserError(f"{name}: expected one per text ({len(texts)}), got {len(values)}")
    out = {}
    for name, task in net.tasks.items():
        if heads is not None and name not in heads:
            continue
        form = task.reading.form
        if form.extra is None:
            out[name] = list(texts)
        elif extras.get(form.extra.request) is not None:
            out[name] = [form.with_text(t, v) for t, v in zip(texts, extras[form.extra.request])]
    return out


def head_options(net, options: Mapping) -> dict[str, dict]:
    """head -> the `options` its kind takes; a name that no head takes, as an option or an extra
    input, is refused with the closest known one suggested."""
    known = [*extras_of(net), *(n for task in net.tasks.values() for n in task.options.declared())]
    for name, value in options.items():
        if not any(name in task.options.declared() for task in net.tasks.values()):
            if closest(name, known):
                raise UserError(unknown_name(name, known, "option or input"))
            next(iter(net.tasks.values())).options.check({name: value})  # says why (another kind's option)
    return {head: {k: v for k, v in options.items() if k in task.options.declared()}
            for head, task in net.tasks.items()}


def bound_tasks(net, options: Mapping, heads: Sequence[str] | None = None) -> dict[str, object]:
    """head -> its task bound to the `options` its kind takes (`head_options`; of `heads` alone
    when given): what analyze runs and its table outputs type their columns by."""
    given = head_options(net, options)
    return {name: task.options.bind(given[name]) for name, task in net.tasks.items()
            if heads is None or name in heads}


def count_abstained(results: list[dict]) -> int:
    """How many of `analyze`'s predictions say `"abstained": true`."""
    return sum(1 for r in results for p in r.values() if isinstance(p, dict) and p.get("abstained") is True)


def analyze(net: BertHeads, texts: list[str], extras: Mapping[str, Sequence] | None = None,
            batch_size: int = INFERENCE_BATCH, heads: Sequence[str] | None = None, **options) -> list[dict]:
    """`{head: prediction}` per text for every head that answers (see `analyze_inputs`; of
    `heads` alone when given);
    `options`: inference options, each given to the heads whose kind takes it.

    Heads whose encoded inputs are identical (the same token ids, windows and segments)
    share one encoder pass; the rest get a pass of their own.
    """
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UserError(f"text {i}: expected a string, got {type(text).__name__}")
    tokenizer = net.encoder.tokenizer
    tasks = bound_tasks(net, options, heads)
    jobs = []
    for name, inputs in analyze_inputs(net, texts, extras, heads).items():
        task = tasks[name]
        examples = task.reading.from_inputs(inputs)
        features, owner = task.modeling.encode_for_inference(examples, tokenizer)
        key = (tuple(owner), tuple(tuple(f["input_ids"]) for f in features),
               tuple(tuple(f.get("token_type_ids") or ()) for f in features))
        jobs.append((name, task, examples, features, owner, key))
    groups: dict[tuple, list] = {}
    for job in jobs:
        groups.setdefault(job[-1], []).append(job)
    results: list[dict] = [{} for _ in texts]
    outputs: dict[str, list] = {}
    for group in groups.values():  # one encoder pass for the heads whose inputs encode alike
        features = group[0][3]
        outputs.update(run_heads(net, features, [job[0] for job in group], batch_size) if features else
                       {job[0]: [] for job in group})
    for name, task, examples, features, owner, _ in jobs:
        collected = task.judging.collect(outputs[name], owner, examples, features)
        for i, prediction in enumerate(task.judging.decode(collected, examples)):
            results[i][name] = prediction
    return results
