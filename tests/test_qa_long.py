"""Answer spans in long passages: choosing across windows, v2 null decisions, negative windows,
joined training passages."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bertheads
import bertheads.tasks.qa.task
from bertheads.base.errors import UserError
from bertheads.base.schema import FACE
from bertheads.tasks.qa.formats import QAExample
from bertheads.tasks.qa.passages import answer_tokens, joined_passages, other_passages
from bertheads.tasks.qa.spans import merge_windows, span_context
from bertheads.tasks.qa.spec import QASpec
from bertheads.tasks.qa.task import QATask


def make_task(tokenizer_dir: str, **settings) -> tuple[QATask, object]:
    from bertheads.encoder.pretrained import load_tokenizer

    return QATask(QASpec(**settings), None), load_tokenizer(tokenizer_dir)


def long_example() -> QAExample:
    words = [f"{w}{i}" for i, w in enumerate(["river", "bridge", "tower", "square"] * 30)]
    answer = "the golden lighthouse"
    context = " ".join(words) + f", and then {answer} stood there."
    return QAExample("Which wonder stood there?", context, "x", [answer], [context.index(answer)])


def distractor_logits(feats: list[dict], example: QAExample) -> list[np.ndarray]:
    """The answer's window: a modest span (8) and a low null score (-8). The first window (no
    answer): a higher-scoring span (10) but an even higher null score (12): it "knows" it
    holds no answer. Every other window: a high null score, low spans."""
    logits = []
    for w, f in enumerate(feats):
        x = np.full((len(f["input_ids"]), 2), -5.0, dtype=np.float32)
        s, e = answer_tokens(f, example)
        c0, _ = f["_context"]
        if s:
            x[s, 0], x[e, 1] = 4.0, 4.0
            x[0] = -4.0
        else:
            x[0] = 6.0
            if w == 0:
                x[c0 + 2, 0], x[c0 + 3, 1] = 5.0, 5.0
        logits.append(x)
    return logits


@pytest.mark.parametrize("choice", ["relative", "relative+context"])
def test_distractor_window_outscores_answer_raw_but_not_relative(tiny_bert, choice):
    task, tokenizer = make_task(tiny_bert, max_length=48, stride=12, max_question_length=8)
    example = long_example()
    feats, owner = task.modeling.encode_for_inference([example], tokenizer)
    assert len(feats) > 3
    assert answer_tokens(feats[0], example) == (0, 0)
    logits = distractor_logits(feats, example)
    task.spec.window_choice = "raw"
    raw = task.judging.decode(task.judging.collect(logits, owner, [example], feats), [example])[0]
    assert raw["answer"] != example.answers[0]  # today's decoding: the distractor wins (10 > 8)
    assert raw["start"] < feats[0]["_offsets"][feats[0]["_context"][1]][1]
    task.spec.window_choice = choice
    got = task.judging.decode(task.judging.collect(logits, owner, [example], feats), [example])[0]
    assert got["answer"] == example.answers[0]
    assert got["raw_score"] == pytest.approx(8.0 + 8.0)  # span minus its own window's null score


def test_saved_choice_is_kept_and_old_models_get_raw():
    assert QASpec.from_saved({"max_length": 256}).window_choice == "raw"  # saved before the setting
    assert QASpec.from_saved({"window_choice": "relative"}).window_choice == "relative"
    assert QASpec.from_saved({"window_choice": "relative+context"}).window_choice == "relative+context"
    assert not QASpec.from_saved({"max_length": 256}).paragraph_windows  # windows across paragraphs, as saved
    assert QASpec.from_saved({"max_length": 256}).paragraph_match == 0.0  # no paragraph match, as saved
    assert QASpec.from_saved({"paragraph_match": 4.0}).paragraph_match == 4.0
    assert QASpec.from_saved({"paragraph_windows": True}).paragraph_windows and QASpec().paragraph_windows


def test_span_context_counts_passage_ends_as_unlimited():
    starts = np.array([[5, 12], [5, 12]])
    ends = np.array([[6, 14], [6, 14]])
    ctx = np.array([[3, 15], [3, 15]])
    first, last = np.array([True, False]), np.array([False, True])
    room = span_context(starts, ends, ctx, first, last)
    assert room[0].tolist() == [9, 1]  # first window: only the right side counts
    assert room[1].tolist() == [2, 9]  # last window: only the left side counts


def test_same_span_in_two_windows_scored_where_it_has_most_context():
    edge = (np.array([9.0, 6.0]), np.array([[10, 15], [30, 35]]), 0.0, np.array([1, 50]))
    middle = (np.array([5.0]), np.array([[10, 15]]), 0.0, np.array([40]))
    got = merge_windows([edge, middle], n_best=20)
    assert got.spans.tolist() == [[30, 35], [10, 15]] and got.scores.tolist() == [6.0, 5.0]
    best = merge_windows([edge[:3], middle[:3]], n_best=20)  # without context: the best score
    assert best.spans.tolist() == [[10, 15], [30, 35]] and best.scores.tolist() == [9.0, 6.0]


def test_v2_null_decision_per_window_with_long_passages():
    """Unanswerable: each window's null score beats its own best span, but the raw decision
    compares the smallest null (window A) with the best span (window B) and answers."""
    task = QATask(QASpec(null_threshold=0.0, unanswerable=True), None)
    ex = QAExample("q", "x" * 60, "1")
    a = (np.array([-3.0]), np.array([[0, 4]]), -2.0, None)  # null - span = 1
    b = (np.array([8.0]), np.array([[20, 24]]), 10.0, None)  # null - span = 2
    raw = merge_windows([a, b], n_best=20)
    assert task.judging.decode([raw], [ex])[0]["answer"] != ""
    rel = merge_windows([(a[0] - a[2], *a[1:]), (b[0] - b[2], *b[1:])], n_best=20, relative=True)
    assert rel.null_score == 0.0
    assert task.judging.decode([rel], [ex])[0] == {"answer": "", "start": 0, "end": 0, "score": None, "raw_score": 0.0}
    # an answerable window (span beats its own null by 3) is answered despite the other window
    c = (np.array([1.0]), np.array([[40, 44]]), -2.0, None)
    rel = merge_windows([(a[0] - a[2], *a[1:]), (c[0] - c[2], *c[1:])], n_best=20, relative=True)
    got = task.judging.decode([rel], [ex])[0]
    assert (got["start"], got["end"], got["raw_score"]) == (40, 44, 3.0)
    assert task.options.bind({"null_threshold": -3.5}).judging.decode([rel], [ex])[0]["answer"] == ""


def test_other_passages_are_the_nearest_distinct_ones():
    ex = [QAExample(f"q{i}", f"passage {i // 2}", f"{i}", ["p"], [0]) for i in range(6)]  # 3 passages
    got, question = other_passages(ex, 2)
    assert question == [i for i in range(6) for _ in range(2)]
    assert len(got) == 12 and all(not g.answers for g in got)
    assert [g.context for g in got[:2]] == ["passage 1", "passage 2"]  # first passage: neighbours after
    assert [g.context for g in got[4:6]] == ["passage 0", "passage 2"]  # middle: one each side
    assert got[4].question == "q2"
    assert other_passages(ex[:2], 3) == ([], [])  # only one passage: no negatives


def test_negative_windows_added_to_training_only(tiny_bert):
    task, tokenizer = make_task(tiny_bert, max_length=64, stride=16, max_question_length=16, negative_windows=1)
    ex = [QAExample("What is the capital?", f"The capital is {c}.", str(i), [c], [15])
          for i, c in enumerate(["Paris", "Rome", "Oslo"])]
    feats = task.modeling.encode(ex, tokenizer, with_labels=True)
    assert len(feats) == 6
    assert all(f["start_positions"] > 0 for f in feats[:3])
    assert all(f["start_positions"] == 0 and f["end_positions"] == 0 for f in feats[3:])
    assert len(task.modeling.encode_for_inference(ex, tokenizer)[0]) == 3
    assert "group" not in feats[0]  # only with shared_norm


def test_shared_norm_groups_a_questions_windows(tiny_bert):
    task, tokenizer = make_task(tiny_bert, max_length=64, stride=16, max_question_length=16, negative_windows=1,
                                shared_norm=True)
    ex = [QAExample("What is the capital?", f"The capital is {c}.", str(i), [c], [15])
          for i, c in enumerate(["Paris", "Rome", "Oslo"])]
    feats = task.modeling.encode(ex, tokenizer, with_labels=True)
    # own windows first, then each question's negative window (nearest passage: 1, 0, 1)
    assert [f["group"] for f in feats] == [0, 1, 2, 0, 1, 2]
    assert [f["start_positions"] > 0 for f in feats] == [True] * 3 + [False] * 3
    assert "group" not in task.modeling.encode_for_inference(ex, tokenizer)[0][0]
    from bertheads.compute.batching import length_grouped_batches

    batches = length_grouped_batches([len(f["input_ids"]) for f in feats], 2, seed=0,
                                     groups=[f["group"] for f in feats])
    assert sorted(sorted(b) for b in batches) == [[0, 3], [1, 4], [2, 5]]  # a question's windows together


def shared_batch(logits_a: list[float], logits_b: list[float]) -> tuple:
    """Two windows of one question, `[CLS] q [SEP] p1 p2 p3 [SEP]`; the answer (p2) is in window
    0. Start and end logits alike: `logits_a` for window 0's passage tokens, `logits_b` for
    window 1's."""
    import torch

    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1]] * 2)
    x = torch.zeros(2, 7, 2)
    x[0, 3:6] = torch.tensor(logits_a)[:, None]
    x[1, 3:6] = torch.tensor(logits_b)[:, None]
    x[:, 6] = 50.0  # the final [SEP]: not a passage token, so it must not count
    batch = {"token_type_ids": types, "attention_mask": torch.ones(2, 7, dtype=torch.long),
             "start_positions": torch.tensor([4, 0]), "end_positions": torch.tensor([4, 0]),
             "group": torch.tensor([7, 7])}
    return x, batch


