"""`bertheads extract`: frozen-encoder vectors for other tools.

Every input text (or text pair) runs through the encoder once; the chosen layers are merged
(`--layer-combine`) into one vector per word piece, and `--vector-pool` makes one vector per text.

```
DIR/features.safetensors     (--output-format safetensors) tensors named as the .npy files below
DIR/tokens.npy               [total pieces, dim]  one row per word piece, texts one after another
DIR/token_offsets.npy        [total pieces, 2]    int32 character start, end of each piece
DIR/token_segments.npy       [total pieces]       int8: 0 first text, 1 second text, -1 special token
DIR/pooled.npy               [texts, dim]         one row per text (--vector-pool cls|mean; absent for none)
DIR/index.jsonl              one line per input, in input order: {"row", "line", "text", "pair",
                             "tokens": [start, end), "pieces", "offsets", "segments", "truncated",
                             and "id" / "words" when the input format has them}
DIR/meta.json                model, layers, combine, pool, dim, dtype, counts, files
```
A piece's offsets index its own segment's text: `text[start:end]` (or `pair[start:end]`).
The output directory is written whole into a temporary sibling and renamed into place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertheads.base.errors import UserError, where
from bertheads.base.machine import resolve_device
from bertheads.base.schema import said, setting
from bertheads.base.values import positive_int
from bertheads.compute.batching import INFERENCE_BATCH, INFERENCE_TOKENS
from bertheads.compute.runner import run_heads
from bertheads.compute.states import EncoderStates, combined
from bertheads.encoder.layers import LayerCombine, parse_layers
from bertheads.encoder.pretrained import Encoder
from bertheads.store.atomic import atomic_directory
from bertheads.store.guard import check_target
from bertheads.store.rowfiles import create_npy, create_safetensors
from bertheads.tasks import TASKS
from bertheads.tasks.base import TextInput
from bertheads.text.readers import file_format, read_jsonl, read_lines

MARKER = "bertheads_extract"
def input_formats() -> tuple[str, ...]:
    """What `--input-format` takes: plain lines, and every kind's own formats (`text_formats`)."""
    return ("auto", "lines", *dict.fromkeys(fmt for cls in TASKS.values() for fmt in cls.parts.reading.text_formats))
POOLS = ("cls", "mean", "none")


EXTRACT_COMBINES = ("concat", "sum", "mean")  # scalar-mix is learned, so not for extract
OUTPUT_FORMATS = ("safetensors", "npy")


@dataclass
class ExtractSource:
    """What `bertheads extract` reads and where it writes (its settings are `ExtractSettings`)."""

    model: str = setting("default", "'default', a checkpoint directory or a saved bertheads model")
    input: str | None = setting(None, "plain lines (TAB separates a pair), TSV/CSV/JSONL, CoNLL or SQuAD JSON; "
                                      "default stdin")
    input_format: str = setting("auto", "format of --input (auto, lines, or a kind's own: see `input_formats`)")
    out: str = setting(None, "output directory (replaced atomically)", required=True)


@dataclass
class ExtractSettings:
    """`bertheads extract` settings (its flags are derived from these; the old flags `--combine`,
    `--pool` and `--format` are still read, with a warning)."""

    layers: str | None = setting(None, "hidden layers: -1 (the last; default), -1,-2,-3,-4, all; 0 is the embeddings")
    layer_combine: str = setting("concat", "how several layers merge", choices=EXTRACT_COMBINES,
                                 aliases=("--combine",))
    vector_pool: str = setting("mean", "per-text vector: mean of the pieces, the [CLS] piece, or none", choices=POOLS,
                               aliases=("--pool",))
    output_format: str = setting("safetensors", "array file format", choices=OUTPUT_FORMATS, aliases=("--format",))
    max_length: int = setting(512, "pieces per input; longer inputs are cut (index: truncated)", type=positive_int)
    dtype: str = setting("float32", "precision of the vectors", choices=("float32", "float16"))
    tokens: bool = setting(True, "write only the pooled vectors", negate=True)
    batch_size: int = setting(INFERENCE_BATCH, "inputs per batch", type=positive_int)
    progress: bool = setting(True, "no progress bar", negate=True)
    device: str = setting("auto", "auto (the first GPU when there is one, else MPS, else the CPU), cpu, cuda, cuda:N "
                                  "or mps")


