"""Character offsets through every tokenizer kind: WordPiece (uncased and cased), byte-level BPE
(`Ġ`) and Unigram with SentencePiece's `▁`, trained here as in `families_matrix.py`. Entities from
raw text, tags of word input and qa answers must come back as exact character spans: no space at
either end, no accent cut off (also in decomposed NFD text), CJK text without spaces, and several
spaces, tabs and newlines between words. The token labels and scores are set from the
tokenizer's own offsets of the gold spans, never from bertheads' word mapping."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest
from families_matrix import train_tokenizer

from bertheads.tasks.qa.formats import QAExample
from bertheads.tasks.qa.passages import answer_tokens
from bertheads.tasks.qa.spec import QASpec
from bertheads.tasks.qa.task import QATask
from bertheads.tasks.tag.formats import TagExample
from bertheads.tasks.tag.spec import TagSpec
from bertheads.tasks.tag.task import TagTask
from bertheads.text.offsets import char_flag, clean_spans, text_words

EXTRA = ("東京に住んでいます。", "Zürich café Zürich", "京都と東京", "New York")
KINDS = {"wordpiece": ("wordpiece", "bert"), "wordpiece-cased": ("wordpiece", "bert"),
         "bpe": ("bpe", "roberta"), "bpe-modernbert": ("bpe", "modernbert"),
         "unigram": ("unigram", "xlm-roberta"), "unigram-deberta": ("unigram", "deberta-v2"),
         "wordpiece-mpnet": ("wordpiece", "mpnet")}
TAGS = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
NFD = unicodedata.normalize("NFD", "Visit Zürich, café.")


@pytest.fixture(scope="module", params=list(KINDS))
def tok(request):
    kind, family = KINDS[request.param]
    tokenizer = train_tokenizer(kind, family, EXTRA)
    if request.param == "wordpiece-cased":
        from tokenizers import normalizers

        tokenizer.backend_tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tokenizer.kind_name = request.param
    return tokenizer


def tag_entities(tok, text: str, gold: list[tuple[str, int, int]]) -> list[tuple]:
    """Entities decoded from token scores that give each piece the gold tag of the characters
    the tokenizer says it covers."""
    task = TagTask(TagSpec(tags=TAGS, max_length=128), None)
    examples = task.reading.from_inputs([text])
    feats, owner = task.modeling.encode_for_inference(examples, tok)
    enc = tok(text, return_offsets_mapping=True)
    assert feats[0]["input_ids"] == enc["input_ids"]
    logits = np.zeros((len(enc["input_ids"]), len(TAGS)), dtype=np.float32)
    logits[:, 0] = 5.0
    begun = set()
    for i, (a, b) in enumerate(enc["offset_mapping"]):
        for kind, s, e in gold:
            if a < e and b > s and text[max(a, s): min(b, e)].strip():
                logits[i] = 0.0
                logits[i, TAGS.index(("I-" if (s, e) in begun else "B-") + kind)] = 10.0
                begun.add((s, e))
    out = task.judging.decode(task.judging.collect([logits], owner, examples, feats), examples)[0]
    return [(x["type"], x["start"], x["end"], x["text"]) for x in out["entities"]]


def test_entities_from_raw_text_are_exact(tok):
    text = "Angela Merkel visited Zürich and a café."
    assert tag_entities(tok, text, [("PER", 0, 13), ("LOC", 22, 28)]) == [
        ("PER", 0, 13, "Angela Merkel"), ("LOC", 22, 28, "Zürich")]
    text = "He  moved to\tNew York\n\nlast  year ."
    assert tag_entities(tok, text, [("LOC", 13, 21)]) == [("LOC", 13, 21, "New York")]
    assert tag_entities(tok, "  Paris is big  ", [("LOC", 2, 7)]) == [("LOC", 2, 7, "Paris")]
    assert tag_entities(tok, "PARIS and paris", [("LOC", 0, 5), ("LOC", 10, 15)]) == [
        ("LOC", 0, 5, "PARIS"), ("LOC", 10, 15, "paris")]


def test_entities_keep_decomposed_accents(tok):
    assert len(NFD) == 21
    assert tag_entities(tok, NFD, [("LOC", 6, 13), ("PER", 15, 20)]) == [
        ("LOC", 6, 13, "Zu\u0308rich"), ("PER", 15, 20, "cafe\u0301")]


def test_entities_in_cjk_text(tok):
    assert tag_entities(tok, "東京に住んでいます", [("LOC", 0, 2)]) == [("LOC", 0, 2, "東京")]


def test_raw_text_words_are_bert_words_for_every_tokenizer(tok):
    text = "Angela  Merkel\tvisited Zürich, a café.\n\nU.S. 東京"
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    _, spans = text_words(text, enc["offset_mapping"])
    words = [text[a:b] for a, b in spans]
    expected = ["Angela", "Merkel", "visited", "Zürich", ",", "a", "café", ".", "U", ".", "S", ".", "東", "京"]
    if tok.kind_name.startswith("unigram"):  # a piece is never split: its 東京 piece is one word
        expected[-2:] = ["東京"]
    assert words == expected


def word_tags(tok, words: list[str], gold: list[str]) -> list[str]:
    """Tags decoded from token scores that give each piece the gold tag of the word its
    tokenizer offsets fall in (words joined by single spaces)."""
    task = TagTask(TagSpec(tags=TAGS, max_length=128), None)
    example = TagExample(words=words)
    feats, owner = task.modeling.encode_for_inference([example], tok)
    joined = " ".join(words)
    enc = tok(joined, return_offsets_mapping=True)
    assert feats[0]["input_ids"] == enc["input_ids"]
    starts = np.cumsum([0] + [len(w) + 1 for w in words])
    logits = np.zeros((len(enc["input_ids"]), len(TAGS)), dtype=np.float32)
    for i, (a, b) in enumerate(enc["offset_mapping"]):
        if b > a and joined[a:b].strip():
            k = int(np.searchsorted(starts, a, side="right")) - 1
            logits[i, TAGS.index(gold[k])] = 10.0
    out = task.judging.decode(task.judging.collect([logits], owner, [example], feats), [example])[0]
    return out["tags"]


def test_word_input_keeps_one_tag_per_word(tok):
    words = ["Angela", "Merkel", "visited", "Zürich", "东京", unicodedata.normalize("NFD", "café"), "."]
    gold = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "O", "O"]
    assert word_tags(tok, words, gold) == ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "O", "O"]


def test_word_input_keeps_words_without_pieces(tok):
    """A word the normalizer removes gives no piece, or, with a leading-space marker, a bare marker."""
    from tokenizers import normalizers

    backend = tok.backend_tokenizer
    saved = backend.normalizer
    drop = normalizers.Replace("\u200b", "")
    backend.normalizer = normalizers.Sequence([drop, saved]) if saved is not None else drop
    try:
        task = TagTask(TagSpec(tags=TAGS, max_length=128), None)
        words = ["Paris", "\u200b", "is", "\u200b", "\u200b", "big"]
        examples = [TagExample(words=words), TagExample(words=["\u200b", "Rome"])]
        feats, owner = task.modeling.encode_for_inference(examples, tok)
        logits = [np.tile(np.eye(len(TAGS), dtype=np.float32)[1], (len(f["input_ids"]), 1)) for f in feats]
        out = task.judging.decode(task.judging.collect(logits, owner, examples, feats), examples)
        assert [len(o["tags"]) for o in out] == [6, 2]
        assert [o["tokens"] for o in out] == [words, ["\u200b", "Rome"]]
    finally:
        backend.normalizer = saved


def test_first_piece_is_not_a_bare_marker(tok):
    task = TagTask(TagSpec(tags=TAGS, max_length=128), None)
    feats, _ = task.modeling.encode_for_inference([TagExample(words=["東京", "Zürich"]), TagExample(text="東京 Zürich")], tok)
    for f in feats:
        firsts = tok.convert_ids_to_tokens([f["input_ids"][p] for p in f["_pos"]])
        assert all(tok.convert_tokens_to_string([t]).strip() for t in firsts), firsts


# -- qa ----------------------------------------------------------------------------------------
def qa_answer(tok, context: str, start_char: int, end_char: int, on_marker: bool = False):
    """The answer decoded from scores that put the start on the piece the tokenizer says holds
    `start_char` (with `on_marker`: on the whitespace piece before it) and the end on the last
    piece starting before `end_char`."""
    task = QATask(QASpec(max_length=128, stride=16, max_question_length=32, paragraph_windows=False,
                         window_choice="raw"), None)
    examples = task.reading.from_inputs([("Where is it?", context)])
    feats, owner = task.modeling.encode_for_inference(examples, tok)
    enc = tok("Where is it?", context, return_offsets_mapping=True)
    assert feats[0]["input_ids"] == enc["input_ids"]
    spans = enc["offset_mapping"]
    passage = [i for i, s in enumerate(enc.sequence_ids()) if s == 1]
    start = next(i for i in passage if spans[i][0] <= start_char < spans[i][1])
    end = max(i for i in passage if spans[i][0] < end_char)
    if on_marker:
        start -= 1
        assert context[spans[start][0]: spans[start][1]].isspace()
    logits = np.full((len(enc["input_ids"]), 2), -10.0, dtype=np.float32)
    logits[start, 0] = logits[end, 1] = 10.0
    pred = task.judging.decode(task.judging.collect([logits], owner, examples, feats), examples)[0]
    return pred["start"], pred["end"], pred["answer"]


def test_qa_answers_are_exact(tok):
    context = "Angela Merkel visited Zürich and a café."
    assert qa_answer(tok, context, 22, 28) == (22, 28, "Zürich")
    assert qa_answer(tok, context, 0, 13) == (0, 13, "Angela Merkel")
    assert qa_answer(tok, context, 35, 39) == (35, 39, "café")
    assert qa_answer(tok, "The capital is\t\tRome.\n\nIt is old.", 16, 20) == (16, 20, "Rome")
    assert qa_answer(tok, NFD, 15, 20) == (15, 20, "cafe\u0301")
    assert qa_answer(tok, NFD, 6, 13) == (6, 13, "Zu\u0308rich")
    assert qa_answer(tok, "東京に住んでいます", 0, 2) == (0, 2, "東京")


def test_qa_answer_starting_on_a_marker_piece(tok):
    if tok.kind_name.startswith("wordpiece"):
        pytest.skip("WordPiece has no leading-space pieces")
    assert qa_answer(tok, "Angela Merkel visited Zürich and a café.", 22, 28, on_marker=True) == (22, 28, "Zürich")


def test_qa_training_labels_point_at_the_answer(tok):
    task = QATask(QASpec(max_length=128, stride=16, max_question_length=32, paragraph_windows=False), None)
    for context, answer, start in (("Angela Merkel visited Zürich and a café.", "Zürich", 22),
                                   ("The capital is\t\tRome.\n\nIt is old.", "Rome", 16),
                                   (NFD, "cafe\u0301", 15), ("東京に住んでいます", "東京", 0)):
        example = QAExample("Where is it?", context, "q", answers=[answer], starts=[start])
        feats, _ = task.modeling.encode_for_inference([example], tok, with_labels=True)
        s, e = answer_tokens(feats[0], example)
        chars = (int(feats[0]["_offsets"][s, 0]), int(feats[0]["_offsets"][e, 1]))
        assert chars == (start, start + len(answer)) and context[chars[0]:chars[1]] == answer


# -- the offset rules themselves ---------------------------------------------------------------
def test_clean_spans_trim_spaces_and_keep_marks():
    text = "a  Zu\u0308rich\tb"
    #        pieces: "a", "  Zu" (a BPE-like piece with spaces), "rich", "\t", "b"
    spans = clean_spans(text, [(0, 1), (1, 5), (6, 10), (10, 11), (11, 12)])
    assert spans.tolist() == [[0, 1], [3, 6], [6, 10], [11, 11], [11, 12]]
    assert text[3:6] == "Zu\u0308"


def test_character_classes():
    assert [char_flag(c) for c in " \t\n\u3000\u00a0"] == [1] * 5
    assert char_flag("\u0301") == 2 and char_flag("\x1c") == 0  # a control character is dropped, not a space
    assert [char_flag(c) for c in ".,'「東"] == [4] * 5 and char_flag("に") == 0  # kana: as BERT, no split
