"""Joint training from a config, combining models, and one-pass analyze."""

from __future__ import annotations

import json

import pytest
from helpers_multi import EncoderCalls, save_heads

import bertheads
from bertheads.api import combine
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.saved import bundle
from bertheads.training.config import read_config

POS, NEG = ["good", "great", "fun", "lovely", "superb", "wonderful"], ["awful", "dull", "bore", "bad", "terrible", "boring"]
SENTIMENT = "sentence\tlabel\n" + "".join(f"{POS[i % 6]} {POS[(i + 1) % 6]} film\tpos\n{NEG[i % 6]} {NEG[(i + 2) % 6]} film\tneg\n"
                                         for i in range(8))
TOPIC = "text,label\n" + "".join(f"the match ended {i} goals,sports\nthe soup was hot {i},food\n" for i in range(8))


def write_config(tmp_path, text: str, name: str = "multi.yaml"):
    conf = tmp_path / "conf"
    data = conf / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "sent.tsv").write_text(SENTIMENT)
    (data / "topic.csv").write_text(TOPIC)
    path = conf / name
    path.write_text(text)
    return path


GOOD = """\
tasks:
  sentiment: {kind: classify, train: data/sent.tsv, dev: data/sent.tsv}
  topic:
    kind: classify
    train: data/topic.csv
    dev: data/topic.csv
    max_length: 48
    limit: 12
sampling: round-robin
"""


@pytest.mark.slow
def test_train_multi_cli(default_model_dir, tmp_path, capsys, monkeypatch):
    """End to end on the real checkpoint (the tiny random BERT does not learn reliably in a few steps)."""
    config = write_config(tmp_path, GOOD)
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the config's folder, not here
    out = tmp_path / "model"
    code = main(["train", "multi", "--config", str(config), "--out", str(out), "--model", default_model_dir,
                 "--epochs", "2", "--batch-size", "8", "--lr", "2e-4", "--warmup-ratio", "0", "--no-progress"])
    assert code == 0
    assert "heads: sentiment, topic" in capsys.readouterr().err
    manifest = json.loads((out / "bertheads.json").read_text())
    assert list(manifest["heads"]) == ["sentiment", "topic"]
    assert manifest["heads"]["topic"]["spec"]["max_length"] == 48  # the task's own setting
    assert manifest["heads"]["sentiment"]["spec"]["max_length"] == 128  # the kind's default
    assert manifest["multi_task"]["sampling"] == "round-robin"
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["dev"]) == {"sentiment", "topic"}
    assert len(metrics["history"]) == 2 and all(set(h["dev"]) == {"sentiment", "topic"} for h in metrics["history"])
    # both heads learned their (easy) task through the shared encoder
    assert metrics["dev"]["sentiment"]["accuracy"] >= 0.9
    assert metrics["dev"]["topic"]["accuracy"] >= 0.9
    model = bertheads.load(out)
    assert model.predict(["great fun film"], head="sentiment")[0]["label"] == "pos"
    assert model.predict(["the soup was hot"], head="topic")[0]["label"] == "food"
    # evaluate per head; a multi-head model asks which head
    assert model.evaluate(str(config.parent / "data" / "topic.csv"), head="topic")["accuracy"] >= 0.9
    with pytest.raises(UserError, match="choose one with head="):
        model.evaluate(str(config.parent / "data" / "topic.csv"))


def test_read_config_options_and_overrides(tmp_path):
    config = read_config(write_config(tmp_path, GOOD.replace("round-robin", "temperature\ntemperature: 3")))
    assert [t.name for t in config.tasks] == ["sentiment", "topic"]
    assert config.tasks[1].limit == 12 and config.tasks[1].options == {"max_length": 48}
    assert config.tasks[0].train == str((tmp_path / "conf" / "data" / "sent.tsv").resolve())
    assert (config.sampling, config.temperature) == ("temperature", 3.0)
    from bertheads.training.joint import task_settings

    # command-line head flags apply to every task; a task's own entry wins
    assert task_settings(config.tasks[0], {"max_length": 64})["max_length"] == 64
    assert task_settings(config.tasks[1], {"max_length": 64})["max_length"] == 48


def test_read_config_toml(tmp_path):
    toml = ('sampling = "round-robin"\n[tasks.sentiment]\nkind = "classify"\ntrain = "data/sent.tsv"\n'
            '[tasks.topic]\nkind = "classify"\ntrain = "data/topic.csv"\nmax_length = 48\n')
    config = read_config(write_config(tmp_path, toml, "multi.toml"))
    assert [t.name for t in config.tasks] == ["sentiment", "topic"] and config.sampling == "round-robin"
    assert config.tasks[1].options == {"max_length": 48} and config.tasks[0].dev is None


