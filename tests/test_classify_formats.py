"""Reading the classify formats: column detection, label types and one-line errors."""

import pytest

from bertheads.base.errors import UserError
from bertheads.tasks.classify.formats import infer_labels, read_file
from bertheads.tasks.classify.spec import ClassifySpec


def read(path, **spec):
    return read_file(path, ClassifySpec(**spec))


def test_sst2_tsv(write):
    path = write("sst.tsv", 'sentence\tlabel\nit \'s a "great" film \t1\nbad\t0\n')
    ex = read(path)
    assert [(e.text, e.pair, e.label) for e in ex] == [('it \'s a "great" film ', None, "1"), ("bad", None, "0")]
    assert infer_labels(ex, path, None) == ("single_label", [0, 1])


def test_mrpc_tsv_with_bom_and_string_columns(write):
    path = write("mrpc.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b .\tC d .\n0\t3\t4\tE\tF\n")
    spec = ClassifySpec()
    ex = read_file(path, spec)
    assert (ex[0].text, ex[0].pair, ex[0].label) == ("A b .", "C d .", "1")
    assert (spec.text_column, spec.pair_column, spec.label_column) == ("#1 String", "#2 String", "Quality")


def test_rte_string_labels_sorted(write):
    path = write("rte.tsv", "index\tsentence1\tsentence2\tlabel\n0\tA\tB\tnot_entailment\n1\tC\tD\tentailment\n")
    ex = read(path)
    assert ex[1].pair == "D"
    assert infer_labels(ex, path, None) == ("single_label", ["entailment", "not_entailment"])


def test_qnli_question_sentence(write):
    path = write("qnli.tsv", "index\tquestion\tsentence\tlabel\n0\tWho?\tHim.\tentailment\n")
    (e,) = read(path)
    assert (e.text, e.pair) == ("Who?", "Him.")


def test_stsb_float_scores_make_regression(write):
    path = write("sts.tsv", "index\tsentence1\tsentence2\tscore\n0\ta\tb\t5.000\n1\tc\td\t0.250\n")
    ex = read(path)
    assert infer_labels(ex, path, None) == ("regression", [])


def test_csv_with_quotes_and_overrides(write):
    path = write("d.csv", 'body,headline,y\n"Hello, world",x,pos\n"a ""quote""",y,neg\n')
    ex = read(path, text_column="body", label_column="y")
    assert [e.text for e in ex] == ["Hello, world", 'a "quote"']
    assert ex[0].pair is None and ex[0].label == "pos"


def test_jsonl_multilabel(write):
    path = write("d.jsonl", '{"text": "a", "labels": ["x", "y"]}\n\n{"text": "b", "labels": []}\n')
    ex = read(path)
    assert infer_labels(ex, path, None) == ("multi_label", ["x", "y"])


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("empty.tsv", "", "empty.tsv: file is empty"),
        ("cols.tsv", "foo\tbar\nx\ty\n", "cols.tsv:1: no text column found"),
        ("nolabel.tsv", "sentence\tfoo\nx\ty\n", "nolabel.tsv:1: no label column found"),
        ("emptytext.tsv", "sentence\tlabel\nfine\t1\n  \t0\n", "emptytext.tsv:3: empty text"),
        ("ncols.tsv", "sentence\tlabel\nfine\t1\nbroken\n", "ncols.tsv:3: expected 2 columns"),
        ("bad.jsonl", '{"text": "a", "label": 1}\n{"text": \n', "bad.jsonl:2: malformed JSON"),
        ("nolab.tsv", "sentence\tlabel\nfine\t\n", "nolab.tsv:2: missing label"),
    ],
)
def test_bad_input_names_file_and_line(write, name, text, message):
    path = write(name, text)
    with pytest.raises(UserError) as err:
        read(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_file():
    with pytest.raises(UserError, match="nope.tsv: no such file"):
        read("nope.tsv")


def test_non_numeric_regression_label(write):
    path = write("sts.tsv", "sentence1\tsentence2\tscore\na\tb\t2.5\nc\td\tabc\n")
    with pytest.raises(UserError, match=r"sts.tsv:3: label 'abc' is not a number"):
        infer_labels(read(path), path, None)
    with pytest.raises(UserError, match=r"sts.tsv:3: label 'abc' is not a number"):
        infer_labels(read(path), path, "regression")


def test_single_label_needs_two_classes(write):
    path = write("one.tsv", "sentence\tlabel\na\t1\nb\t1\n")
    with pytest.raises(UserError, match="only one label"):
        infer_labels(read(path), path, None)
