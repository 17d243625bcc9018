"""Token tagging: reading, schemes, windows, sub-word labels, metrics equal to seqeval, predict."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import bertheads
from bertheads.cli.main import main
from bertheads.inference.path import head_outputs
from bertheads.tasks.tag.formats import read_tagged
from bertheads.tasks.tag.head import windows
from bertheads.tasks.tag.scheme import detect_scheme, entity_metrics, entity_spans, scheme_codes, tag_list
from bertheads.tasks.tag.spec import TagSpec
from bertheads.tasks.tag.task import TagTask
from bertheads.text.encoding import encode_texts

PEOPLE = [("Angela", "Merkel"), ("John", "Smith"), ("Maria", "Garcia"), ("Boris", "Yeltsin")]
PLACES = ["Paris", "Berlin", "Madrid", "Moscow"]
ORGS = ["Siemens", "Reuters", "Fiat"]


def sentences(n: int, seed: int = 0) -> list[list[tuple[str, str]]]:
    """Small NER sentences built from templates (IOB2)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        first, last = rng.choice(PEOPLE)
        place, org = rng.choice(PLACES), rng.choice(ORGS)
        if i % 2:
            out.append([(first, "B-PER"), (last, "I-PER"), ("visited", "O"), (place, "B-LOC"), ("on", "O"),
                        ("Monday", "O"), (".", "O")])
        else:
            out.append([("The", "O"), (org, "B-ORG"), ("office", "O"), ("in", "O"), (place, "B-LOC"),
                        ("closed", "O"), (".", "O")])
    return out


def conll(sents, columns: int = 2, docstart: bool = False, final_newline: bool = True) -> str:
    blocks = []
    for s in sents:
        blocks.append("\n".join(" ".join([w] + ["X"] * (columns - 2) + [t]) for w, t in s))
    text = ("-DOCSTART- -X- -X- O\n\n" if docstart else "") + "\n\n".join(blocks)
    return text + ("\n" if final_newline else "")


FAST = dict(epochs=6, batch_size=8, lr=3e-3, progress=False)


@pytest.fixture(scope="module")
def tag_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("tagdata")
    (d / "train.txt").write_text(conll(sentences(48), columns=4, docstart=True, final_newline=False))
    (d / "dev.txt").write_text(conll(sentences(12, seed=1), columns=4))
    return d


@pytest.fixture(scope="module")
def tagger(tiny_bert, tag_data):
    """A tiny tagger trained on the template sentences (saved and loaded back)."""
    out = tag_data / "model"
    bertheads.train("tag", str(tag_data / "train.txt"), str(tag_data / "dev.txt"), out, model=tiny_bert,
                    settings=bertheads.TrainSettings(**FAST))
    return str(out)


def test_reads_conll_and_jsonl(write):
    spec = TagSpec()
    text = "-DOCSTART- -X- O\n\nEU NNP B-ORG\r\nrejects VBZ O\n\n\nPeter NNP B-PER\nBlackburn NNP I-PER"
    ex = read_tagged(write("a.txt", text), spec, None, need_labels=True)
    assert [e.words for e in ex] == [["EU", "rejects"], ["Peter", "Blackburn"]]
    assert [e.tags for e in ex] == [["B-ORG", "O"], ["B-PER", "I-PER"]]
    assert ex[1].word_lines == [7, 8]
    spec.tag_column = 2
    with pytest.raises(bertheads.UserError, match=r"a.txt:3: tag 'NNP' is outside"):
        read_tagged(write("a.txt", text), spec, None, need_labels=True)
    rows = [{"tokens": ["Paris", "is", "big"], "tags": ["B-LOC", "O", "O"]}, {"text": "unused"}]
    path = write("b.jsonl", json.dumps(rows[0]) + "\n")
    assert read_tagged(path, TagSpec(), None, True)[0].tags == ["B-LOC", "O", "O"]
    raw = read_tagged(write("c.jsonl", "\n".join(map(json.dumps, rows))), TagSpec(), None, need_labels=False)
    assert raw[0].words == ["Paris", "is", "big"] and raw[1].text == "unused"