BAD = [
    ("tasks: [1, 2]\n", "tasks: expected a mapping"),
    ("tasks:\n  s: {kind: classify, train: data/sent.tsv}\nepoch: 3\n",
     "3: epoch: unknown setting 'epoch' (did you mean 'epochs'?)"),
    ("tasks:\n  s: {train: data/sent.tsv}\n", "tasks.s: missing field 'kind'"),
    ("tasks:\n  s: {kind: regress, train: data/sent.tsv}\n", "tasks.s.kind: unknown task kind 'regress'"),
    ("tasks:\n  s: {kind: classify}\n", "tasks.s: missing field 'train'"),
    ("tasks:\n  s: {kind: classify, train: data/nope.tsv}\n", "tasks.s.train: no such file"),
    ("tasks:\n  s:\n    kind: classify\n    train: data/sent.tsv\n    limit: -3\n", "5: tasks.s.limit: expected a positive"),
    ("tasks:\n  s: {kind: classify, train: data/sent.tsv, max_length: long}\n",
     "tasks.s.max_length: expected a positive integer, got 'long'"),
    ("tasks:\n  s: {kind: classify, train: data/sent.tsv, colour: red}\n", "tasks.s.colour: unknown setting 'colour' for a classify"),
    ("tasks:\n  s: {kind: classify, train: data/sent.tsv, max_lenght: 8}\n",
     "tasks.s.max_lenght: unknown setting 'max_lenght' for a classify task (did you mean 'max_length'?)"),
    ("tasks:\n  s: {kind: tag, train: data/sent.tsv, text_column: x}\n", "tasks.s.text_column: unknown setting"),
    ("tasks:\n  s: {kind: classify, train: data/sent.tsv}\nsampling: random\n", "sampling: expected one of"),
    ("tasks:\n  s: {kind: classify, train: data/sent.tsv}\ntemperature: 0\n", "temperature: expected a positive"),
    ("tasks:\n  s/x: {kind: classify, train: data/sent.tsv}\n", "tasks.s/x: a head name may hold only"),
    ("tasks:\n  s: {kind: classify, train: [data/sent.tsv\n", "malformed YAML"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_config_errors_are_one_line(tmp_path, capsys, text, message):
    config = write_config(tmp_path, text)
    with pytest.raises(UserError) as info:
        read_config(config)
    assert str(config) in str(info.value) and message in str(info.value)
    assert main(["train", "multi", "--config", str(config), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertheads: error: ") and "\n" not in err and message in err


def test_train_multi_features_mode_keeps_the_encoder(tiny_bert, tmp_path):
    """--mode features on the command line applies to every task: the encoder stays as it was."""
    out = tmp_path / "m"
    assert main(["train", "multi", "--config", str(write_config(tmp_path, GOOD)), "--out", str(out), "--model",
                 tiny_bert, "--mode", "features", "--cache-dir", str(tmp_path / "cache"), "--epochs", "1",
                 "--batch-size", "8", "--no-progress", "--sampling", "proportional"]) == 0
    model = bertheads.load(out)
    assert {model.task(h).spec.mode for h in model.heads} == {"features"}
    manifest = bundle.read_manifest(out)
    assert manifest["multi_task"]["sampling"] == "proportional"  # the flag overrides the file
    assert any((tmp_path / "cache").iterdir())
    from bertheads.encoder.pretrained import Encoder, encoder_hash

    assert manifest["encoder_hash"] == encoder_hash(Encoder.load(tiny_bert))


def test_mixed_modes_refused(tmp_path, tiny_bert):
    text = GOOD.replace("    limit: 12\n", "    limit: 12\n    mode: features\n").replace(
        "dev: data/sent.tsv}", "dev: data/sent.tsv, mode: finetune}")  # (a task without a mode follows the other's)
    with pytest.raises(UserError, match="mix mode='finetune' and features"):
        bertheads.train_multi(write_config(tmp_path, text), tmp_path / "m", model=tiny_bert)


# -- analyze -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_heads(tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("two-heads") / "model"
    save_heads(tiny_bert, out, {"sentiment": ("classify", 1, {"labels": ["neg", "pos"]}),
                                "topic": ("classify", 2, {"labels": ["food", "politics", "sports"], "max_length": 16})})
    return bertheads.load(out)


TEXTS = ["A warm and funny film.", "The minister resigned on Friday.", "Soup again?"]


def test_analyze_runs_the_encoder_once_for_all_heads(two_heads):
    calls = EncoderCalls(two_heads.net)
    try:
        results = two_heads.analyze(TEXTS)
        assert calls.count == 1  # one encoder pass feeds both heads
        separate = {head: two_heads.predict(TEXTS, head=head) for head in two_heads.heads}
        assert calls.count == 3  # one pass per head when asked head by head
    finally:
        calls.close()
    assert [set(r) for r in results] == [{"sentiment", "topic"}] * len(TEXTS)
    for head, predictions in separate.items():
        for result, prediction in zip(results, predictions):
            assert result[head]["label"] == prediction["label"]
            assert result[head]["scores"] == pytest.approx(prediction["scores"], abs=1e-5)


def test_analyze_classify_and_tag_heads_share_one_pass(tiny_bert, tmp_path):
    out = save_heads(tiny_bert, tmp_path / "m", {"sentiment": ("classify", 1, {"labels": ["neg", "pos"]}),
                                                 "ner": ("tag", 2, {"tags": ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]})})
    model = bertheads.load(out)
    texts = ["Angela Merkel visited Paris.", "A fine day in Rome"]
    calls = EncoderCalls(model.net)
    try:
        results = model.analyze(texts)
        assert calls.count == 1  # a raw text that fits one window encodes alike for both kinds
    finally:
        calls.close()
    assert [r["ner"] for r in results] == model.predict(texts, head="ner")
    for result, text in zip(results, texts):
        assert all(text[e["start"]:e["end"]] == e["text"] for e in result["ner"]["entities"])
    assert [r["sentiment"]["label"] for r in results] == [p["label"] for p in model.predict(texts, head="sentiment")]


def test_analyze_gives_heads_with_different_inputs_their_own_pass(two_heads):
    long_text = "a long review " * 20  # truncated at 16 tokens by topic, 128 by sentiment
    calls = EncoderCalls(two_heads.net)
    try:
        result = two_heads.analyze([long_text])[0]
        assert calls.count == 2
    finally:
        calls.close()
    assert result["topic"]["scores"] == pytest.approx(two_heads.predict([long_text], head="topic")[0]["scores"],
                                                      abs=1e-5)
    assert result["sentiment"]["scores"] == pytest.approx(
        two_heads.predict([long_text], head="sentiment")[0]["scores"], abs=1e-5)


def test_analyze_runs_pair_and_qa_heads_only_with_their_second_input(tiny_bert, tmp_path):
    out = save_heads(tiny_bert, tmp_path / "m", {"sentiment": ("classify", 1, {"labels": ["neg", "pos"]}),
                                                 "nli": ("classify", 3, {"labels": ["no", "yes"], "pair": True}),
                                                 "qa": ("qa", 4, {})})
    model = bertheads.load(out)
    passage = "The cat sat on the mat in Paris."
    assert set(model.analyze([passage])[0]) == {"sentiment"}
    both = model.analyze([passage], second_texts=["an animal sat"])[0]
    assert set(both) == {"sentiment", "nli"}
    assert both["nli"]["scores"] == pytest.approx(
        model.predict([(passage, "an animal sat")], head="nli")[0]["scores"], abs=1e-5)
    answered = model.analyze([passage], questions=["Where did the cat sit?"])[0]
    assert set(answered) == {"sentiment", "qa"}
    alone = model.predict([{"question": "Where did the cat sit?", "context": passage}], head="qa")[0]
    assert answered["qa"]["answer"] == alone["answer"] == passage[alone["start"]:alone["end"]]
    with pytest.raises(UserError, match="second_texts: expected one per text"):
        model.analyze(["a", "b"], second_texts=["c"])


# -- combine -------------------------------------------------------------------------------------
def test_combine_heads_trained_in_features_mode(tiny_bert, tmp_path, write, capsys):
    """Heads trained apart on the frozen encoder (--mode features) combine into one model."""
    settings = bertheads.TrainSettings(epochs=1, batch_size=8, progress=False)
    cache = str(tmp_path / "cache")
    a, b = tmp_path / "a", tmp_path / "b"
    bertheads.train("classify", write("s.tsv", SENTIMENT), None, a, model=tiny_bert, settings=settings,
                    mode="features", cache_dir=cache)
    train_topic = write("t.csv", TOPIC)
    bertheads.train("classify", train_topic, None, b, model=tiny_bert, settings=settings, mode="features",
                    cache_dir=cache)
    for directory in (a, b):  # each holds one head named after its kind: --names renames them
        assert list(json.loads((directory / "bertheads.json").read_text())["heads"]) == ["classify"]
    assert main(["combine", str(a), str(b), "--out", str(tmp_path / "ab"), "--names", "sentiment", "topic"]) == 0
    assert "sentiment (classify), topic (classify)" in capsys.readouterr().err
    combined = bertheads.load(tmp_path / "ab")
    assert combined.heads == {"sentiment": "classify", "topic": "classify"}
    sources = json.loads((tmp_path / "ab" / "bertheads.json").read_text())["combined_from"]
    assert sources["topic"] == {"from": str(b), "head": "classify"}
    for directory, head in ((a, "sentiment"), (b, "topic")):
        alone = bertheads.load(directory).predict(TEXTS)
        together = combined.predict(TEXTS, head=head)
        for t, s in zip(together, alone):
            assert t["label"] == s["label"] and t["scores"] == pytest.approx(s["scores"], abs=1e-6)
    assert combined.evaluate(train_topic, head="topic")["examples"] == 16
    calls = EncoderCalls(combined.net)
    combined.analyze(TEXTS)
    assert calls.count == 1


def test_combine_duplicate_names_and_renaming(tiny_bert, tmp_path, capsys):
    a = save_heads(tiny_bert, tmp_path / "a", {"sentiment": ("classify", 1, {"labels": ["neg", "pos"]})})
    b = save_heads(tiny_bert, tmp_path / "b", {"sentiment": ("classify", 2, {"labels": ["bad", "good"]})})
    assert main(["combine", str(a), str(b), "--out", str(tmp_path / "ab")]) == 2
    err = capsys.readouterr().err
    assert "head name 'sentiment' is in both" in err and "--names" in err
    assert not (tmp_path / "ab").exists()
    with pytest.raises(UserError, match="expected 2 names"):
        combine([a, b], tmp_path / "ab", ["only"])
    model = combine([a, b], tmp_path / "ab", ["sst", "reviews"])
    assert model.heads == {"sst": "classify", "reviews": "classify"}
    assert model.task("reviews").spec.labels == ["bad", "good"]


def test_combine_refuses_different_encoders(tiny_bert, tmp_path, write):
    a = save_heads(tiny_bert, tmp_path / "a", {"sentiment": ("classify", 1, {"labels": ["neg", "pos"]})})
    train = write("train.tsv", SENTIMENT)
    tuned = tmp_path / "tuned"  # fine-tuning changes the encoder's weights
    bertheads.train("classify", train, None, tuned, model=tiny_bert,
                    settings=bertheads.TrainSettings(epochs=1, batch_size=8, progress=False))
    assert bundle.read_manifest(a)["encoder_hash"] != bundle.read_manifest(tuned)["encoder_hash"]
    with pytest.raises(UserError, match="encoder differs") as info:
        combine([a, tuned], tmp_path / "ab", ["x", "y"])
    assert "mode='features'" in str(info.value) and "tune_layers" in str(info.value)
    assert not (tmp_path / "ab").exists()


def test_analyze_command_streams_every_head_as_json_lines(tiny_bert, tmp_path, capsys):
    out = save_heads(tiny_bert, tmp_path / "m", {"sentiment": ("classify", 1, {"labels": ["neg", "pos"]}),
                                                 "nli": ("classify", 3, {"labels": ["no", "yes"], "pair": True}),
                                                 "qa": ("qa", 4, {})})
    model = bertheads.load(out)
    passage = "The cat sat on the mat in Paris."
    records = [{"id": 7, "text": "A warm film."},
               {"id": "b", "text": passage, "second_text": "an animal sat", "src": "x"},
               {"text": passage, "question": "Where did the cat sit?"}]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = tmp_path / "out.jsonl"
    assert main(["analyze", str(out), "--input", str(data), "--output", str(result), "--chunk-size", "1",
                 "--keep-fields", "src"]) == 0
    lines = [json.loads(line) for line in result.read_text().splitlines()]
    expected = [model.analyze(["A warm film."])[0], model.analyze([passage], second_texts=["an animal sat"])[0],
                model.analyze([passage], questions=["Where did the cat sit?"])[0]]
    assert [line.get("id") for line in lines] == [7, "b", None] and lines[1]["src"] == "x"
    assert [set(line) - {"id", "src"} for line in lines] == [{"sentiment"}, {"sentiment", "nli"}, {"sentiment", "qa"}]
    for line, want in zip(lines, expected):
        for head, prediction in want.items():
            assert json.dumps(line[head], sort_keys=True) == json.dumps(json.loads(json.dumps(prediction)),
                                                                         sort_keys=True)
    plain = tmp_path / "in.txt"
    plain.write_text("A warm film.\n" + passage + "\tan animal sat\n")
    capsys.readouterr()
    assert main(["analyze", str(out), "--input", str(plain)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [set(p) for p in printed] == [{"sentiment"}, {"sentiment", "nli"}]
    data.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    assert main(["analyze", str(out), "--input", str(data)]) == 2
    assert f'{data}:2: no "text" field (fields: txt)' in capsys.readouterr().err
    assert main(["analyze", str(out), "--input", str(data), "--skip-bad-lines"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