def test_shared_norm_loss_is_one_softmax_over_the_questions_windows():
    import torch

    from bertheads.tasks.qa.spans import shared_window_loss

    x, batch = shared_batch([0.0, 2.0, 0.0], [1.0, 3.0, 1.0])
    want = -(2.0 - torch.logsumexp(torch.tensor([0.0, 2.0, 0.0, 1.0, 3.0, 1.0]), 0))
    assert torch.isclose(shared_window_loss(x, batch), want)
    # the other window's passage scores count: lowering them lowers the loss
    low, batch = shared_batch([0.0, 2.0, 0.0], [-3.0, -3.0, -3.0])
    assert shared_window_loss(low, batch) < want - 1.0
    # as separate questions, the answerless window drops out (its own loss is [CLS]'s)
    batch["group"] = torch.tensor([7, 8])
    assert torch.isclose(shared_window_loss(x, batch), -(2.0 - torch.logsumexp(torch.tensor([0.0, 2.0, 0.0]), 0)))
    # no answer in the batch (SQuAD v2.0 unanswerables): zero, with a gradient of zeros
    x.requires_grad_(True)
    batch["start_positions"] = batch["end_positions"] = torch.tensor([0, 0])
    loss = shared_window_loss(x, batch)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.equal(x.grad, torch.zeros_like(x))


