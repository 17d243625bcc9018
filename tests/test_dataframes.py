"""Data from Python: pandas DataFrames, datasets.Dataset / DatasetDict and lists of dicts go
through train, evaluate and predict for every task kind, with the file readers' column rules and
one-line errors that name the row and the column."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import bertheads
from bertheads.base.errors import UserError
from bertheads.text.rows import as_rows

pd = pytest.importorskip("pandas")
datasets = pytest.importorskip("datasets")

FAST = dict(epochs=1, batch_size=8, progress=False)


def sentiment_frame(n: int = 16):
    good = ["a wonderful film", "great acting and a fine story", "I loved it", "superb and moving"]
    bad = ["a dull film", "terrible acting and a weak story", "I hated it", "boring and flat"]
    rows = [{"sentence": (good if i % 2 else bad)[i % 4], "label": i % 2} for i in range(n)]
    return pd.DataFrame(rows, index=[f"r{i}" for i in range(n)])


def test_classify_dataframe_train_predict_evaluate(tiny_bert, tmp_path):
    frame = sentiment_frame()
    model = bertheads.train("classify", frame, frame.iloc[:6], tmp_path / "m", model=tiny_bert, **FAST)
    assert model.task().spec.text_column == "sentence"
    config = (tmp_path / "m" / "config.yaml").read_text()
    assert "train: DataFrame of 16 rows" in config  # not a path, so described

    out = model.predict(frame.iloc[:5])
    assert isinstance(out, pd.DataFrame)
    assert list(out.index) == ["r0", "r1", "r2", "r3", "r4"]  # the input's index comes back
    assert set(out["label"]) <= {0, 1}
    texts = model.predict(list(frame["sentence"][:5]))  # the same texts as plain strings
    assert list(out["label"]) == [p["label"] for p in texts]

    metrics = model.evaluate(frame)
    assert metrics == bertheads.evaluate(tmp_path / "m", frame)
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["loss"] > 0
    # the same rows written as a TSV file score the same
    path = tmp_path / "dev.tsv"
    frame.to_csv(path, sep="\t", index=False)
    assert model.evaluate(str(path))["accuracy"] == metrics["accuracy"]


def test_classify_dataset_with_class_labels_and_dataset_dict(tiny_bert, tmp_path):
    frame = sentiment_frame()
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    ds = datasets.Dataset.from_dict({"text": list(frame["sentence"]), "label": list(frame["label"])},
                                    features=features)
    dd = datasets.DatasetDict({"train": ds, "validation": ds.select(range(6))})
    model = bertheads.train("classify", dd, None, tmp_path / "m", model=tiny_bert, **FAST)
    assert model.task().spec.labels == ["negative", "positive"]  # the ClassLabel names, not 0/1
    metrics = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert "accuracy" in metrics["dev"]  # the validation split was the dev set
    preds = model.predict(ds.select(range(3)))
    assert [p["label"] in ("negative", "positive") for p in preds] == [True] * 3
    assert model.evaluate(dd["validation"])["accuracy"] == pytest.approx(metrics["dev"]["accuracy"])
    with pytest.raises(UserError, match=r"a DatasetDict; pass one split.*splits: train, validation"):
        model.evaluate(dd)


def test_list_of_dicts_carries_ids(tiny_bert, tmp_path):
    rows = [{"id": f"x{i}", "review": r["sentence"], "class": r["label"]}
            for i, r in enumerate(sentiment_frame().to_dict("records"))]
    model = bertheads.train("classify", rows, None, None, model=tiny_bert, **FAST)
    preds = model.predict(rows[:3], keep_fields=("review",))
    assert [p["id"] for p in preds] == ["x0", "x1", "x2"]
    assert preds[0]["review"] == rows[0]["review"]


@pytest.mark.parametrize("frame, message", [
    (pd.DataFrame({"sentence": ["good", None, "bad"], "label": [1, 0, 0]}), r"^DataFrame row 1: missing text in column 'sentence'$"),
    (pd.DataFrame({"sentence": ["good", "  ", "bad"], "label": [1, 0, 0]}), r"^DataFrame row 1: empty text in column 'sentence'$"),
    (pd.DataFrame({"sentence": ["good", 7, "bad"], "label": [1, 0, 0]}), r"^DataFrame row 1: text in column 'sentence': expected a string, got int$"),
    (pd.DataFrame({"sentence": ["good", "ok", "bad"], "label": [1, float("nan"), 0]}), r"^DataFrame row 1: missing label in column 'label'$"),
    (pd.DataFrame({"words": ["good"], "label": [1]}), r"^DataFrame: no text column found \(columns: words, label\)"),
])
def test_bad_rows_are_one_line_errors_naming_row_and_column(tiny_bert, frame, message):
    with pytest.raises(UserError, match=message):
        bertheads.train("classify", frame, None, None, model=tiny_bert, **FAST)


def test_bad_inputs_name_what_was_given():
    with pytest.raises(UserError, match=r"^train: list item 1: expected a dict"):
        as_rows([{"text": "a"}, "b"], "train")
    with pytest.raises(UserError, match=r"^train: expected a file path, a pandas DataFrame"):
        as_rows(42, "train")


def tag_rows(n: int = 16):
    names = ["B-PER", "I-PER", "O", "B-LOC"]
    rows = []
    for i in range(n):
        person, place = ["Angela Merkel", "John Smith"][i % 2].split(), ["Paris", "Berlin"][i % 2]
        rows.append({"tokens": [*person, "visited", place], "ner_tags": [0, 1, 2, 3]})
    return rows, names


def test_tag_dataset_with_class_label_sequences(tiny_bert, tmp_path):
    rows, names = tag_rows()
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    ds = datasets.Dataset.from_list(rows, features=features)
    model = bertheads.train("tag", ds, ds.select(range(4)), tmp_path / "m", model=tiny_bert, lr=3e-3, **FAST)
    assert set(model.task().spec.tags) == {"B-PER", "I-PER", "O", "B-LOC", "I-LOC"}  # names (and the scheme's I-LOC)
    metrics = model.evaluate(ds.select(range(4)))
    assert "f1" in metrics
    # a DataFrame of the same rows, the tags as names (numbers have no names there)
    frame = pd.DataFrame([{"tokens": r["tokens"], "tags": [names[t] for t in r["ner_tags"]]} for r in rows])
    assert model.evaluate(frame.iloc[:4])["f1"] == pytest.approx(metrics["f1"])
    out = model.predict(pd.DataFrame({"text": ["Angela Merkel visited Paris"]}))
    assert isinstance(out, pd.DataFrame) and "entities" in out.columns
    bad = pd.DataFrame([{"tokens": ["a", "b"], "tags": ["O"]}])
    with pytest.raises(UserError, match=r"^DataFrame row 0: 2 tokens but 1 tags$"):
        model.evaluate(bad)


def test_qa_dataset_in_squad_layout(tiny_bert, tmp_path):
    cities = ["Paris", "Berlin", "Rome", "Madrid"]
    rows = []
    for i in range(12):
        context = f"The old town has many bridges. The capital is {cities[i % 4]}. Rivers run through it."
        rows.append({"id": f"q{i}", "question": "What is the capital?", "context": context,
                     "answers": {"text": [cities[i % 4]], "answer_start": [context.index(cities[i % 4])]}})
    ds = datasets.Dataset.from_list(rows)  # the layout of the hub's squad dataset
    model = bertheads.train("qa", ds, ds, None, model=tiny_bert, max_length=64, stride=16, max_question_length=16,
                            **FAST)
    metrics = model.evaluate(ds)
    assert {"exact_match", "f1"} <= set(metrics)
    frame = ds.to_pandas()
    out = model.predict(frame[["id", "question", "context"]])
    assert isinstance(out, pd.DataFrame) and len(out) == 12 and "answer" in out.columns
    bad = frame.assign(question=[""] + list(frame["question"][1:]))
    with pytest.raises(UserError, match=r"^DataFrame row 0: .*question"):
        model.evaluate(bad)


def test_pandas_and_datasets_are_imported_only_when_given(tiny_bert):
    code = ("import sys, bertheads; m = bertheads.train('classify', [{'text': 'a b', 'label': 0}, "
            "{'text': 'c d', 'label': 1}], None, None, model=sys.argv[1], epochs=1, progress=False); "
            "m.predict(['a']); print('pandas' in sys.modules, 'datasets' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, tiny_bert], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]
