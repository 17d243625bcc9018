"""Distillation: a student with a teacher's heads, on another checkpoint, trained on the
teacher's scores of unlabelled inputs (and the gold labels where a file gives them).

```
teacher (a bertheads model, read only) --one pass per text, every head--> raw scores per input
        (`Distilling.teacher_scores`, kept in the cache: TEACHER HASH + the file's bytes)
student spec (`Distilling.student_spec`) + fresh head on --model
        --`Distilling.soft_targets`--> features carrying the scores on the student's own tokens
        --fit, the loss `Distilling.loss`--> a normal model folder (dev, calibration, card, gate)
```
Each kind decides what its scores and targets are (`tasks/KIND/distilling.py`); this module names
none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np

from bertheads.base.errors import UserError
from bertheads.base.schema import check_given, convert, known_fields, names, said, setting, tagged
from bertheads.base.values import fraction, positive_float
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.compute.runner import run_heads
from bertheads.encoder.pretrained import Encoder, model_hash
from bertheads.model import BertHeads
from bertheads.saved import bundle
from bertheads.store import lock
from bertheads.store.atomic import atomic_writer
from bertheads.store.encoder_refs import cache_root
from bertheads.tasks.parts import Distilling
from bertheads.tasks.recipes import holdout_size
from bertheads.text.readers import check_input_file
from bertheads.training import checkpoint
from bertheads.training.config import load_mapping
from bertheads.training.joint import fit_max_length, fresh_head
from bertheads.training.keeping import evaluate_task
from bertheads.training.loop import TaskData, fit
from bertheads.training.provenance import made_with, plain
from bertheads.training.resolve import holdout_share, settle_run
from bertheads.training.settings import TrainSettings, recipe_of

log = logging.getLogger("bertheads")
CACHE_FORMAT = 1


@dataclass
class DistillData:
    """What a distillation reads: the teacher and its files."""

    teacher: str | None = setting(None, "the teacher: a bertheads model directory (any heads; never written into)",
                                  positional=True, nargs="?")
    data: str | None = setting(None, "unlabelled inputs in a format each teacher head reads (labels, if any, are "
                                     "not read): the teacher scores them, the student learns the scores")
    train: str | None = setting(None, "labelled inputs: the teacher scores them too, and the student learns "
                                      "their gold labels beside the scores (--soft-weight)")
    dev: str | None = setting(None, "labelled file evaluated after every epoch: the best epoch is kept and the "
                                    "temperature fitted on it (default: a held-out share of --train, as train "
                                    "holds one out; none without --train: the last epoch is kept, uncalibrated)")


@dataclass
class DistillSettings:
    """How a student learns from its teacher."""

    model: str = setting("default", "the student's checkpoint (as `train --model`): 'default' (the embedded MiniLM-L6), a checkpoint "
                                   "directory or a hub name", group="distillation")
    soft_temperature: float = setting(2.0, "the temperature both the teacher's and the student's scores are "
                                           "softened by (the loss is scaled by its square)", type=positive_float,
                                      group="distillation", metavar="T")
    soft_weight: float = setting(0.5, "on labelled inputs, the teacher's share of the loss (the rest: the gold "
                                      "label's); unlabelled inputs learn the teacher's scores alone", type=fraction,
                                 group="distillation", metavar="SHARE")
    teacher_cache: bool = setting(True, "do not keep (or read) the teacher's scores in the cache "
                                        "(CACHE/distill: a second student of the same teacher and files costs no "
                                        "teacher pass)", negate=True, group="distillation", tags=("not-compared",))
    cache_dir: str | None = setting(None, "where the teacher's scores are kept (default: $BERTHEADS_CACHE or "
                                          "~/.cache/bertheads)", group="distillation", tags=("where",))


CONFIG_GROUPS = (DistillData, DistillSettings, TrainSettings)


def read_distill_config(path: str) -> dict:
    """A distillation's config file (YAML, or TOML by its extension): the fields of
    `CONFIG_GROUPS` (`teacher`, `data`, `train`, `dev` resolved against the file's folder), each
    converted like its flag; errors name the file, line and field."""
    data, lines = load_mapping(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping with teacher, data (and train, dev, model, ...)")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}

    def fail(key: str, message: str):
        line = lines.get((key,))
        raise UserError(f"{path}{f':{line}' if line else ''}: {key}: {message}")

    data = check_given(data, *CONFIG_GROUPS, at=path, fail=fail)
    fields = known_fields(*CONFIG_GROUPS)
    out = {k: convert(fields[k], v, partial(fail, k)) for k, v in data.items()}
    base = Path(path).resolve().parent
    for key in names(DistillData):
        if out.get(key) is not None:
            out[key] = str((base / Path(str(out[key])).expanduser()).resolve())
    if out.get("model") not in (None, "default") and (base / out["model"]).exists():
        out["model"] = str((base / out["model"]).resolve())
    return out


def teacher_key(teacher: BertHeads, path: str) -> str:
    """The cache key of a teacher's scores of a file: the teacher's weights and heads' settings,
    and the file's bytes."""
    digest = hashlib.sha256(f"distill {CACHE_FORMAT}\n".encode())
    digest.update(model_hash(teacher).encode())
    for name, task in sorted(teacher.tasks.items()):
        digest.update(json.dumps([name, task.kind, asdict(task.spec)], sort_keys=True, default=str).encode())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def teacher_pass(teacher: BertHeads, examples: dict[str, list], batch_size: int = INFERENCE_BATCH,
                 progress: bool = True) -> dict[str, list]:
    """Every head's raw scores of its examples (`Distilling.teacher_scores`); heads whose encoded
    inputs are identical share one encoder pass."""
    tokenizer = teacher.encoder.tokenizer
    jobs = []
    for name, task in teacher.tasks.items():
        features, owner = task.modeling.encode_for_inference(examples[name], tokenizer)
        key = (tuple(owner), tuple(tuple(f["input_ids"]) for f in features),
               tuple(tuple(f.get("token_type_ids") or ()) for f in features))
        jobs.append((name, task, features, owner, key))
    groups: dict[tuple, list] = {}
    for job in jobs:
        groups.setdefault(job[-1], []).append(job)
    outputs: dict[str, list] = {}
    for group in groups.values():
        heads = [job[0] for job in group]
        outputs.update(run_heads(teacher, group[0][2], heads, batch_size,
                                 progress="teacher" if progress else None) if group[0][2] else {h: [] for h in heads})
    return {name: Distilling.of(task).teacher_scores(outputs[name], owner, examples[name], features)
            for name, task, features, owner, _ in jobs}


def pack(scores: dict[str, list]) -> dict[str, np.ndarray]:
    """Scores as plain arrays for an `.npz` file (no pickle): each input's score is an array or
    a tuple of arrays (or None), `HEAD/I/J` its J-th, with a JSON index of the shapes."""
    arrays, index = {}, {}
    for head, items in scores.items():
        tuples = bool(items) and isinstance(items[0], tuple)
        index[head] = {"count": len(items), "tuple": tuples, "width": len(items[0]) if tuples else 1}
        for i, item in enumerate(items):
            for j, part in enumerate(item if tuples else (item,)):
                if part is not None:
                    arrays[f"{head}/{i}/{j}"] = np.asarray(part)
    arrays["index"] = np.asarray(json.dumps(index))
    return arrays


def unpack(data) -> dict[str, list]:
    """`pack`'s arrays as scores again."""
    index = json.loads(str(data["index"]))
    scores = {}
    for head, shape in index.items():
        items = []
        for i in range(shape["count"]):
            parts = tuple(data[key] if (key := f"{head}/{i}/{j}") in data else None for j in range(shape["width"]))
            items.append(parts if shape["tuple"] else parts[0])
        scores[head] = items
    return scores


def cached_scores(teacher: BertHeads, path: str, examples: dict[str, list], chosen: DistillSettings,
                  progress: bool = True) -> dict[str, list]:
    """`teacher_pass` of a file's examples, read from the cache when this teacher scored this
    file before (and written there when not; plain arrays, never a pickle)."""
    if not chosen.teacher_cache:
        return teacher_pass(teacher, examples, progress=progress)
    where = cache_root(chosen.cache_dir) / "distill" / f"{teacher_key(teacher, path)}.npz"
    if where.is_file():
        try:
            with np.load(where, allow_pickle=False) as data:
                scores = unpack({key: data[key] for key in data.files})
            if set(scores) == set(examples) and all(len(scores[n]) == len(examples[n]) for n in examples):
                log.info(f"the teacher's scores of {path}: from the cache ({where})")
                return scores
        except (OSError, KeyError, ValueError):
            pass
        log.info(f"{where}: an unreadable cache entry, scored again")
    scores = teacher_pass(teacher, examples, progress=progress)
    try:
        with atomic_writer(where, "wb") as f:
            np.savez(f, **pack(scores))
    except OSError as exc:
        log.warning(f"could not keep the teacher's scores in {where} ({exc})")
    return scores


def run_record(files: DistillData, chosen: DistillSettings, settings: TrainSettings, teacher: BertHeads) -> dict:
    """What the student's folder records of how it was made (`config.yaml`, the card)."""
    left_out = set(tagged(TrainSettings, "not-recorded")) | {"teacher_cache"}
    training = {k: v for k, v in asdict(settings).items() if k not in left_out}
    tasks = {name: {"kind": task.kind, "train": files.train or files.data, **({"dev": files.dev} if files.dev else {})}
             for name, task in teacher.tasks.items()}
    return plain({"teacher": str(Path(files.teacher).resolve()), "data": files.data,
                  **({"train": files.train} if files.train else {}), "model": chosen.model,
                  "soft_temperature": chosen.soft_temperature, "soft_weight": chosen.soft_weight,
                  **training, "tasks": tasks})


def distill_model(files: DistillData, out: str | Path | None, settings: TrainSettings | None = None,
                  chosen: DistillSettings | None = None) -> tuple[BertHeads, dict]:
    """Train a student of `files.teacher` on `chosen.model`: every teacher head once, on the
    teacher's scores of `files.data` (and of `files.train`, with its gold labels); the kept
    epoch saved to `out` as `train` saves a model. Returns the student and its metrics."""
    settings, chosen = settings or TrainSettings(), chosen or DistillSettings()
    if not files.teacher or not bundle.is_model(files.teacher):
        raise UserError(f"{said('teacher', files.teacher)}: expected a bertheads model directory (bertheads.json)")
    if not files.data:
        raise UserError(f"{said('data')}: the unlabelled inputs the teacher scores are required")
    for path in (files.data, files.train, files.dev):
        if path:
            check_input_file(path)
    inputs = [files.teacher, files.data, files.train, files.dev,
              *([chosen.model] if Path(str(chosen.model)).exists() else [])]
    if out is not None:
        checkpoint.claim_out(out, settings.resume, settings.overwrite, [p for p in inputs if p])
    try:
        teacher = bundle.load(files.teacher)
        encoder = Encoder.load(chosen.model)
        how = recipe_of(settings)
        students = {}
        for name, t in teacher.tasks.items():
            spec = Distilling.of(t).student_spec()
            fit_max_length(spec, encoder, given=False)
            students[name] = type(t)(spec, None)
        unlabelled = {name: s.reading.read(files.data, need_labels=False) for name, s in students.items()}
        gold = {name: s.reading.read(files.train, need_labels=True) for name, s in students.items()} \
            if files.train else {}
        progress = settings.progress
        scores = cached_scores(teacher, files.data, unlabelled, chosen, progress)
        gold_scores = cached_scores(teacher, files.train, gold, chosen, progress) if files.train else {}
        data = []
        for name, student in students.items():
            tokenizer = encoder.tokenizer
            features = Distilling.of(student).soft_targets(unlabelled[name], scores[name], tokenizer, with_labels=False)
            labelled, dev, held = list(range(len(gold.get(name, ())))), None, 0
            if files.train and files.dev is None and (count := holdout_size(len(labelled), holdout_share(settings, how))):
                random.Random(settings.seed).shuffle(labelled)
                held_out, labelled = sorted(labelled[:count]), sorted(labelled[count:])
                dev, held = [gold[name][i] for i in held_out], count
            if labelled:
                features += Distilling.of(student).soft_targets([gold[name][i] for i in labelled],
                                                          [gold_scores[name][i] for i in labelled], tokenizer,
                                                          with_labels=True)
                student.spec.trained_counts = student.scoring.class_counts([gold[name][i] for i in labelled])
            if files.dev:
                dev = student.reading.read(files.dev, need_labels=True)
            if not features:
                raise UserError(f"{files.data}: no usable inputs for head {name!r}")
            loss = partial(Distilling.of(student).loss, temperature=chosen.soft_temperature,
                           soft_weight=chosen.soft_weight)
            data.append(TaskData(name, student, features, dev, files.dev,
                                 examples=len(unlabelled[name]) + len(gold.get(name, ())), held_out=held, loss=loss))
        run = settle_run(settings, data, "finetune", mode_left=False, how=how)
        settings = run.settings
        for d in data:
            d.task = fresh_head(d.task, encoder)
        if not any(d.dev_examples for d in data):
            log.info(f"no labelled dev data ({said('dev')} or {said('train')}): the last epoch is kept, uncalibrated")
            settings.keep = "last"
        net = BertHeads(encoder, {d.name: d.task for d in data})
        extra = {"source_model": chosen.model, "made_with": made_with(),
                 "distilled_from": {"teacher": str(Path(files.teacher).resolve()),
                                    "heads": {n: t.kind for n, t in teacher.tasks.items()},
                                    "soft_temperature": chosen.soft_temperature, "soft_weight": chosen.soft_weight},
                 "settings": run_record(files, chosen, settings, teacher)}
        log.info(f"distilling {len(data)} head{'s' * (len(data) > 1)} of {files.teacher} into {chosen.model}: "
                 f"{sum(len(d.train_features) for d in data):,} features, {settings.epochs} epoch{'s' * (settings.epochs > 1)}")
        result = fit(net, data, settings, out, evaluate_task, extra)
        return net, result
    finally:
        if out is not None:
            lock.release(out)
