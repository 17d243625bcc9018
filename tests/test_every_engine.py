"""Every head option, every engine: the same options (calibration on and off,
`--min-confidence`, `--long-input`, `--threshold`) through every engine and output format —
JSON lines `predict` (the reference), Parquet `predict`, `analyze` in JSON lines and Parquet,
`BatchPredictor` (pandas and Arrow batches), Dask and the MLflow flavour — give the same
predictions and the same fields (`abstained` wherever `--min-confidence` is given). Spark's and
Ray's workers run `BatchPredictor` with the options they are given; tests/test_engines.py runs
them for real with head options, in the one local Ray and Spark session of the suite. Also: the
MLflow flavour refuses what the CLI refuses."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers_multi import save_heads

import bertheads
from bertheads import BatchPredictor, UserError
from bertheads.cli.main import main
from bertheads.tasks import inference_options

pytestmark = pytest.mark.slow

TAGS = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
WORDS = ["Angela", "Merkel", "visited", "Paris", "a", "warm", "film", "about", "Rome", "the", "baker", "on", "Monday"]
TEXTS = [" ".join(WORDS[(i * 5 + j * 3) % len(WORDS)] for j in range(2 + i % 6)) for i in range(10)]
TEXTS[3] = " ".join(WORDS * 4)  # longer than the heads' 24 tokens: --long-input windows reads it whole

# head -> its options (as a Python keyword and as the flags of predict), one row each
ROWS = [
    ("sentiment", {}),
    ("sentiment", {"min_confidence": 0.57}),
    ("sentiment", {"calibrate": False, "min_confidence": 0.5014}),
    ("sentiment", {"long_input": "windows", "min_confidence": 0.57}),
    ("ner", {"min_confidence": 0.5}),
    ("ner", {"calibrate": False, "min_confidence": 0.22}),
    ("topics", {"threshold": 0.55, "min_confidence": 0.5296}),
]
ENGINES = ["parquet", "analyze", "analyze-parquet", "batch-pandas", "batch-arrow", "dask", "mlflow"]


def flags(options: dict) -> list[str]:
    out = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


@pytest.fixture(scope="module")
def model_dir(tiny_bert, tmp_path_factory):
    """classify (one label, a fitted temperature), tag and multi-label classify heads on one tiny
    encoder: untrained heads (seeded) whose temperatures make calibration on and off differ."""
    out = tmp_path_factory.mktemp("every-engine") / "model"
    short = {"max_length": 24, "stride": 8}
    return str(save_heads(tiny_bert, out, {
        "sentiment": ("classify", 1, {"labels": ["neg", "pos"], "temperature": 0.02, **short}),
        "ner": ("tag", 2, {"tags": TAGS, "temperature": 0.05, **short}),
        "topics": ("classify", 3, {"labels": ["art", "food", "news"], "problem": "multi_label", "temperature": 0.05,
                                   **short})}))


@pytest.fixture(scope="module")
def inputs(model_dir, tmp_path_factory):
    """The texts as JSON lines and as Parquet (two row groups), with ids."""
    d = tmp_path_factory.mktemp("every-engine-inputs")
    (d / "in.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    pq.write_table(pa.table({"id": list(range(len(TEXTS))), "text": TEXTS}), d / "in.parquet", row_group_size=5)
    return d


@pytest.fixture(scope="module")
def reference(model_dir, inputs, tmp_path_factory):
    """row -> JSON lines `predict`'s predictions (by id) for its head and options."""
    d = tmp_path_factory.mktemp("every-engine-ref")
    out = {}
    for k, (head, options) in enumerate(ROWS):
        target = d / f"{k}.jsonl"
        assert main(["predict", model_dir, "--head", head, "--input", str(inputs / "in.jsonl"), "--output",
                     str(target), "--runtime", "torch", "--precision", "fp32", "-q", *flags(options)]) == 0
        out[k] = {r["id"]: r for r in map(json.loads, target.read_text().splitlines())}
    return out


def test_the_options_change_the_reference(reference):
    """The table means something: each option changes predict's answers, and some abstain."""
    label = {k: [reference[k][i].get("label") for i in range(len(TEXTS))] for k in reference}
    scores = {k: [reference[k][i].get("scores") for i in range(len(TEXTS))] for k in reference}
    assert scores[0] != scores[2]  # calibration off
    assert scores[1] != scores[3]  # the long text read in windows
    for k, (_, options) in enumerate(ROWS):
        abstained = [reference[k][i].get("abstained") for i in range(len(TEXTS))]
        if "min_confidence" in options:
            assert True in abstained and False in abstained, (ROWS[k], abstained)
        else:
            assert set(abstained) == {None}
    assert label[0] == label[1]