def test_shared_norm_loss_adds_to_the_window_loss(tiny_bert):
    task, _ = make_task(tiny_bert)
    x, batch = shared_batch([0.0, 2.0, 0.0], [1.0, 3.0, 1.0])
    alone = {k: v for k, v in batch.items() if k != "group"}
    from bertheads.tasks.qa.spans import shared_window_loss

    assert float(task.modeling.loss(x, batch)) == pytest.approx(float(task.modeling.loss(x, alone) + shared_window_loss(x, batch)))


def test_joined_passages_keep_the_answer_and_the_file_order():
    texts = [f"Passage {i} says {w}." for i, w in enumerate(["alpha", "beta", "gamma", "delta"])]
    ex = [QAExample("q", texts[i], str(i), [w], [texts[i].index(w)] if i != 2 else [-1])
          for i, w in enumerate(["alpha", "beta", "gamma", "delta"])]
    ex.append(QAExample("unanswerable?", texts[1], "none"))
    got = joined_passages(ex, 2)
    assert got[0].context == "\n".join(texts[:3])  # first passage: the two after it
    assert got[1].context == "\n".join(texts[:3])  # one before, one after
    assert got[3].context == "\n".join(texts[1:])  # last: the two before it, in file order
    for g, e in zip(got[:4], ex):
        s = g.starts[0]
        assert g.context[s: s + len(e.answers[0])] == e.answers[0] and g.context.count(e.context) == 1
        assert s == g.context.index(e.context) + e.context.index(e.answers[0])  # in its own passage
    assert got[4].answers == [] and got[4].starts == []
    assert [g.context for g in joined_passages(ex, 0)] == [e.context for e in ex]


