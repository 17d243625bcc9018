"""`bertheads extract`: frozen-encoder vectors for other tools.

Every input text (or text pair) runs through the encoder once; the chosen layers are merged
(`--combine`) into one vector per word piece, and `--pool` makes one vector per text.

```
DIR/features.safetensors     (--format safetensors) tensors named as the .npy files below
DIR/tokens.npy               [total pieces, dim]  one row per word piece, texts one after another
DIR/token_offsets.npy        [total pieces, 2]    int32 character start, end of each piece
DIR/token_segments.npy       [total pieces]       int8: 0 first text, 1 second text, -1 special token
DIR/pooled.npy               [texts, dim]         one row per text (--pool cls|mean; absent for none)
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
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from bertheads.errors import UserError, where
from bertheads.features import LayerCombine, accept_layer_lists, parse_layers
from bertheads.packing import INFERENCE_BATCH, INFERENCE_TOKENS, encoder_batch, run_batches, sorted_batches
from bertheads.readers import file_format, read_jsonl, read_lines, read_text
from bertheads.rowfiles import create_npy, create_safetensors

MARKER = "bertheads_extract"
INPUT_FORMATS = ("auto", "lines", "tsv", "csv", "jsonl", "conll", "squad")
POOLS = ("cls", "mean", "none")


@dataclass
class ExtractSettings:
    layers: str | None = None  # "-1" (default), "-1,-2,-3,-4", "all"
    combine: str = "concat"  # concat, sum or mean
    pool: str = "mean"  # cls, mean (over all the text's pieces, specials included) or none
    format: str = "safetensors"  # or npy
    max_length: int = 512
    dtype: str = "float32"
    tokens: bool = True  # write the per-piece vectors
    batch_size: int = INFERENCE_BATCH
    progress: bool = True


@dataclass
class TextInput:
    text: str
    pair: str | None = None
    line: int | None = None
    extra: dict = field(default_factory=dict)  # "id", "words" (character spans of given words)


# -- reading ---------------------------------------------------------------------------
def read_inputs(path: str | None, fmt: str = "auto") -> list[TextInput]:
    """Plain lines (a TAB separates a pair), the classify tables (TSV/CSV/JSONL), tag files
    (CoNLL, JSONL with "tokens") and qa files (SQuAD JSON, JSONL with question/context)."""
    if fmt not in INPUT_FORMATS:
        raise UserError(f"--input-format: expected one of {', '.join(INPUT_FORMATS)}, got {fmt!r}")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "lines":
        out = []
        for line_no, line in read_lines(path):
            text, tab, pair = line.partition("\t")
            if not text.strip():
                raise UserError(f"{where(path, line_no)}: empty text")
            out.append(TextInput(text, pair if tab else None, line_no))
        return out
    if fmt == "conll":
        from bertheads.tasks.tag import TagSpec, read_tagged

        return [words_input(e.words, e.line) for e in read_tagged(path, TagSpec(), "conll", need_labels=False)]
    if fmt == "squad":
        from bertheads.tasks.qa import read_examples

        return [TextInput(e.question, e.context, None, {"id": e.id}) for e in read_examples(path, False, fmt="squad")]
    if fmt == "jsonl":
        records = list(read_jsonl(path))
        keys = set().union(*(obj.keys() for _, obj in records)) if records else set()
        if keys & {"tokens", "words"}:
            return [words_input(jsonl_words(obj, path, line), line) for line, obj in records]
        if {"question", "context"} <= keys:
            return [TextInput(required(obj, "question", path, line), required(obj, "context", path, line), line,
                              {"id": obj["id"]} if "id" in obj else {}) for line, obj in records]
    from bertheads.tasks.classify import ClassifySpec, ClassifyTask

    return [TextInput(e.text, e.pair, e.line) for e in ClassifyTask.read_file(path, ClassifySpec(), fmt,
                                                                              need_labels=False)]


def detect_format(path: str | None) -> str:
    if path in (None, "-"):
        return "lines"
    from bertheads.tasks.tag import CONLL_SUFFIXES

    suffix = Path(path).suffix.lower()
    if suffix in CONLL_SUFFIXES:
        return "conll"
    if suffix == ".json" and read_text(path).lstrip().startswith("{"):
        return "squad"
    return file_format(path)


def words_input(words: list[str], line: int | None) -> TextInput:
    """Given words joined by single spaces; `extra["words"]` holds each word's span."""
    spans, position = [], 0
    for word in words:
        spans.append([position, position + len(word)])
        position += len(word) + 1
    return TextInput(" ".join(words), None, line, {"words": spans})


