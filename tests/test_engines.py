"""The model inside the data engines: `BatchPredictor` on pandas (the reference), pyarrow and
numpy batches, then for real in Ray Data (a local Ray, a killed worker), Spark (local[2]) and
Dask; Parquet in and out."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pyarrow as pa
import pytest
from helpers_multi import EncoderCalls, save_heads

import bertheads
from bertheads import BatchPredictor, UserError

pytestmark = pytest.mark.slow

TAGS = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
PASSAGES = ["Angela Merkel visited Paris on Monday.", "The cat sat on the mat in Rome.",
            "A warm and funny film about a baker.", "The tower was finished in 1889 and stands in Paris."]
QUESTIONS = ["Who visited Paris?", "Where did the cat sit?", "What is the film about?", "When was it finished?"]


@pytest.fixture(scope="module")
def multi_dir(tiny_bert, tmp_path_factory):
    """classify, tag (a branch: its own copy of the top layer) and qa heads on one tiny encoder
    (untrained, seeded)."""
    out = tmp_path_factory.mktemp("engines") / "model"
    return str(save_heads(tiny_bert, out, {"sentiment": ("classify", 1, {"labels": ["neg", "pos"]}),
                                           "ner": ("tag", 2, {"tags": TAGS, "tune_layers": 1}),  # (a branch head)
                                           "qa": ("qa", 3, {})}))


def frame(n: int = len(PASSAGES)) -> pd.DataFrame:
    return pd.DataFrame({"id": range(n), "text": [PASSAGES[i % 4] for i in range(n)],
                         "question": [QUESTIONS[i % 4] for i in range(n)]})


def check_against_predict(model, out: pd.DataFrame, heads=("sentiment", "ner", "qa"), **options) -> None:
    """Every row's columns equal `Model.predict`'s prediction of that head with the same inference
    `options` (scores to 1e-5; `HEAD_abstained` too, under `min_confidence`)."""
    out = out.sort_values("id")
    texts, questions = list(out["text"]), list(out["question"])
    if "min_confidence" in options:
        given = {"sentiment": texts, "ner": texts,
                 "qa": [{"question": q, "context": t} for q, t in zip(questions, texts)]}
        for head in heads:
            expected = model.predict(given[head], head=head, **options)
            assert list(out[f"{head}_abstained"]) == [p["abstained"] for p in expected], head
    if "sentiment" in heads:
        expected = model.predict(texts, head="sentiment", **options)
        assert list(out["sentiment_label"]) == [p["label"] for p in expected]
        for got, p in zip(out["sentiment_scores"], expected):
            assert dict(got) == pytest.approx(p["scores"], abs=1e-5)
        assert list(out["sentiment_score"]) == pytest.approx([p["scores"][p["label"]] for p in expected], abs=1e-5)
    if "ner" in heads:
        expected = model.predict(texts, head="ner", **options)
        assert [[dict(e) for e in got] for got in out["ner_entities"]] == [p["entities"] for p in expected]
    if "qa" in heads:
        expected = model.predict([{"question": q, "context": t} for q, t in zip(questions, texts)], head="qa",
                                 **options)
        assert list(out["qa_answer"]) == [p["answer"] for p in expected]
        assert list(out["qa_start"]) == [p["start"] for p in expected]
        assert list(out["qa_score"]) == pytest.approx([p["score"] for p in expected], abs=1e-5)


# -- the class on plain batches --------------------------------------------------------------------
def test_batch_predictor_on_pandas_matches_predict_from_one_encoder_pass(multi_dir):
    predictor = BatchPredictor(multi_dir, batch_size=64)
    model = predictor.model
    calls = EncoderCalls(model.net)
    try:
        out = predictor(frame())
        assert calls.count == 2  # classify and tag share a pass; qa's packed question its own
    finally:
        calls.close()
    assert list(out.columns[:3]) == ["id", "text", "question"]  # the batch as it was, then the heads'
    check_against_predict(model, out)
    schema = predictor.output_schema()
    assert schema.field("sentiment_scores").type == pa.struct([("neg", pa.float64()), ("pos", pa.float64())])
    assert schema.field("ner_entities").type == pa.list_(pa.struct(
        [("text", pa.string()), ("type", pa.string()), ("start", pa.int64()), ("end", pa.int64()),
         ("score", pa.float64())]))
    assert schema.field("qa_start").type == pa.int64()


def test_a_kind_without_column_types_gets_one_json_column():
    from bertheads.tasks.parts import Publishing, Struct

    assert Publishing(None).output_columns() == Struct.of(prediction=str)  # parts.py's default
    assert json.loads(Publishing(None).output_row({"x": [1, 2]})["prediction"]) == {"x": [1, 2]}


def test_engine_ray_without_its_extra_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util

    from bertheads.base import extras
    from bertheads.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    code = main(["predict", str(tmp_path / "m"), "--input", str(tmp_path / "in.parquet"), "--output",
                 str(tmp_path / "out"), "--engine", "ray"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0
    assert "--engine ray needs the 'ray' extra" in err and "pip install 'bertheads[ray]'" in err


def test_batch_predictor_keeps_the_batch_type_and_maps_columns(multi_dir):
    predictor = BatchPredictor(multi_dir, heads=["sentiment"], columns={"text": "review"})
    reference = predictor(pd.DataFrame({"review": PASSAGES}))
    table = predictor(pa.table({"review": PASSAGES}))
    assert isinstance(table, pa.Table) and table.schema.field("sentiment_label").type == pa.string()
    assert table.column("sentiment_label").to_pylist() == list(reference["sentiment_label"])
    import numpy as np

    numpy_batch = predictor({"review": np.array(PASSAGES, dtype=object)})
    assert list(numpy_batch["sentiment_label"]) == list(reference["sentiment_label"])
    with pytest.raises(UserError, match="no column 'review'"):
        predictor(pd.DataFrame({"text": PASSAGES}))


def test_batch_predictor_bad_rows_fail_or_are_skipped(multi_dir):
    batch = pd.DataFrame({"text": ["fine text", None, ""], "question": ["q?", "q?", "q?"]})
    with pytest.raises(UserError, match="batch row 1: column 'text' is null"):
        BatchPredictor(multi_dir)(batch)
    out = BatchPredictor(multi_dir, skip_bad_rows=True)(batch)
    assert list(out["error"].isna()) == [True, False, False]
    assert out["sentiment_label"].isna().tolist() == [False, True, True]
    assert "row 2: column 'text' is empty" in out["error"][2]


# -- Ray Data, for real: a local Ray started here ----------------------------------------------
def write_parquet_input(folder, rows_per_file: int = 60, files: int = 2, bad: dict | None = None):
    """`files` Parquet files of `rows_per_file` rows in row groups of 20; `bad`: {(file, row): text}."""
    import pyarrow.parquet as pq

    folder.mkdir()
    for f in range(files):
        ids = [f * rows_per_file + i for i in range(rows_per_file)]
        texts = [(bad or {}).get((f, i), PASSAGES[n % 4]) for i, n in enumerate(ids)]
        pq.write_table(pa.table({"id": ids, "text": texts, "question": [QUESTIONS[n % 4] for n in ids]}),
                       folder / f"part-{f}.parquet", row_group_size=20)
    return folder


def test_ray_job_survives_a_killed_worker_and_matches_predict(multi_dir, tmp_path):
    """`predict --engine ray` (Ray Data: `map_batches(GroupPredictor, fn_constructor_kwargs=...,
    concurrency=1)`: one actor keeps the suite's two cores for the other tests) on two Parquet
    files, with head options (they reach the workers: `abstained` columns, raw scores); the worker
    is SIGKILLed at its second batch, restarted, and its task retried."""
    ray = pytest.importorskip("ray")
    import pyarrow.parquet as pq

    from bertheads.cli.main import main

    marker = tmp_path / "killed-once"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"BERTHEADS_CRASH_AT": "engine:batch:2", "BERTHEADS_CRASH_ONCE": str(marker),
                                       "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}})
    try:
        source = write_parquet_input(tmp_path / "in", bad={(1, 7): None})
        out = tmp_path / "out"
        assert main(["predict", multi_dir, "--input", str(source), "--output", str(out), "--engine", "ray",
                     "--workers", "1", "--rows-per-batch", "8", "--skip-bad-lines", "--min-confidence", "0.6",
                     "--no-calibrate"]) == 0
        assert marker.exists()  # a worker was killed (SIGKILL) at its second batch, and the job went on
        table = pq.read_table([str(p) for p in sorted(out.glob("*.parquet"))]).to_pandas()
        assert sorted(table["id"]) == list(range(120))  # every row exactly once
        assert sorted(zip(table["_file"].map(lambda f: f.rsplit("/", 1)[1]), table["_row"])) == sorted(
            [(f"part-{f}.parquet", r) for f in range(2) for r in range(60)])
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rows"] == 120 and summary["failures"] == 1 and summary["parts"] == len(list(out.glob("*.parquet")))
        assert summary["failed_rows"] == [f"{source / 'part-1.parquet'} row 7: column 'text' is null, "
                                          f"expected a text"]
        good = table[table["error"].isna()]
        model = bertheads.load(multi_dir)
        check_against_predict(model, good, min_confidence=0.6, calibrate=False)
    finally:
        ray.shutdown()


def test_a_ray_worker_names_the_flag_of_the_caller(multi_dir, tmp_path):
    """The job's actor (built as Ray builds it, with the caller's face) says a bad row's way out as
    the caller gives it: `--skip-bad-lines` to the command line, `skip_bad_rows=True` to Python."""
    import pyarrow.parquet as pq

    from bertheads.engines.ray_job import GroupPredictor

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": [0, 1], "text": ["fine", None], "question": ["q", "q"]}), bad)
    items = pa.table({"file": [str(bad)], "group": [0], "first": [0]})
    for face, way in (("cli", "--skip-bad-lines skips it"), ("python", "skip_bad_rows=True skips it")):
        actor = GroupPredictor(8, face=face, model=multi_dir, heads=["sentiment"])
        with pytest.raises(UserError) as info:
            actor(items)
        assert str(info.value).endswith(f"row 1: column 'text' is null, expected a text ({way})"), str(info.value)


def test_a_ray_task_holds_whole_row_groups_of_about_rows_per_batch():
    from bertheads.engines.ray_job import groups_per_task

    groups = [("a.parquet", g, g * 1000, 1000) for g in range(10)]
    assert groups_per_task(groups, 4096) == 4  # padding: a call sorts its rows by length, more rows pad less
    assert groups_per_task(groups, 256) == 1  # never less than a row group
    assert groups_per_task([("b.parquet", 0, 0, 1_000_000)], 4096) == 1


# -- Spark (local[2], on this machine's Java) and Dask, for real ---------------------------------
def test_spark_local_session_matches_predict(multi_dir, monkeypatch):
    pytest.importorskip("pyspark")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # the workers run this environment's Python
    from pyspark.sql import SparkSession

    # local[1]: one Python worker, reused for both partitions (the model loaded once); the
    # benchmark runs local[2]
    spark = (SparkSession.builder.master("local[1]").appName("bertheads-test")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.default.parallelism", "2")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.executorEnv.TOKENIZERS_PARALLELISM", "false").getOrCreate())
    try:
        df = spark.createDataFrame(frame(24))  # two partitions (default parallelism), one after the other
        assert df.rdd.getNumPartitions() == 2
        model = bertheads.load(multi_dir)
        # the workers get its folder and load it once each, with the heads' options
        fn, schema = bertheads.spark_udf(model, df.schema, min_confidence=0.6, calibrate=False)
        assert schema["ner_entities"].dataType.simpleString() == (
            "array<struct<text:string,type:string,start:bigint,end:bigint,score:double>>")
        out = df.mapInArrow(fn, schema).toPandas()
        assert len(out) == 24 and sorted(out["id"]) == list(range(24))
        check_against_predict(model, out, min_confidence=0.6, calibrate=False)
    finally:
        spark.stop()


def test_dask_map_partitions_matches_predict(multi_dir):
    dd = pytest.importorskip("dask.dataframe")
    import dask

    ddf = dd.from_pandas(frame(12), npartitions=3)
    model = bertheads.load(multi_dir)
    with dask.config.set(scheduler="threads", num_workers=2):  # dask's default for DataFrames
        out = bertheads.dask_predict(ddf, model, heads=["sentiment", "ner"]).compute()
    assert len(out) == 12 and list(out["id"]) == list(range(12))
    check_against_predict(model, out, heads=("sentiment", "ner"))


# -- Parquet in and out: predict, evaluate, analyze --------------------------------------------------
def test_parquet_in_and_out_for_predict_evaluate_and_analyze(multi_dir, tmp_path, capsys):
    import pyarrow.parquet as pq

    from bertheads.cli.main import main

    source = write_parquet_input(tmp_path / "in", rows_per_file=30)  # two files, row groups of 20
    out = tmp_path / "sentiment.parquet"
    assert main(["predict", multi_dir, "--head", "sentiment", "--input", str(source), "--output", str(out),
                 "--chunk-size", "16", "--runtime", "torch", "--precision", "fp32"]) == 0
    table = pq.read_table(out)
    assert table.schema.field("scores").type == pa.struct([("neg", pa.float64()), ("pos", pa.float64())])
    model = bertheads.load(multi_dir)
    texts = pq.read_table(source).column("text").to_pylist()
    assert table.column("id").to_pylist() == list(range(60))  # in input order, files sorted
    assert table.column("label").to_pylist() == [p["label"] for p in model.predict(texts, head="sentiment")]

    analyzed = tmp_path / "all.parquet"
    assert main(["analyze", multi_dir, "--input", str(source / "*.parquet"), "--output", str(analyzed),
                 "--runtime", "torch", "--precision", "fp32"]) == 0
    frame_out = pq.read_table(analyzed).to_pandas()
    frame_out["text"], frame_out["question"] = texts, pq.read_table(source).column("question").to_pylist()
    check_against_predict(model, frame_out)

    labelled = tmp_path / "dev.parquet"
    pq.write_table(pa.table({"text": texts[:8], "label": ["neg", "pos"] * 4}), labelled, row_group_size=3)
    assert main(["evaluate", multi_dir, "--head", "sentiment", "--data", str(labelled), "--json",
                 "--runtime", "torch", "--precision", "fp32"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    gold = ["neg", "pos"] * 4
    predicted = [p["label"] for p in model.predict(texts[:8], head="sentiment")]
    assert metrics["accuracy"] == pytest.approx(sum(g == p for g, p in zip(gold, predicted)) / 8)
