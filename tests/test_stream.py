"""Prediction and evaluation a chunk at a time: same results as the whole-file path, in input
order, ids and kept fields carried, bad lines, torchrun shards, long-input windows."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bertheads.inference.path
from bertheads import api
from bertheads.cli.main import main
from bertheads.inference.path import evaluate_head
from bertheads.inference.stream import StreamSettings

ROWS = "".join(f"a great movie {i}\t1\na boring movie {i}\t0\n" for i in range(12))
TAGGED = "".join(f"John{i} NNP B-PER\nlives VBZ O\nin IN O\nParis NNP B-LOC\n\n" for i in range(6))


@pytest.fixture(scope="module")
def models(tiny_bert, tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    (d / "train.tsv").write_text("sentence\tlabel\n" + ROWS)
    (d / "train.conll").write_text(TAGGED)
    common = ["--model", tiny_bert, "--epochs", "1", "--batch-size", "8", "--no-progress", "-q"]
    assert main(["train", "classify", "--train", str(d / "train.tsv"), "--out", str(d / "c"), *common]) == 0
    assert main(["train", "tag", "--train", str(d / "train.conll"), "--out", str(d / "t"), *common]) == 0
    return d


def sentences(n: int) -> list[str]:
    words = ["good", "bad", "plot", "a", "very", "long", "and", "short", "film", "actors"]
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(1 + i % 9)) for i in range(n)]


def test_streamed_output_is_the_whole_file_output_in_order_with_ids(models, tmp_path, capsys):
    texts = sentences(45)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "sentence": t, "src": i % 3}) + "\n" for i, t in enumerate(texts)))
    model = api.load(models / "c")
    examples, whole = model.predict_file(str(src))
    out = tmp_path / "out.jsonl"
    assert main(["predict", str(models / "c"), "--input", str(src), "--output", str(out), "--chunk-size", "7",
                 "--keep-fields", "src", "-q"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(45)]
    assert [r["src"] for r in rows] == [i % 3 for i in range(45)]
    assert [{k: r[k] for k in ("label", "scores")} for r in rows] == [{k: w[k] for k in ("label", "scores")}
                                                                      for w in whole]
    assert list(model.predict_iter(str(src), settings=StreamSettings(chunk_size=4))) == [
        {"id": f"r{i}", **w} for i, w in enumerate(whole)]


def test_tag_conll_and_ids_stream_like_the_whole_file(models, tmp_path, capsys):
    model = api.load(models / "t")
    conll = tmp_path / "in.conll"
    conll.write_text("-DOCSTART- -X- O\n\n" + "".join(f"Anna{i} NNP\nsaw VBD\nRome{i} NNP\n\n" for i in range(9)))
    examples, whole = model.predict_file(str(conll), fmt="conll")
    expected = model.render(whole, examples, "conll")
    out = tmp_path / "out.conll"
    assert main(["predict", str(models / "t"), "--input", str(conll), "--format", "conll", "--output", str(out),
                 "--chunk-size", "2", "-q"]) == 0
    assert out.read_text() == expected
    jl = tmp_path / "in.jsonl"
    jl.write_text("".join(json.dumps({"id": i, "tokens": ["Anna", "saw", f"Rome{i}"]}) + "\n" for i in range(5)))
    preds = list(model.predict_iter(str(jl), settings=StreamSettings(chunk_size=2)))
    assert [p["id"] for p in preds] == list(range(5)) and all(p["tokens"][0] == "Anna" for p in preds)


class CountingInput:
    """A text stream that counts the lines read from it."""

    def __init__(self, lines: list[str]) -> None:
        self.lines, self.read = lines, 0

    def __iter__(self):
        for line in self.lines:
            self.read += 1
            yield line


def test_memory_follows_the_chunk_not_the_input(models, monkeypatch):
    """An input ten chunks long: at most a chunk is encoded at once, and the first results are
    written when only about a chunk of the input has been read."""
    model = api.load(models / "c")
    source = CountingInput([t + "\n" for t in sentences(400)])
    largest = []
    real = bertheads.inference.path.run_heads

    def spy(net, features, *args, **kwargs):
        largest.append(len(features))
        return real(net, features, *args, **kwargs)

    monkeypatch.setattr(bertheads.inference.path, "run_heads", spy)
    written = []
    report = model.predict_stream(source, write=lambda text: written.append((source.read, text.count("\n"))),
                                  settings=StreamSettings(chunk_size=40))
    assert report.examples == 400 and report.chunks == 10
    assert max(largest) == 40 and len(largest) == 10
    assert written[0] == (40, 40)  # the first chunk came out after reading 40 of 400 lines
    assert sum(n for _, n in written) == 400


def test_bad_line_in_the_middle_stops_with_file_and_line_and_no_output(models, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    lines = [json.dumps({"sentence": t}) for t in sentences(30)]
    lines[16] = '{"text": "broken'
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    rc = main(["predict", str(models / "c"), "--input", str(src), "--output", str(out), "--chunk-size", "5"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{src}:17: malformed JSON" in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]  # no temporary left either
    rc = main(["predict", str(models / "c"), "--input", str(src), "--output", str(out), "--chunk-size", "5",
               "--skip-bad-lines"])
    err = capsys.readouterr().err
    assert rc == 0 and f"skipped: {src}:17" in err and "skipped 1 bad record" in err
    assert len(out.read_text().splitlines()) == 29


def test_tsv_row_with_wrong_columns_is_reported_by_line(models, tmp_path, capsys):
    src = tmp_path / "in.tsv"
    src.write_text("sentence\n" + "".join(f"{t}\n" for t in sentences(10)) + "a\tb\n" + "ok\n")
    rc = main(["predict", str(models / "c"), "--input", str(src), "--chunk-size", "3"])
    captured = capsys.readouterr()
    assert rc == 2 and f"{src}:12: expected 1 columns" in captured.err


def test_streamed_evaluation_equals_the_whole_file(models, tmp_path):
    model = api.load(models / "c")
    whole = evaluate_head(model.net, "classify", model.task().reading.read(str(models / "train.tsv")), None)
    streamed = model.evaluate(str(models / "train.tsv"), settings=StreamSettings(chunk_size=5))
    assert streamed.pop("mode") == "torch fp32 on cpu"  # evaluate says what it ran in
    assert streamed.keys() - {"learned_nothing"} == whole.keys()  # (evaluate's warning: the tiny model's)
    for key in whole:
        if isinstance(whole[key], dict):  # per-class figures and the confusion matrix: counts
            assert streamed[key] == whole[key]
        else:
            assert streamed[key] == pytest.approx(whole[key], rel=1e-6)
    tagger = api.load(models / "t")
    whole = evaluate_head(tagger.net, "tag", tagger.task().reading.read(str(models / "train.conll")), None)
    streamed = tagger.evaluate(str(models / "train.conll"), settings=StreamSettings(chunk_size=4))
    assert streamed["f1"] == whole["f1"] and streamed["loss"] == pytest.approx(whole["loss"], rel=1e-6)


def test_windows_pool_per_document(models, tmp_path):
    model = api.load(models / "c")
    task = model.task()
    tokenizer = model.net.encoder.tokenizer
    long_text = " ".join(["word"] * 300)
    examples = task.reading.from_inputs(["short one", long_text])
    task.spec.long_input, task.spec.stride = "windows", 16
    try:
        feats, owner = task.modeling.encode_for_inference(examples, tokenizer)
        assert owner[0] == 0 and owner.count(1) >= 3 and all(len(f["input_ids"]) <= 128 for f in feats)
        assert feats[0]["input_ids"] == task.modeling.encode(examples[:1], tokenizer, with_labels=False)[0]["input_ids"]
        outputs = [np.array([float(i), -float(i)]) for i in range(len(feats))]
        task.spec.pool = "mean"
        mean = task.judging.collect(outputs, owner, examples, feats)
        task.spec.pool = "max"
        biggest = task.judging.collect(outputs, owner, examples, feats)
        rest = np.stack(outputs[1:])
        assert np.allclose(mean[1], rest.mean(0)) and np.allclose(biggest[1], rest.max(0))
        assert np.allclose(mean[0], outputs[0])
    finally:
        task.spec.long_input = "truncate"


def test_train_with_windows_saves_the_setting(tiny_bert, tmp_path):
    src = tmp_path / "train.tsv"
    src.write_text("sentence\tlabel\n" + "".join(f"{'x ' * 150}good {i}\t1\n{'x ' * 150}bad {i}\t0\n"
                                                 for i in range(4)))
    assert main(["train", "classify", "--train", str(src), "--out", str(tmp_path / "m"), "--model", tiny_bert,
                 "--epochs", "1", "--max-length", "64", "--long-input", "windows", "--pool", "max", "--no-progress",
                 "-q"]) == 0
    model = api.load(tmp_path / "m")
    assert (model.task().spec.long_input, model.task().spec.pool) == ("windows", "max")
    preds = model.predict([f"{'x ' * 150}good"])
    assert set(preds[0]["scores"]) == {"0", "1"}


def torchrun(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "bertheads", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_torchrun_refuses_a_parquet_output_in_one_line(models, tmp_path, monkeypatch, capsys):
    src = tmp_path / "in.tsv"
    src.write_text("id\tsentence\n0\ta fine film\n")
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets (the check comes before any process group)
    monkeypatch.setenv("RANK", "0")
    assert main(["predict", str(models / "c"), "--input", str(src), "--output", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "under torchrun the output is JSON lines" in err[0] and "--engine ray" in err[0]
    assert not list(tmp_path.glob("*o.parquet*"))


@pytest.mark.slow  # runs extra processes (torchrun, kills, signals)
def test_torchrun_shards_give_the_single_process_bytes(models, tmp_path):
    src = tmp_path / "in.tsv"
    src.write_text("id\tsentence\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(sentences(50))))
    single = tmp_path / "one.jsonl"
    assert main(["predict", str(models / "c"), "--input", str(src), "--output", str(single), "--chunk-size", "6",
                 "-q"]) == 0
    sharded = tmp_path / "two.jsonl"
    done = torchrun(["predict", str(models / "c"), "--input", str(src), "--output", str(sharded),
                     "--chunk-size", "6", "-q"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sharded.read_bytes() == single.read_bytes()
    assert [json.loads(line)["id"] for line in sharded.read_text().splitlines()] == [str(i) for i in range(50)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tsv", "one.jsonl", "two.jsonl"]  # parts removed



@pytest.mark.slow  # runs extra processes (two ranks)
def test_a_failed_rank_stops_every_rank_and_writes_nothing(models, tmp_path):
    """Two ranks as torchrun starts them (forked from one process that imported everything:
    tests/forkserver.py `ranks`); the input's last line is malformed: every rank stops with that
    line's message and no output is written."""
    from forkserver import ForkServer

    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"sentence": t}) + "\n" for t in sentences(20)) + "{oops\n")
    forks = ForkServer(tmp_path / "forks")
    try:
        failed = forks.ranks(["predict", str(models / "c"), "--input", str(bad), "--output",
                              str(tmp_path / "x.jsonl"), "--chunk-size", "6"], cwd=tmp_path)
    finally:
        forks.close()
    assert failed.returncode == 2 and "of 2 failed" in failed.stderr  # the CLI's exit status for bad input
    assert f"{bad}:21: malformed JSON" in failed.stderr
    assert not (tmp_path / "x.jsonl").exists() and not list(tmp_path.glob(".x.jsonl*"))