def test_detects_schemes():
    def ex(*seqs):
        return [type("E", (), {"tags": list(s)}) for s in seqs]

    assert detect_scheme(ex(["B-PER", "I-PER", "O"]), "f") == "IOB2"
    assert detect_scheme(ex(["I-PER", "I-PER", "B-PER"]), "f") == "IOB1"
    assert detect_scheme(ex(["S-PER", "O", "B-LOC", "E-LOC"]), "f") == "IOBES"
    assert detect_scheme(ex(["U-PER", "B-LOC", "L-LOC"]), "f") == "BILOU"
    with pytest.raises(bertheads.UserError, match="mix"):
        detect_scheme(ex(["U-PER", "S-LOC"]), "f")


def test_every_tag_of_the_scheme_for_each_type_seen():
    def ex(*seqs):
        return [type("E", (), {"tags": list(s)}) for s in seqs]

    few = ex(["B-LOC", "O", "B-PER", "I-PER"])  # every location one word long: no I-LOC in training
    assert tag_list(few, False, "IOB2") == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    assert tag_list(few, False) == ["O", "B-LOC", "B-PER", "I-PER"]
    assert tag_list(ex(["S-ORG", "O"]), False, "IOBES") == ["O", "B-ORG", "I-ORG", "E-ORG", "S-ORG"]


def test_entity_decoding_follows_seqeval_default_mode():
    from seqeval.metrics.sequence_labeling import get_entities

    rng = random.Random(3)
    tags = ["O", "B-A", "I-A", "E-A", "S-A", "B-B", "I-B", "E-B", "S-B", "L-A", "U-B"]
    codes, types = scheme_codes(tags)
    for _ in range(200):
        seq = [rng.randrange(len(tags)) for _ in range(rng.randrange(0, 12))]
        ours = entity_spans([codes[i] for i in seq], [types[i] for i in seq])
        as_iobes = [tags[i].replace("L-", "E-").replace("U-", "S-") for i in seq]
        assert [(t, a, b - 1) for t, a, b in ours] == get_entities(as_iobes)


def test_metrics_equal_seqeval():
    from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score

    rng = random.Random(7)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG"]
    gold = [[rng.choice(tags) for _ in range(rng.randrange(1, 15))] for _ in range(200)]
    pred = [[t if rng.random() < 0.7 else rng.choice(tags) for t in s] for s in gold]
    ours = entity_metrics(gold, pred)
    assert ours["f1"] == f1_score(gold, pred)
    assert ours["precision"] == precision_score(gold, pred)
    assert ours["recall"] == recall_score(gold, pred)
    assert ours["accuracy"] == accuracy_score(gold, pred)
    report = classification_report(gold, pred, output_dict=True)
    for kind, row in ours["per_type"].items():
        assert row["f1"] == report[kind]["f1-score"] and row["support"] == report[kind]["support"]
    assert set(ours["per_type"]) == {"PER", "LOC", "ORG"}


def test_trains_and_metrics_equal_seqeval_on_predictions(tagger, tag_data):
    from seqeval.metrics import f1_score

    model = bertheads.load(tagger)
    saved = json.loads((tag_data / "model" / "metrics.json").read_text())["dev"]
    assert set(saved) == {"f1", "precision", "recall", "per_type", "accuracy", "loss", "errors", "type_confusion",
                          "calibration"}
    task = model.task()
    examples = task.reading.read(str(tag_data / "dev.txt"))
    outputs = head_outputs(model.net, "tag", examples)
    pred = task.judging.predicted_tags(outputs)
    metrics = model.evaluate(str(tag_data / "dev.txt"))
    assert metrics["f1"] == f1_score([e.tags for e in examples], pred)
    assert metrics["f1"] > 0.5  # the templates are learnable
    assert metrics.pop("mode") == "torch fp32 on cpu"  # evaluate says what it ran in
    # training records the temperature's fit, evaluate what the scores mean with it: here none, as
    # 84 dev words (every one right) are too little evidence (a fitted one: test_calibration's tag test)
    fit = saved.pop("calibration")
    assert fit["temperature"] is None and "fewer than the" in fit["none"]
    assert metrics.pop("calibration")["temperature"] == fit["temperature"]
    assert metrics == saved  # the saved model is the one evaluated after its best epoch


