"""A model folder is someone else's data: its values are checked when it is opened (one line
naming the file and the field, exit 2; Python: UserError), the dev file it records is read only
inside the folder (or when given again), and its JSON and a config's YAML are read within bounds.
Each failed probe of the third trust review (bench/RESULTS.md) about these is a case here."""

from __future__ import annotations

import builtins
import io
import json
import math
import shutil
import time
from pathlib import Path

import pytest
from helpers_machine import pretend
from helpers_multi import edit_manifest, load_error

import bertheads
from bertheads.base.errors import UserError
from bertheads.base.machine import Machine
from bertheads.cli.main import main

TORCH_ONLY_AMX = Machine(cpu="Intel Xeon", flags=frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni",
                                                            "amx_bf16", "amx_int8"}), cores=2, threads=2,
                         installed=frozenset())
SECRET = "API_KEY=sk-live-123\tpassword=hunter2\n"


def rows(n: int) -> str:
    return "sentence\tlabel\n" + "".join(f"a great film {i}\tpositive\nan awful film {i}\tnegative\n"
                                         for i in range(n))


@pytest.fixture(scope="module")
def trained(tiny_bert, tmp_path_factory) -> Path:
    """A classify head trained for one epoch, with its dev file beside the folder (as training records it)."""
    d = tmp_path_factory.mktemp("folder-trust")
    (d / "train.tsv").write_text(rows(8))
    (d / "dev.tsv").write_text(rows(3))
    bertheads.train("classify", str(d / "train.tsv"), str(d / "dev.tsv"), d / "model", model=tiny_bert, epochs=1,
                    batch_size=8, progress=False, precision="fp32")
    return d