# -- each engine's predictions as {id: {field: value}} ----------------------------------------
def fields_of(row: dict, head: str | None = None) -> dict:
    """A table row's prediction fields (`HEAD_FIELD` columns when `head`), nulls left out."""
    prefix = f"{head}_" if head else ""
    return {k[len(prefix):]: v for k, v in row.items() if k.startswith(prefix) and v is not None
            and k not in ("id", "text", "_file", "_row", "error")}


def table_rows(frame: pd.DataFrame, head: str | None = None) -> dict:
    return {int(r["id"]): fields_of(r, head) for r in frame.to_dict("records")}


def run_engine(engine: str, model_dir: str, inputs, head: str, options: dict, tmp_path, capsys) -> dict:
    if engine == "parquet":
        out = tmp_path / "out.parquet"
        assert main(["predict", model_dir, "--head", head, "--input", str(inputs / "in.jsonl"), "--output", str(out),
                     "--runtime", "torch", "--precision", "fp32", "-q", *flags(options)]) == 0
        return table_rows(pq.read_table(out).to_pandas())
    if engine in ("analyze", "analyze-parquet"):
        out = tmp_path / ("out.parquet" if engine == "analyze-parquet" else "out.jsonl")
        assert main(["analyze", model_dir, "--input", str(inputs / "in.jsonl"), "--output", str(out),
                     "--runtime", "torch", "--precision", "fp32", "-q", *flags(options)]) == 0
        if engine == "analyze":
            return {r["id"]: r[head] for r in map(json.loads, out.read_text().splitlines())}
        return table_rows(pq.read_table(out).to_pandas(), head)
    frame = pd.DataFrame({"id": range(len(TEXTS)), "text": TEXTS})
    if engine == "batch-pandas":
        return table_rows(BatchPredictor(model_dir, heads=head, **options)(frame), head)
    if engine == "batch-arrow":
        return table_rows(BatchPredictor(model_dir, heads=[head], **options)(pa.Table.from_pandas(frame)).to_pandas(),
                          head)
    if engine == "dask":
        dd = pytest.importorskip("dask.dataframe")
        import dask

        with dask.config.set(scheduler="synchronous"):
            out = bertheads.dask_predict(dd.from_pandas(frame, npartitions=2), model_dir, heads=[head],
                                         **options).compute()
        return table_rows(out, head)
    if engine == "mlflow":
        mlflow = pytest.importorskip("mlflow")
        loaded = mlflow.pyfunc.load_model(model_dir)  # MLflow keeps only the params the MLmodel declares
        answers = loaded.predict(TEXTS, params={"head": head, **options})
        return dict(enumerate(answers))
    raise AssertionError(engine)


def same_prediction(got: dict, expected: dict) -> None:
    """`got` (a table row's fields, or a JSON prediction) holds `expected`'s fields and values."""
    expected = {k: v for k, v in expected.items() if k != "id"}
    got = {k: v for k, v in got.items() if k != "id" and not (k == "score" and "score" not in expected)}
    assert set(got) == set(expected), (got, expected)  # the same fields: `abstained` where JSON has it
    for key, value in expected.items():
        if key == "scores":
            assert dict(got[key]) == pytest.approx(value, abs=1e-5)
        elif key == "entities":
            assert [dict(e) for e in got[key]] == [{**e, "score": pytest.approx(e["score"], abs=1e-5)} for e in value]
        elif key == "labels":
            assert list(got[key]) == value
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("engine", ENGINES)
def test_every_option_reaches_every_engine(engine, model_dir, inputs, reference, tmp_path, capsys):
    analyzed = inference_options("analyze")
    for k, (head, options) in enumerate(ROWS):
        if engine.startswith("analyze") and not set(options) <= set(analyzed):
            continue  # an option analyze has no flag for (--long-input, --threshold: predict's and serve's)
        got = run_engine(engine, model_dir, inputs, head, options, tmp_path / str(k), capsys)
        assert sorted(got) == sorted(reference[k]), (engine, ROWS[k])
        for i, expected in reference[k].items():
            try:
                same_prediction(got[i], expected)
            except AssertionError as exc:
                raise AssertionError(f"{engine}, {ROWS[k]}, input {i}: {exc}") from None


