"""Feature extraction: --mode features (frozen encoder, cached states), the cache's reuse and
invalidation, and `bertheads extract`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli import main as cli
from bertheads.encoder.pretrained import Encoder
from bertheads.store.features_cache import (
    CachedFeatures,
    CacheSettings,
    cache_key,
    encoder_identity,
    ensure_cache,
)
from bertheads.text.encoding import encode_texts

QUICK = bertheads.TrainSettings(epochs=2, batch_size=8, lr=5e-3, progress=False)


@pytest.fixture
def count_encoder_calls(monkeypatch):
    """A list that grows by one entry per encoder forward pass."""
    calls: list[int] = []
    original = Encoder.forward

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Encoder, "forward", counted)
    return calls


@pytest.fixture
def count_first_token_layers(monkeypatch):
    """A list that grows by one entry each time a last layer runs for [CLS] alone."""
    import bertheads.encoder.first_token as encoder_module

    calls: list[int] = []
    real = encoder_module.first_token_layer
    monkeypatch.setattr(encoder_module, "first_token_layer", lambda *a: calls.append(1) or real(*a))
    return calls


def sentiment(write, n: int = 16, name: str = "train.tsv") -> str:
    rows = "".join(f"a good fun film number {i}\t1\nan awful dull bore {i} times over\t0\n" for i in range(n))
    return write(name, "sentence\tlabel\n" + rows)


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "features").iterdir() if not p.name.startswith("."))


@pytest.mark.slow
def test_classify_features_mode_trains_the_head_and_reuses_the_cache(default_model_dir, write, tmp_path,
                                                                    count_encoder_calls):
    from safetensors.torch import load_file

    # the real checkpoint: a random tiny BERT's [CLS] barely depends on the text
    train = sentiment(write)
    cache = tmp_path / "cache"
    options = dict(mode="features", layers="-1,-2", cache_dir=str(cache))
    model = bertheads.train("classify", train, None, None, model=default_model_dir, settings=QUICK, **options)
    assert count_encoder_calls, "the first run builds the cache with the encoder"
    [entry] = entries(cache)
    meta = json.loads((entry / "meta.json").read_text())
    # the checkpoint declares mean pooling: one pooled row per sentence and layer
    assert meta["positions"] == "mean" and meta["rows"] == 32 and meta["layers"] == [6, 5]
    assert model.task().spec.pooling == "mean"
    assert np.load(entry / "states.npy", mmap_mode="r").shape == (32, 2, 384)

    # frozen: the encoder is the checkpoint, unchanged; the head learned the task
    original = load_file(str(Path(default_model_dir) / "model.safetensors"))
    for name, value in model.net.encoder.model.state_dict().items():
        assert torch.equal(value, original[name]), name
    assert [p["label"] for p in model.predict(["a good fun film number 3", "an awful dull bore 3 times over"])] == [1, 0]
    assert model.evaluate(train)["accuracy"] == 1.0

    # same key (the combine is not part of it): no encoder pass at all, same entry
    count_encoder_calls.clear()
    scalar = bertheads.train("classify", train, None, None, model=default_model_dir, settings=QUICK,
                             combine="scalar-mix", **options)
    assert count_encoder_calls == []
    assert entries(cache) == [entry]
    assert scalar.net.heads["classify"].combine.mode == "scalar-mix"


def build(encoder, features, layers, positions, root, dtype="float32") -> CachedFeatures:
    settings = CacheSettings(Path(root), dtype=dtype, progress=False, batch_size=2)
    key = cache_key(encoder_identity(encoder), features, layers, positions, dtype, True)
    directory = ensure_cache(encoder, features, key, layers, positions, settings, {})
    return CachedFeatures(directory, [len(f["input_ids"]) for f in features], 0)


@pytest.mark.parametrize("dtype,tolerance", [("float32", 1e-5), ("float16", 1e-2)])
def test_cached_states_equal_the_live_encoder(tiny_bert, tmp_path, dtype, tolerance):
    encoder = Encoder.load(tiny_bert).eval()
    texts = ["short one", "a somewhat longer sentence with more pieces in it", "mid length text here"]
    features = encode_texts(encoder.tokenizer, texts, [None, "with a pair", None], max_length=32)
    tokens = build(encoder, features, (2, 0), "tokens", tmp_path, dtype)
    first = build(encoder, features, (2, 0), "cls", tmp_path, dtype)
    for f in features:
        f["labels"] = 0
    idx = [2, 0, 1]
    batch = tokens.batch(idx, features)
    first_batch = first.batch(idx, features)
    assert batch["labels"].tolist() == [0, 0, 0] and batch["attention_mask"].shape == batch["input_ids"].shape
    with torch.inference_mode():
        for j, i in enumerate(idx):
            ids = torch.tensor([features[i]["input_ids"]])
            live = encoder(ids, torch.ones_like(ids), torch.tensor([features[i]["token_type_ids"]]), layers=(2, 0))
            n = ids.shape[1]
            for layer in range(2):
                got = batch["states"][layer][j]
                torch.testing.assert_close(got[:n], live[layer][0], atol=tolerance, rtol=tolerance)
                assert torch.count_nonzero(got[n:]) == 0  # padding
                torch.testing.assert_close(first_batch["states"][layer][j, 0], live[layer][0, 0],
                                           atol=tolerance, rtol=tolerance)
    assert first_batch["states"][0].shape == (3, 1, 32)


def test_cls_of_the_last_layer_is_cached_and_extracted_by_the_first_token_path(tiny_bert, tmp_path, write,
                                                                               count_first_token_layers):
    """A cache (or extract output) of [CLS] of the last layer alone runs that layer for [CLS]
    only, and gives the same vectors as the full pass."""
    from bertheads.inference.extract import ExtractSettings, extract

    encoder = Encoder.load(tiny_bert).eval()
    texts = ["short one", "a somewhat longer sentence with more pieces in it", "mid length text here"]
    features = encode_texts(encoder.tokenizer, texts, [None, "with a pair", None], max_length=32)
    for f in features:
        f["labels"] = 0
    first = build(encoder, features, (2,), "cls", tmp_path / "a")
    assert len(count_first_token_layers) == 2  # batches of 2: one call per batch
    full = build(encoder, features, (2,), "tokens", tmp_path / "b")
    assert len(count_first_token_layers) == 2
    idx = [0, 1, 2]
    torch.testing.assert_close(first.batch(idx, features)["states"][:, 0],
                               full.batch(idx, features)["states"][:, 0], atol=1e-5, rtol=1e-5)

    src = write("texts.txt", "\n".join(texts))
    extract(tiny_bert, src, tmp_path / "x", ExtractSettings(output_format="npy", vector_pool="cls", progress=False))
    calls = len(count_first_token_layers)
    extract(tiny_bert, src, tmp_path / "y", ExtractSettings(output_format="npy", vector_pool="cls", tokens=False, progress=False))
    assert len(count_first_token_layers) > calls
    np.testing.assert_allclose(np.load(tmp_path / "y" / "pooled.npy"), np.load(tmp_path / "x" / "pooled.npy"),
                               atol=1e-5)


def test_cache_builds_and_extract_run_batches_on_cpu_workers(tiny_bert, tmp_path, write, monkeypatch):
    """With 2 torch threads, cache and extract batches run on 2 single-threaded workers and
    write the same rows, in the same places, as a serial run."""
    import bertheads.compute.runner as packing_module
    from bertheads.inference.extract import ExtractSettings, extract

    used: list[int] = []
    real = packing_module.cpu_workers
    monkeypatch.setattr(packing_module, "cpu_workers", lambda device, n: used.append(real(device, n)) or used[-1])
    encoder = Encoder.load(tiny_bert).eval()
    texts = [f"{'very ' * (i % 7)}text number {i}" for i in range(15)]
    features = encode_texts(encoder.tokenizer, texts, max_length=32)
    src = write("texts.txt", "\n".join(texts))
    before = torch.get_num_threads()
    try:
        outputs = {}
        for threads in (2, 1):
            torch.set_num_threads(threads)
            outputs[threads] = (build(encoder, features, (1, 2), "tokens", tmp_path / f"c{threads}"),
                                extract(tiny_bert, src, tmp_path / f"x{threads}",
                                        ExtractSettings(output_format="npy", vector_pool="mean", progress=False, batch_size=2)))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert used == [(2, 1), (2, 1), (1, 1), (1, 1)]  # cache build, extract; with 2 threads, then with 1
    np.testing.assert_allclose(outputs[2][0].states, outputs[1][0].states, atol=1e-5)
    for name in ("tokens", "pooled"):
        np.testing.assert_allclose(np.load(tmp_path / "x2" / f"{name}.npy"), np.load(tmp_path / "x1" / f"{name}.npy"),
                                   atol=1e-5)


def test_every_part_of_the_key_counts(tiny_bert):
    encoder = Encoder.load(tiny_bert)
    ident = encoder_identity(encoder)
    tok = encoder.tokenizer
    long_text = ["one two three four five six seven eight nine ten eleven twelve"]
    base = encode_texts(tok, long_text, max_length=8)
    key = cache_key(ident, base, (2,), "tokens", "float16", True)
    assert key == cache_key(ident, encode_texts(tok, long_text, max_length=8), (2,), "tokens", "float16", True)
    changed = {
        "max_length": cache_key(ident, encode_texts(tok, long_text, max_length=10), (2,), "tokens", "float16", True),
        "data": cache_key(ident, encode_texts(tok, ["other words"], max_length=8), (2,), "tokens", "float16", True),
        "pair": cache_key(ident, encode_texts(tok, long_text, ["x"], max_length=8), (2,), "tokens", "float16", True),
        "layers": cache_key(ident, base, (1, 2), "tokens", "float16", True),
        "positions": cache_key(ident, base, (2,), "cls", "float16", True),
        "dtype": cache_key(ident, base, (2,), "tokens", "float32", True),
    }
    with torch.no_grad():
        encoder.model.embeddings.word_embeddings.weight[5, 0] += 1.0
    changed["weights"] = cache_key(encoder_identity(encoder), base, (2,), "tokens", "float16", True)
    assert len({key, *changed.values()}) == len(changed) + 1, changed


def test_cache_cap_and_a_failed_build_leave_nothing_behind(tiny_bert, write, tmp_path, monkeypatch):
    train = sentiment(write)
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match="^cache_max_gb="):
        bertheads.train("classify", train, None, None, model=tiny_bert, settings=QUICK, mode="features",
                        cache_dir=str(cache), cache_max_gb=1e-7)

    calls = []
    original = Encoder.forward

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Encoder, "forward", failing)
    encoder = Encoder.load(tiny_bert)
    features = encode_texts(encoder.tokenizer, ["one", "two two", "three three three"], max_length=16)
    with pytest.raises(RuntimeError):
        build(encoder, features, (2,), "tokens", cache)
    # no entry, no temporary directory (and no folder the failed build made)
    assert not (cache / "features").exists() or list((cache / "features").iterdir()) == []


def test_a_damaged_entry_is_built_again(tiny_bert, tmp_path, count_encoder_calls):
    encoder = Encoder.load(tiny_bert)
    features = encode_texts(encoder.tokenizer, ["one", "two two"], max_length=16)
    first = build(encoder, features, (2,), "tokens", tmp_path)
    calls = len(count_encoder_calls)
    build(encoder, features, (2,), "tokens", tmp_path)
    assert len(count_encoder_calls) == calls  # whole: reused
    states = first.directory / "states.npy"
    states.write_bytes(states.read_bytes()[:-64])
    again = build(encoder, features, (2,), "tokens", tmp_path)
    assert len(count_encoder_calls) > calls and again.states.shape == first.states.shape


def test_cli_features_mode_and_cap_error(tiny_bert, write, tmp_path, capsys):
    train = sentiment(write)
    out = tmp_path / "m"
    common = ["train", "classify", "--train", train, "--model", tiny_bert, "--epochs", "1", "--no-progress",
              "--mode", "features", "--layers", "-1,-2", "--cache-dir", str(tmp_path / "c")]
    assert cli.main([*common, "--out", str(out), "--cache-max-gb", "0.0000001"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # the settled run's line, said first, then one error line
    assert len(err) == 2 and " training examples " in err[0] and err[1].startswith("bertheads: error: --cache-max-gb")
    assert cli.main([*common, "--out", str(out)]) == 0
    manifest = json.loads((out / "bertheads.json").read_text())
    assert manifest["heads"]["classify"]["spec"]["mode"] == "features"
    assert manifest["heads"]["classify"]["spec"]["layers"] == [-1, -2]


# -- bertheads extract --------------------------------------------------------------------
def test_extract_rows_point_back_at_their_text(tiny_bert, write, tmp_path):
    from safetensors.numpy import load_file

    lines = ["Angela Merkel visited Paris.", "Short\tand a second text, paired", "naïve café, déjà vu!"]
    src = write("in.txt", "\n".join(lines) + "\n")
    out = tmp_path / "ext"
    assert cli.main(["extract", "--model", tiny_bert, "--input", src, "--out", str(out), "--layers", "-1,-2",
                     "--vector-pool", "mean", "--no-progress"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    arrays = load_file(str(out / "features.safetensors"))
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert meta["dim"] == 64 and meta["texts"] == 3 and arrays["pooled"].shape == (3, 64)
    assert arrays["tokens"].shape == (meta["tokens"], 64) == (index[-1]["tokens"][1], 64)
    tok = Encoder.load(tiny_bert).tokenizer
    for record, line in zip(index, lines):
        text, _, pair = line.partition("\t")
        assert record["text"] == text and record["pair"] == (pair or None)
        start, end = record["tokens"]
        assert end - start == len(record["pieces"]) == len(record["offsets"])
        assert arrays["token_offsets"][start:end].tolist() == record["offsets"]
        assert arrays["token_segments"][start:end].tolist() == record["segments"]
        for piece, (a, b), seg in zip(record["pieces"], record["offsets"], record["segments"]):
            if seg < 0:
                assert piece in tok.all_special_tokens
                continue
            source = (text, pair)[seg]
            # the uncased tokenizer lowercases and strips accents: compare through it
            assert tok.backend_tokenizer.normalizer.normalize_str(source[a:b]) == piece.removeprefix("##")
        # pooled = mean over the text's piece vectors
        np.testing.assert_allclose(arrays["pooled"][record["row"]], arrays["tokens"][start:end].mean(0), atol=1e-5)
    assert [r["segments"].count(1) > 0 for r in index] == [False, True, False]

    # the vectors are the encoder's layers, concatenated
    encoder = Encoder.load(tiny_bert).eval()
    ids = torch.tensor([tok(lines[0])["input_ids"]])
    with torch.inference_mode():
        live = encoder(ids, torch.ones_like(ids), torch.zeros_like(ids), layers=(-1, -2))
    np.testing.assert_allclose(arrays["tokens"][: ids.shape[1]], torch.cat(live, -1)[0].numpy(), atol=1e-5)


def test_extract_npy_task_formats_and_truncation(tiny_bert, write, tmp_path):
    from safetensors import safe_open

    from bertheads.inference.extract import ExtractSettings, extract

    conll = write("s.conll", "EU B-ORG\nrejects O\nGerman B-MISC\n\nPeter B-PER\nBlackburn I-PER")
    meta = extract(tiny_bert, conll, tmp_path / "c", ExtractSettings(output_format="npy", vector_pool="cls", progress=False))
    index = [json.loads(x) for x in (tmp_path / "c" / "index.jsonl").read_text().splitlines()]
    assert [r["text"] for r in index] == ["EU rejects German", "Peter Blackburn"]
    assert [index[1]["text"][a:b] for a, b in index[1]["words"]] == ["Peter", "Blackburn"]
    tokens = np.load(tmp_path / "c" / "tokens.npy", mmap_mode="r")
    pooled = np.load(tmp_path / "c" / "pooled.npy")
    np.testing.assert_array_equal(pooled[1], tokens[index[1]["tokens"][0]])  # cls = the first piece
    assert meta["files"] == ["tokens.npy", "token_offsets.npy", "token_segments.npy", "pooled.npy",
                             "index.jsonl", "meta.json"]

    table = write("t.tsv", "sentence1\tsentence2\tlabel\nfirst text\tsecond text\t1\n"
                           "one two three four five six seven eight nine ten\tx\t0\n")
    meta = extract(tiny_bert, table, tmp_path / "t", ExtractSettings(max_length=8, tokens=False, progress=False))
    index = [json.loads(x) for x in (tmp_path / "t" / "index.jsonl").read_text().splitlines()]
    assert [r["pair"] for r in index] == ["second text", "x"] and [r["truncated"] for r in index] == [False, True]
    assert meta["truncated"] == 1 and meta["tokens"] == 0
    with safe_open(str(tmp_path / "t" / "features.safetensors"), "np") as fh:
        assert list(fh.keys()) == ["pooled"] and fh.get_tensor("pooled").shape == (2, 32)

    squad = {"data": [{"title": "t", "paragraphs": [{"context": "The capital is Rome.", "qas": [
        {"id": "q1", "question": "What is the capital?", "answers": [{"text": "Rome", "answer_start": 15}]}]}]}]}
    src = write("dev.json", json.dumps(squad))
    extract(tiny_bert, src, tmp_path / "q", ExtractSettings(tokens=False, progress=False))
    [record] = [json.loads(x) for x in (tmp_path / "q" / "index.jsonl").read_text().splitlines()]
    assert (record["id"], record["text"], record["pair"]) == ("q1", "What is the capital?", "The capital is Rome.")

    # replacing an earlier output is fine; another directory's files are not overwritten
    extract(tiny_bert, table, tmp_path / "t", ExtractSettings(tokens=False, progress=False))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not a bertheads extract output"):
        extract(tiny_bert, table, tmp_path / "mine", ExtractSettings(progress=False))


def test_extract_bad_input_is_one_line(tiny_bert, write, tmp_path, capsys):
    src = write("bad.jsonl", '{"text": "fine"}\n{"text": \n')
    assert cli.main(["extract", "--model", tiny_bert, "--input", src, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.jsonl:2" in err[0]
    assert not (tmp_path / "o").exists()


# -- tag and qa in features mode ---------------------------------------------------------
def ner_conll(n: int) -> str:
    people, places = ["Angela Merkel", "John Smith", "Maria Garcia"], ["Paris", "Berlin", "Madrid"]
    blocks = []
    for i in range(n):
        person, place = people[i % 3].split(), places[(i // 3) % 3]
        words = [(person[0], "B-PER"), (person[1], "I-PER"), ("visited", "O"), (place, "B-LOC"), (".", "O")]
        blocks.append("\n".join(f"{w} {t}" for w, t in words))
    return "\n\n".join(blocks) + "\n"


def test_tag_features_mode_linear_and_bilstm_share_one_cache(tiny_bert, write, tmp_path, count_encoder_calls):
    train = write("train.conll", ner_conll(18))
    cache = tmp_path / "cache"
    options = dict(mode="features", layers="-1,-2,-3", cache_dir=str(cache))
    settings = bertheads.TrainSettings(epochs=8, batch_size=9, lr=5e-2, progress=False)
    linear = bertheads.train("tag", train, None, None, model=tiny_bert, settings=settings, **options)
    [entry] = entries(cache)
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["positions"] == "tokens" and meta["layers"] == [2, 1, 0]
    assert meta["rows"] == int(np.load(entry / "offsets.npy")[-1]) == sum(
        len(f["input_ids"]) for f in linear.task().modeling.encode(linear.task().reading.read(train), linear.net.encoder.tokenizer))

    count_encoder_calls.clear()
    bilstm = bertheads.train("tag", train, None, tmp_path / "m", model=tiny_bert, settings=settings,
                             head_type="bilstm", lstm_size=16, **options)
    assert count_encoder_calls == [] and entries(cache) == [entry]
    lstm = bilstm.net.heads["tag"].lstm  # --head bilstm --lstm-size 16: two bidirectional layers of 16
    assert (type(lstm).__name__, lstm.hidden_size, lstm.num_layers, lstm.bidirectional) == ("LSTM", 16, 2, True)
    assert linear.net.heads["tag"].lstm is None
    for model in (linear, bilstm):
        assert model.evaluate(train)["f1"] > 0.8  # learned from the cached states
    [prediction] = bilstm.predict(["Maria Garcia visited Berlin ."])
    assert [(e["text"], e["type"]) for e in prediction["entities"]] == [("Maria Garcia", "PER"), ("Berlin", "LOC")]

    # extract reads a saved model's encoder, and CoNLL input by its name
    assert cli.main(["extract", "--model", str(tmp_path / "m"), "--input", train, "--out", str(tmp_path / "x"),
                     "--layers", "all", "--combine", "mean", "--no-progress"]) == 0
    meta = json.loads((tmp_path / "x" / "meta.json").read_text())
    assert (meta["texts"], meta["dim"], meta["layers"]) == (18, 32, [0, 1, 2])


def test_qa_features_mode_trains_on_cached_windows(tiny_bert, write, tmp_path):
    cities = ["Paris", "Berlin", "Rome", "Madrid"]
    rows = []
    for i in range(16):
        context = f"The old town has bridges and the capital is {cities[i % 4]} . Rivers run through it and ships sail ."
        rows.append(json.dumps({"id": f"q{i}", "question": "What is the capital?", "context": context,
                                "answers": {"text": [cities[i % 4]], "answer_start": [context.index(cities[i % 4])]}}))
    train = write("train.jsonl", "\n".join(rows) + "\n")
    cache = tmp_path / "cache"
    model = bertheads.train("qa", train, None, tmp_path / "m", model=tiny_bert, mode="features", layers="-1,0",
                            cache_dir=str(cache), max_length=24, stride=4, max_question_length=8,
                            settings=bertheads.TrainSettings(epochs=6, batch_size=8, lr=1e-2, progress=False))
    [entry] = entries(cache)
    meta = json.loads((entry / "meta.json").read_text())
    windows = model.task().modeling.encode(model.task().reading.read(train), model.net.encoder.tokenizer)
    assert meta["positions"] == "tokens" and meta["features"] == len(windows) > 16  # passages > one window
    assert meta["rows"] == sum(len(w["input_ids"]) for w in windows)
    assert model.evaluate(train)["f1"] > 50.0
    [answer] = bertheads.load(tmp_path / "m").predict([{"question": "What is the capital?", "context":
                                                       "The old town has bridges and the capital is Rome . Rivers run."}])
    assert answer["answer"] == "The old town has bridges and the capital is Rome . Rivers run."[answer["start"]:answer["end"]]