@pytest.fixture
def model_dir(trained, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "model"
    shutil.copytree(trained / "model", target)
    (target / "gate.json").unlink(missing_ok=True)
    return target


def set_spec(directory: Path, **values) -> None:
    edit_manifest(directory, lambda m: m["heads"]["classify"]["spec"].update(values))


def cli_error(capsys, argv: list) -> str:
    """The command's one error line (exit 2)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("bertheads: error: "), err
    return err.strip()


# -- each value a head reads is checked against the schema ---------------------------------
HOSTILE = [
    ({"temperature": -1}, "temperature: expected null or a finite number from 0.001 to 1000, got -1"),
    ({"temperature": math.nan}, "temperature: expected a finite number, got NaN"),
    ({"temperature": math.inf}, "temperature: expected a finite number, got Infinity"),
    ({"temperature": 1e-300}, "temperature: expected null or a finite number from 0.001 to 1000, got 1e-300"),
    ({"label_names": ["good", "good"]}, 'label_names: expected distinct label names, got "good"'),
    ({"layers": [-99]}, "layers: expected layers from -3 to 2 (0: the embeddings; the encoder has 2 layers), got -99"),
    ({"max_length": 10**9}, "max_length: expected at most 512 (the tokens the encoder's checkpoint reads), "
                            "got 1000000000"),
    ({"trained_counts": {"negative": "many"}}, 'trained_counts.negative: expected an integer of 0 or more, got "many"'),
    ({"labels": ["negative", "negative"]}, 'labels: expected distinct labels, got "negative"'),
    ({"label_names": ["bad"]}, 'label_names: expected 2 names, one per label, got ["bad"]'),
    ({"thresholds": [0.5, 7]}, "thresholds[1]: expected a number from 0 to 1, got 7"),
    ({"threshold": 1.5}, "threshold: expected a number from 0 to 1, got 1.5"),
    ({"long_input": "everything"}, 'long_input: expected one of truncate, windows, got "everything"'),
    ({"dropout": 1.0}, "dropout: expected a number from 0 to below 1, got 1.0"),
]


@pytest.mark.parametrize("values,message", HOSTILE, ids=[f"{next(iter(v))}={next(iter(v.values()))!r}"
                                                          for v, _ in HOSTILE])
def test_a_value_a_head_cannot_use_is_one_line_naming_the_file_and_field(model_dir, trained, capsys, values, message):
    set_spec(model_dir, **values)
    expected = f"{model_dir / 'bertheads.json'}: heads.classify.spec.{message}"
    err = cli_error(capsys, ["predict", model_dir, "--input", trained / "train.tsv"])
    assert err == f"bertheads: error: {expected}"
    assert load_error(model_dir) == expected
    assert load_error(model_dir, runtime="onnx", precision="fp32") == expected  # the ONNX runner opens it the same way


def test_the_values_a_training_run_saves_are_accepted(model_dir):
    assert bertheads.load(model_dir).predict(["a great film"])[0]["label"] in ("negative", "positive")


def test_each_kind_checks_its_own_values():
    from bertheads.tasks import TASKS
    from bertheads.tasks.base import SavedValue

    with pytest.raises(SavedValue, match='tags: expected distinct tags, got "B-LOC"'):
        TASKS["tag"].spec_type.check_saved({"tags": ["O", "B-LOC", "B-LOC"]})
    with pytest.raises(SavedValue, match="null_scaling: expected two finite numbers"):
        TASKS["qa"].spec_type.check_saved({"null_scaling": [1.0, math.nan]})
    with pytest.raises(SavedValue, match="paragraph_match: expected a number of 0 or more"):
        TASKS["qa"].spec_type.check_saved({"paragraph_match": -1.0})
    TASKS["qa"].spec_type.check_saved({"null_scaling": [1.0, -2.0], "temperature": 1.3, "max_length": 384},
                                      num_layers=2, max_tokens=512)


def test_a_deep_metrics_json_is_refused_in_one_line_by_report_and_load(model_dir, tmp_path, capsys):
    (model_dir / "metrics.json").write_text("[" * 100_000)
    expected = f"{model_dir / 'metrics.json'}: JSON nested too deeply (more than 64 levels)"
    assert cli_error(capsys, ["report", model_dir, "--out", tmp_path / "page"]) == f"bertheads: error: {expected}"
    assert load_error(model_dir) == expected
    assert not (tmp_path / "page").exists()


@pytest.mark.parametrize("name,content,message", [
    ("metrics.json", {"history": [{"epoch": "one"}]}, 'history[0].epoch: expected a number, got "one"'),
    ("gate.json", {"machines": []}, "machines: expected an object of machines, got a list"),
    ("onnx/export.json", {"graphs": {"fp32": {"file": "../../secret.onnx"}}},
     "graphs.fp32.file: expected a file name in"),
])
def test_the_folders_other_json_files_are_checked_when_it_is_opened(model_dir, name, content, message):
    (model_dir / name).parent.mkdir(exist_ok=True)
    (model_dir / name).write_text(json.dumps(content))
    error = load_error(model_dir)
    assert error.startswith(f"{model_dir / name}: ") and message in error


def test_a_model_folders_json_larger_than_the_bound_is_refused(model_dir, monkeypatch):
    from bertheads.base import bounded

    monkeypatch.setattr(bounded, "MAX_JSON_BYTES", 100)
    assert "bytes, more than the 100 a model folder's JSON file may hold" in load_error(model_dir)


# -- the recorded dev file is read only inside the folder, its content never shown ----------
@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """Every path opened through open() (pathlib's too) while the test runs."""
    seen: list[str] = []
    real = builtins.open

    def spy(file, *args, **kwargs):
        seen.append(str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    return seen


def test_a_recorded_dev_path_outside_the_folder_is_never_opened(model_dir, tmp_path, capsys, opened):
    secret = tmp_path / "secret.tsv"
    secret.write_text(SECRET + "x\ty\n")
    edit_manifest(model_dir, lambda m: m["settings"].update(dev=str(secret)))
    inputs = tmp_path / "in.txt"
    inputs.write_text("a great film\n")
    opened.clear()  # what the test wrote
    with pretend(TORCH_ONLY_AMX):  # a machine where auto would check bf16 against fp32 on the dev data
        code = main(["predict", str(model_dir), "--input", str(inputs), "--runtime", "auto"])
        out, err = capsys.readouterr()
        assert code == 0 and json.loads(out)["label"] in ("negative", "positive")
        assert "lies outside the model folder and is not opened (--gate-data gives some)" in err
        assert "auto: torch fp32" in err
        assert bertheads.load(model_dir).mode.precision == "fp32"
    assert "sk-live" not in out + err and "hunter2" not in out + err
    assert str(secret) not in opened and str(model_dir / "bertheads.json") in opened  # the spy saw the reads


def test_a_recorded_dev_file_inside_the_folder_that_does_not_fit_is_not_echoed(model_dir, tmp_path, capsys):
    (model_dir / "secret.tsv").write_text(SECRET + "x\ty\n")
    edit_manifest(model_dir, lambda m: m["settings"].update(dev="secret.tsv"))
    inputs = tmp_path / "in.txt"
    inputs.write_text("a great film\n")
    with pretend(TORCH_ONLY_AMX):
        code = main(["predict", str(model_dir), "--input", str(inputs)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "the dev file the model records does not fit head classify (--gate-data gives one)" in err
    assert "sk-live" not in out + err and "hunter2" not in out + err


def test_a_dev_file_given_again_on_the_command_line_is_read(model_dir, trained, tmp_path, capsys):
    inputs = tmp_path / "in.txt"
    inputs.write_text("a great film\n")
    with pretend(TORCH_ONLY_AMX):
        code = main(["predict", str(model_dir), "--input", str(inputs), "--gate-data", str(trained / "dev.tsv")])
    err = capsys.readouterr().err
    assert code == 0 and f"checking torch bf16 against fp32 on {trained / 'dev.tsv'}" in err
    assert "6 labelled inputs" in err  # read, and too few to judge by


# -- a config's YAML read within bounds -------------------------------------------------------
def bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\nlabel_names: *a{levels}\n"


@pytest.mark.parametrize("text,message", [
    (bomb(), "refused: more than 100,000 values once its aliases are expanded"),
    ("x: &x [1]\ny: [" + ", ".join(["*x"] * 101) + "]\n", "refused: more than 100 aliases (*name)"),
    ("label_names: " + "[" * 5000 + "]" * 5000 + "\n", "refused: nested deeper than 64 levels"),
])
def test_a_yaml_bomb_in_a_config_is_refused_fast(trained, tmp_path, capsys, text, message):
    config = tmp_path / "bomb.yaml"
    config.write_text(f"kind: classify\ntrain: {trained / 'train.tsv'}\n" + text)
    start = time.perf_counter()
    err = cli_error(capsys, ["train", "--config", config, "--out", tmp_path / "out"])
    assert time.perf_counter() - start < 2
    assert err.startswith(f"bertheads: error: {config}") and message in err
    with pytest.raises(UserError, match="refused"):
        bertheads.train_multi(str(config), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_search_space_is_read_within_the_same_bounds(tmp_path):
    from bertheads.training.tune import read_space

    space = tmp_path / "space.yaml"
    space.write_text(bomb().replace("label_names", "lr"))
    with pytest.raises(UserError, match="refused: more than 100,000 values"):
        read_space(str(space), "classify")


def test_an_ordinary_config_with_an_alias_still_reads(tmp_path):
    from bertheads.training.config import read_config

    config = tmp_path / "two.yaml"
    (tmp_path / "t.tsv").write_text(rows(2))
    config.write_text("made_with: &task {kind: classify, train: t.tsv}\ntasks:\n  a: *task\n  b: *task\n")
    read = read_config(config)
    assert [t.name for t in read.tasks] == ["a", "b"] and read.tasks[0].train == str(tmp_path / "t.tsv")