def test_batch_predictor_options_are_checked_like_predicts(model_dir):
    with pytest.raises(UserError, match=r"min_confidence=2: expected a number from 0 to 1"):
        BatchPredictor(model_dir, heads="sentiment", min_confidence=2)
    with pytest.raises(UserError, match=r"threshold=.* is for .*classify|unknown setting 'treshold'"):
        BatchPredictor(model_dir, heads="ner", treshold=0.5)
    with pytest.raises(UserError, match="is for classify heads, not tag"):
        BatchPredictor(model_dir, heads="ner", long_input="windows")
    with pytest.raises(UserError, match=r"unknown setting 'devce' of BatchPredictor \(did you mean 'device'\?\)"):
        BatchPredictor(model_dir, devce="cpu")
    with pytest.raises(UserError, match="heads: expected a head's name or a list of names"):
        BatchPredictor(model_dir, heads=3)
    schema = BatchPredictor(model_dir, min_confidence=0.5).output_schema()  # several heads: each its own
    assert {"sentiment_abstained", "ner_abstained", "topics_abstained"} <= set(schema.names)
    assert "sentiment_abstained" not in BatchPredictor(model_dir).output_schema().names


def test_analyze_parquet_counts_abstentions_as_json_lines_do(model_dir, inputs, tmp_path, capsys):
    for out in (tmp_path / "a.jsonl", tmp_path / "a.parquet"):
        assert main(["analyze", model_dir, "--input", str(inputs / "in.jsonl"), "--output", str(out),
                     "--min-confidence", "0.75"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "abstained on" in line]
    assert len(lines) == 2 and lines[0] == lines[1] and "abstained on 0 " not in lines[0], lines


# -- the MLflow flavour refuses what the CLI refuses ---------------------------------------------
@pytest.fixture(scope="module")
def flavour(model_dir):
    from bertheads.serve.pyfunc import _load_pyfunc

    return _load_pyfunc(model_dir)


@pytest.mark.parametrize("model_input, params, message", [
    (["a warm film"], {}, "this model has several heads (sentiment, ner, topics); choose one with "
                          "params={'head': ...}"),
    (pd.DataFrame({"id": [101], "body": ["Angela Merkel"]}), {}, "several heads"),  # not "101" as the text
    (pd.DataFrame({"id": [101], "body": ["Angela Merkel in Paris"]}), {"head": "ner"},
     "DataFrame row 0: expected a \"tokens\" list or a \"text\" string"),  # not "101" as a text
    (pd.DataFrame(), {"head": "sentiment"}, "no text column found (columns: ); name one with "
                                            "params={'text_column': ...}"),
    (pd.DataFrame({"text": ["fine", None]}), {"head": "sentiment"}, "DataFrame row 1: missing text in column 'text'"),
    (pd.DataFrame({"text": ["fine", float("nan")]}), {"head": "ner"}, "DataFrame row 1: expected"),
    (pd.DataFrame({"text": ["fine", 5]}), {"head": "sentiment"}, "row 1: text in column 'text': expected a string, "
                                                                 "got int"),
    (["fine", 7], {"head": "ner"}, "input 1: expected a text"),
    ({"text": ["fine", None]}, {"head": "sentiment"}, "row 1: missing text in column 'text'"),
    (pd.DataFrame({"id": [1], "body": ["x"]}), {"head": "sentiment", "text_column": "review"},
     "params={'text_column': 'review'}: no such column (columns: id, body)"),
    (["fine"], {"head": "sentiment", "min_confidence": 2}, "params={'min_confidence': 2}: expected a number"),
])
def test_the_mlflow_flavour_refuses_what_the_cli_refuses(flavour, model_input, params, message):
    with pytest.raises(UserError) as caught:
        flavour.predict(model_input, params)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert "text_column=" not in str(caught.value)  # MLflow drops keywords: only params reach the model


def test_the_mlflow_flavour_reads_a_named_column_and_empty_frames(flavour, model_dir):
    frame = pd.DataFrame({"id": [101, 102], "body": ["Angela Merkel visited Paris", "a warm film"]})
    got = flavour.predict(frame, {"head": "ner", "text_column": "body"})
    model = bertheads.load(model_dir)
    assert [list(e) for e in got["entities"]] == [p["entities"] for p in model.predict(list(frame["body"]),
                                                                                          head="ner")]
    assert list(got["id"]) == [101, 102]
    assert len(flavour.predict(pd.DataFrame({"text": []}), {"head": "sentiment"})) == 0  # no IndexError
    assert flavour.predict([], {"head": "sentiment"}) == []
    from bertheads.saved.mlmodel import params_of

    assert {"head", "text_column", "min_confidence", "calibrate", "long_input", "threshold"} <= {
        p["name"] for p in params_of(model.net.tasks)}  # what MLflow keeps