def test_raw_text_entities_have_exact_offsets(tagger, tiny_bert):
    model = bertheads.load(tagger)
    texts = ["Angela Merkel visited Paris on Monday.", "  The Siemens office in   Berlin closed.  "]
    out = model.predict(texts)
    assert len(out) == 2
    found = [(e["text"], e["type"]) for e in out[0]["entities"] + out[1]["entities"]]
    assert ("Paris", "LOC") in found and ("Berlin", "LOC") in found
    for text, o in zip(texts, out):
        for e in o["entities"]:
            assert text[e["start"]:e["end"]] == e["text"] and 0 < e["score"] <= 1
    task, tok = model.task(), model.net.encoder.tokenizer
    feats, owner = task.modeling.encode_for_inference(task.reading.from_inputs(texts), tok)
    assert owner == [0, 1]
    for f, expected in zip(feats, encode_texts(tok, texts, max_length=task.spec.max_length)):
        assert f["input_ids"] == expected["input_ids"] and f["token_type_ids"] == expected["token_type_ids"]


def test_long_sentence_every_word_gets_one_tag_from_its_best_window(tagger):
    model = bertheads.load(tagger)
    task = model.task()
    task.spec.max_length, task.spec.stride = 12, 3  # 10 content tokens a window
    task.spec.calibrate = False  # the raw scores (a sharpening temperature would round them all to 1)
    words = ["the", "office", "in", "paris", "closed", "on", "monday", "and", "john", "visited"] * 3
    assert all(len(model.net.encoder.tokenizer.tokenize(w)) == 1 for w in words)
    ex = task.reading.from_inputs([words])
    feats, owner = task.modeling.encode_for_inference(ex, model.net.encoder.tokenizer)
    assert len(feats) > 2 and set(owner) == {0}
    outs = head_outputs(model.net, "tag", ex)[0].probs
    assert outs.shape[0] == len(words)
    assert len(model.predict([words])[0]["tags"]) == len(words)
    first = head_outputs(model.net, "tag", task.reading.from_inputs([words[:10]]))[0].probs  # window 1 alone
    last = head_outputs(model.net, "tag", task.reading.from_inputs([words[-10:]]))[0].probs  # last window alone
    np.testing.assert_allclose(outs[:4], first[:4], atol=1e-5)  # most context in the first window
    np.testing.assert_allclose(outs[-4:], last[-4:], atol=1e-5)
    assert not np.allclose(outs[9], first[9], atol=1e-4)  # window 1's last word comes from window 2
    text = " ".join(words[:25]) + " Paris."
    pred = model.predict([text])[0]
    for e in pred["entities"]:
        assert text[e["start"]:e["end"]] == e["text"]


def test_windows_cover_everything():
    for n in range(0, 60):
        spans = windows(n, 10, 3)
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(b - a <= 10 for a, b in spans)
        assert all(b1 - a2 >= 3 for (_, b1), (a2, _) in zip(spans, spans[1:]))