def test_join_passages_trains_on_longer_windows_only(tiny_bert):
    task, tokenizer = make_task(tiny_bert, max_length=48, stride=8, max_question_length=8, join_passages=2)
    cities = ["Paris", "Rome", "Oslo", "Bern"]
    ex = [QAExample("What is the capital?", f"The capital of the country number {i} is {c}, by the river.",
                    str(i), [c], [f"The capital of the country number {i} is ".__len__()])
          for i, c in enumerate(cities)]
    plain, _ = task.modeling.encode_for_inference(ex, tokenizer, with_labels=True)
    feats = task.modeling.encode(ex, tokenizer, with_labels=True)
    assert len(feats) >= 2 * len(plain)  # three passages a question: more windows
    positives = [f for f in feats if f["start_positions"] > 0]
    assert positives and any(f["start_positions"] == 0 for f in feats)  # windows without the answer: [CLS]
    for f in positives:  # each labelled span is one of the capitals
        s, e = f["_offsets"][f["start_positions"]][0], f["_offsets"][f["end_positions"]][1]
        assert any(tokenizer.decode(f["input_ids"][f["start_positions"]: f["end_positions"] + 1]).lower() == c.lower()
                   for c in cities) and e > s
    assert len(task.modeling.encode_for_inference(ex, tokenizer)[0]) == len(plain)  # prediction reads passages as given


def test_cli_flags_saved_with_the_model(tiny_bert, tmp_path, monkeypatch):
    from bertheads.cli.main import main

    doc = {"data": [{"paragraphs": [{"context": f"The capital is {c}. Rivers run through it.",
                                     "qas": [{"id": c, "question": "What is the capital?",
                                              "answers": [{"text": c, "answer_start": 15}]}]}
                                    for c in ("Paris", "Rome", "Oslo", "Bern")]}]}
    train = tmp_path / "train.json"
    train.write_text(json.dumps(doc))
    out = tmp_path / "m"
    assert main(["train", "qa", "--train", str(train), "--out", str(out), "--model", tiny_bert, "--epochs", "1",
                 "--max-length", "64", "--stride", "16", "--max-question-length", "16", "--no-progress",
                 "--window-choice", "relative+context", "--negative-windows", "2", "--join-passages", "1",
                 "--paragraph-windows", "--shared-norm", "--paragraph-match", "2.5", "--no-topic-segments"]) == 0
    model = bertheads.load(out)
    spec = model.task().spec
    assert spec.shared_norm and not spec.topic_segments
    model.set_options(topic_segments=True)  # predict/evaluate --topic-segments
    assert model.task().spec.topic_segments
    assert spec.window_choice == "relative+context" and spec.negative_windows == 2 and spec.join_passages == 1
    assert spec.paragraph_windows and spec.paragraph_match == 2.5
    model.set_options(window_choice="raw")
    assert model.task().spec.window_choice == "raw"
    with pytest.raises(UserError, match="window_choice='best'"):
        model.set_options(window_choice="best")
    used = []
    decode = bertheads.tasks.qa.judging.QAJudging.collect
    monkeypatch.setattr(bertheads.tasks.qa.judging.QAJudging, "collect",
                        lambda self, *a: used.append((self.spec.window_choice, self.spec.paragraph_windows,
                                                      self.spec.paragraph_match)) or decode(self, *a))
    assert main(["predict", str(out), "--question", "What is the capital?", "--context", "The capital is Rome.",
                 "--window-choice", "relative"]) == 0
    assert main(["evaluate", str(out), "--data", str(train), "--window-choice", "context",
                 "--no-paragraph-windows", "--paragraph-match", "0"]) == 0
    assert used == [("relative", True, 2.5), ("context", False, 0.0)]
    with pytest.raises(UserError, match="^paragraph_match= is for qa heads"):
        classify = bertheads.load(out)
        classify.task().kind = "classify"
        classify.set_options(paragraph_match=1.0)


