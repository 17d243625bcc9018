"""One guard for every write (`store/guard.py` `check_target`): every command and Python entry
point that writes refuses the same hostile targets (a model folder, the folder holding its
input, the input itself, a non-empty folder of other files) with one line, changing nothing;
its own earlier output is replaced, and `--overwrite` never deletes inputs or models."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from helpers_multi import save_heads

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.engines.batches import BatchPredictor
from bertheads.export.hf import export_hf
from bertheads.inference.extract import extract
from bertheads.training.tune import tune

HEADS = {"sentiment": ("classify", 1, {"labels": ["negative", "positive"]})}
ROWS = [("a warm and funny film", "positive"), ("tedious and overlong", "negative"),
        ("lovely acting throughout", "positive"), ("dull plot and awful lines", "negative")] * 3


@pytest.fixture(scope="module")
def world(tiny_bert, tmp_path_factory) -> Path:
    """A model (and a second with the same encoder), a data folder holding every input beside a
    notes file, and a folder of someone else's files."""
    root = tmp_path_factory.mktemp("guard")
    save_heads(tiny_bert, root / "model", HEADS)
    shutil.copytree(root / "model", root / "model2")
    data = root / "data"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in ROWS))
    (data / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in ROWS[:4]))
    (data / "pool.txt").write_text("".join(f"{t}\n" for t, _ in ROWS[:5]))
    (data / "notes.txt").write_text("mine")
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("someone else's")
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under `root` with its bytes' digest (folders: '')."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
            for p in sorted(root.rglob("*")) if "cache" not in p.parts}


def hostile(world: Path, own_input: str) -> dict[str, Path]:
    return {"model folder": world / "model", "folder holding the input": world / "data",
            "the input itself": world / "data" / own_input, "non-empty folder": world / "other",
            "inside the model": world / "model" / "heads"}


def cli_cases(world: Path, tiny_bert: str) -> dict[str, tuple[list[str], str]]:
    """command -> (argv with OUT where the target goes, the input it reads)."""
    m, d = str(world / "model"), world / "data"
    fast = ["--model", tiny_bert, "--epochs", "1", "--batch-size", "4", "-q"]
    return {
        "train": (["train", "classify", "--train", str(d / "train.tsv"), "--out", "OUT", *fast], "train.tsv"),
        "audit": (["audit", "classify", "--train", str(d / "train.tsv"), "--out", "OUT", "--folds", "2", *fast],
                  "train.tsv"),
        "tune": (["tune", "classify", "--train", str(d / "train.tsv"), "--dev", str(d / "dev.tsv"), "--out", "OUT",
                  *fast], "train.tsv"),
        "select": (["select", m, "--pool", str(d / "pool.txt"), "-k", "1", "--out", "OUT"], "pool.txt"),
        "calibrate": (["calibrate", m, "--data", str(d / "dev.tsv"), "--out", "OUT"], "dev.tsv"),
        "export hf": (["export", m, "--to", "hf", "--out", "OUT"], "dev.tsv"),
        "export onnx": (["export", m, "--to", "onnx", "--out", "OUT", "--gate-data", str(d / "dev.tsv")], "dev.tsv"),
        "predict": (["predict", m, "--input", str(d / "pool.txt"), "--output", "OUT", "-q"], "pool.txt"),
        "analyze": (["analyze", m, "--input", str(d / "pool.txt"), "--output", "OUT", "-q"], "pool.txt"),
        "extract": (["extract", "--model", tiny_bert, "--input", str(d / "pool.txt"), "--out", "OUT", "-q"],
                    "pool.txt"),
        "report": (["report", m, "--data", str(d / "dev.tsv"), "--out", "OUT"], "dev.tsv"),
        "combine": (["combine", m, str(world / "model2"), "--names", "a", "b", "--out", "OUT"], "dev.tsv"),
    }


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertheads: error"), err
    return lines[0]


@pytest.mark.parametrize("command", ["train", "audit", "tune", "select", "calibrate", "export hf", "export onnx",
                                     "predict", "analyze", "extract", "report", "combine"])
def test_every_command_refuses_every_hostile_target(world, tiny_bert, command, capsys):
    argv, own_input = cli_cases(world, tiny_bert)[command]
    for what, target in hostile(world, own_input).items():
        if command == "train" and what == "model folder":
            continue  # (a model of another run: replaced with --overwrite, below)
        before = snapshot(world)
        code = main([str(target) if a == "OUT" else a for a in argv])
        line = one_error_line(capsys)
        assert code == 2, (what, line)
        assert str(target) in line, (what, line)
        assert snapshot(world) == before, (command, what)  # nothing changed, nothing deleted, no leftovers
    for flag in (["--overwrite"] if command in ("train", "audit") else []):  # never over inputs or models
        for what in ("folder holding the input", "the input itself", "inside the model"):
            before = snapshot(world)
            target = hostile(world, own_input)[what]
            assert main([str(target) if a == "OUT" else a for a in argv] + [flag]) == 2, what
            assert str(target) in one_error_line(capsys) and snapshot(world) == before, (command, what)


def test_train_refuses_a_model_of_another_run_without_overwrite(world, tiny_bert, capsys):
    argv, _ = cli_cases(world, tiny_bert)["train"]
    before = snapshot(world)
    assert main([str(world / "model") if a == "OUT" else a for a in argv]) == 2
    assert "holds a model from another run" in one_error_line(capsys) and snapshot(world) == before