# -- reading ---------------------------------------------------------------------------
def read_inputs(path: str | None, fmt: str = "auto") -> list[TextInput]:
    """Plain lines (a TAB separates a pair), or any task kind's own formats: the classify
    tables (TSV/CSV/JSONL), tag files (CoNLL, JSONL with "tokens"), qa files (SQuAD JSON,
    JSONL with question/context). Each kind says which formats and records are its own."""
    if fmt not in input_formats():
        raise UserError(f"{said('input_format')}: expected one of {', '.join(input_formats())}, got {fmt!r}")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "lines":
        out = []
        for line_no, line in read_lines(path):
            text, tab, pair = line.partition("\t")
            if not text.strip():
                raise UserError(f"{where(path, line_no)}: empty text")
            out.append(TextInput(text, pair if tab else None, line_no))
        return out
    keys: set[str] = set()
    if fmt == "jsonl":
        keys = set().union(*(obj.keys() for _, obj in read_jsonl(path)))
    kinds = [cls for cls in TASKS.values() if fmt in cls.parts.reading.text_formats]
    own = [cls for cls in kinds
           if not cls.parts.reading.generic_reader and (fmt != "jsonl" or cls.parts.reading.claims_records(keys))]
    reader = (own or [cls for cls in kinds if cls.parts.reading.generic_reader])[0]
    return reader.parts.reading.read_texts(path, fmt)


def detect_format(path: str | None) -> str:
    if path in (None, "-"):
        return "lines"
    for cls in TASKS.values():
        fmt = cls.parts.reading.sniff_format(path)
        if fmt:
            return fmt
    return file_format(path)


# -- encoding --------------------------------------------------------------------------
def encode_inputs(tokenizer, inputs: list[TextInput], max_length: int) -> list[dict]:
    """Model inputs with each piece's character offsets and segment (-1 for special tokens),
    packed like training (`text.encoding.encode_texts`: longest-first truncation)."""
    out: list[dict | None] = [None] * len(inputs)
    for has_pair in (False, True):
        idx = [i for i, x in enumerate(inputs) if (x.pair is not None) == has_pair]
        for start in range(0, len(idx), 1024):
            chunk = idx[start : start + 1024]
            texts = [inputs[i].text for i in chunk]
            pairs = [inputs[i].pair for i in chunk] if has_pair else None
            enc = tokenizer(texts, pairs, truncation="longest_first", max_length=max_length, padding=False,
                            return_attention_mask=False, return_token_type_ids=True, return_offsets_mapping=True)
            full = [len(ids) >= max_length for ids in enc["input_ids"]]
            if any(full):  # only inputs that fill the window can have been cut
                long = [k for k, f in enumerate(full) if f]
                whole = tokenizer([texts[k] for k in long], [pairs[k] for k in long] if has_pair else None,
                                  truncation=False, padding=False, return_attention_mask=False)["input_ids"]
                cut = {k for k, ids in zip(long, whole) if len(ids) > max_length}
            else:
                cut = set()
            for k, i in enumerate(chunk):
                segments = [-1 if s is None else s for s in enc.sequence_ids(k)]
                out[i] = {"input_ids": enc["input_ids"][k], "token_type_ids": enc["token_type_ids"][k],
                          "offsets": [list(o) for o in enc["offset_mapping"][k]], "segments": segments,
                          "truncated": k in cut}
    return out  # type: ignore[return-value]


def model_max_length(encoder) -> int | None:
    """The encoder's limit (`encoder.pretrained.max_tokens`; None: none known)."""
    return encoder.info.max_tokens


# -- writing ---------------------------------------------------------------------------
def check_out(out: Path, inputs=()) -> Path:
    """`out` once `store.guard.check_target` allows it (never over the input, the checkpoint
    read or a model); an earlier extract output (meta.json with its marker) is replaced."""
    check_target(out, "meta.json", inputs=inputs, what="a bertheads extract output")
    meta = out / "meta.json"
    if meta.is_file() and MARKER not in meta.read_text(errors="replace"):
        raise UserError(f"{said('out', str(out))}: exists, is not empty and is not a bertheads extract output; "
                        f"choose another {said('out')}")
    return out