def test_bad_settings_are_user_errors(tiny_bert):
    from bertheads.encoder.pretrained import Encoder
    from bertheads.tasks.qa.task import check_settings

    encoder = Encoder.load(tiny_bert)
    with pytest.raises(UserError, match="window_choice='best'"):
        check_settings(QASpec(window_choice="best"), encoder)
    # from Python the keyword is named; on the command line, the flag (`schema.said`)
    with pytest.raises(UserError, match="^negative_windows=: must be at least 0"):
        check_settings(QASpec(negative_windows=-1), encoder)
    with pytest.raises(UserError, match="^join_passages=: must be at least 0"):
        check_settings(QASpec(join_passages=-2), encoder)
    with pytest.raises(UserError, match="^paragraph_match=: must be at least 0"):
        check_settings(QASpec(paragraph_match=-1.0), encoder)
    face = FACE.set("cli")
    try:
        with pytest.raises(UserError, match="^--negative-windows: must be at least 0"):
            check_settings(QASpec(negative_windows=-1), encoder)
    finally:
        FACE.reset(face)


def test_paragraph_spans_split_at_blank_lines_else_line_breaks():
    from bertheads.tasks.qa.passages import paragraph_spans

    long_a, long_b = "a" * 30, "b" * 30
    text = f"{long_a}\n{long_b}\n\n  {long_b} tail\n"
    assert [text[a:b] for a, b in paragraph_spans(text, min_chars=10)] == [f"{long_a}\n{long_b}", f"{long_b} tail"]
    lines = f"Heading\n{long_a}\n{long_b}\nend"
    # no blank line: each line is a paragraph; the short heading joins the next, the short end the one before
    assert [lines[a:b] for a, b in paragraph_spans(lines, min_chars=10)] == [f"Heading\n{long_a}", f"{long_b}\nend"]
    wrapped = "\n".join(["a hard-wrapped line of some sixty characters, as email has it"] * 6)
    assert paragraph_spans(wrapped) == [(0, len(wrapped))]  # most lines short, no blank line: kept whole
    crlf = f"{long_a}\r\n{long_b}\r\n\r\n{long_b}"
    assert [crlf[a:b] for a, b in paragraph_spans(crlf, min_chars=10)] == [f"{long_a}\r\n{long_b}", long_b]
    assert paragraph_spans("one paragraph only") == [(0, 18)]
    assert paragraph_spans("\n\n") == [(0, 2)]