def jsonl_words(obj: dict, path, line: int) -> list[str]:
    words = obj.get("tokens", obj.get("words"))
    if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
        raise UserError(f"{where(path, line)}: 'tokens' must be a non-empty list of non-empty strings")
    return words


def required(obj: dict, key: str, path, line: int) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where(path, line)}: missing or empty {key!r}")
    return value


# -- encoding --------------------------------------------------------------------------
def encode_inputs(tokenizer, inputs: list[TextInput], max_length: int) -> list[dict]:
    """Model inputs with each piece's character offsets and segment (-1 for special tokens),
    packed like training (`packing.encode_texts`: longest-first truncation)."""
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


def model_max_length(encoder) -> int:
    limit = int(getattr(encoder.model.config, "max_position_embeddings", 512) or 512)
    tok_limit = getattr(encoder.tokenizer, "model_max_length", None)
    if isinstance(tok_limit, int) and 0 < tok_limit < 100_000:
        limit = min(limit, tok_limit)
    return limit


# -- writing ---------------------------------------------------------------------------
def check_out(out: Path) -> None:
    if out.exists():
        if not out.is_dir():
            raise UserError(f"{out}: exists and is not a directory")
        meta = out / "meta.json"
        ours = meta.is_file() and MARKER in meta.read_text(errors="replace")
        if any(out.iterdir()) and not ours:
            raise UserError(f"{out}: exists, is not empty and is not a bertheads extract output; choose another --out")


def extract(model: str, path: str | None, out: str | Path, settings: ExtractSettings | None = None,
            input_format: str = "auto", encoder=None) -> dict:
    """Write the features of every input in `path` to the directory `out`; returns its meta."""
    from bertheads.bundle import swap_into_place
    from bertheads.encoder import Encoder

    settings = settings or ExtractSettings()
    out = Path(out)
    check_out(out)
    if settings.pool not in POOLS:
        raise UserError(f"--pool: expected one of {', '.join(POOLS)}, got {settings.pool!r}")
    if settings.combine not in ("concat", "sum", "mean"):
        raise UserError(f"--combine: extract takes concat, sum or mean (scalar-mix is learned), got {settings.combine!r}")
    if settings.format not in ("safetensors", "npy"):
        raise UserError(f"--format: expected safetensors or npy, got {settings.format!r}")
    if settings.dtype not in ("float32", "float16"):
        raise UserError(f"--dtype: expected float32 or float16, got {settings.dtype!r}")
    if settings.pool == "none" and not settings.tokens:
        raise UserError("--pool none with --no-tokens leaves nothing to write")
    inputs = read_inputs(path, input_format)
    if not inputs:
        raise UserError(f"{where(path)}: no inputs")
    encoder = encoder or Encoder.load(model)
    limit = model_max_length(encoder)
    if not 2 < settings.max_length <= limit:
        raise UserError(f"--max-length: expected 3..{limit} (the model's limit), got {settings.max_length}")
    layers = parse_layers(settings.layers, encoder.info.num_layers)
    combine = LayerCombine(len(layers), settings.combine)
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
    if settings.pool != "none":
        shapes["pooled"] = ((len(features), dim), settings.dtype)
    meta = {MARKER: 1, "model": model, "input": str(path) if path else "<stdin>", "layers": list(layers),
            "combine": settings.combine, "pool": settings.pool, "dim": dim, "dtype": settings.dtype,
            "max_length": settings.max_length, "texts": len(features), "tokens": total if settings.tokens else 0,
            "truncated": sum(f["truncated"] for f in features), "format": settings.format,
            "files": (["features.safetensors"] if settings.format == "safetensors"
                      else [f"{name}.npy" for name in shapes]) + ["index.jsonl", "meta.json"],
            "arrays": {name: {"shape": list(shape), "dtype": dtype} for name, (shape, dtype) in shapes.items()}}

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)
        if settings.format == "safetensors":
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
        for p in tmp.iterdir():
            p.chmod(0o644)
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def run_encoder(encoder, features: list[dict], layers: tuple[int, ...], combine: LayerCombine,
                settings: ExtractSettings, arrays: dict, starts: np.ndarray) -> None:
    """Encoder over length-sorted batches (side by side on a CPU: `packing.run_batches`); each
    text's rows go straight to their place on disk."""
    encoder.eval()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    encoder.to(device)
    pad_id = encoder.tokenizer.pad_token_id or 0
    lengths = [len(f["input_ids"]) for f in features]
    cls_only = settings.pool == "cls" and not settings.tokens
    bar = tqdm(total=len(features), desc="extract", unit="text", disable=not settings.progress or None,
               dynamic_ncols=True)

    def run(idx: list[int]) -> None:
        batch = encoder_batch([features[i] for i in idx], pad_id, device)
        states = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], layers=layers,
                         first_token_only=cls_only)  # T = 1 when only [CLS] of the last layer is kept
        vectors = combine(states).float()  # [B, T, dim]
        if settings.pool == "cls":
            pooled = vectors[:, 0]
        elif settings.pool == "mean":
            mask = batch["attention_mask"].unsqueeze(-1).to(vectors.dtype)
            pooled = (vectors * mask).sum(1) / mask.sum(1)
        vectors = vectors.cpu().numpy()
        for j, i in enumerate(idx):
            if settings.tokens:
                arrays["tokens"].write(int(starts[i]), vectors[j, : lengths[i]])
            if settings.pool != "none":
                arrays["pooled"].write(i, pooled[j : j + 1].cpu().numpy())

    try:
        run_batches(sorted_batches(lengths, settings.batch_size, max_tokens=INFERENCE_TOKENS), run, device, bar)
    finally:
        bar.close()