def test_label_subwords_first_vs_all(tiny_bert, tag_data, tmp_path):
    from bertheads.encoder.pretrained import Encoder

    encoder = Encoder.load(tiny_bert)
    sentence = [("Merkel", "B-PER"), ("visited", "O")]  # merkel -> mer ##kel
    first = TagTask.build(TagSpec(tags=["O", "B-PER", "I-PER"]), encoder)
    every = TagTask.build(TagSpec(tags=["O", "B-PER", "I-PER"], label_subwords="all"), encoder)
    ex = first.reading.from_inputs([[w for w, _ in sentence]])
    ex[0].tags = [t for _, t in sentence]
    assert first.modeling.encode(ex, encoder.tokenizer)[0]["tok_labels"] == [-100, 1, -100, 0, -100]
    assert every.modeling.encode(ex, encoder.tokenizer)[0]["tok_labels"] == [-100, 1, 2, 0, -100]
    model = bertheads.train("tag", str(tag_data / "train.txt"), None, None, model=tiny_bert,
                            settings=bertheads.TrainSettings(**{**FAST, "epochs": 1}), label_subwords="all")
    dev = model.evaluate(str(tag_data / "dev.txt"))
    words = sum(len(e.words) for e in model.task().reading.read(str(tag_data / "dev.txt")))
    assert sum(r["support"] for r in dev["per_type"].values()) == 24  # entities counted per word
    assert words == 84 and model.task().spec.tags == ["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


def test_loss_weighs_every_labelled_token_the_same(tiny_bert):
    import math

    import torch

    from bertheads.encoder.pretrained import Encoder
    from bertheads.text.encoding import collate

    encoder = Encoder.load(tiny_bert)
    task = TagTask.build(TagSpec(tags=["O", "B-PER", "I-PER"]), encoder)
    ex = task.reading.from_inputs([["Merkel", "visited"], ["a", "b", "c", "d", "e", "f"]])
    ex[0].tags, ex[1].tags = ["B-PER", "O"], ["O"] * 6
    feats = task.modeling.encode(ex, encoder.tokenizer)
    assert task.modeling.labelled_per_window == 4.0
    for idx, expected in (([0, 1], math.log(3)), ([0], math.log(3) * 2 / 4), ([1], math.log(3) * 6 / 4)):
        batch = collate([feats[i] for i in idx], 0)
        logits = torch.zeros(*batch["input_ids"].shape, 3)
        assert float(task.modeling.loss(logits, batch)) == pytest.approx(expected)


def test_bilstm_head_on_frozen_features_round_trips(tiny_bert, tag_data, tmp_path):
    out = tmp_path / "lstm"
    code = main(["train", "tag", "--train", str(tag_data / "train.txt"), "--dev", str(tag_data / "dev.txt"),
                 "--out", str(out), "--model", tiny_bert, "--head", "bilstm", "--lstm-size", "16", "--epochs", "2",
                 "--lr", "3e-3", "--batch-size", "8", "--stride", "8", "--tag-column", "4", "--no-progress",
                 "--mode", "features", "--layers=-1,-2", "--cache-dir", str(tmp_path / "cache")])
    assert code == 0
    spec = json.loads((out / "bertheads.json").read_text())["heads"]["tag"]["spec"]
    assert (spec["head_type"], spec["lstm_size"], spec["stride"], spec["tag_column"]) == ("bilstm", 16, 8, 4)
    model = bertheads.load(out)
    lstm = model.task().head.lstm  # loaded as trained: two bidirectional layers of 16
    assert (type(lstm).__name__, lstm.hidden_size, lstm.num_layers, lstm.bidirectional) == ("LSTM", 16, 2, True)
    saved = json.loads((out / "metrics.json").read_text())["dev"]
    live = model.evaluate(str(tag_data / "dev.txt"))
    # same weights after loading; training evaluated from the cached (float16) dev states
    live.pop("learned_nothing", None)  # (evaluate's warning of a tiny model; not a metric training records)
    assert live.pop("mode") == "torch fp32 on cpu"  # what it ran in
    # training records the temperature's fit (none on so few dev words), evaluate what the scores mean with it
    assert live.pop("calibration")["temperature"] == saved.pop("calibration")["temperature"] is None
    assert live.pop("loss") == pytest.approx(saved.pop("loss"), abs=1e-4) and live == saved
    assert len(model.predict(["Angela Merkel visited Paris."])) == 1


def test_bilstm_head_fine_tunes(tiny_bert, tag_data):
    import torch

    from bertheads.encoder.pretrained import Encoder

    model = bertheads.train("tag", str(tag_data / "train.txt"), None, None, model=tiny_bert, head_type="bilstm",
                            lstm_size=8, settings=bertheads.TrainSettings(epochs=1, batch_size=16, progress=False))
    head = model.task().head
    assert isinstance(head.lstm, torch.nn.LSTM) and head.lstm.num_layers == 2 and head.lstm.bidirectional
    start = Encoder.load(tiny_bert).model.state_dict()
    tuned = model.net.encoder.model.state_dict()
    key = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(start[key], tuned[key])  # gradients flow through the BiLSTM into the encoder
    assert len(model.predict([["Paris", "is", "big"]])[0]["tags"]) == 3


def test_predict_conll_format(tagger, write, capsys):
    text = "-DOCSTART- -X- O\n\nAngela NNP B-PER\nMerkel NNP I-PER\nvisited VBD O\n\nParis\tNNP\tB-LOC\n"
    path = write("in.conll", text)
    assert main(["predict", tagger, "--input", path, "--format", "conll"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[0] == "-DOCSTART- -X- O O" and lines[1] == ""
    assert [line.rsplit(" ", 1)[0] for line in lines[2:5]] == ["Angela NNP B-PER", "Merkel NNP I-PER", "visited VBD O"]
    assert lines[5] == "" and lines[6].startswith("Paris\tNNP\tB-LOC\t")
    tags = [line.split()[-1] for line in lines[2:5] + lines[6:7]]
    assert all(t == "O" or t[:2] in ("B-", "I-") for t in tags)
    assert main(["predict", tagger, "--input", write("t.txt", "Angela Merkel visited Paris.\n")]) == 0
    record = json.loads(capsys.readouterr().out)
    assert set(record) == {"entities"}


def test_word_without_pieces_still_gets_a_tag(tagger):
    model = bertheads.load(tagger)
    out = model.predict([["Angela", "\u200b", "Merkel"]])[0]
    assert len(out["tags"]) == 3


@pytest.mark.parametrize("name,text,message", [
    ("cols.txt", "EU NNP B-ORG\nrejects O\n", r"cols.txt:2: expected 3 columns"),
    ("scheme.txt", "EU NNP B-ORG\nrejects VBZ ORG\n", r"scheme.txt:2: tag 'ORG' is outside the tagging scheme"),
    ("empty.txt", "\n\n", r"empty.txt: file is empty"),
    ("one.txt", "EU\nrejects\n", r"one.txt:1: expected at least 2 columns"),
])
def test_bad_training_input_is_one_line_exit_2(tiny_bert, write, tmp_path, capsys, name, text, message):
    import re

    code = main(["train", "tag", "--train", write(name, text), "--out", str(tmp_path / "m"), "--model", tiny_bert])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and re.search(message, err), err


def test_unseen_tag_at_evaluation_names_the_line(tagger, write, capsys):
    path = write("dev.txt", "Paris NNP B-NP B-LOC\n\nSony NNP B-NP B-COMPANY\n")
    assert main(["evaluate", tagger, "--data", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dev.txt:3: tag 'B-COMPANY' was not seen in training" in err


def test_dev_loss_after_loading_is_the_one_training_reported(tiny_bert, tag_data, tmp_path):
    """The dev loss is a mean per labelled token, not scaled by the training set's statistics
    (here the dev sentences are twice as long as the training ones)."""
    dev = tmp_path / "dev.txt"
    pairs = sentences(8, seed=2)
    dev.write_text(conll([a + b for a, b in zip(pairs[::2], pairs[1::2])]))
    out = tmp_path / "m"
    bertheads.train("tag", str(tag_data / "train.txt"), str(dev), out, model=tiny_bert,
                    settings=bertheads.TrainSettings(epochs=1, batch_size=8, progress=False))
    saved = json.loads((out / "metrics.json").read_text())["dev"]["loss"]
    assert bertheads.load(out).evaluate(str(dev))["loss"] == pytest.approx(saved, rel=1e-5)


def test_the_trained_head_keeps_the_training_windows_loss_yardstick(tiny_bert, tag_data):
    """The head the run trains is the task that encoded the training data: its loss divides by the
    labelled tokens per training window (`TagModeling.labelled_per_window`), not per batch."""
    model = bertheads.train("tag", str(tag_data / "train.txt"), str(tag_data / "dev.txt"), None, model=tiny_bert,
                            settings=bertheads.TrainSettings(**{**FAST, "epochs": 1}))
    assert model.task().modeling.labelled_per_window == 7.0  # seven words a sentence, each labelled once
