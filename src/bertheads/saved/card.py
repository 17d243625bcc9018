"""The model card: `README.md` in every saved model directory and in every export.

It follows the Hugging Face model-card layout: a YAML front matter made with
`huggingface_hub.ModelCardData` (library, base model, pipeline tag, tags, language and license
when the base checkpoint's own card gives them, the training files as `datasets`, the metrics,
and a `model-index` of the dev metrics), then Markdown sections: model description, heads and
labels, training data and settings, evaluation, how to use, intended use and limits, versions.

What depends on a head's kind (its pipeline tag, what it outputs, its labels or tags, its
limits, the transformers snippet) comes from the head's `Task.card_text` and `Task.hf_usage`.
The card is written inside the directory's atomic build; a card that cannot be made is left
out with a warning, never at the cost of the model (`card_or_none`).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from bertheads.base.bounded import MAX_CONFIG_BYTES, read_json, read_yaml
from bertheads.base.errors import UserError
from bertheads.encoder.pretrained import DEFAULT_MODEL, default_model_path
from bertheads.saved.manifest import METRICS
from bertheads.tasks.families import family_of_config

log = logging.getLogger("bertheads")

CARD = "README.md"
LIBRARY = "bertheads"
DEFAULT_HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"  # the checkpoint `--model default` embeds
TRAINING_ROWS = (("epochs", "epochs"), ("lr", "learning rate"), ("batch_size", "batch size"),
                 ("max_length", "max length (tokens)"), ("seed", "seed"), ("warmup_ratio", "warm-up ratio"),
                 ("weight_decay", "weight decay"), ("sampling", "sampling across heads"))
FRONT_ORDER = ("library_name", "base_model", "pipeline_tag", "tags", "language", "license", "datasets", "metrics")
MAX_LISTED = 60  # labels or tags listed in full up to this many


@dataclass
class Usage:
    """How the directory a card describes is used: its library and the snippets."""

    library_name: str
    snippets: list[tuple[str, str, str]]  # (what it does, code language, code)
    notes: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)  # front-matter tags of this form (onnx, transformers)


# -- what a saved model records ------------------------------------------------------------------
def read_metrics(directory: str | Path) -> dict | None:
    """A saved model's metrics.json, read within `base/bounded.py`'s bounds (None when it has none
    or it cannot be read; opening the folder, `manifest.read_manifest`, says why)."""
    path = Path(directory) / METRICS
    try:
        data = read_json(path) if path.is_file() else None
    except UserError:
        return None
    return data if isinstance(data, dict) else None


def head_metrics(metrics: dict | None, names: list[str]) -> dict[str, dict]:
    """The dev metrics of each head from metrics.json's content (`dev` is the one head's metrics,
    or {head: metrics} for several); {} when there are none."""
    dev = (metrics or {}).get("dev") or {}
    if not isinstance(dev, dict):
        return {}
    if len(names) == 1 and not (set(dev) == {names[0]} and isinstance(dev.get(names[0]), dict)):
        return {names[0]: dev} if dev else {}
    return {n: dev[n] for n in names if isinstance(dev.get(n), dict)}


def scalar_metrics(values: dict) -> dict[str, float | int]:
    """The metrics that are one finite number (per-class tables and matrices left out)."""
    return {k: v for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def source_of(manifest: dict) -> str | None:
    """The checkpoint the model started from, as given (`default`, a hub name or a path)."""
    reference = manifest.get("encoder") or {}
    source = manifest.get("source_model") or reference.get("source") or (manifest.get("settings") or {}).get("model")
    return None if source in (None, "") else str(source)


def base_model(manifest: dict) -> str | None:
    """The base model's hub name (the embedded default's too), else its path as given."""
    source = source_of(manifest)
    return DEFAULT_HUB_NAME if source == DEFAULT_MODEL else source


def checkpoint_metadata(manifest: dict) -> dict:
    """The front matter of the base checkpoint's own README.md, when it is a local directory
    that has one (its language and license carry over)."""
    source = source_of(manifest)
    candidates = [default_model_path() if source == DEFAULT_MODEL else source,
                  (manifest.get("encoder") or {}).get("path"), (manifest.get("settings") or {}).get("model")]
    for candidate in candidates:
        if not candidate:
            continue
        path = Path(candidate) / CARD
        try:
            if path.is_file():
                return front_matter(path)
        except (OSError, ValueError, UserError):  # (a card that cannot say it leaves these out)
            continue
    return {}


def front_matter(path: Path) -> dict:
    """The YAML front matter of a model card, read within the config files' bounds
    (`base/bounded.py`: a card a manifest points at is someone else's data)."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        return {}
    text = path.read_text(encoding="utf-8", errors="replace")
    end = text.find("\n---", 3)
    if not text.startswith("---") or end < 0:
        return {}
    data, _ = read_yaml(text[3:end], path)
    return data if isinstance(data, dict) else {}


def declared_license(manifest: dict) -> str:
    """The license the run declared (`TrainSettings.license`), else "other": a model is bound
    by its training data's terms as well as its checkpoint's, which bertheads cannot know."""
    return str((manifest.get("settings") or {}).get("license") or "other")


def head_data(manifest: dict, names: list[str]) -> dict[str, dict]:
    """Each head's training settings as recorded: {head: {"train", "dev", ...}} (one task at the
    top level of `settings`, several under `tasks`; a combined model's come from its sources)."""
    settings = manifest.get("settings") or {}
    if isinstance(settings.get("tasks"), dict):
        return {n: dict(settings["tasks"].get(n) or {}) for n in names}
    if settings and len(names) == 1:
        return {names[0]: dict(settings)}
    return {n: {} for n in names}


def file_name(data) -> str:
    """A data file as the card names it: its name (the full path stays in config.yaml)."""
    text = str(data)
    return Path(text).name if ("/" in text or "\\" in text) and " of " not in text else text


def versions(manifest: dict) -> dict:
    """The versions that made the model (the manifest's `made_with`), else the running ones."""
    made = manifest.get("made_with")
    if isinstance(made, dict) and made:
        return made
    import transformers

    return {"bertheads": getattr(sys.modules.get("bertheads"), "__version__", "unknown"),
            "python": sys.version.split()[0], "torch": str(torch.__version__), "transformers": transformers.__version__}


# -- the card -----------------------------------------------------------------------------------
def build_card(net, manifest: dict, metrics: dict | None, title: str, usage: Usage,
               heads: list[str] | None = None) -> str:
    """The card's text for the heads `heads` (default: every head) of `net`, a loaded or
    freshly trained model whose manifest is `manifest` and metrics.json content `metrics`."""
    names = list(heads or net.tasks)
    tasks = {n: net.tasks[n] for n in names}
    texts = {n: t.publishing.card_text() for n, t in tasks.items()}
    data = head_data(manifest, names)
    dev = {n: m for n, m in head_metrics(metrics, list(net.tasks)).items() if n in names}
    config = net.encoder.config
    family = family_of_config(config).name
    checkpoint = checkpoint_metadata(manifest)
    modes = {getattr(t.spec, "mode", "finetune") for t in tasks.values()}
    pipeline_tags = [texts[n].pipeline_tag for n in names if texts[n].pipeline_tag]

    train_files = [file_name(data[n]["train"]) for n in names if data[n].get("train")]
    metric_names = sorted({k for m in dev.values() for k in scalar_metrics(m) if k not in ("examples", "loss")})
    results = [EvalResult(task_type=texts[n].pipeline_tag or tasks[n].kind, task_name=head_label(n, tasks[n]),
                          dataset_type=file_name(data[n].get("dev") or "dev"),
                          dataset_name=file_name(data[n].get("dev") or "dev"), dataset_config=n, dataset_split="dev",
                          metric_type=k, metric_value=v)
               for n in names for k, v in scalar_metrics(dev.get(n, {})).items() if k != "examples"]
    front = ModelCardData(
        library_name=usage.library_name, base_model=base_model(manifest),
        pipeline_tag=pipeline_tags[0] if pipeline_tags and len(set(pipeline_tags)) == 1 else None,
        tags=[LIBRARY, family, *pipeline_tags, *usage.tags, *(["multi-head"] if len(names) > 1 else []),
              "frozen-encoder" if modes == {"features"} else "setfit" if modes == {"contrastive"} else "fine-tuned"],
        language=checkpoint.get("language"), license=declared_license(manifest),
        datasets=list(dict.fromkeys(train_files)) or None, metrics=metric_names or None,
        model_name=title if results else None, eval_results=results or None)

    body = [f"# {title}", ""]
    if len(names) == 1:
        body += [f"A {LIBRARY} model: the {tasks[names[0]].kind} head `{names[0]}` on a {family} encoder.", ""]
    else:
        body += [f"A {LIBRARY} model: {len(names)} heads on one {family} encoder, which runs once for all of them: "
                 + ", ".join(head_label(n, tasks[n]) for n in names) + ".", ""]
    body += description(net, manifest, tasks, family, modes)
    body += heads_section(tasks, texts)
    body += training_section(manifest, metrics, data, names)
    body += evaluation_section(metrics, dev, data, names)
    body += ["## How to use", ""]
    for what, language, code in usage.snippets:
        body += [what, "", f"```{language}", code.rstrip("\n"), "```", ""]
    body += [f"- {note}" for note in usage.notes] + ([""] if usage.notes else [])
    body += limits_section(tasks, texts, data, names, manifest)
    made = versions(manifest)
    body += ["## Versions", "", ", ".join(f"{k} {v}" for k, v in made.items()) + ".", ""]
    card = ModelCard(f"---\n{front.to_yaml(original_order=list(FRONT_ORDER))}\n---\n\n" + "\n".join(body))
    return str(card)


def description(net, manifest: dict, tasks: dict, family: str, modes: set[str]) -> list[str]:
    config = net.encoder.config
    info = net.encoder.info
    source = source_of(manifest)
    shown = f"`{base_model(manifest)}`" + (" (the embedded default)" if source == DEFAULT_MODEL else "")
    lines = ["## Model description", "",
             f"- Base checkpoint: {shown if source else 'not recorded'}",
             f"- Encoder family: {family} (`model_type` {getattr(config, 'model_type', '?')}), "
             f"{info.num_layers} layers, hidden size {info.hidden_size}"]
    if modes == {"features"}:
        lines.append("- Mode: features: the encoder stayed frozen and only the heads learned")
    elif modes == {"finetune"}:
        lines.append("- Mode: fine-tune: the encoder learned with the heads")
    elif modes == {"contrastive"}:
        lines.append("- Mode: contrastive (SetFit's recipe): the encoder was tuned on pairs of training texts "
                     "(alike when they share a label), then the heads learned on it, frozen")
    else:
        lines.append(f"- Mode: {', '.join(sorted(modes))} (per head below)")
    reference = manifest.get("encoder")
    if reference:
        lines.append(f"- Heads only: the encoder is the unchanged checkpoint `{reference.get('source')}`, found "
                     f"through the manifest and checked by its hash; put a copy at `encoder/` to move the model")
    sources = manifest.get("combined_from")
    if isinstance(sources, dict) and sources:
        lines.append("- Combined (`bertheads combine`) from: " + ", ".join(
            f"`{n}` = head `{s.get('head')}` of `{file_name(s.get('from'))}`" for n, s in sources.items()
            if isinstance(s, dict) and n in tasks))
    return lines + [""]


def head_label(name: str, task) -> str:
    """A head as the card names it: `name` (kind), or the kind alone when the head is named after it."""
    return f"`{name}`" if name == task.kind else f"`{name}` ({task.kind})"


def layers_text(spec) -> str:
    layers = list(getattr(spec, "layers", [-1]))
    if layers == [-1]:
        return "last layer"
    return f"layers {', '.join(map(str, layers))} ({getattr(spec, 'combine', 'concat')})"


def heads_section(tasks: dict, texts: dict) -> list[str]:
    lines = ["## Heads and labels", ""]
    for name, task in tasks.items():
        text, spec = texts[name], task.spec
        lines += [f"### {head_label(name, task)}", "", f"{task.help[0].upper()}{task.help[1:]}.", "",
                  f"- Input: {task.reading.form.says}, up to {spec.max_length} tokens",
                  f"- Output: {text.outputs}",
                  f"- Reads the encoder's {layers_text(spec)}"
                  + ("" if len({getattr(t.spec, "mode", None) for t in tasks.values()}) == 1 else f" ({spec.mode})")]
        if text.labels:
            shown = text.labels if len(text.labels) <= MAX_LISTED else text.labels[:MAX_LISTED] + ["..."]
            lines.append(f"- {text.labels_title.capitalize()} ({len(text.labels)}): "
                         + ", ".join(f"`{label}`" for label in shown))
        lines.append("")
    return lines


def training_section(manifest: dict, metrics: dict | None, data: dict, names: list[str]) -> list[str]:
    lines = ["## Training data and settings", ""]
    settings = manifest.get("settings") or {}
    if not settings:
        lines += ["This directory records no training run of its own"
                  + (" (it was combined from models that do)." if manifest.get("combined_from") else "."), ""]
        return lines
    lines += ["| head | train | dev |", "|---|---|---|"]
    for name in names:
        entry = data.get(name, {})
        lines.append(f"| `{name}` | {file_name(entry.get('train', '-'))} | {file_name(entry.get('dev', '-'))} |")
    lines += ["", "| setting | value |", "|---|---|"]
    for key, label in TRAINING_ROWS:
        if key in settings and not (key == "sampling" and len(names) == 1):
            lines.append(f"| {label} | {settings[key]} |")
    kept = (metrics or {}).get("kept")
    if isinstance(kept, dict) and kept.get("epoch") is not None:
        lines.append(f"| kept epoch | {kept['epoch']} (by {kept.get('by', '?')}) |")
    return lines + ["", "Every setting is in `config.yaml`: `bertheads train --config config.yaml --out DIR` trains "
                    "it again.", ""]


def number(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def evaluation_section(metrics: dict | None, dev: dict, data: dict, names: list[str]) -> list[str]:
    lines = ["## Evaluation", ""]
    if not dev:
        return lines + ["No dev set was given, so no evaluation is recorded.", ""]
    kept = (metrics or {}).get("kept")
    when = f" of the kept epoch ({kept['epoch']})" if isinstance(kept, dict) and "epoch" in kept else ""
    lines += [f"Dev metrics{when}, as in `metrics.json`:", "", "| head | dev | metric | value |", "|---|---|---|---|"]
    for name in names:
        where = file_name(data.get(name, {}).get("dev", "-"))
        for key, value in scalar_metrics(dev.get(name, {})).items():
            lines.append(f"| `{name}` | {where} | {key} | {number(value)} |")
    nothing = (metrics or {}).get("learned_nothing") or {}
    lines += [""] + [f"**Warning: `{name}` learned nothing**: {why} on the dev set; its outputs are no better "
                     f"than a guess. Do not use it as it is." for name, why in nothing.items() if name in names]
    return lines + [""] + calibration_section(dev, names, (metrics or {}).get("calibration") or {})


def calibration_section(dev: dict, names: list[str], refitted: dict) -> list[str]:
    """What the scores mean: each head's temperature, and its ECE and Brier score before and
    after it, measured on the half of the data it was not fitted on (dev, or the file
    `bertheads calibrate` fitted it on: `refitted`)."""
    found = {n: refitted.get(n) or dev.get(n, {}).get("calibration") for n in names}
    found = {n: c for n, c in found.items() if isinstance(c, dict)}
    if not found:
        return []
    files = sorted({file_name(c["fitted_on"]) for c in found.values() if c.get("fitted_on")})
    on = f"the file it was refitted on ({', '.join(files)})" if files else "dev"
    lines = ["### Calibration", "",
             f"Each head's scores are a softmax of its logits divided by a temperature fitted on {on}; ECE (15 "
             f"bins) and Brier score are measured on cross-fitted halves of {on} (the temperature fitted on one "
             "half, measured on the other, both ways). \"ECE floor\" is what a perfectly calibrated model with "
             "these scores would measure on a half: an ECE near it is as small as so few rows can show. "
             "`--no-calibrate` gives the raw scores.", "",
             "| head | temperature | ECE before | ECE after | ECE floor | Brier before | Brier after | accuracy |",
             "|---|---|---|---|---|---|---|---|"]
    for name, c in found.items():
        if c.get("none"):
            lines.append(f"| `{name}` | none: {c['none']} | | | | | | |")
            continue
        cells = [c.get(k) for k in ("temperature", "ece_before", "ece_after", "ece_floor", "brier_before",
                                    "brier_after", "accuracy")]
        lines.append(f"| `{name}` | " + " | ".join("-" if v is None else number(float(v)) for v in cells) + " |")
    notes = [f"`{name}`: {c['fitted']}." for name, c in found.items() if c.get("fitted")]  # a kind's own calibration
    return lines + ([""] + notes if notes else []) + [""]


def license_note(manifest: dict) -> str:
    """What the card says of its license beside the front matter's."""
    declared = (manifest.get("settings") or {}).get("license")
    base = checkpoint_metadata(manifest).get("license")
    note = f"; declared license: {declared}" if declared else "; no license declared (give one with `license`)"
    return note + (f"; the base checkpoint's: {base}" if base else "")


def limits_section(tasks: dict, texts: dict, data: dict, names: list[str], manifest: dict) -> list[str]:
    files = sorted({file_name(d["train"]) for d in data.values() if d.get("train")})
    lines = ["## Intended use and limits", "",
             f"- Made for inputs like its training data{' (' + ', '.join(files) + ')' if files else ''}; measure "
             f"it on your own data before relying on it.",
             f"- The dev metrics say how it does on data like the dev file{'s' if len(names) > 1 else ''}, "
             f"not elsewhere.",
             "- It inherits the biases, the language coverage and the license terms of its base checkpoint and of "
             "its training data" + license_note(manifest) + "."]
    for name in names:
        prefix = f"`{name}`: " if len(names) > 1 else ""
        lines += [f"- {prefix}{limit}" for limit in texts[name].limits]
    return lines + [""]


# -- the three forms: a saved model, a transformers export, an ONNX export -----------------------
def saved_usage(name: str, tasks: dict) -> Usage:
    """A bertheads model directory: the CLI and the Python API."""
    several = len(tasks) > 1
    cli = "\n".join(f"bertheads predict {name}{f' --head {n}' if several else ''} --input INPUTS" for n in tasks)
    cli += f"\nbertheads evaluate {name}{' --head NAME' if several else ''} --data DEV_FILE"
    calls = "\n".join(f"print(model.predict([{t.publishing.card_text().example!r}]{f', head={n!r}' if several else ''}))"
                      for n, t in tasks.items())
    return Usage(LIBRARY, [("With the `bertheads` command line (inputs in the formats of each head's kind):",
                            "bash", cli),
                           ("In Python:", "python", f"import bertheads\n\nmodel = bertheads.load({name!r})\n{calls}")],
                 [f"`bertheads export {name} --to hf --out OUT{' --head NAME' if several else ''}` writes a "
                  f"transformers model of one head; `--to onnx` one ONNX graph of every head."])


def hf_usage(out: str, task, name: str, info: dict) -> Usage:
    """A transformers directory of one head."""
    notes = [f"Exported by `bertheads export --to hf` from head `{name}` of the bertheads model "
             f"`{file_name(info.get('source', ''))}` as `{info.get('class')}`; on a check batch its outputs matched "
             f"the head's within {info.get('max_abs_diff', 0):.1e}."]
    if info.get("pipeline_options"):
        notes.append("Pipeline options that give bertheads' own reading: "
                     + ", ".join(f"`{k}={v!r}`" for k, v in info["pipeline_options"].items()) + ".")
    return Usage("transformers", [("With transformers:", "python", task.exporting.usage(out))], notes,
                 tags=["transformers"])


def onnx_usage(out: Path, directory: Path, tokenizer: str, manifest: dict, tasks: dict, meta: dict) -> Usage:
    """An ONNX export: bertheads' runtime switch (when it sits at DIR/onnx) and the raw session."""
    graphs = meta.get("graphs", {})
    snippets = []
    model = file_name(directory)
    inside = out.name == "onnx" and out.parent.resolve() == directory.resolve()
    graph = f"{model}/onnx/" if inside else f"{out.name}/"
    graph += graphs.get("fp32", {}).get("file", "model.onnx")
    if Path(tokenizer).resolve() == (directory / "encoder").resolve():
        tokenizer = f"{model}/encoder"
    else:  # a head-only model: the checkpoint it names
        tokenizer = base_model(manifest) or tokenizer
    if inside:
        precision = ", precision='int8'" if "int8" in graphs else ""
        calls = "\n".join(f"print(model.predict([{t.publishing.card_text().example!r}]"
                          f"{f', head={n!r}' if len(tasks) > 1 else ''}))" for n, t in tasks.items())
        snippets.append(("With bertheads (the same reading and decoding as the torch model):", "python",
                         f"import bertheads\n\nmodel = bertheads.load({model!r}, runtime='onnx'{precision})\n{calls}"))
    snippets.append(("With ONNX Runtime alone (raw head outputs; a pair or a question and passage go in as the "
                     "tokenizer's text pair):", "python",
                     "import onnxruntime as ort\nfrom transformers import AutoTokenizer\n\n"
                     f"tokenizer = AutoTokenizer.from_pretrained({tokenizer!r})\n"
                     f"session = ort.InferenceSession({graph!r})\n"
                     "inputs = tokenizer(['A sample text.'], return_tensors='np', return_token_type_ids=True)\n"
                     "wanted = {i.name for i in session.get_inputs()}\n"
                     "outputs = session.run(None, {k: v.astype('int64') for k, v in inputs.items() if k in wanted})\n"
                     "print(dict(zip([o.name for o in session.get_outputs()], outputs)))"))
    files = ", ".join(f"`{g.get('file')}` (the fp32 graph as OpenVINO IR, weights in `{g.get('weights')}`; "
                      f"`openvino.Core().compile_model` reads it)" if p == "openvino" else f"`{g.get('file')}` ({p})"
                      for p, g in graphs.items())
    notes = [f"Graphs: {files}; inputs `input_ids`, `attention_mask`, `token_type_ids` (int64, `[batch, seq]`)."]
    notes += [f"Output `{n}`: {t.publishing.card_text().raw_outputs}." for n, t in tasks.items()]
    notes.append(f"Exported from the bertheads model `{model}`; the fp32 graph's outputs matched torch's within "
                 f"{graphs.get('fp32', {}).get('max_abs_diff_vs_torch', 0):.1e} on a check batch (`export.json`).")
    return Usage(LIBRARY, snippets, notes, tags=["onnx"])


def card_or_none(build: Callable[[], str], where: Path | str) -> str | None:
    """The card `build` makes, or None with a warning when it fails: the model matters more."""
    try:
        return build()
    except Exception as exc:  # a card is never worth a lost model
        reason = str(exc).splitlines()[0] if str(exc) else ""
        log.warning(f"{where}: no model card written ({type(exc).__name__}: {reason})")
        return None


def write_card(directory: Path, build: Callable[[], str], where: Path | str) -> None:
    """Write README.md into `directory` (a directory being built atomically), unless the card
    cannot be made (`card_or_none`)."""
    text = card_or_none(build, where)
    if text is not None:
        (Path(directory) / CARD).write_text(text, encoding="utf-8")
