"""`bertheads audit`: out-of-fold heads find planted label errors; issues.jsonl and summary.json;
multi-label and pairs; fine-tuned folds; one-line refusals."""

from __future__ import annotations

import html
import json
import random
from pathlib import Path

import pytest

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main

pytestmark = pytest.mark.slow  # the real default checkpoint, fold training, two command-line runs

GOOD = ["wonderful", "great", "delightful", "superb", "charming", "moving", "brilliant", "lovely"]
BAD = ["awful", "dull", "boring", "dreadful", "tedious", "terrible", "clumsy", "lifeless"]
THINGS = ["film", "movie", "story", "cast", "script", "plot"]


def sentiment_rows(count: int, seed: int = 0) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        label = i % 2
        words = GOOD if label else BAD
        rows.append((f"the {rng.choice(THINGS)} was {rng.choice(words)} and {rng.choice(words)}", label))
    return rows


def test_audit_finds_planted_label_errors(default_model_dir, write, tmp_path):
    rows = sentiment_rows(80)
    flipped = {3, 10, 27, 44, 58, 71}
    lines = ["sentence\tlabel"] + [f"{t}\t{1 - y if i in flipped else y}" for i, (t, y) in enumerate(rows)]
    train = write("train.tsv", "\n".join(lines) + "\n")
    out = tmp_path / "audit"
    result = bertheads.audit("classify", train, out=out, model=default_model_dir, mode="features",
                             cache_dir=str(tmp_path / "cache"), epochs=10, batch_size=32, lr=1e-2, folds=4)
    top = {r["row"] for r in result.ranking[:len(flipped)]}
    assert len(top & flipped) >= 5, result.ranking[:8]
    issues = [json.loads(line) for line in (out / "issues.jsonl").read_text().splitlines()]
    assert issues and all(r["flagged"] for r in issues)
    assert len({r["row"] for r in issues} & flipped) >= len(flipped) - 1  # cleanlab flags all but one at most
    first = issues[0]
    # where the row is: the file and its line (header on line 1), its text, both labels and probabilities
    assert first["file"] == train and first["line"] == first["row"] + 2
    assert first["text"] == rows[first["row"]][0]
    assert first["given"] != first["suggested"] and first["suggested_probability"] > 0.5 > first["given_probability"]
    assert [r["score"] for r in issues] == sorted(r["score"] for r in issues)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["examples"] == 80 and summary["flagged"] == len(issues)
    assert set(summary["noise_rate"]) == {"0", "1"} and all(0 < v < 0.5 for v in summary["noise_rate"].values())
    assert summary["settings"]["audit"]["folds"] == 4 and summary["settings"]["task"]["mode"] == "features"
    assert summary["top"][0]["text"] == first["text"]
    # the report page shows the top suspects with their text and labels
    model = bertheads.train("classify", train, None, tmp_path / "model", model=default_model_dir, mode="features",
                            cache_dir=str(tmp_path / "cache"), epochs=1, progress=False)
    page = model.report(out=tmp_path / "page", audit=out).read_text()
    assert "Label audit" in page and html.escape(first["text"]) in page and "estimated noise rate" in page


def test_multi_label_and_pairs_fine_tuned_from_the_command_line(tiny_bert, write, tmp_path):
    records = [{"sentence1": f"item {i}", "sentence2": f"other {i % 3}", "labels": ["a"] if i % 2 else ["b", "c"]}
               for i in range(12)]
    train = write("multi.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "multi"
    assert main(["audit", "classify", "-q", "--train", train, "--out", str(out), "--model", tiny_bert, "--folds", "3",
                 "--epochs", "1", "--rows", "all", "--no-progress"]) == 0
    issues = [json.loads(line) for line in (out / "issues.jsonl").read_text().splitlines()]
    assert len(issues) == 12 and sorted(r["row"] for r in issues) == list(range(12))
    first = issues[0]
    assert isinstance(first["given"], list) and set(first["given_probability"]) == set(first["given"])
    assert first["pair"].startswith("other")
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["noise_rate"]) == {"a", "b", "c"} and summary["settings"]["task"]["mode"] == "finetune"


def test_a_dataframe_is_audited_with_its_ids(tiny_bert, tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"id": [f"r{i}" for i in range(10)], "text": [f"text {i}" for i in range(10)],
                          "label": ["yes", "no"] * 5})
    result = bertheads.audit("classify", frame, model=tiny_bert, mode="features", folds=2, epochs=1, rows="all",
                             cache_dir=str(tmp_path / "cache"), progress=False)
    assert sorted(r["id"] for r in result.ranking) == sorted(frame["id"])
    assert all(frame["id"][r["row"]] == r["id"] and r["given"] == frame["label"][r["row"]] for r in result.ranking)


