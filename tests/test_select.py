"""`bertheads select`: uncertain inputs first, diverse picks from different clusters, records in
each kind's training format with the label empty, id and score; the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.inference.select import choose, entropy_scores, kmeans, margin_scores


def test_scores_and_diverse_choice():
    units = [np.array([[0.5, 0.5]]), np.array([[0.9, 0.1]]), np.array([[0.99, 0.01], [0.6, 0.4]])]
    assert margin_scores(units).round(3).tolist() == [1.0, 0.2, 0.8]
    assert entropy_scores(units)[0] == pytest.approx(1.0) and entropy_scores(units)[1] < entropy_scores(units)[2]
    # ten copies of one uncertain input and five others: margin takes copies, diverse one of each cluster
    vectors = np.concatenate([np.tile([[1.0, 0.0, 0.0]], (10, 1)), np.eye(3)[[1, 2, 1, 2, 1]] + 0.01 * np.arange(5)[:, None]])
    scores = np.array([0.9] * 10 + [0.5, 0.4, 0.3, 0.2, 0.1])
    assert set(choose(scores, 3, "margin", 0).tolist()) <= set(range(10))
    picked = choose(scores, 3, "diverse", 0, lambda idx: vectors[idx]).tolist()
    assert len(picked) == 3 and len(set(picked) & set(range(10))) == 1 and picked[0] < 10
    assert len(set(kmeans(vectors, 3, 0).tolist())) == 3


@pytest.fixture(scope="module")
def sentiment_model(default_model_dir, tmp_path_factory):
    from test_audit import sentiment_rows

    root = tmp_path_factory.mktemp("select")
    train = root / "train.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in sentiment_rows(40)))
    bertheads.train("classify", str(train), None, root / "model", model=default_model_dir, mode="features",
                    epochs=2, lr=2e-3, batch_size=16, progress=False, cache_dir=str(root / "cache"))
    return root


def test_classify_select_prefers_the_unsure_and_writes_training_records(sentiment_model, tmp_path):
    pool = ["the film was wonderful and superb", "the plot was awful and dull",
            "the cast was wonderful and awful", "the story was great but boring", "the movie was lovely and charming"]
    records = [{"id": f"p{i}", "text": t} for i, t in enumerate(pool)]
    model = bertheads.load(sentiment_model / "model")
    chosen = model.select(records, k=2, out=tmp_path / "next.jsonl")
    # the two whose two label scores are closest, by the model's own predictions
    gaps = [abs(p["scores"]["0"] - p["scores"]["1"]) for p in model.predict(pool)]
    assert {r["id"] for r in chosen.records} == {f"p{i}" for i in np.argsort(gaps)[:2]}
    assert chosen.records[0]["score"] == pytest.approx(1 - min(gaps), abs=1e-5)
    written = [json.loads(line) for line in (tmp_path / "next.jsonl").read_text().splitlines()]
    assert written == chosen.records and written[0]["score"] >= written[1]["score"]
    # the training file's own columns (it named the text "sentence")
    assert set(written[0]) == {"sentence", "label", "id", "score"} and written[0]["label"] is None
    # the command line: a pool file, diverse, the line number as id where the input has none
    (tmp_path / "pool.txt").write_text("\n".join(pool) + "\n")
    assert main(["select", str(sentiment_model / "model"), "--pool", str(tmp_path / "pool.txt"), "-k", "3",
                 "--strategy", "diverse", "--out", str(tmp_path / "cli.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "cli.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(r["sentence"] == pool[r["id"] - 1] for r in lines)
    with pytest.raises(UserError, match="strategy"):
        model.select(records, k=2, strategy="smart")


@pytest.mark.parametrize("strategy", ["margin", "entropy", "diverse", "random"])
def test_a_pool_read_a_chunk_at_a_time_gives_the_same_choice(sentiment_model, monkeypatch, strategy):
    from bertheads.inference import select

    pool = [f"the film {i} was {'wonderful' if i % 3 else 'awful'} and {'dull' if i % 4 else 'superb'}"
            for i in range(30)]
    model = bertheads.load(sentiment_model / "model")
    whole = model.select(pool, k=4, strategy=strategy, seed=3)
    seen = []
    real = select.head_outputs
    monkeypatch.setattr(select, "SCORE_CHUNK", 7)
    monkeypatch.setattr(select, "head_outputs", lambda net, name, chunk, *a: (seen.append(len(chunk)),
                                                                              real(net, name, chunk, *a))[1])
    chunks = model.select(pool, k=4, strategy=strategy, seed=3)
    assert max(seen) == 7 and sum(seen) == 30 and chunks.pool == whole.pool == 30  # never more than a chunk at once
    if strategy != "random":  # (random: another uniform sample for another chunking)
        assert [r["id"] for r in chunks.records] == [r["id"] for r in whole.records]
        # (other batches pad differently: the scores agree to float noise)
        assert [r["score"] for r in chunks.records] == pytest.approx([r["score"] for r in whole.records], abs=1e-5)
    assert len({r["id"] for r in chunks.records}) == 4


def test_tag_and_qa_select_write_their_own_formats(tiny_bert, write, tmp_path):
    from test_qa import squad_doc
    from test_tag import conll, sentences

    tagger = bertheads.train("tag", write("t.txt", conll(sentences(8))), None, None, model=tiny_bert, epochs=1,
                             progress=False)
    # the entities each type had in the sentences trained on (a held-out few choose the epoch)
    counts = tagger.net.tasks[tagger.head_name(None)].spec.trained_counts
    assert set(counts) == {"LOC", "ORG", "PER"} and counts["LOC"] == counts["ORG"] + counts["PER"] <= 8
    pool = [{"tokens": ["Angela", "Merkel", "visited", "Paris"]}, {"tokens": ["Hello"]}]
    assert tagger.select(pool, k=1).cold_start == counts  # (fewer than 10 of every type: at random)
    chosen = tagger.select(pool, k=1, cold_start=0)
    assert chosen.strategy == "margin" and not chosen.cold_start
    assert chosen.records[0]["tags"] == [] and chosen.records[0]["tokens"][0] in ("Angela", "Hello")
    reader = bertheads.train("qa", write("q.json", json.dumps(squad_doc(4))), None, None, model=tiny_bert,
                             epochs=1, max_length=64, stride=16, max_question_length=16, progress=False)
    pool = [{"id": q["id"], "question": q["question"], "context": p["context"]}
            for p in squad_doc(3)["data"][0]["paragraphs"] for q in p["qas"]]
    chosen = reader.select(pool, k=1, strategy="entropy")
    assert chosen.records[0]["answers"] == [] and chosen.records[0]["id"] in ("q0", "q1", "q2")
    assert set(chosen.records[0]) == {"question", "context", "answers", "id", "score"}


def test_a_head_trained_on_a_handful_of_a_class_picks_at_random(tiny_bert, write, tmp_path, caplog, capsys):
    rows = [(f"the film {i} was {'wonderful' if i < 4 else 'awful'}", int(i < 4)) for i in range(30)]
    train = write("skewed.tsv", "sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    bertheads.train("classify", train, None, tmp_path / "model", model=tiny_bert, epochs=1, holdout=0,
                    progress=False)
    model = bertheads.load(tmp_path / "model")  # (the counts are saved with the head)
    assert model.net.tasks[model.head_name(None)].spec.trained_counts == {"0": 26, "1": 4}
    pool = [f"the show {i} was {'wonderful' if i % 2 else 'awful'} and long" for i in range(12)]
    with caplog.at_level("WARNING", logger="bertheads"):
        cold = model.select(pool, k=3, seed=5)
    assert cold.strategy == "random" and cold.cold_start == {"1": 4}
    assert "trained on 4 of '1'" in caplog.text and "cold_start=10" in caplog.text and "random sample" in caplog.text
    assert [r["id"] for r in cold.records] == [r["id"] for r in model.select(pool, k=3, seed=5, strategy="random").records]
    # 4 of a class is no cold start below 4, nor with the rule off: the least margins first
    gaps = sorted(abs(p["scores"]["0"] - p["scores"]["1"]) for p in model.predict(pool))
    for informed in (model.select(pool, k=3, cold_start=4), model.select(pool, k=3, cold_start=0)):
        assert informed.strategy == "margin" and not informed.cold_start
        assert [r["score"] for r in informed.records] == pytest.approx([1 - g for g in gaps[:3]], abs=1e-5)
    # the command line says so
    (tmp_path / "pool.txt").write_text("\n".join(pool) + "\n")
    capsys.readouterr()
    assert main(["select", str(tmp_path / "model"), "--pool", str(tmp_path / "pool.txt"), "-k", "2",
                 "--out", str(tmp_path / "next.jsonl")]) == 0
    said = capsys.readouterr().err
    assert "(random, a cold start)" in said and "--cold-start 10" in said
    with pytest.raises(SystemExit):
        main(["select", str(tmp_path / "model"), "--pool", str(tmp_path / "pool.txt"), "--cold-start", "-1",
              "--out", str(tmp_path / "bad.jsonl")])