def test_paragraph_windows_read_each_paragraph_alone(tiny_bert):
    paragraphs = [f"Paragraph {i} is about the river {w} and the old town near it, as the guide says. " * 3
                  for i, w in enumerate(["Rhine", "Seine", "Danube"])]
    context = "\n".join(paragraphs)
    answer = "Danube"
    example = QAExample("Which river?", context, "x", [answer], [context.index(answer)])
    task, tokenizer = make_task(tiny_bert, max_length=48, stride=8, max_question_length=8)  # the default
    feats, owner = task.modeling.encode_for_inference([example], tokenizer, with_labels=True)
    plain_task, _ = make_task(tiny_bert, max_length=48, stride=8, max_question_length=8, paragraph_windows=False)
    alone = [plain_task.modeling.windows([QAExample("Which river?", p, "p")], tokenizer)[0] for p in paragraphs]
    # the windows are those of each paragraph read as its own passage, offsets moved into the whole passage
    assert [f["input_ids"] for f in feats] == [f["input_ids"] for part in alone for f in part]
    assert owner == [0] * len(feats) and len(feats) > 3  # a paragraph longer than a window is still cut
    for f in feats:
        c0, c1 = f["_context"]
        text = context[f["_offsets"][c0][0]: f["_offsets"][c1][1]]
        assert "\n" not in text and any(text in p for p in paragraphs)
    held = [w for w, f in enumerate(feats) if f["start_positions"] > 0]
    assert held and all(answer in paragraphs[2] for _ in held)
    f = feats[held[0]]
    assert context[f["_offsets"][f["start_positions"]][0]: f["_offsets"][f["end_positions"]][1]] == answer
    # token windows over the whole passage mix paragraphs in one window
    mixed, _ = plain_task.modeling.encode_for_inference([example], tokenizer)
    assert any("\n" in context[f["_offsets"][f["_context"][0]][0]: f["_offsets"][f["_context"][1]][1]] for f in mixed)


def test_joined_training_passages_are_read_across_their_ends(tiny_bert):
    task, tokenizer = make_task(tiny_bert, max_length=96, stride=16, max_question_length=8, join_passages=1)
    long = " and the old town near it, as the guide book says about the place and its long history" * 3
    ex = [QAExample("Which river?", f"The river is the {w}{long}.", str(i), [w], [13])
          for i, w in enumerate(["Rhine", "Seine", "Danube"])]
    feats = task.modeling.encode(ex, tokenizer, with_labels=True)
    spans = [ex_text for f in feats
             for ex_text in [tokenizer.decode(f["input_ids"][f["_context"][0]: f["_context"][1] + 1])]]
    assert any(s.count("the river is the") == 2 for s in spans)  # one window holds the end of one, start of another