def write_index(path: Path, inputs: list[TextInput], features: list[dict], starts: np.ndarray, tokenizer) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i, (x, f) in enumerate(zip(inputs, features)):
            record = {"row": i, "line": x.line, **({"id": x.extra["id"]} if "id" in x.extra else {}),
                      "text": x.text, "pair": x.pair, "tokens": [int(starts[i]), int(starts[i + 1])],
                      "pieces": tokenizer.convert_ids_to_tokens(f["input_ids"]), "offsets": f["offsets"],
                      "segments": f["segments"], "truncated": f["truncated"]}
            if "words" in x.extra:
                record["words"] = x.extra["words"]
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


# -- command line ----------------------------------------------------------------------
def add_parser(sub) -> dict:
    """Add `bertheads extract` to the CLI's subcommands; returns {"extract": handler}."""
    p = sub.add_parser("extract", help="frozen-encoder vectors per word piece and per text, for other tools")
    p.add_argument("--model", default="default", help="'default', a checkpoint directory or a saved bertheads model")
    p.add_argument("--input", help="plain lines (TAB separates a pair), TSV/CSV/JSONL, CoNLL or SQuAD JSON; default stdin")
    p.add_argument("--input-format", choices=INPUT_FORMATS, default="auto")
    p.add_argument("--out", required=True, help="output directory (replaced atomically)")
    p.add_argument("--layers", default=None, help="hidden layers: -1 (default), -1,-2,-3,-4, all; 0 is the embeddings")
    p.add_argument("--combine", choices=("concat", "sum", "mean"), default="concat")
    p.add_argument("--pool", choices=POOLS, default="mean", help="per-text vector: mean of the pieces (default), "
                                                                 "the [CLS] piece, or none")
    p.add_argument("--format", choices=("safetensors", "npy"), default="safetensors")
    p.add_argument("--max-length", type=int, default=512, help="pieces per input; longer inputs are cut (index: truncated)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--no-tokens", action="store_true", help="write only the pooled vectors")
    p.add_argument("--batch-size", type=int, default=INFERENCE_BATCH)
    p.add_argument("--no-progress", action="store_true")
    accept_layer_lists(p)
    return {"extract": run}


def run(args) -> int:
    import sys

    model = args.model
    if model not in (None, "", "default") and (Path(model) / "bertheads.json").is_file():
        model = str(Path(model) / "encoder")  # a saved bertheads model: its (fine-tuned) encoder
    settings = ExtractSettings(layers=args.layers, combine=args.combine, pool=args.pool, format=args.format,
                               max_length=args.max_length, dtype=args.dtype, tokens=not args.no_tokens,
                               batch_size=args.batch_size, progress=not args.no_progress)
    meta = extract(model, args.input, args.out, settings, args.input_format)
    cut = f", {meta['truncated']} cut at --max-length {meta['max_length']}" if meta["truncated"] else ""
    print(f"wrote {args.out}: {meta['texts']} texts, {meta['tokens']} pieces, dim {meta['dim']}{cut}",
          file=sys.stderr)
    return 0
