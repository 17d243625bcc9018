"""`--mode contrastive` (SetFit's recipe): the pairs it tunes the encoder on, a run that tunes
the encoder and saves an ordinary model, and the kinds and inputs it refuses in one line."""

from __future__ import annotations

import json

import pytest
import torch

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.encoder.pretrained import Encoder
from bertheads.training.contrastive import make_pairs
from bertheads.training.settings import MOST_PAIRS


def test_pairs_are_balanced_seeded_and_pair_by_a_label_in_common():
    groups = [frozenset({0})] * 6 + [frozenset({1})] * 4
    pairs = make_pairs(groups, seed=0)
    # every pair of the 10 inputs (itself included): 31 alike (21 + 10), 24 unlike; oversampling
    # takes all of the commoner sort and as many of the other, alternately
    assert len(pairs) == 62 and [y for *_, y in pairs[:4]] == [1.0, 0.0, 1.0, 0.0]
    assert sum(y for *_, y in pairs) == 31
    assert all((groups[i] == groups[j]) == (y == 1.0) and i <= j for i, j, y in pairs)
    assert len({(i, j) for i, j, y in pairs if y == 0.0}) == 24  # the rarer sort repeated, none left out
    assert make_pairs(groups, seed=0) == pairs and make_pairs(groups, seed=1) != pairs
    assert len(make_pairs(groups, seed=0, most=10)) == 10
    # the default cap: 200 texts of two labels make about 20,000 pairs, of which half each sort are taken
    many = make_pairs([frozenset({i % 2}) for i in range(200)], seed=0)
    assert len(many) == MOST_PAIRS and sum(y for *_, y in many) == MOST_PAIRS // 2
    assert len({(i, j) for i, j, _ in many}) == MOST_PAIRS  # distinct pairs drawn, none repeated
    # multi-label: a label in common makes a pair alike
    shared = make_pairs([frozenset({0, 1}), frozenset({1}), frozenset({2})], seed=0)
    assert {(i, j, y) for i, j, y in shared} == {(0, 0, 1.0), (1, 1, 1.0), (2, 2, 1.0), (0, 1, 1.0),
                                                 (0, 2, 0.0), (1, 2, 0.0)}
    with pytest.raises(UserError, match="needs two labels or more"):
        make_pairs([frozenset({0})] * 3, seed=0)


@pytest.fixture
def sentences(write):
    words = ["a good film", "great acting", "a bad plot", "an awful film", "a fine story", "a dull film"]
    return write("train.tsv", "sentence\tlabel\n" + "".join(
        f"{words[i % 6]} {i}\t{'pos' if i % 6 in (0, 1, 4) else 'neg'}\n" for i in range(12)))


def test_contrastive_mode_tunes_the_encoder_and_saves_an_ordinary_model(tiny_bert, sentences, tmp_path):
    out = tmp_path / "m"
    settings = bertheads.TrainSettings(epochs=2, batch_size=4, progress=False, pairs=24)
    bertheads.train("classify", sentences, sentences, out, model=tiny_bert, settings=settings, mode="contrastive")
    manifest = json.loads((out / "bertheads.json").read_text())
    assert manifest["contrastive"]["pair_count"] == 24 and manifest["contrastive"]["steps"] == 2
    before = Encoder.load(tiny_bert).model.state_dict()
    after = Encoder.load(str(out / "encoder")).model.state_dict()  # the tuned weights are the model's own
    changed = [k for k, v in before.items() if k in after and not torch.equal(v, after[k])]
    assert any("encoder.layer" in k for k in changed)
    assert "encoder" not in manifest and manifest["heads"]["classify"]["spec"]["mode"] == "contrastive"
    loaded = bertheads.load(str(out))
    [prediction] = loaded.predict(["a good film 99"])
    assert prediction["label"] in ("pos", "neg")
    # its head read the states of the tuned encoder: the saved model predicts what training evaluated
    kept = json.loads((out / "metrics.json").read_text())["dev"]
    assert loaded.evaluate(sentences)["accuracy"] == pytest.approx(kept["accuracy"])