def test_training_plan_keeps_a_questions_windows_in_one_batch(tiny_bert):
    from bertheads.training.loop import TaskData, TrainSettings, plan_epoch

    task, tokenizer = make_task(tiny_bert, max_length=64, stride=16, max_question_length=16, negative_windows=2,
                                shared_norm=True)
    ex = [QAExample("What is the capital?", f"The capital is {c}.", str(i), [c], [15])
          for i, c in enumerate(["Paris", "Rome", "Oslo", "Bern", "Kyiv", "Riga", "Lima"])]
    feats = task.modeling.encode(ex, tokenizer, with_labels=True)
    plan = plan_epoch([TaskData("qa", task, feats)], TrainSettings(batch_size=4, seed=3), epoch=0, rank=0, world=1)
    seen = sorted(i for _, b in plan for i in b)
    assert seen == list(range(len(feats)))
    assert all(len({feats[i]["group"] for i in b}) == len(b) // 3 for _, b in plan)  # whole groups of 3


def three_paragraphs() -> tuple[QAExample, list[str]]:
    """The answer's paragraph, one of the same topic sharing a few question words, and filler
    (each over 200 characters, so each is a paragraph of its own)."""
    paragraphs = ["This sentence is only filler text and it says nothing about anything in particular. " * 3,
                  "The Louvre was a royal palace before it was a museum, and the city grew around it. " * 3,
                  "The Eiffel tower was built in 1889 for the world fair held in the city that year. " * 3]
    context = "\n\n".join(paragraphs)
    return QAExample("When was the Eiffel tower built?", context, "x", ["1889"], [context.index("1889")]), paragraphs


def test_paragraph_match_ranks_the_paragraphs_by_the_questions_words(tiny_bert):
    from bertheads.tasks.qa.spans import paragraph_match_gaps

    task, tokenizer = make_task(tiny_bert, max_length=64, stride=16, max_question_length=16)
    example, paragraphs = three_paragraphs()
    plain = QAExample(example.question, paragraphs[2], "y", ["1889"], [paragraphs[2].index("1889")])
    feats, owner = task.modeling.encode_for_inference([example, plain], tokenizer)
    gaps = paragraph_match_gaps(feats, owner)
    which = np.array([f["_paragraph"] for f in feats])
    filler, louvre, eiffel, alone = (gaps[which == p] for p in range(4))
    assert len(set(filler)) == len(set(louvre)) == len(set(eiffel)) == 1  # one value per paragraph
    assert eiffel[0] == 0.0 and filler[0] < louvre[0] < 0.0  # "the", "was" also in the Louvre's
    assert filler[0] == -1.0  # none of the question's words: the whole gap
    assert (alone == 0.0).all() and owner.count(1) > 1  # one paragraph: no gap, however many windows
    # words every paragraph has count for little: adding "the eiffel" to the filler's text moves it up
    closer = QAExample(example.question, example.context.replace("particular", "the eiffel"), "z")
    moved = paragraph_match_gaps(*task.modeling.encode_for_inference([closer], tokenizer))
    assert moved[0] > filler[0]


def test_paragraph_match_lets_the_answers_paragraph_win(tiny_bert):
    from bertheads.tasks.qa.spans import paragraph_match_gaps

    task, tokenizer = make_task(tiny_bert, max_length=64, stride=16, max_question_length=16)
    assert task.spec.paragraph_match == 6.0  # on by default for new models
    task.spec.paragraph_match = 0.0
    example, _ = three_paragraphs()
    feats, owner = task.modeling.encode_for_inference([example], tokenizer)
    logits = []
    for f in feats:  # the filler's first window: a stronger span (relative 24) than the answer's (16)
        x = np.full((len(f["input_ids"]), 2), -5.0, dtype=np.float32)
        x[0] = -4.0
        s, e = answer_tokens(f, example)
        if s:
            x[s, 0], x[e, 1] = 4.0, 4.0
        elif f is feats[0]:
            x[f["_context"][0] + 1, 0], x[f["_context"][0] + 2, 1] = 8.0, 8.0
        logits.append(x)
    got = task.judging.decode(task.judging.collect(logits, owner, [example], feats), [example])[0]
    assert got["answer"] != "1889" and got["raw_score"] == pytest.approx(24.0)  # the filler's span wins
    gap = paragraph_match_gaps(feats, owner)[0]
    assert gap < 0
    task.spec.paragraph_match = 9.0 / -gap  # the filler's span falls to 24 - 9 = 15 < 16
    got = task.judging.decode(task.judging.collect(logits, owner, [example], feats), [example])[0]
    assert got["answer"] == "1889" and got["raw_score"] == pytest.approx(16.0)  # the best paragraph loses nothing
    task.spec.paragraph_match = 7.0 / -gap  # not enough: 24 - 7 = 17 > 16
    assert task.judging.decode(task.judging.collect(logits, owner, [example], feats), [example])[0]["answer"] != "1889"


def test_paragraph_match_changes_nothing_on_one_paragraph(tiny_bert):
    task, tokenizer = make_task(tiny_bert, max_length=48, stride=12, max_question_length=8)
    example = long_example()
    feats, owner = task.modeling.encode_for_inference([example], tokenizer)
    logits = distractor_logits(feats, example)
    before = task.judging.collect(logits, owner, [example], feats)[0]
    task.spec.paragraph_match = 50.0
    after = task.judging.collect(logits, owner, [example], feats)[0]
    assert len(feats) > 3 and np.array_equal(before.scores, after.scores) and np.array_equal(before.spans, after.spans)


# -- passages without paragraph breaks: topic segments ----------------------------------------------
RIVER = ["The river Rhine floods its valley every spring.", "Boats on the Rhine carry coal and grain downstream.",
         "Its valley floods when snow melts in the Alps.", "Barges and boats crowd the river harbours of the Rhine."]
MUSIC = ["A violin concerto needs a soloist and an orchestra.", "The orchestra tunes to the oboe before the concerto.",
         "Soloists practise the violin cadenza for months.", "An orchestra without a conductor rarely plays a concerto."]


def word_starts(text: str) -> list[int]:
    import re

    return [m.start() for m in re.finditer(r"\w+|[^\w\s]", text)]


def test_sentence_spans_keep_titles_initials_and_lower_case_continuations():
    from bertheads.tasks.qa.segments import sentence_spans

    text = 'Dr. Who met J. Smith, e.g. there. Then "he left." Finally! 東京。大阪。'
    assert [text[a:b] for a, b in sentence_spans(text)] == [
        "Dr. Who met J. Smith, e.g. there.", 'Then "he left."', "Finally!", "東京。", "大阪。"]


def test_topic_spans_cut_flat_text_where_the_subject_changes():
    from bertheads.tasks.qa.segments import topic_spans

    text = " ".join(RIVER * 2 + MUSIC * 2)
    starts = word_starts(text)
    spans = topic_spans(text, starts, room=60, min_tokens=20)
    assert [text[a:b] for a, b in spans] == [" ".join(RIVER * 2), " ".join(MUSIC * 2)]
    assert topic_spans(text, starts, room=len(starts)) == [(0, len(text))]  # it fits: kept whole
    one = "a " * 200 + "b."
    assert topic_spans(one, word_starts(one), room=10) == [(0, len(one))]  # one sentence: kept whole


def test_topic_segments_read_each_topic_of_a_flat_passage_alone(tiny_bert):
    context = " ".join(RIVER * 2 + MUSIC * 2)
    music = " ".join(MUSIC * 2)
    example = QAExample("What tunes to the oboe?", context, "x", ["The orchestra"], [context.index(music) + 52])
    task, tokenizer = make_task(tiny_bert, max_length=64, stride=8, max_question_length=12)  # the defaults
    feats, _ = task.modeling.encode_for_inference([example], tokenizer, with_labels=True)
    flat, _ = make_task(tiny_bert, max_length=64, stride=8, max_question_length=12, topic_segments=False)
    plain, _ = flat.modeling.encode_for_inference([example], tokenizer)
    shown = [context[f["_offsets"][f["_context"][0]][0]: f["_offsets"][f["_context"][1]][1]] for f in feats]
    assert any(text.startswith(MUSIC[0]) for text in shown)  # a window starts where the music does
    assert all(music.startswith(text) or text in " ".join(RIVER * 2) or text in music for text in shown)
    assert any("Rhine" in t and "violin" in t for t in
               (context[f["_offsets"][f["_context"][0]][0]: f["_offsets"][f["_context"][1]][1]] for f in plain))
    held = [f for f in feats if f["start_positions"] > 0]
    assert held and context[held[0]["_offsets"][held[0]["start_positions"]][0]:].startswith("The orchestra")
    # the segments count as paragraphs for the match
    assert len({f["_paragraph"] for f in feats}) == 2


def test_topic_segments_leave_one_window_passages_alone(tiny_bert):
    example = QAExample("What floods?", " ".join(RIVER + MUSIC[:1]), "x")
    on, tokenizer = make_task(tiny_bert, max_length=128, stride=8, max_question_length=12)
    off, _ = make_task(tiny_bert, max_length=128, stride=8, max_question_length=12, topic_segments=False)
    a, b = on.modeling.windows([example], tokenizer)[0], off.modeling.windows([example], tokenizer)[0]
    assert len(a) == 1 and a[0]["input_ids"] == b[0]["input_ids"]
    assert not QASpec.from_saved({"max_length": 256}).topic_segments and QASpec().topic_segments