def extract(model: str, path: str | None, out: str | Path, settings: ExtractSettings | None = None,
            input_format: str = "auto", encoder=None) -> dict:
    """Write the features of every input in `path` to the directory `out`; returns its meta."""
    settings = settings or ExtractSettings()
    out = check_out(Path(out), [path, *([model] if model and Path(str(model)).exists() else [])])
    if settings.vector_pool not in POOLS:
        raise UserError(f"{said('vector_pool')}: expected one of {', '.join(POOLS)}, got {settings.vector_pool!r}")
    if settings.layer_combine not in EXTRACT_COMBINES:
        raise UserError(f"{said('layer_combine')}: extract takes concat, sum or mean (scalar-mix is learned), "
                        f"got {settings.layer_combine!r}")
    if settings.output_format not in OUTPUT_FORMATS:
        raise UserError(f"{said('output_format')}: expected safetensors or npy, got {settings.output_format!r}")
    if settings.dtype not in ("float32", "float16"):
        raise UserError(f"{said('dtype')}: expected float32 or float16, got {settings.dtype!r}")
    if settings.vector_pool == "none" and not settings.tokens:
        raise UserError(f"{said('vector_pool', 'none')} with {said('tokens', False)} leaves nothing to write")
    inputs = read_inputs(path, input_format)
    if not inputs:
        raise UserError(f"{where(path)}: no inputs")
    encoder = encoder or Encoder.load(model)
    limit = model_max_length(encoder)
    if not 2 < settings.max_length <= (limit or settings.max_length):
        raise UserError(f"{said('max_length')}: expected 3..{limit or 'any'} (the model's limit), got {settings.max_length}")
    layers = parse_layers(settings.layers, encoder.info.num_layers)
    combine = LayerCombine(len(layers), settings.layer_combine)
    dim = combine.output_size(encoder.info.hidden_size)
    features = encode_inputs(encoder.tokenizer, inputs, settings.max_length)
    lengths = [len(f["input_ids"]) for f in features]
    starts = np.zeros(len(features) + 1, dtype=np.int64)
    starts[1:] = np.cumsum(lengths)
    total = int(starts[-1])

    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    if settings.tokens:
        shapes.update(tokens=((total, dim), settings.dtype), token_offsets=((total, 2), "int32"),
                      token_segments=((total,), "int8"))
    if settings.vector_pool != "none":
        shapes["pooled"] = ((len(features), dim), settings.dtype)
    meta = {MARKER: 1, "model": model, "input": str(path) if path else "<stdin>", "layers": list(layers),
            "combine": settings.layer_combine, "pool": settings.vector_pool, "dim": dim, "dtype": settings.dtype,
            "max_length": settings.max_length, "texts": len(features), "tokens": total if settings.tokens else 0,
            "truncated": sum(f["truncated"] for f in features), "format": settings.output_format,
            "files": (["features.safetensors"] if settings.output_format == "safetensors"
                      else [f"{name}.npy" for name in shapes]) + ["index.jsonl", "meta.json"],
            "arrays": {name: {"shape": list(shape), "dtype": dtype} for name, (shape, dtype) in shapes.items()}}

    with atomic_directory(out) as tmp:
        if settings.output_format == "safetensors":
            files = [create_safetensors(tmp / "features.safetensors", shapes, {"format": "pt", MARKER: "1"})]
            arrays = files[0].arrays
        else:
            files = [create_npy(tmp / f"{name}.npy", shape, dtype) for name, (shape, dtype) in shapes.items()]
            arrays = {name: f["array"] for name, f in zip(shapes, files)}
        try:
            if settings.tokens:
                for i, f in enumerate(features):
                    arrays["token_offsets"].write(int(starts[i]), np.asarray(f["offsets"], dtype=np.int32))
                    arrays["token_segments"].write(int(starts[i]), np.asarray(f["segments"], dtype=np.int8))
            run_encoder(encoder, features, layers, combine, settings, arrays, starts)
        finally:
            for f in files:
                f.close()
        write_index(tmp / "index.jsonl", inputs, features, starts, encoder.tokenizer)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def run_encoder(encoder, features: list[dict], layers: tuple[int, ...], combine: LayerCombine,
                settings: ExtractSettings, arrays: dict, starts: np.ndarray) -> None:
    """The encoder's states (`compute/states.py`) over length-sorted batches; each text's rows,
    merged over the layers, go straight to their place on disk."""
    wanted = (["tokens"] if settings.tokens else []) + ([settings.vector_pool] if settings.vector_pool != "none"
                                                        else [])
    runner = EncoderStates(encoder, layers, wanted, resolve_device(settings.device))
    lengths = [len(f["input_ids"]) for f in features]

    def write(idx: list[int], states: dict, _) -> None:
        for j, i in enumerate(idx):
            if settings.tokens:
                arrays["tokens"].write(int(starts[i]), combined(states["tokens"][j, : lengths[i]], combine.mode))
            if settings.vector_pool != "none":
                arrays["pooled"].write(i, combined(states[settings.vector_pool][j : j + 1], combine.mode))

    run_heads(runner, features, wanted, settings.batch_size, INFERENCE_TOKENS,
              "extract" if settings.progress else None, sink=write, unit="text")


def write_index(path: Path, inputs: list[TextInput], features: list[dict], starts: np.ndarray, tokenizer) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i, (x, f) in enumerate(zip(inputs, features)):
            record = {"row": i, "line": x.line, **({"id": x.extra["id"]} if "id" in x.extra else {}),
                      **x.texts(), "tokens": [int(starts[i]), int(starts[i + 1])],
                      "pieces": tokenizer.convert_ids_to_tokens(f["input_ids"]), "offsets": f["offsets"],
                      "segments": f["segments"], "truncated": f["truncated"]}
            if "words" in x.extra:
                record["words"] = x.extra["words"]
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
