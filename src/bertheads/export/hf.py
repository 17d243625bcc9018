"""`bertheads export DIR --to hf --out OUT [--head NAME]`: one head as a transformers model.

classify -> `AutoModelForSequenceClassification` (the head's pooler into the model's pooler,
its linear layer into the classifier; `id2label`/`label2id`, and `problem_type` for
regression and multi-label), tag -> `AutoModelForTokenClassification`, qa ->
`AutoModelForQuestionAnswering`; the tokenizer beside it. `from_pretrained(OUT)` and
`pipeline(task, model=OUT)` load it. Before it is written, the transformers model's outputs
are compared with the head's on a check batch; a head with no transformers equivalent
(several layers or a layer mix, a BiLSTM, a classifier layout the architecture does not have)
is refused. OUT is written into a temporary sibling and renamed into place.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bertheads.base.errors import UserError
from bertheads.model import pick_head
from bertheads.saved import bundle
from bertheads.store.atomic import atomic_directory, check_replaceable

MARKER = "bertheads-export.json"
AUTO_CLASSES = {"classify": "AutoModelForSequenceClassification", "tag": "AutoModelForTokenClassification",
                "qa": "AutoModelForQuestionAnswering"}
PIPELINE_TASKS = {"classify": "text-classification", "tag": "token-classification", "qa": "question-answering"}
PROBLEM_TYPES = {"single_label": "single_label_classification", "regression": "regression",
                 "multi_label": "multi_label_classification"}
CHECK_TOLERANCE = 1e-4


def check_equivalent(name: str, task, num_layers: int) -> None:
    """Refuse heads that no transformers model class computes."""
    spec = task.spec
    layers = list(spec.layers)
    if layers not in ([-1], [num_layers]):
        raise UserError(f"head {name!r} reads layers {','.join(map(str, layers))} ({spec.combine}); "
                        f"a transformers model reads only the last layer, so it has no equivalent")
    if getattr(spec, "head_type", "linear") != "linear":
        raise UserError(f"head {name!r}: a BiLSTM tag head has no transformers equivalent")


def copy_linear(target: nn.Module, source: nn.Linear, what: str) -> None:
    if not isinstance(target, nn.Linear) or target.weight.shape != source.weight.shape:
        raise UserError(f"{what}: the transformers model has no layer of this shape, so the head has no equivalent")
    with torch.no_grad():
        target.weight.copy_(source.weight)
        target.bias.copy_(source.bias)


def build_config(encoder_dir: Path, task):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(encoder_dir))
    spec = task.spec
    if task.kind == "classify":
        labels = ["value"] if spec.problem == "regression" else [str(label) for label in spec.labels]
        config.problem_type = PROBLEM_TYPES[spec.problem]
    elif task.kind == "tag":
        labels = list(spec.tags)
    else:
        labels = ["start", "end"]
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = {label: i for i, label in enumerate(labels)}
    return config


def to_transformers(net, name: str, encoder_dir: Path) -> nn.Module:
    """The transformers model computing head `name` on the model's encoder."""
    import transformers

    task = net.tasks[name]
    head = net.heads[name]
    config = build_config(encoder_dir, task)
    auto = getattr(transformers, AUTO_CLASSES[task.kind])
    try:
        model = auto.from_config(config)
    except ValueError as exc:
        raise UserError(f"{config.model_type}: transformers has no {AUTO_CLASSES[task.kind]} for it "
                        f"({str(exc).splitlines()[0]})") from None
    model.eval()
    base = getattr(model, model.base_model_prefix)
    missing, unexpected = base.load_state_dict(net.encoder.model.state_dict(), strict=False)
    if unexpected or [k for k in missing if not k.startswith("pooler.")]:
        raise UserError(f"{config.model_type}: the encoder's weights do not fit {type(model).__name__}")
    if task.kind == "classify":
        pooler = getattr(getattr(base, "pooler", None), "dense", None)
        classifier = getattr(model, "classifier", None)
        if isinstance(pooler, nn.Linear) and isinstance(classifier, nn.Linear):  # BERT layout
            copy_linear(pooler, head.pooler, f"head {name!r}")
            copy_linear(classifier, head.out, f"head {name!r}")
        elif hasattr(classifier, "dense") and hasattr(classifier, "out_proj"):  # RoBERTa layout
            copy_linear(classifier.dense, head.pooler, f"head {name!r}")
            copy_linear(classifier.out_proj, head.out, f"head {name!r}")
        else:
            raise UserError(f"head {name!r}: {type(model).__name__} has no pooler + linear classifier "
                            f"(dense, tanh, linear), so the head has no equivalent")
    elif task.kind == "tag":
        copy_linear(getattr(model, "classifier", None), head.out, f"head {name!r}")
    else:
        copy_linear(getattr(model, "qa_outputs", None), head.out, f"head {name!r}")
    return model


def max_difference(net, name: str, model: nn.Module) -> float:
    """Largest difference between the head's outputs and the transformers model's on a check batch."""
    from bertheads.export.onnx import example_inputs

    feed = {k: torch.from_numpy(v) for k, v in example_inputs(net.encoder.tokenizer).items()}
    if not net.encoder.info.uses_token_types:
        feed.pop("token_type_ids")
    with torch.no_grad():
        ours = net(feed, [name])[name]
        out = model(**feed)
    if net.tasks[name].kind == "qa":
        theirs = torch.stack([out.start_logits, out.end_logits], dim=-1)
    else:
        theirs = out.logits
    if ours.dim() == 3:
        mask = feed["attention_mask"].bool()
        ours, theirs = ours[mask], theirs[mask]
    return float(np.abs(ours.numpy() - theirs.numpy()).max())


def export_hf(directory: str | Path, out: str | Path, head: str | None = None) -> dict:
    """Write head `head` of the model in `directory` as a transformers directory at `out`."""
    directory = Path(directory)
    bundle.read_manifest(directory)
    out = Path(out)
    check_replaceable(out, MARKER, "a bertheads export")
    if out.resolve() == directory.resolve() or directory.resolve() in out.resolve().parents:
        raise UserError(f"--out {out}: choose a directory outside the model")
    net = bundle.load(directory)
    name = pick_head(net, head)
    task = net.tasks[name]
    check_equivalent(name, task, net.encoder.info.num_layers)
    model = to_transformers(net, name, directory / "encoder")
    diff = max_difference(net, name, model)
    if not diff <= CHECK_TOLERANCE:
        raise UserError(f"head {name!r}: {type(model).__name__} does not compute this head (outputs differ by "
                        f"{diff:.2e}), so it has no transformers equivalent")
    info = {"source": str(directory), "head": name, "kind": task.kind, "class": type(model).__name__,
            "pipeline": PIPELINE_TASKS[task.kind], "max_abs_diff": diff}
    if task.kind == "qa":
        info["pipeline_options"] = {"max_answer_len": task.spec.max_answer_length, "doc_stride": task.spec.stride,
                                    "max_seq_len": task.spec.max_length,
                                    "max_question_len": task.spec.max_question_length}
    elif task.kind == "tag":
        info["pipeline_options"] = {"aggregation_strategy": "first"}
    with atomic_directory(out) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        net.encoder.tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    return info
