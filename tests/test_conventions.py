"""Command-line conventions (python -m, --version, help with defaults, one-line errors, -q) and
how training chooses the model it keeps."""

import json
import logging
import math
import os
import subprocess
import sys

import pytest

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.encoder.pretrained import Encoder
from bertheads.model import BertHeads
from bertheads.training.joint import prepare_task
from bertheads.training.loop import TrainSettings, fit

ROWS = "sentence\tlabel\n" + "".join(f"a great movie {i}\t1\na boring movie {i}\t0\n" for i in range(8))


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# -- conventions ----------------------------------------------------------------------------
@pytest.mark.slow  # runs extra processes (torchrun, kills, signals)
def test_python_dash_m_and_version(capsys):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "bertheads", "--version"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"bertheads {bertheads.__version__}"
    with pytest.raises(SystemExit) as exit_:  # (the same parser, in this process: one interpreter start is enough)
        main(["--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert all(c in shown for c in ("train", "evaluate", "predict", "extract", "combine", "serve"))


@pytest.mark.slow  # runs extra processes
def test_command_exits_quickly_without_losing_output_or_exit_handlers(tiny_bert, write, tmp_path):
    """`bertheads` ends with os._exit after the command: its output is all there, the exit
    handlers ran, and the exit status is the command's."""
    model = str(tmp_path / "m")
    assert main(["train", "classify", "--model", tiny_bert, "--train", write("t.tsv", ROWS), "--out", model,
                 "--epochs", "1", "--no-progress", "-q"]) == 0
    texts = write("in.txt", "".join(f"movie number {i}\n" for i in range(300)))
    marker = tmp_path / "atexit-ran"
    script = ("import atexit, pathlib, sys; "
              f"atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text('yes')); "
              "from bertheads.cli.main import command; sys.argv[0] = 'bertheads'; command()")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", script, "predict", model, "--input", texts],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ["label" in json.loads(line) for line in proc.stdout.splitlines()] == [True] * 300
    assert marker.read_text() == "yes"
    marker.unlink()
    proc = subprocess.run([sys.executable, "-c", script, "predict", str(tmp_path / "none"), "--input",
                           texts], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("bertheads: error:") and marker.read_text() == "yes"


def test_help_shows_each_kinds_defaults(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "qa", "--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-length MAX_LENGTH tokens per input (pairs are cut longest-first) (default: 384)" in text
    assert "--batch-size N training examples per step (default auto: by the training data's size, 8 for small " \
           "sets, 32 for large ones; qa 16)" in text


@pytest.mark.parametrize("argv, message", [
    (["predict", "m", "--batch-size", "0"], "argument --batch-size: expected a positive integer, got '0'"),
    (["train", "classify", "--train", "t", "--out", "o", "--epochs", "0"],
     "argument --epochs: expected a positive integer, got '0'"),
    (["predict", "m", "--format", "xml"], "argument --format: invalid choice: 'xml'"),
    (["train", "classify", "--train", "t", "--out", "o", "--lr", "-1"], "argument --lr: expected a positive number"),
])
def test_bad_options_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert err[0].startswith("bertheads: error: ") and message in err[0]


def test_quiet_and_messages_on_stderr(tiny_bert, write, tmp_path, capsys):
    data = write("t.tsv", ROWS)
    argv = ["train", "classify", "--train", data, "--out", str(tmp_path / "m"), "--model", tiny_bert, "--epochs", "1",
            "--no-progress"]
    code, out, err = run(argv, capsys)
    assert code == 0 and f"bertheads: saved {tmp_path / 'm'}" in err and "saved" not in out
    code, out, err = run(argv + ["-q", "--overwrite"], capsys)
    assert code == 0 and "saved" not in err


def test_load_leaves_transformers_logging_alone(tiny_bert):
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_info()
    try:
        Encoder.load(tiny_bert)
        assert hf_logging.get_verbosity() == logging.INFO
    finally:
        hf_logging.set_verbosity_warning()


# -- the kept model ------------------------------------------------------------------------
def scripted(metrics_by_epoch):
    """An `evaluate` for `fit` that reports the given dev metrics, epoch after epoch."""
    calls = iter(metrics_by_epoch)
    return lambda model, data: dict(next(calls))


def kept(saved: dict) -> dict:
    return {k: saved["kept"][k] for k in ("epoch", "by")}


def fit_scripted(tiny_bert, write, tmp_path, metrics_by_epoch, **settings):
    encoder = Encoder.load(tiny_bert)
    data = prepare_task("classify", write("t.tsv", ROWS), write("d.tsv", ROWS), encoder, {})
    net = BertHeads(encoder, {data.name: data.task})
    options = dict(epochs=len(metrics_by_epoch), batch_size=8, progress=False) | settings
    result = fit(net, [data], TrainSettings(**options), tmp_path / "m", scripted(metrics_by_epoch))
    return result, json.loads((tmp_path / "m" / "metrics.json").read_text())


def test_ties_go_to_the_lower_dev_loss(tiny_bert, write, tmp_path):
    epochs = [{"accuracy": 0.5, "f1": 0.4, "loss": 0.9}] + [{"accuracy": 1.0, "f1": 1.0, "loss": x}
                                                            for x in (0.6, 0.3, 0.1)]
    result, saved = fit_scripted(tiny_bert, write, tmp_path, epochs)
    assert kept(saved) == {"epoch": 4, "by": "accuracy, then dev loss"} and saved["best_epoch"] == 4
    assert saved["dev"]["loss"] == 0.1 and result["kept"]["epoch"] == 4


def test_a_tie_with_a_higher_loss_keeps_the_earlier_epoch(tiny_bert, write, tmp_path):
    epochs = [{"accuracy": 1.0, "loss": 0.2}, {"accuracy": 1.0, "loss": 0.5}, {"accuracy": 0.9, "loss": 0.05}]
    _, saved = fit_scripted(tiny_bert, write, tmp_path, epochs)
    assert saved["kept"]["epoch"] == 1 and len(saved["history"]) == 3


def test_keep_last_and_select_metric(tiny_bert, write, tmp_path):
    epochs = [{"accuracy": 1.0, "f1": 0.2, "loss": 0.1}, {"accuracy": 0.5, "f1": 0.9, "loss": 0.8}]
    _, saved = fit_scripted(tiny_bert, write, tmp_path / "a", epochs, keep="last")
    assert kept(saved) == {"epoch": 2, "by": "last epoch (--keep last)"}
    _, saved = fit_scripted(tiny_bert, write, tmp_path / "b", epochs, select_metric="f1")
    assert kept(saved) == {"epoch": 2, "by": "f1, then dev loss"}
    _, saved = fit_scripted(tiny_bert, write, tmp_path / "c", epochs, select_metric="loss")  # smaller is better
    assert saved["kept"]["epoch"] == 1
    with pytest.raises(UserError, match="select_metric='spearman': head 'classify' has no such dev metric"):
        fit_scripted(tiny_bert, write, tmp_path / "d", epochs, select_metric="spearman")


def test_cli_keep_last_saves_the_final_epoch(tiny_bert, write, tmp_path, capsys):
    data = write("t.tsv", ROWS)
    code, out, _ = run(["train", "classify", "--train", data, "--dev", data, "--out", str(tmp_path / "m"),
                        "--model", tiny_bert, "--epochs", "3", "--keep", "last", "--no-progress"], capsys)
    assert code == 0
    saved = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert saved["kept"]["epoch"] == 3 and saved["dev"] == saved["history"][-1]["dev"]["classify"]
    assert math.isfinite(saved["dev"]["loss"]) and json.loads(out.splitlines()[-1])["kept"]["epoch"] == 3
    # evaluate reports the same dev loss from the saved weights
    again = bertheads.load(tmp_path / "m").evaluate(data)
    assert again["loss"] == pytest.approx(saved["dev"]["loss"], rel=1e-5)


def test_joint_score_puts_percent_metrics_on_the_same_scale():
    from bertheads.training.keeping import score_of

    metrics = {"qa": {"f1": 80.0, "loss": 1.0}, "sentiment": {"accuracy": 0.9, "loss": 0.5}}
    chosen = {"qa": "f1", "sentiment": "accuracy"}
    assert score_of(metrics, chosen, {"qa": 100.0, "sentiment": 1.0}) == (pytest.approx(0.85), 0.75)
    # without the scale the QA F1 would decide alone
    better_qa = {"qa": {"f1": 81.0, "loss": 1.0}, "sentiment": {"accuracy": 0.5, "loss": 0.5}}
    scales = {"qa": 100.0, "sentiment": 1.0}
    assert score_of(better_qa, chosen, scales)[0] < score_of(metrics, chosen, scales)[0]


def test_progress_in_a_log_file_is_lines_not_bar_frames(tiny_bert, write, tmp_path, capsys):
    """stderr is not a terminal here (as in CI or `make demo > log`): no carriage-return frames,
    one line per epoch with the bar's figures; predict shows no bar at all."""
    data = write("t.tsv", ROWS)
    code, out, err = run(["train", "classify", "--train", data, "--out", str(tmp_path / "m"), "--model", tiny_bert,
                          "--epochs", "2", "--batch-size", "8"], capsys)
    assert code == 0 and "\r" not in err
    lines = [line for line in err.splitlines() if ": batch " in line]
    assert [line.split(",")[0] for line in lines] == ["bertheads: epoch 1/2: batch 2/2", "bertheads: epoch 2/2: batch 2/2"]
    assert all("loss=" in line and "ex_s=" in line for line in lines)
    code, out, err = run(["predict", str(tmp_path / "m"), "--input", write("x.txt", "a great movie\n"),
                          "--output", str(tmp_path / "p.jsonl")], capsys)
    assert code == 0 and "\r" not in err and "predict:" not in err


@pytest.mark.parametrize("argv, extra", [(["serve", "m"], "serve"), (["tune", "classify", "--train", "t", "--dev", "d",
                                                                        "--out", "o"], "tune"),
                                         (["report", "m"], "report"), (["export", "m", "--to", "onnx"], "export")])
def test_a_command_whose_extra_is_missing_names_it(argv, extra, capsys, monkeypatch):
    import importlib.util

    from bertheads.base import extras

    real = importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name, *a: None if name in extras.EXTRAS[extra] else real(name, *a))
    code, out, err = run(argv, capsys)
    assert code == 2 and err.strip().count("\n") == 0
    assert f"needs the '{extra}' extra" in err and f"pip install 'bertheads[{extra}]'" in err, err