def test_what_contrastive_mode_refuses_is_one_line(tiny_bert, write, tmp_path, capsys):
    ner = write("train.conll", "John B-PER\nlives O\nin O\nParis B-LOC\n\nMary B-PER\nsings O\n")
    scores = write("scores.tsv", "sentence\tlabel\na 1\t0.5\nb 2\t1.5\nc 3\t2.25\nd 4\t0.75\n")
    pairs = write("pairs.tsv", "sentence1\tsentence2\tlabel\na\tb\t0\nc\td\t1\ne\tf\t0\ng\th\t1\n")
    expected = {
        ("tag", ner): "--mode contrastive: tag heads do not take contrastive tuning (it pairs whole texts by their "
                      "label); use --mode features or finetune",
        ("classify", scores): "--mode contrastive: regression has no labels to pair texts by; use --mode features "
                              "or finetune",
        ("classify", pairs): "--mode contrastive: it tunes the encoder on single texts, and these inputs are text "
                             "pairs; use --mode features or finetune",
    }
    for (kind, path), line in expected.items():
        assert main(["train", kind, "--train", path, "--out", str(tmp_path / "x"), "--model", tiny_bert,
                     "--mode", "contrastive", "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == f"bertheads: error: {line}"
        assert not (tmp_path / "x").exists()


def test_attention_dropout_setting_reaches_both_training_loops(tiny_bert, sentences, tmp_path, monkeypatch):
    """`attention_dropout` is applied where the encoder trains (the pair loop, the head's loop)
    and recorded with the run's settings."""
    seen = []
    real = Encoder.set_attention_dropout

    def spy(self, p):
        seen.append((p, real(self, p)))
        return seen[-1][1]

    monkeypatch.setattr(Encoder, "set_attention_dropout", spy)
    settings = bertheads.TrainSettings(epochs=1, batch_size=4, progress=False, pairs=8, attention_dropout=0.0)
    for mode in ("contrastive", "finetune"):  # (after the pairs the head trains on the frozen encoder: not set)
        seen.clear()
        bertheads.train("classify", sentences, sentences, tmp_path / mode, model=tiny_bert, settings=settings, mode=mode)
        assert seen == [(0.0, 2)]  # tiny_bert's two layers' attention
        assert "attention_dropout: 0.0" in (tmp_path / mode / "config.yaml").read_text()


def test_a_contrastive_run_logged_to_a_file_is_never_silent(tiny_bert, sentences, tmp_path, capsys, monkeypatch):
    """With stderr a file (no bar drawn), the chosen line comes first, then progress lines of the
    pairs (done/total, rate, ETA) and of the features cache, all before the first epoch's line."""
    from bertheads.base import progress

    monkeypatch.setattr(progress, "LOG_LINE_SECONDS", 0.0)  # a line at every step, no waiting
    monkeypatch.setattr(progress, "LOG_FIRST_SECONDS", 0.0)
    assert main(["train", "classify", "--train", sentences, "--dev", sentences, "--out", str(tmp_path / "m"),
                 "--model", tiny_bert, "--mode", "contrastive", "--pairs", "48", "--epochs", "1",
                 "--batch-size", "4"]) == 0
    lines = capsys.readouterr().err.splitlines()

    def first(text: str) -> int:
        return next(i for i, x in enumerate(lines) if text in x)

    chosen, pairs, epoch = first("training examples (--recipe fixed): --mode contrastive"), first("contrastive pairs: "), \
        first("epoch 1/1: batch")
    assert chosen < first("contrastive tuning: 48 pairs in 3 steps") < pairs < epoch
    assert chosen == min(i for i, x in enumerate(lines) if "contrastive" in x)
    assert [x.removeprefix("bertheads: ").split(", loss=")[0] for x in lines if "contrastive pairs: " in x] == \
        ["contrastive pairs: 16/48 text pairs", "contrastive pairs: 32/48 text pairs", "contrastive pairs: 48/48 text pairs"]
    assert " text pairs/s, " in lines[pairs] and "ETA " in lines[pairs]
    assert first("feature cache: ") < epoch  # the tuned encoder's states, cached before the epochs