# -- the progress total ---------------------------------------------------------------------------
@pytest.fixture
def every_step_logged(monkeypatch):
    from bertheads.base import progress

    monkeypatch.setattr(progress, "LOG_LINE_SECONDS", 0.0)  # a progress line at every chunk, no waiting
    monkeypatch.setattr(progress, "LOG_FIRST_SECONDS", 0.0)


def progress_lines(model, command: str, src, out, caplog) -> list[str]:
    """`model.predict_stream` or `model.analyze_stream` on `src`, 8 inputs a chunk: its progress lines."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bertheads"):
        getattr(model, f"{command}_stream")(str(src), out, settings=StreamSettings(chunk_size=8))
    return [x for x in caplog.messages if x.startswith(f"{command}: ")]


def test_a_parquet_input_s_progress_total_is_its_row_count(models, tmp_path, caplog, every_step_logged):
    """The total comes from the Parquet metadata (not from the newline bytes of a binary file)
    and the count done reaches it."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    from bertheads.text.readers import count_lines

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": sentences(30)}), src, row_group_size=7)
    assert count_lines(str(src)) == 30  # a Parquet path as it is given (select's pool)
    model = api.load(models / "c")
    for command in ("predict", "analyze"):
        shown = progress_lines(model, command, src, tmp_path / "o.jsonl", caplog)
        assert shown and all("/30 rows, " in x for x in shown), shown
        assert f"{command}: 30/30 rows, " in shown[-1]