def test_every_python_entry_point_refuses_every_hostile_target(world, tiny_bert):
    model = bertheads.load(world / "model")
    d = world / "data"
    fast = {"model": tiny_bert, "epochs": 1, "batch_size": 4, "progress": False}
    entries = {
        "train": (lambda out: bertheads.train("classify", str(d / "train.tsv"), out=out, **fast), "train.tsv"),
        "audit": (lambda out: bertheads.audit("classify", str(d / "train.tsv"), out=out, folds=2, **fast),
                  "train.tsv"),
        "tune": (lambda out: tune("classify", str(d / "train.tsv"), str(d / "dev.tsv"), out, model=tiny_bert,
                                  epochs=1), "train.tsv"),
        "select": (lambda out: model.select(str(d / "pool.txt"), k=1, out=out), "pool.txt"),
        "predict_stream": (lambda out: model.predict_stream(str(d / "pool.txt"), out), "pool.txt"),
        "analyze_stream": (lambda out: model.analyze_stream(str(d / "pool.txt"), out), "pool.txt"),
        "calibrate": (lambda out: model.calibrate(str(d / "dev.tsv"), out), "dev.tsv"),
        "report": (lambda out: model.report(str(d / "dev.tsv"), out), "dev.tsv"),
        "combine": (lambda out: bertheads.combine([world / "model", world / "model2"], out, ["a", "b"]), "dev.tsv"),
        "export_hf": (lambda out: export_hf(world / "model", out), "dev.tsv"),
        "extract": (lambda out: extract(tiny_bert, str(d / "pool.txt"), out), "pool.txt"),
    }
    for name, (call, own_input) in entries.items():
        for what, target in hostile(world, own_input).items():
            if name == "train" and what == "model folder":
                continue
            before = snapshot(world)
            with pytest.raises(UserError) as caught:
                call(target)
            line = str(caught.value)
            assert "\n" not in line and str(target) in line, (name, what, line)
            assert snapshot(world) == before, (name, what)
    # the model's own files, named one by one
    for name in ("select", "predict_stream", "analyze_stream"):
        before = snapshot(world)
        with pytest.raises(UserError, match="is inside the model folder"):
            entries[name][0](world / "model" / "bertheads.json")
        assert snapshot(world) == before, name


def test_own_earlier_output_is_replaced_and_overwrite_keeps_inputs(world, tiny_bert, tmp_path):
    d = world / "data"
    shutil.copy(d / "train.tsv", tmp_path / "train.tsv")
    audit_out = tmp_path / "audit"
    argv = ["audit", "classify", "--train", str(tmp_path / "train.tsv"), "--out", str(audit_out), "--folds", "2",
            "--model", tiny_bert, "--epochs", "1", "--batch-size", "4", "--mode", "features", "--cache-dir",
            str(tmp_path / "cache"), "-q"]
    assert main(argv) == 0 and (audit_out / "summary.json").is_file()
    assert main(argv) == 0 and main([*argv, "--overwrite"]) == 0  # its own earlier output: replaced
    assert sorted(p.name for p in audit_out.iterdir()) == ["issues.jsonl", "summary.json"]
    # --overwrite never replaces a folder holding an input
    assert main([*argv[:4], "--out", str(tmp_path), *argv[6:], "--overwrite"]) == 2
    assert (tmp_path / "train.tsv").read_bytes() == (d / "train.tsv").read_bytes()
    # extract: twice to the same folder
    for _ in range(2):
        assert main(["extract", "--model", tiny_bert, "--input", str(d / "pool.txt"), "--out",
                     str(tmp_path / "vectors"), "-q"]) == 0
    assert json.loads((tmp_path / "vectors" / "meta.json").read_text())["texts"] == 5
    # select, twice to the same file
    model = bertheads.load(world / "model")
    for _ in range(2):
        model.select(str(d / "pool.txt"), k=2, out=tmp_path / "next.jsonl")
    assert len((tmp_path / "next.jsonl").read_text().splitlines()) == 2


def test_select_keeps_id_0_apart_from_id_1(world, tmp_path):
    model = bertheads.load(world / "model")
    records = [{"id": 1, "text": "a warm and funny film"}, {"id": 0, "text": "tedious and overlong"},
               {"id": 2, "text": "lovely acting"}]
    chosen = model.select(records, k=3, out=tmp_path / "next.jsonl", strategy="random")
    assert sorted(r["id"] for r in chosen.records) == [0, 1, 2]
    written = [json.loads(line)["id"] for line in (tmp_path / "next.jsonl").read_text().splitlines()]
    assert sorted(written) == [0, 1, 2]


def test_select_names_its_own_flag(world, capsys):
    pool = world / "data" / "pool.txt"
    before = snapshot(world)
    assert main(["select", str(world / "model"), "--pool", str(pool), "-k", "1", "--out", str(pool)]) == 2
    line = one_error_line(capsys)
    assert f"--out {pool}: is the input" in line and "--output" not in line
    assert snapshot(world) == before


def test_ray_says_what_is_wrong_with_an_existing_folder(world, tmp_path, capsys):
    pytest.importorskip("ray")
    (tmp_path / "out").mkdir()
    assert main(["predict", str(world / "model"), "--engine", "ray", "--input", str(tmp_path / "in.parquet"),
                 "--output", str(tmp_path / "out")]) == 2
    line = one_error_line(capsys)
    assert "the folder exists" in line and "give a file name" not in line


def test_batch_predictor_of_a_list_says_what_it_takes():
    with pytest.raises(UserError, match="expected a model directory or a loaded Model, got list"):
        BatchPredictor(["a warm film", "a dull film"])
