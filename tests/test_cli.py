"""The command-line contract: train, evaluate --json, predict (files and stdin), one-line errors."""

import io
import json
import sys

import pytest

from bertheads.cli.main import main

ROWS = "".join(f"a great movie {i}\t1\na boring movie {i}\t0\n" for i in range(16))


@pytest.fixture(scope="module")
def model_dir(tiny_bert, tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "train.tsv").write_text("sentence\tlabel\n" + ROWS)
    rc = main(["train", "classify", "--train", str(d / "train.tsv"), "--dev", str(d / "train.tsv"),
               "--out", str(d / "m"), "--model", tiny_bert, "--epochs", "8", "--lr", "3e-3", "--batch-size", "8",
               "--no-progress"])
    assert rc == 0
    return d


def run(argv, capsys, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_train_writes_metrics(model_dir):
    metrics = json.loads((model_dir / "m" / "metrics.json").read_text())
    assert set(metrics["dev"]) >= {"accuracy", "f1", "mcc"}


def test_evaluate_json_is_one_object(model_dir, capsys):
    rc, out, _ = run(["evaluate", str(model_dir / "m"), "--data", str(model_dir / "train.tsv"), "--json"], capsys)
    assert rc == 0
    metrics = json.loads(out)
    assert metrics["accuracy"] == 1.0 and out.count("\n") == 1


def test_evaluate_human_readable(model_dir, capsys):
    rc, out, _ = run(["evaluate", str(model_dir / "m"), "--data", str(model_dir / "train.tsv")], capsys)
    assert rc == 0 and "accuracy" in out and "1.0000" in out


def test_predict_stdin_lines_and_pairs_in_order(model_dir, capsys, monkeypatch):
    text = "a great movie\na boring movie\nsome premise\tsome hypothesis\na great movie\n"
    rc, out, _ = run(["predict", str(model_dir / "m")], capsys, stdin=text, monkeypatch=monkeypatch)
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 4
    assert [r["label"] for r in rows][:2] == [1, 0] and rows[3]["label"] == 1
    assert set(rows[0]["scores"]) == {"0", "1"}


def test_predict_file_to_output_file(model_dir, capsys, tmp_path):
    src = tmp_path / "in.tsv"
    src.write_text("sentence\na boring movie 3\na great movie 3\n")  # training format, no labels
    out = tmp_path / "preds.jsonl"
    rc, stdout, _ = run(["predict", str(model_dir / "m"), "--input", str(src), "--output", str(out)], capsys)
    assert rc == 0 and stdout == ""
    assert [json.loads(line)["label"] for line in out.read_text().splitlines()] == [0, 1]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["evaluate", "{m}", "--data", "{d}/missing.tsv"], "missing.tsv: no such file"),
        (["evaluate", "{d}/nomodel", "--data", "{d}/train.tsv"], "no such model directory"),
        (["predict", "{d}", "--input", "{d}/train.tsv"], "not a bertheads model"),
        (["train", "classify", "--train", "{d}/empty.tsv", "--out", "{d}/x", "--model", "{tiny}"], "empty.tsv: file is empty"),
        (["train", "classify", "--train", "{d}/train.tsv", "--out", "{d}/x", "--model", "{d}/nomodel"], "no such directory"),
        (["train", "classify", "--train", "{d}/train.tsv", "--out", "{d}/x", "--model", "{d}"], "not a checkpoint directory"),
        (["evaluate", "{m}", "--data", "{d}/unseen.tsv"], "unseen.tsv:3: label '5' was not seen in training"),
    ],
)
def test_errors_are_one_line_exit_2(model_dir, tiny_bert, capsys, argv, needle):
    (model_dir / "empty.tsv").write_text("")
    (model_dir / "unseen.tsv").write_text("sentence\tlabel\nfine\t1\nodd\t5\n")
    argv = [a.format(m=model_dir / "m", d=model_dir, tiny=tiny_bert) for a in argv]
    rc, out, err = run(argv, capsys)
    assert rc == 2
    assert err.startswith("bertheads: error: ") and err.count("\n") == 1 and needle in err
    assert "Traceback" not in err


def test_hub_name_offline_is_a_clear_error(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "t.tsv").write_text("sentence\tlabel\na\t1\nb\t0\n")
    rc, _, err = run(["train", "classify", "--train", str(tmp_path / "t.tsv"), "--out", str(tmp_path / "o"),
                      "--model", "bert-base-uncased"], capsys)
    assert rc == 2 and "HF_HUB_OFFLINE" in err and err.count("\n") == 1