def test_audit_refusals_are_one_line(tiny_bert, write, tmp_path, capsys):
    train = write("t.tsv", "sentence\tlabel\nfine\t1\nbad\t0\nok\t1\n")
    with pytest.raises(UserError, match="^folds=5: only 3 training examples"):
        bertheads.audit("classify", train, model=tiny_bert)
    with pytest.raises(UserError, match="unknown setting 'fold'"):
        bertheads.audit("classify", train, model=tiny_bert, fold=2)
    reg = write("r.tsv", "sentence\tlabel\nfine\t1.5\nbad\t0.2\nok\t1.1\n")
    with pytest.raises(UserError, match="regression heads have no audit"):
        bertheads.audit("classify", reg, model=tiny_bert, folds=2, epochs=1, problem="regression")
    code = main(["audit", "classify", "--train", train, "--out", str(tmp_path / "o"), "--model", tiny_bert, "--folds", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--folds 1: needs at least 2" in err and err.count("\n") == 1
    assert not Path(tmp_path / "o").exists()


def test_tag_audit_names_disputed_words_with_offsets(tiny_bert, write, tmp_path):
    from test_tag import conll, sentences

    sents = sentences(24)
    sents[5] = [(w, "B-ORG" if t == "B-LOC" else t) for w, t in sents[5]]  # a place tagged as an organisation
    train = write("train.txt", conll(sents, columns=2))
    result = bertheads.audit("tag", train, out=tmp_path / "tag", model=tiny_bert, mode="features", folds=3,
                             epochs=4, batch_size=8, lr=3e-3, rows="all", cache_dir=str(tmp_path / "cache"))
    assert len(result.ranking) == sum(len(s) for s in sents) and result.summary["unit"] == "token"
    place = next(r for r in result.ranking if r["row"] == 5 and r["given"] == "B-ORG")
    words = [w for w, _ in sents[5]]
    assert place["token"] == words[place["word"]] and place["sentence"] == " ".join(words)
    assert place["sentence"][place["start"]:place["end"]] == place["token"]
    assert place["given_entity"] == {"text": place["token"], "type": "ORG", "start": place["start"],
                                     "end": place["end"]}
    # a CoNLL word's own line (sentence 5 starts after 5 sentences of 7 words and a blank line each)
    assert place["line"] == 5 * 8 + place["word"] + 1
    assert set(result.summary["noise_rate"]) == {"B-LOC", "B-ORG", "B-PER", "I-PER", "O"}


def test_qa_audit_scores_each_question_by_its_gold_answer(tiny_bert, write, tmp_path):
    from test_qa import squad_doc

    train = write("train.json", json.dumps(squad_doc(8)))
    result = bertheads.audit("qa", train, out=tmp_path / "qa", model=tiny_bert, mode="features", folds=2, epochs=1,
                             max_length=64, stride=16, max_question_length=16, rows="all",
                             cache_dir=str(tmp_path / "cache"))
    assert result.summary["unit"] == "question" and len(result.ranking) == 8
    scores = [r["score"] for r in result.ranking]
    assert scores == sorted(scores) and all(0.0 <= s <= 1.0 for s in scores)
    first = result.ranking[0]
    assert first["id"].startswith("q") and first["question"] == "What is the capital?"
    assert first["given"] == first["gold_answers"][0] and isinstance(first["suggested"], str)


def test_side_by_side_fold_heads_learn_only_outside_their_fold():
    """Features mode trains the k heads in one pass: head j's gradient is its own loss on the
    rows outside fold j, as if it had trained alone on them."""
    import copy

    import torch
    from torch.nn import functional as F

    from bertheads.training.audit import FOLD, FoldHeads, FoldLoss

    class Modeling:
        def loss(self, logits, batch):
            return F.cross_entropy(logits, batch["labels"])

    class Task:
        modeling = Modeling()

    class Head(torch.nn.Linear):
        layers, token_level = (-1,), False

        def forward(self, states, batch):
            return super().forward(states)

    torch.manual_seed(0)
    head = Head(4, 2)
    heads = FoldHeads([copy.deepcopy(head) for _ in range(3)])
    states = torch.randn(6, 4)
    batch = {"labels": torch.tensor([0, 1, 1, 0, 1, 0]), FOLD: torch.tensor([0, 0, 1, 1, 2, 2])}
    FoldLoss(Task()).loss(heads(states, batch), batch).backward()
    for j in range(3):
        alone = copy.deepcopy(head)
        keep = batch[FOLD] != j
        F.cross_entropy(alone(states[keep], {}), batch["labels"][keep]).backward()
        assert torch.allclose(heads.folds[j].weight.grad, alone.weight.grad, atol=1e-6)
    heads.zero_grad()
    only_fold_0 = {k: v[:2] for k, v in batch.items()}
    FoldLoss(Task()).loss(heads(states[:2], only_fold_0), only_fold_0).backward()
    assert heads.folds[0].weight.grad is None or not heads.folds[0].weight.grad.any()
    assert heads.folds[1].weight.grad.abs().sum() > 0


def test_each_side_by_side_head_takes_the_steps_of_its_own_run(tiny_bert, tmp_path):
    """A joint batch holds batch_size * k/(k-1) rows: each head sees batches of batch_size rows
    outside its fold and takes as many steps as training alone on its 3/4 of 40 rows would."""
    rows = [{"text": f"text {i}", "label": "yes" if i % 2 else "no"} for i in range(40)]
    result = bertheads.audit("classify", rows, model=tiny_bert, mode="features", folds=4, epochs=2, batch_size=8,
                             cache_dir=str(tmp_path / "cache"), progress=False)
    alone = 2 * -(-30 // 8)  # 2 epochs of 30 rows in batches of 8
    assert result.summary["fold_steps"] == [alone] * 4  # (joint batches of 8 rows would take 2 * 5)
    tuned = bertheads.audit("classify", rows, model=tiny_bert, mode="finetune", folds=2, epochs=1, batch_size=8,
                            progress=False)
    assert tuned.summary["fold_steps"] == [3, 3]  # each fold's own run: 20 rows in batches of 8


def test_features_folds_train_the_kinds_reader_unless_told_the_head(tiny_bert, tmp_path):
    """By default features-mode folds train the kind's audit reader (classify: one linear layer
    over the last 4 layers' pooled vectors, as many as the encoder has, each L2-normalised, side
    by side, 10 epochs), named in the summary; --reader head trains the head `train` trains."""
    import torch

    from bertheads.tasks.classify.head import ClassifyHead
    from bertheads.tasks.classify.spec import ClassifySpec

    rows = [{"text": f"text {i}", "label": "yes" if i % 2 else "no"} for i in range(12)]
    options = dict(model=tiny_bert, mode="features", folds=2, cache_dir=str(tmp_path / "cache"), progress=False)
    summary = bertheads.audit("classify", rows, **options).summary
    assert summary["reader"].startswith("linear over the last 4 layers' pooled vectors, each L2-normalised")
    task = summary["settings"]["task"]
    assert (task["normalised"], task["layers"], task["layer_combine"]) == (True, "-1,-2", "concat")  # (2 layers)
    assert summary["settings"]["training"]["epochs"] == 10
    old = bertheads.audit("classify", rows, reader="head", **options).summary
    assert old["reader"] == "the classify head `train` trains" and "normalised" not in old["settings"]["task"]
    assert old["settings"]["training"]["epochs"] is None and "layers" not in old["settings"]["task"]
    from bertheads.training.audit import fold_reader  # a head from label descriptions reads as it starts

    assert fold_reader("classify", {"mode": "features", "label_descriptions": ["no: a", "yes: b"]}) is None
    assert fold_reader("classify", {"mode": "features"}) is not None
    # the reader: each layer's pooled vector normalised (its scale does not matter), no dense layer
    head = ClassifyHead(8, 2, ClassifySpec(layers=[-1, -2], combine="concat", normalised=True, pooling="mean")).eval()
    states, mask = [torch.randn(3, 5, 8), torch.randn(3, 5, 8)], {"attention_mask": torch.ones(3, 5)}
    assert head.pooler is None and head.out.in_features == 16
    assert torch.allclose(head(states, mask), head([states[0] * 7, states[1] * 0.1], mask), atol=1e-5)


def test_a_warm_features_audit_reads_no_encoder_weights(tiny_bert, tmp_path, monkeypatch):
    """With the cache warm, the checkpoint's remembered hash names the cache entry: the
    weights never load (as in `train --mode features`)."""
    from bertheads.encoder import pretrained

    rows = [{"text": f"text {i}", "label": "yes" if i % 2 else "no"} for i in range(12)]
    options = dict(model=tiny_bert, mode="features", folds=2, epochs=1, cache_dir=str(tmp_path / "cache"),
                   progress=False)
    bertheads.audit("classify", rows, **options)  # fills the cache

    def refuse(*args, **kwargs):
        raise AssertionError("the encoder's weights were loaded")

    monkeypatch.setattr(pretrained, "load_encoder_model", refuse)
    assert len(bertheads.audit("classify", rows, **options).ranking) == 12