def test_a_large_input_is_read_once_and_its_progress_has_no_total(models, tmp_path, caplog, monkeypatch,
                                                                   every_step_logged):
    """A file over `COUNT_AHEAD_BYTES` is not counted up front (that is a second full read): its
    progress lines give done and rate, no ETA; a smaller file still gets its total and ETA."""
    import builtins

    from bertheads.text import readers

    src = tmp_path / "in.txt"
    src.write_text("".join(f"{t}\n" for t in sentences(20)))
    model = api.load(models / "c")
    opened, real_open = [], builtins.open
    monkeypatch.setattr(builtins, "open", lambda file, *a, **k: (opened.append(file), real_open(file, *a, **k))[1])

    def reads() -> int:
        n = sum(1 for f in opened if isinstance(f, (str, Path)) and Path(f) == src)
        opened.clear()
        return n

    shown = progress_lines(model, "predict", src, tmp_path / "o.jsonl", caplog)
    assert reads() == 2 and shown and all("/20 lines, " in x and "ETA " in x for x in shown), shown
    monkeypatch.setattr(readers, "COUNT_AHEAD_BYTES", src.stat().st_size - 1)
    for command in ("predict", "analyze"):
        shown = progress_lines(model, command, src, tmp_path / "o.jsonl", caplog)
        assert reads() == 1, command
        assert shown and all("/" not in x.split(" lines, ")[0] and "ETA" not in x for x in shown), shown
        assert f"{command}: 20 lines, " in shown[-1]
