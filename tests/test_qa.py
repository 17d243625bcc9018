"""Answer spans: windows, decoding, the v2 null threshold, SQuAD metrics, CLI."""

from __future__ import annotations

import json
import string
from collections import Counter

import numpy as np
import pytest

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.tasks.qa.formats import QAExample, read_examples
from bertheads.tasks.qa.metrics import (
    best_threshold,
    exact,
    f1_v1,
    f1_v2,
    normalize_answer,
    squad_v1_scores,
    squad_v2_scores,
)
from bertheads.tasks.qa.spans import QAOutput, best_spans, merge_windows
from bertheads.tasks.qa.spec import QASpec
from bertheads.tasks.qa.task import QATask

CITIES = ["Paris", "Berlin", "Rome", "Madrid", "Lisbon", "Vienna"]


def squad_doc(n: int = 12, unanswerable: bool = False) -> dict:
    paragraphs = []
    for i in range(n):
        city = CITIES[i % len(CITIES)]
        context = f"The old town has many bridges. The capital is {city}. Rivers run through it."
        qa = {"id": f"q{i}", "question": "What is the capital?",
              "answers": [{"text": city, "answer_start": context.index(city)}]}
        if unanswerable and i % 3 == 0:
            qa = {"id": f"q{i}", "question": "Who built the bridges?", "answers": [], "is_impossible": True,
                  "plausible_answers": [{"text": "old town", "answer_start": 4}]}
        paragraphs.append({"context": context, "qas": [qa]})
    return {"version": "2.0" if unanswerable else "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


def make_task(tokenizer_dir: str, **settings) -> tuple[QATask, object]:
    from bertheads.encoder.pretrained import load_tokenizer

    spec = QASpec(**settings)
    return QATask(spec, None), load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def v2_model(tiny_bert, tmp_path_factory):
    """A tiny model trained one epoch on SQuAD v2-style data (threshold tuned on dev)."""
    root = tmp_path_factory.mktemp("qa")
    train = root / "train.json"
    train.write_text(json.dumps(squad_doc(12, unanswerable=True)))
    model = bertheads.train("qa", str(train), str(train), root / "model", model=tiny_bert, max_length=64, stride=16,
                            max_question_length=16, settings=bertheads.TrainSettings(epochs=1, batch_size=4, progress=False))
    return model, root


# -- windows ---------------------------------------------------------------------------------
def test_a_passage_longer_than_the_encoder_reads_is_windowed_without_transformers_warning(tiny_bert):
    task, tokenizer = make_task(tiny_bert, max_length=384, stride=128, max_question_length=64)
    context = " ".join(f"{w}{i}" for i, w in enumerate(["river", "bridge", "tower", "square"] * 200))
    example = QAExample("Which tower stood by the river?", context, "x", ["tower2"], [context.index("tower2")])
    feats = task.modeling.encode([example], tokenizer, with_labels=True)
    # transformers marks a tokenizer that warned "Token indices sequence length is longer than the
    # specified maximum ... will result in indexing errors" (a Python caller sees that line; the
    # windows are what the encoder reads, so it would be false)
    assert not tokenizer.deprecation_warnings.get("sequence-length-is-longer-than-the-specified-maximum")
    assert len(feats) > 2
    tokenizer(context)
    assert tokenizer.deprecation_warnings.get("sequence-length-is-longer-than-the-specified-maximum")


def test_windows_long_passage_answer_near_end(tiny_bert):
    task, tokenizer = make_task(tiny_bert, max_length=48, stride=12, max_question_length=8)
    words = [f"{w}{i}" for i, w in enumerate(["river", "bridge", "tower", "square"] * 40)]
    answer = "the golden lighthouse of Alexandria"
    context = " ".join(words) + f", and finally {answer} stood there."
    example = QAExample("Which wonder stood there at the very end of this long list?", context, "x",
                        [answer], [context.index(answer)])
    feats = task.modeling.encode([example], tokenizer, with_labels=True)
    assert len(feats) > 5  # the passage was cut into several windows
    assert all(len(f["input_ids"]) <= 48 for f in feats)
    assert len(feats[-1]["input_ids"]) < 48  # the last window is not padded
    labelled = [f for f in feats if f["start_positions"] != 0]
    assert labelled and labelled[-1] is feats[-1]  # the answer is near the end
    for f in feats:
        c0, c1 = f["_context"]
        assert len(f["_offsets"]) == len(f["input_ids"])
        if f["start_positions"]:
            s, e = f["start_positions"], f["end_positions"]
            assert c0 <= s <= e <= c1
            assert context[f["_offsets"][s][0]:f["_offsets"][e][1]] == answer
        else:  # a window without the whole answer points at [CLS]
            assert f["end_positions"] == 0
            lo, hi = f["_offsets"][c0][0], f["_offsets"][c1][1]
            assert not (lo <= context.index(answer) and context.index(answer) + len(answer) <= hi)
    # neighbouring windows share `stride` passage tokens, and together they cover the passage
    first, second = feats[0], feats[1]
    assert second["_offsets"][second["_context"][0]][0] < first["_offsets"][first["_context"][1]][1]
    assert feats[0]["_offsets"][feats[0]["_context"][0]][0] == 0
    assert feats[-1]["_offsets"][feats[-1]["_context"][1]][1] == len(context)


def test_question_cut_to_max_question_length(tiny_bert):
    task, tokenizer = make_task(tiny_bert, max_length=64, stride=8, max_question_length=5)
    example = QAExample("one two three four five six seven eight nine ten?", "A short passage here.", "x")
    feats, owner = task.modeling.encode_for_inference([example], tokenizer)
    assert owner == [0]
    assert feats[0]["_context"][0] == 1 + 5 + 1  # [CLS] five question tokens [SEP]


# -- decoding --------------------------------------------------------------------------------
def brute_force_best(logits: np.ndarray, c0: int, c1: int, max_len: int) -> tuple[int, int, float]:
    best = (-1, -1, -np.inf)
    for s in range(c0, c1 + 1):
        for e in range(s, min(c1, s + max_len - 1) + 1):
            v = logits[s, 0] + logits[e, 1]
            if v > best[2]:
                best = (s, e, v)
    return best


def test_decoding_picks_best_valid_span():
    logits = np.zeros((12, 2), dtype=np.float32)
    logits[2, 0] = logits[3, 1] = 50.0  # inside the question: never a span
    logits[8, 0], logits[4, 1] = 9.0, 9.0  # end before start: invalid
    logits[4, 0], logits[8:, 1] = -20.0, -20.0
    logits[5, 0], logits[7, 1] = 4.0, 3.0  # the best valid span
    logits[5, 1] = 2.5
    scores, starts, ends, null = best_spans([logits], np.array([[4, 10]]), n_best=20, max_answer_length=30)
    assert (starts[0, 0], ends[0, 0]) == (5, 7) and scores[0, 0] == pytest.approx(7.0)
    assert (starts[0, 1], ends[0, 1]) == (5, 5) and scores[0, 1] == pytest.approx(6.5)
    finite = np.isfinite(scores[0])
    assert np.all(starts[0][finite] >= 4) and np.all(ends[0][finite] <= 10)
    assert np.all(ends[0][finite] >= starts[0][finite])
    assert np.all(np.diff(scores[0][finite]) <= 0)  # best first
    assert null[0] == pytest.approx(logits[0, 0] + logits[0, 1])
    # a length limit of 2 tokens rules out 5..7
    scores, starts, ends, _ = best_spans([logits], np.array([[4, 10]]), n_best=20, max_answer_length=2)
    assert ends[0, 0] - starts[0, 0] + 1 <= 2


def test_decoding_matches_brute_force_over_windows():
    rng = np.random.default_rng(0)
    windows = [rng.normal(size=(n, 2)).astype(np.float32) for n in (40, 33, 17)]
    ctx = np.array([[6, 38], [6, 31], [4, 15]])
    scores, starts, ends, _ = best_spans(windows, ctx, n_best=40, max_answer_length=5)
    for w, x in enumerate(windows):
        s, e, v = brute_force_best(x, *ctx[w], 5)
        assert (starts[w, 0], ends[w, 0]) == (s, e) and scores[w, 0] == pytest.approx(v)


def test_no_valid_pair_among_top_candidates_falls_back_to_exact_search():
    logits = np.full((30, 2), -5.0, dtype=np.float32)
    logits[20:25, 0] = 10.0  # strong starts late, strong ends early: no valid top-2 pair
    logits[2:7, 1] = 10.0
    scores, starts, ends, _ = best_spans([logits], np.array([[1, 28]]), n_best=2, max_answer_length=30)
    s, e, v = brute_force_best(logits, 1, 28, 30)
    assert np.isfinite(scores[0, 0]) and (starts[0, 0], ends[0, 0]) == (s, e)


def test_merge_windows_best_across_windows_once_per_span():
    a = (np.array([5.0, 1.0]), np.array([[10, 15], [0, 3]]), 2.0)
    b = (np.array([7.0, 5.5]), np.array([[40, 44], [10, 15]]), -1.0)
    out = merge_windows([a, b], n_best=20)
    assert out.null_score == -1.0  # the smallest [CLS] score over the windows
    assert out.spans.tolist() == [[40, 44], [10, 15], [0, 3]]
    assert out.scores.tolist() == [7.0, 5.5, 1.0]


def test_span_probability_is_the_pipelines_softmax_product():
    """P(start) * P(end), each a softmax over the window's passage tokens and [CLS], as the
    transformers question-answering pipeline computes it; per window, whichever window wins."""
    from bertheads.tasks.qa.spans import best_spans

    rng = np.random.default_rng(3)
    windows = [rng.normal(size=(12, 2)).astype(np.float32) * 3 for _ in range(2)]
    ctx = np.array([[4, 10], [3, 9]])
    scores, starts, ends, null, norm = best_spans(windows, ctx, n_best=5, max_answer_length=4, with_norm=True)

    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    for w, logits in enumerate(windows):
        keep = np.r_[0, np.arange(ctx[w, 0], ctx[w, 1] + 1)]  # [CLS] and the passage
        p_start, p_end = np.zeros(12), np.zeros(12)
        p_start[keep], p_end[keep] = softmax(logits[keep, 0]), softmax(logits[keep, 1])
        got = np.exp(scores[w] - norm[w])
        assert got == pytest.approx(p_start[starts[w]] * p_end[ends[w]], rel=1e-5)
        assert np.exp(null[w] - norm[w]) == pytest.approx(p_start[0] * p_end[0], rel=1e-5)
        assert 0 < got.sum() <= 1  # distinct spans of one window: probabilities of disjoint events
    chars = [np.stack([starts[w], ends[w] + 1], 1) for w in range(2)]
    probs = [np.exp(scores[w] - norm[w]) for w in range(2)]
    out = merge_windows([(scores[w], chars[w], float(null[w]), None, probs[w], float(np.exp(null[w] - norm[w])))
                         for w in range(2)], n_best=5)
    best = int(np.argmax([scores[0][0], scores[1][0]]))
    assert out.probabilities[0] == pytest.approx(probs[best][0])  # the winning span keeps its window's
    assert out.null_probability == pytest.approx(min(np.exp(null - norm)))


# -- SQuAD v2 null threshold -------------------------------------------------------------------
def test_null_threshold_decides_no_answer():
    task = QATask(QASpec(null_threshold=1.0, unanswerable=True), None)
    ex = QAExample("q", "abc Paris def", "1", ["Paris"], [4])
    near = QAOutput(null_score=6.0, scores=np.array([5.5]), spans=np.array([[4, 9]]),  # null - best = 0.5
                    probabilities=np.array([0.4]), null_probability=0.3)
    far = QAOutput(null_score=8.0, scores=np.array([5.5]), spans=np.array([[4, 9]]),  # 2.5 > 1.0
                   probabilities=np.array([0.1]), null_probability=0.7)
    got = task.judging.decode([near, far], [ex, ex])
    assert got[0] == {"answer": "Paris", "start": 4, "end": 9, "score": 0.4, "raw_score": 5.5}
    assert got[1] == {"answer": "", "start": 0, "end": 0, "score": 0.7, "raw_score": 8.0}
    assert task.options.bind({"null_threshold": 3.0}).judging.decode([far], [ex])[0]["answer"] == "Paris"  # the override
    v1 = QATask(QASpec(), None)  # a v1.1 model never answers nothing
    assert v1.judging.decode([far], [ex])[0]["answer"] == "Paris"


def test_best_threshold_maximises_f1():
    diffs = np.array([-3.0, -1.0, 0.5, 2.0, 3.0, 4.0])
    has_answer = np.array([True, True, False, True, True, False])
    span_f1 = np.array([1.0, 0.5, 0.0, 1.0, 1.0, 0.0])
    thr = best_threshold(diffs, has_answer, span_f1)

    def total(t):  # the dev F1 sum with threshold t, straight from the definition
        return sum((f if h else 0.0) if d <= t else (0.0 if h else 1.0)
                   for d, h, f in zip(diffs, has_answer, span_f1))

    candidates = [-10.0, *diffs, 10.0]
    assert total(thr) == max(total(t) for t in candidates)
    assert 3.0 <= thr < 4.0  # answer the first five, not the last
    assert best_threshold(np.array([1.0, 2.0]), np.array([False, False]), np.zeros(2)) < 1.0


def test_threshold_tuned_during_training_and_saved(v2_model):
    model, root = v2_model
    manifest = json.loads((root / "model" / "bertheads.json").read_text())
    spec = manifest["heads"]["qa"]["spec"]
    assert spec["unanswerable"] is True and isinstance(spec["null_threshold"], float)
    metrics = json.loads((root / "model" / "metrics.json").read_text())["dev"]
    assert {"exact_match", "f1", "HasAns_f1", "NoAns_f1", "HasAns_total", "NoAns_total"} <= set(metrics)
    assert metrics["NoAns_total"] == 4 and metrics["HasAns_total"] == 8
    assert metrics["null_threshold"] == pytest.approx(spec["null_threshold"], abs=1e-4)


# -- metrics: the official scripts' formulas ---------------------------------------------------
def official_normalize(s):  # transcribed from the official v1.1/v2.0 evaluation scripts' definition
    import re

    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def test_squad_normalisation_em_f1_on_hand_made_cases():
    assert normalize_answer("The  Eiffel-Tower!") == official_normalize("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple, a pear and THE plum.") == "apple pear and plum"
    assert exact("the Eiffel Tower.", "Eiffel tower") == 1.0
    assert exact("Eiffel", "Eiffel tower") == 0.0
    # "big red dog" vs "red dog house": 2 shared tokens, precision 2/3, recall 2/3
    assert f1_v1("big red dog", "red dog house") == pytest.approx(2 / 3)
    # repeated tokens count with multiplicity: "a a b" -> [b]; "dog dog cat" vs "dog cat cat"
    p, r = 2 / 3, 2 / 3
    assert f1_v1("dog dog cat", "dog cat cat") == pytest.approx(2 * p * r / (p + r))
    assert f1_v1("", "Paris") == 0.0 and f1_v1("Paris", "Paris.") == 1.0
    # v2.0: an empty prediction is right only for a question without an answer
    assert f1_v2("", "") == 1.0 and f1_v2("", "Paris") == 0.0 and f1_v2("Paris", "") == 0.0
    # the two differ where the gold normalizes to nothing: v1 F1 0, v2 compares token lists
    assert f1_v1("the", "a") == 0.0 and f1_v2("the", "a") == 1.0


def test_squad_v1_and_v2_totals():
    examples = [QAExample("q", "c", "1", ["Denver Broncos", "the Broncos"]),
                QAExample("q", "c", "2", ["Santa Clara, California"]),
                QAExample("q", "c", "3", [])]
    v1 = squad_v1_scores(["Broncos", "Santa Clara"], examples[:2])
    # q1: EM 1 (vs "the Broncos"); q2: F1 = 2*(1*2/3)/(1+2/3) = 0.8
    assert v1["exact_match"] == pytest.approx(50.0) and v1["f1"] == pytest.approx(90.0)
    v2 = squad_v2_scores(["Broncos", "Santa Clara", ""], examples)
    assert v2["HasAns_exact"] == pytest.approx(50.0) and v2["HasAns_f1"] == pytest.approx(90.0)
    assert v2["NoAns_exact"] == 100.0 and v2["NoAns_total"] == 1 and v2["HasAns_total"] == 2
    assert v2["f1"] == pytest.approx(100 * (1 + 0.8 + 1) / 3)
    wrong = squad_v2_scores(["Broncos", "Santa Clara", "Paris"], examples)
    assert wrong["NoAns_f1"] == 0.0


def test_f1_agrees_with_official_formula_on_random_cases():
    rng = np.random.default_rng(1)
    vocab = ["the", "a", "red", "dog", "Dog,", "house", "an", "cat."]
    for _ in range(200):
        pred = " ".join(rng.choice(vocab, rng.integers(0, 5)))
        gold = " ".join(rng.choice(vocab, rng.integers(1, 5)))
        pt, gt = official_normalize(pred).split(), official_normalize(gold).split()
        same = sum((Counter(pt) & Counter(gt)).values())
        want = 0.0 if same == 0 else 2 * (same / len(pt)) * (same / len(gt)) / (same / len(pt) + same / len(gt))
        assert f1_v1(pred, gold) == pytest.approx(want)


# -- reading -----------------------------------------------------------------------------------
def test_reads_squad_json_and_jsonl(write):
    doc = squad_doc(3, unanswerable=True)
    examples = read_examples(write("d.json", json.dumps(doc, indent=2)))
    assert [e.id for e in examples] == ["q0", "q1", "q2"] and examples[0].answers == []
    assert examples[1].answers == ["Berlin"]
    line = {"id": "a", "question": "Q?", "context": "It is Rome.", "answers": {"text": ["Rome"], "answer_start": [6]}}
    none = {"id": "b", "question": "Q?", "context": "It is Rome.", "answers": {"text": [], "answer_start": []}}
    ex, unanswerable = read_examples(write("d.jsonl", json.dumps(line) + "\n\n" + json.dumps(none) + "\n"))
    assert ex.answers == ["Rome"] and ex.starts == [6] and ex.has_id
    assert unanswerable.answers == [] and unanswerable.record.endswith(":3")


def test_training_answer_mismatch_skipped_and_reported_once(write, capsys):
    doc = squad_doc(6)
    for i in (1, 4):
        doc["data"][0]["paragraphs"][i]["qas"][0]["answers"][0]["answer_start"] += 3
    path = write("train.json", json.dumps(doc))
    examples = read_examples(path, strict=False)
    assert [e.id for e in examples] == ["q0", "q2", "q3", "q5"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "skipped 2" in err[0] and "q1" in err[0]
    with pytest.raises(UserError, match="q1"):  # evaluation data: the same record is an error
        doc["data"][0]["paragraphs"][1]["qas"][0]["answers"][0]["answer_start"] = 500
        read_examples(write("dev.json", json.dumps(doc)), strict=True)


# -- the model: Python API, save/load, CLI ------------------------------------------------------
def test_predict_python_and_round_trip(v2_model):
    model, root = v2_model
    context = "The old town has many bridges. The capital is Rome. Rivers run through it."
    got = model.predict([{"question": "What is the capital?", "context": context},
                         ("What runs through it?", context)])
    assert len(got) == 2
    assert all(set(g) == {"answer", "start", "end", "score", "raw_score"} for g in got)
    assert all(0.0 <= g["score"] <= 1.0 for g in got)  # probabilities
    # the same question gives the same answer whichever input form carries it
    assert model.predict([("What is the capital?", context)])[0] == got[0]
    from bertheads.saved import bundle

    bundle.save(model.net, root / "copy")
    loaded = bertheads.load(root / "copy")
    assert loaded.predict([("What runs through it?", context)])[0] == got[1]
    assert loaded.task().spec == model.task().spec and loaded.task().spec.null_threshold is not None
    with pytest.raises(UserError, match="^list row 0: question without a context$"):
        model.predict([{"question": "Q?"}])


def test_short_passages_batched_with_a_longer_one(v2_model):
    """Windows shorter than their batch's longest have fewer spans than n_best: each still gets
    its answer from its own passage."""
    model, _ = v2_model
    contexts = ["a", "Yes.", "b c", "The capital is Rome and the river is long."]
    got = model.predict([{"question": "Where?", "context": c} for c in contexts])
    assert len(got) == 4
    for g, context in zip(got, contexts):
        assert context[g["start"]:g["end"]] == g["answer"] and g["end"] <= len(context)


def test_cli_predict_question_context_and_jsonl(v2_model, write, capsys):
    model, root = v2_model
    context = "The old town has many bridges. The capital is Madrid. Rivers run through it."
    assert main(["predict", str(root / "model"), "--question", "What is the capital?", "--context", context]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == model.predict([("What is the capital?", context)])[0]  # the CLI answers as the API does
    path = write("in.jsonl", json.dumps({"id": "z", "question": "What?", "context": context}) + "\n"
                 + json.dumps({"question": "Where?", "context": context}) + "\n")
    assert main(["predict", str(root / "model"), "--input", path, "--null-threshold", "1e9"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[0]["id"] == "z" and "id" not in lines[1]
    # --null-threshold 1e9 never answers nothing: each line is the best span, as the API gives it
    api = model.predict([("What?", context), ("Where?", context)], null_threshold=1e9)
    assert [x["answer"] for x in lines] == [a["answer"] for a in api] and all(x["answer"] for x in lines)
    assert main(["predict", str(root / "model"), "--null-threshold", "-1000000.0", "--question", "Q?",
                 "--context", context]) == 0
    assert json.loads(capsys.readouterr().out)["answer"] == ""


def test_cli_evaluate_writes_predictions_and_nbest(v2_model, tmp_path, capsys):
    _, root = v2_model
    out = tmp_path / "preds.json"
    assert main(["evaluate", str(root / "model"), "--data", str(root / "train.json"), "--json",
                 "--predictions-out", str(out)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    preds = json.loads(out.read_text())
    assert set(preds) == {f"q{i}" for i in range(12)} and all(isinstance(v, str) for v in preds.values())
    nbest = json.loads((tmp_path / "preds.nbest.json").read_text())
    assert set(nbest) == set(preds) and all("null_score" in v and v["spans"] for v in nbest.values())
    doc = squad_doc(12, unanswerable=True)
    examples = [QAExample("q", "c", qa["id"], [a["text"] for a in qa["answers"]])
                for p in doc["data"][0]["paragraphs"] for qa in p["qas"]]
    assert metrics["f1"] == pytest.approx(squad_v2_scores([preds[e.id] for e in examples], examples)["f1"])


def test_cli_question_needs_context(v2_model, write, capsys):
    _, root = v2_model
    assert main(["predict", str(root / "model"), "--question", "Q?"]) == 2
    assert capsys.readouterr().err == "bertheads: error: --question/--context: missing context\n"
    path = write("in.jsonl", json.dumps({"question": "Q?", "context": "C."}) + "\n")
    assert main(["predict", str(root / "model"), "--input", path, "--question", "Q?", "--context", "C."]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ('{"data": [ {"paragraphs": [}', "malformed JSON"),
    (json.dumps({"data": [{"paragraphs": [{"qas": [{"id": "k1", "question": "Q?", "answers": []}]}]}]}),
     "question k1: question without a context"),
    (json.dumps({"id": "k2", "question": "Q?", "context": "abc", "answers": {"text": ["zzz"], "answer_start": [40]}}),
     ":1: answer 'zzz' at 40 is outside its context"),
])
def test_cli_bad_evaluation_input_is_one_line(v2_model, write, capsys, content, message):
    _, root = v2_model
    path = write("bad.jsonl" if content.startswith('{"id"') else "bad.json", content)
    assert main(["evaluate", str(root / "model"), "--data", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertheads: error: ") and path in err and message in err
