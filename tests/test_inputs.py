"""Hostile or unusual input files: one line naming the file and line (exit 2), never a crash;
a column's role, not its name, carries over from training to prediction."""

from __future__ import annotations

import json

import pytest
from helpers_multi import save_heads

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.tasks.qa.formats import read_examples
from bertheads.text.readers import read_jsonl, read_table


@pytest.fixture(scope="module")
def model_dir(tiny_bert, tmp_path_factory):
    heads = {"sentiment": ("classify", 1, {"labels": ["negative", "positive"], "text_column": "sentence",
                                           "label_column": "label"}),
             "nli": ("classify", 2, {"labels": ["no", "yes"], "pair": True, "text_column": "sentence1",
                                     "pair_column": "sentence2"})}
    return str(save_heads(tiny_bert, tmp_path_factory.mktemp("inputs") / "model", heads))


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertheads: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("content", ["[" * 50_000 + "\n", '{"text": ' + "[" * 50_000 + "\n"])
def test_deeply_nested_jsonl_is_one_line(write, model_dir, capsys, content):
    path = write("deep.jsonl", '{"text": "fine"}\n' + content if content.startswith("{") else content)
    err = one_line_error(capsys, ["predict", model_dir, "--head", "sentiment", "--input", path])
    where = "deep.jsonl:2" if content.startswith("{") else "deep.jsonl:1"  # a JSON array: where it starts
    assert f"{where}: JSON nested too deeply" in err


def test_deeply_nested_squad_is_one_line(write):
    path = write("deep.json", '{"data": ' + "[" * 50_000)
    with pytest.raises(UserError, match="deep.json: JSON nested too deeply"):
        read_examples(path)
    path = write("deep2.json", '{"version": "1.1",\n "data": [' + "[" * 50_000 + "\n")
    with pytest.raises(UserError, match="JSON nested too deeply"):
        read_examples(path, fmt="squad")


@pytest.mark.parametrize("header,message", [
    ("sentence\tlabel\tsentence", "column 'sentence' appears twice (columns 1 and 3)"),
    ("Text\tlabel\ttext", "column 'text' and 'Text' differ only in case (columns 1 and 3)"),
])
def test_duplicate_column_names_are_rejected(write, header, message):
    path = write("dup.tsv", f"{header}\na\t1\tb\n")
    with pytest.raises(UserError) as info:
        list(read_table(path, "tsv")[1])
    assert "dup.tsv:1: " in str(info.value) and message in str(info.value)


def test_duplicate_jsonl_keys_are_rejected(write, model_dir, capsys):
    path = write("dup.jsonl", '{"text": "good"}\n{"text": "first", "text": "second"}\n')
    with pytest.raises(UserError, match="dup.jsonl:2: key 'text' appears twice"):
        list(read_jsonl(path))
    err = one_line_error(capsys, ["predict", model_dir, "--head", "sentiment", "--input", path])
    assert "key 'text' appears twice" in err


def test_output_naming_a_directory(write, model_dir, tmp_path, capsys):
    path = write("in.txt", "a film\n")
    err = one_line_error(capsys, ["predict", model_dir, "--head", "sentiment", "--input", path,
                                  "--output", str(tmp_path)])
    assert f"--output {tmp_path}: is a directory" in err
    err = one_line_error(capsys, ["predict", model_dir, "--head", "sentiment", "--input", path,
                                  "--output", f"{path}/out.jsonl"])
    assert "is not a directory" in err


def test_column_roles_carry_over_between_formats(write, model_dir, tmp_path):
    model = bertheads.load(model_dir)
    texts = ["a warm film", "a dull one"]
    expected = model.predict(texts, head="sentiment")
    jsonl = write("in.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert main(["predict", model_dir, "--head", "sentiment", "--input", jsonl,
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert got == expected
    assert model.net.tasks["sentiment"].spec.text_column == "sentence"  # the stored name is kept
    tsv = write("in.tsv", "sentence\n" + "\n".join(texts) + "\n")
    assert model.predict_file(tsv, head="sentiment")[1] == expected
    pairs = write("pairs.jsonl", json.dumps({"premise": "it rains", "hypothesis": "it is wet"}) + "\n")
    assert model.predict_file(pairs, head="nli")[1] == model.predict([("it rains", "it is wet")], head="nli")
    with pytest.raises(UserError, match="no text column found"):
        model.predict_file(write("other.jsonl", '{"body": "x"}\n'), head="sentiment")
