"""`bertheads export DIR --to hf --out OUT [--head NAME]`: one head as a transformers model.

Each kind says how (its `Task.hf_*` members): the `AutoModelFor...` class, the pipeline task,
the config's labels (`id2label`/`label2id`, ...), how its head's weights go into the class's
head and how the class's outputs compare with the head's; the tokenizer goes beside it. `from_pretrained(OUT)` and
`pipeline(task, model=OUT)` load it. Before it is written, the transformers model's outputs
are compared with the head's on a check batch, then the head's temperature is folded into the
class's last linear layer where the pipeline's scores are a softmax of its logits (classify,
tag; `Publishing.hf_fold_temperature` says where it is not exact); a head with no transformers equivalent
(several layers or a layer mix, a BiLSTM, a classifier layout the architecture does not have)
is refused. The labels are the ones predictions show (a classify head's `--label-names`), so the
pipeline answers with the same names. OUT also gets a model card (`README.md`) describing the
head, with the transformers snippet. OUT is written into a temporary sibling and renamed into
place.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bertheads.base.errors import UserError
from bertheads.model import pick_head
from bertheads.saved import bundle, card
from bertheads.store.atomic import atomic_directory
from bertheads.store.guard import check_target

MARKER = "bertheads-export.json"
CHECK_TOLERANCE = 1e-4


def check_equivalent(name: str, task, num_layers: int) -> None:
    """Refuse heads that no transformers model class computes."""
    spec = task.spec
    layers = list(spec.layers)
    branch = getattr(task.head, "branch", None)
    if branch is not None and layers == [branch.split]:  # its own top layers: in the encoder's place
        layers = [num_layers]
    if layers not in ([-1], [num_layers]):
        raise UserError(f"head {name!r} reads layers {','.join(map(str, layers))} ({spec.combine}); "
                        f"a transformers model reads only the last layer, so it has no equivalent")
    task.exporting.check(name, 'hf')


def build_config(encoder_dir: Path, task):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(encoder_dir), trust_remote_code=False)
    task.exporting.configure(config)
    return config


def to_transformers(net, name: str, encoder_dir: Path) -> nn.Module:
    """The transformers model computing head `name` on the model's encoder."""
    import transformers

    task = net.tasks[name]
    config = build_config(encoder_dir, task)
    auto = getattr(transformers, task.exporting.hf_auto_class)
    try:
        model = auto.from_config(config, trust_remote_code=False)
    except ValueError as exc:
        raise UserError(f"{config.model_type}: transformers has no {task.exporting.hf_auto_class} for it "
                        f"({str(exc).splitlines()[0]})") from None
    model.eval()
    base = getattr(model, model.base_model_prefix)
    state = net.encoder.model.state_dict()
    branch = getattr(task.head, "branch", None)
    if branch is not None:  # the head's own top layers in place of the trunk's
        state.update(branch.encoder_state())
    missing, unexpected = base.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.startswith("pooler.")]:
        raise UserError(f"{config.model_type}: the encoder's weights do not fit {type(model).__name__}")
    task.exporting.copy_head(model, name)
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
    theirs = net.tasks[name].exporting.outputs(out)
    if ours.dim() == 3:
        mask = feed["attention_mask"].bool()
        ours, theirs = ours[mask], theirs[mask]
    return float(np.abs(ours.numpy() - theirs.numpy()).max())


def export_hf(directory: str | Path, out: str | Path, head: str | None = None) -> dict:
    """Write head `head` of the model in `directory` as a transformers directory at `out`."""
    directory = Path(directory)
    bundle.read_manifest(directory)
    out = check_target(out, MARKER, models=bundle.model_folders(directory), what="a bertheads export")
    net = bundle.load(directory)
    name = pick_head(net, head)
    task = net.tasks[name]
    check_equivalent(name, task, net.encoder.info.num_layers)
    model = to_transformers(net, name, Path(bundle.encoder_location(directory)))
    diff = max_difference(net, name, model)
    if not diff <= CHECK_TOLERANCE:
        raise UserError(f"head {name!r}: {type(model).__name__} does not compute this head (outputs differ by "
                        f"{diff:.2e}), so it has no transformers equivalent")
    folded = task.exporting.fold_temperature(model)  # after the check, which compares the raw logits
    info = {"source": str(directory), "head": name, "kind": task.kind, "class": type(model).__name__,
            "pipeline": task.exporting.hf_pipeline, "max_abs_diff": diff}
    if folded:
        info["calibration"] = folded
    if task.exporting.pipeline_options():
        info["pipeline_options"] = task.exporting.pipeline_options()
    with atomic_directory(out) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        net.encoder.tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
        card.write_card(tmp, lambda: card.build_card(
            net, net.manifest, card.read_metrics(directory), out.name, card.hf_usage(out.name, task, name, info),
            heads=[name]), out)
    return info
