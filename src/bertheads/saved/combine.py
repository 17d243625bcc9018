"""One model from several that share an identical encoder (`bertheads combine`)."""

from __future__ import annotations

from pathlib import Path

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.encoder.pretrained import encoder_hash
from bertheads.model import BertHeads
from bertheads.saved import bundle, card


def combine(directories: list[str | Path], out: str | Path, names: list[str] | None = None,
            replace: bool = False) -> Path:
    """Save at `out` one model holding the heads of several models whose encoders are identical
    (`replace`: a head of a later model takes the place of an earlier one of the same name)."""
    if len(directories) < 2:
        raise UserError("combine: give at least two model directories")
    bundle.check_writable_out(out, models=[f for d in directories for f in bundle.model_folders(d)])  # never over (or into) a model it reads
    manifests = [bundle.read_manifest(d) for d in directories]
    hashes = []
    for directory, manifest in zip(directories, manifests):
        digest = manifest.get("encoder_hash")
        if not digest:  # older manifests: hash the weights themselves
            digest = encoder_hash(bundle.load(directory).encoder)
        hashes.append(digest)
    for directory, digest in zip(directories[1:], hashes[1:]):
        if digest != hashes[0]:
            raise UserError(
                f"{directory}: its encoder differs from {directories[0]}'s (encoder_hash {digest[:12]}... vs "
                f"{hashes[0][:12]}...); only models sharing one encoder can be combined: heads trained with "
                f"{said('tune_layers')} (their own top layers) or {said('mode', 'features')} on the same "
                f"checkpoint, or a model trained jointly with `train multi`")
    heads = [(str(d), name) for d, m in zip(directories, manifests) for name in m["heads"]]
    later = {name: i for i, (_, name) in enumerate(heads)}
    dropped = {i for i, (_, name) in enumerate(heads) if replace and later[name] != i}
    heads = [h for i, h in enumerate(heads) if i not in dropped]
    if names is not None:
        if len(names) != len(heads):
            raise UserError(f"{said('names')}: expected {len(heads)} names, one per head in order "
                            f"({', '.join(f'{d}:{n}' for d, n in heads)}), got {len(names)}")
        for name in names:
            if not bundle.HEAD_NAME.match(name):
                raise UserError(f"{said('names')}: {name!r} is not a valid head name (letters, digits, '_', '.', '-')")
    new_names = names or [n for _, n in heads]
    seen: dict[str, str] = {}
    for (directory, _), name in zip(heads, new_names):
        if name in seen:
            raise UserError(f"head name {name!r} is in both {seen[name]} and {directory}; rename heads with "
                            f"{said('names')} (one per head, in order: {', '.join(f'{d}:{n}' for d, n in heads)})")
        seen[name] = directory
    models = [bundle.load(d) for d in directories]
    tasks, metrics, renamed = {}, {}, iter(new_names)
    kept = set(heads)
    for directory, model in zip(directories, models):
        dev = read_dev_metrics(Path(directory), list(model.tasks))
        for name, task in model.tasks.items():
            if (str(directory), name) not in kept:
                continue
            new = next(renamed)
            tasks[new] = task
            if name in dev:
                metrics[new] = dev[name]
    net = BertHeads(models[0].encoder, tasks)
    sources = {new: {"from": str(d), "head": n} for new, (d, n) in zip(new_names, heads)}
    extra = {"source_model": manifests[0].get("source_model"), "combined_from": sources}
    return bundle.save(net, out, {"dev": metrics} if metrics else None, extra)


def into_source(into: str | Path) -> str:
    """The checkpoint a run adding heads to model `into` trains on (`train --into`): the one its
    heads branch from; a model with an encoder of its own (fine-tuned) is refused."""
    if not bundle.is_model(into):
        raise UserError(f"{said('into', str(into))}: not a bertheads model directory")
    if bundle.read_manifest(into).get("encoder") is None:
        raise UserError(f"{said('into', str(into))}: its encoder was trained with its heads, so a new head cannot "
                        f"share it; add heads to a model of heads trained with {said('tune_layers')} or "
                        f"{said('mode', 'features')}")
    return bundle.encoder_location(into)


def read_dev_metrics(directory: Path, names: list[str]) -> dict:
    """A saved model's dev metrics per head ({} when it has none)."""
    return card.head_metrics(card.read_metrics(directory), names)
