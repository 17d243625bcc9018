"""Trust boundaries of the command line and the library, each probe run as an attacker or a
careless user would: no output over an input, a model file or another live run's output;
nothing in a model folder executed or unpickled; paths in a manifest kept inside the folder;
an export used only with the weights it was made from; blank lines kept in place; errors at the
right line, on one line; leftovers of a killed run removed; `-q` quiet. The server's part is in
test_serve_trust.py."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_multi import build_task, save_heads
from safetensors.torch import load_file, save_file

import bertheads
from bertheads.cli.main import main
from bertheads.encoder.pretrained import Encoder
from bertheads.model import BertHeads
from bertheads.saved import bundle
from bertheads.store.encoder_refs import reference

SRC = str(Path(__file__).resolve().parents[1] / "src")
HEADS = {"sentiment": ("classify", 1, {"labels": ["negative", "positive"]}),
         "ner": ("tag", 2, {"tags": ["O", "B-LOC", "I-LOC"], "max_length": 32, "stride": 8})}
TEXTS = ["A warm, funny film.", "Anna flew to Madrid.", "Tedious and overlong."]


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    """A checkpoint memo (and features cache) of this module's own: no checkpoint is known yet."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BERTHEADS_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def saved(tiny_bert, tmp_path_factory) -> Path:
    return save_heads(tiny_bert, tmp_path_factory.mktemp("trust") / "model", HEADS)


@pytest.fixture
def model_dir(saved, tmp_path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(saved, out)
    return out


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("bertheads: error")]
    assert len(lines) == 1 and len(err.strip().splitlines()) == 1, err
    return lines[0]


def dot_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*"))


# -- 1. outputs: never over an input, never into a model, one run per output ------------------------
def test_an_output_over_its_input_or_into_a_model_folder_is_refused(model_dir, tmp_path, capsys):
    table = tmp_path / "in.tsv"
    table.write_text("sentence\n" + "".join(t + "\n" for t in TEXTS))
    before = table.read_bytes()
    assert main(["predict", str(model_dir), "--head", "sentiment", "--input", str(table), "--output", str(table),
                 "-q"]) == 2
    assert "is the input" in one_line(capsys) and table.read_bytes() == before
    link = tmp_path / "link.jsonl"
    link.symlink_to(table)
    assert main(["predict", str(model_dir), "--head", "sentiment", "--input", str(table), "--output", str(link),
                 "-q"]) == 2
    assert "is the input" in one_line(capsys) and table.read_bytes() == before

    records = tmp_path / "x.jsonl"
    records.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    kept = records.read_bytes()
    assert main(["analyze", str(model_dir), "--input", str(records), "--output", str(records), "-q"]) == 2
    assert "is the input" in one_line(capsys) and records.read_bytes() == kept

    one = tmp_path / "one.txt"
    one.write_text(TEXTS[0] + "\n")
    manifest = (model_dir / "bertheads.json").read_bytes()
    for target in (model_dir / "bertheads.json", model_dir / "encoder" / "model.safetensors",
                   model_dir / "preds.jsonl"):
        assert main(["predict", str(model_dir), "--head", "sentiment", "--input", str(one), "--output", str(target),
                     "-q"]) == 2
        assert "is inside the model folder" in one_line(capsys)
    assert (model_dir / "bertheads.json").read_bytes() == manifest and not (model_dir / "preds.jsonl").exists()
    assert bertheads.load(model_dir).heads == {"sentiment": "classify", "ner": "tag"}
    assert dot_files(tmp_path) == []  # no lock or temporary file left by the refusals


def test_a_second_run_writing_the_same_output_stops_at_once(model_dir, tmp_path, capsys):
    """Another live run holds the output (its lock beside it): this one stops before any work."""
    one = tmp_path / "one.txt"
    one.write_text("".join(t + "\n" for t in TEXTS))
    out = tmp_path / "same.jsonl"
    script = ("import fcntl, json, os, sys, time\n"
              f"fd = os.open({str(tmp_path / '.same.jsonl.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "os.write(fd, json.dumps({'pid': os.getpid(), 'started': time.time(), "
              "'command': 'bertheads predict M --output same.jsonl'}).encode())\n"
              "print('held', flush=True)\nsys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        assert main(["predict", str(model_dir), "--head", "sentiment", "--input", str(one), "--output", str(out),
                     "-q"]) == 2
        line = one_line(capsys)
        assert time.monotonic() - start < 2  # refused before the model is loaded
        assert f"another bertheads predict is writing here (pid {holder.pid}" in line and "output file" in line, line
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    assert main(["predict", str(model_dir), "--head", "sentiment", "--input", str(one), "--output", str(out),
                 "-q"]) == 0
    assert len(out.read_text().splitlines()) == 3 and dot_files(tmp_path) == []


# -- 2. no code from a model folder runs ---------------------------------------------------------
def plant_custom_code(encoder_dir: Path, marker: Path) -> None:
    """An unknown model_type whose auto_map names classes in a .py beside the config."""
    config = json.loads((encoder_dir / "config.json").read_text())
    config.update(model_type="trojanbert", auto_map={"AutoConfig": "trojan.TrojanConfig",
                                                     "AutoModel": "trojan.TrojanModel"})
    (encoder_dir / "config.json").write_text(json.dumps(config))
    (encoder_dir / "trojan.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import BertConfig, BertModel\n"
        "class TrojanConfig(BertConfig):\n    model_type = 'trojanbert'\n"
        "class TrojanModel(BertModel):\n    config_class = TrojanConfig\n")


def test_code_planted_in_a_model_folder_never_runs(model_dir, tmp_path, capsys, monkeypatch):
    marker = tmp_path / "ran"
    plant_custom_code(model_dir / "encoder", marker)
    one = tmp_path / "one.txt"
    one.write_text(TEXTS[0] + "\n")
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # whoever asks "run the custom code? [y/N]"...
    monkeypatch.setattr("builtins.input", lambda *_: "y")  # ...is answered yes
    assert main(["predict", str(model_dir), "--head", "sentiment", "--input", str(one), "-q"]) == 2
    line = one_line(capsys)
    assert "never runs code" in line and not marker.exists(), line
    assert main(["evaluate", str(model_dir), "--data", str(one)]) == 2
    assert "never runs code" in one_line(capsys) and not marker.exists()


# -- 3. nothing is unpickled; manifest paths stay inside the folder ---------------------------------
class Trap:
    """A pickle that leaves a file behind when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def save_head_only(checkpoint: Path, out: Path) -> Path:
    """A head-only model (as features mode saves) whose encoder is the checkpoint at `checkpoint`."""
    encoder = Encoder.load(str(checkpoint))
    encoder.reference = reference(encoder, str(checkpoint))
    bundle.save(BertHeads(encoder, {"sentiment": build_task(encoder, *HEADS["sentiment"])}), out)
    return out


def test_no_pickle_is_read_and_manifest_paths_stay_inside(tiny_bert, tmp_path, capsys):
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_bert, checkpoint)
    model = save_head_only(checkpoint, tmp_path / "a" / "b" / "c" / "model")
    one = tmp_path / "one.txt"
    one.write_text(TEXTS[0] + "\n")
    marker = tmp_path / "unpickled"

    # a pickle at DIR/encoder/pytorch_model.bin, beside the checkpoint's config and tokenizer
    (model / "encoder").mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(checkpoint / name, model / "encoder" / name)
    (model / "encoder" / "pytorch_model.bin").write_bytes(pickle.dumps(Trap(marker)))
    assert main(["predict", str(model), "--input", str(one), "-q"]) == 2
    line = one_line(capsys)
    assert "pytorch_model.bin (a pickle)" in line and "safetensors only" in line and not marker.exists(), line
    shutil.rmtree(model / "encoder")

    # the manifest's encoder path leads out of the folder, to a checkpoint never named by the user
    elsewhere = tmp_path / "x" / "else"
    shutil.copytree(checkpoint, elsewhere)
    (elsewhere / "model.safetensors").unlink()
    (elsewhere / "pytorch_model.bin").write_bytes(pickle.dumps(Trap(marker)))
    manifest = json.loads((model / "bertheads.json").read_text())
    manifest["encoder"].update(path=os.path.relpath(elsewhere, model), source="somewhere/else")
    assert manifest["encoder"]["path"].startswith("../../../../")
    (model / "bertheads.json").write_text(json.dumps(manifest))
    assert main(["predict", str(model), "--input", str(one), "-q"]) == 2
    line = one_line(capsys)
    assert f"names the encoder at {elsewhere}, outside the model folder" in line and not marker.exists(), line
    assert "--encoder" in line

    # named on the command line, the checkpoint is read (safetensors, hash checked)
    shutil.rmtree(elsewhere)
    shutil.copytree(checkpoint, elsewhere)
    assert main(["predict", str(model), "--input", str(one), "--encoder", str(elsewhere), "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["label"] in ("negative", "positive")


# -- 5. an export is used only with the weights it was made from; 9b: `export -q` is quiet ----------
@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_bert) -> tuple[Path, str]:
    """A one-head model exported (fp32 and int8) by `bertheads export -q`, and what it printed."""
    out = save_heads(tiny_bert, tmp_path_factory.mktemp("exported") / "model", {"sentiment": HEADS["sentiment"]})
    done = subprocess.run([sys.executable, "-m", "bertheads", "export", str(out), "--to", "onnx", "--quantize", "int8",
                           "-q"], env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out, done.stderr


def test_export_q_prints_nothing(exported):
    _, stderr = exported
    assert stderr == ""


@pytest.mark.parametrize("runtime", ["onnx", "openvino"])
def test_an_export_of_other_encoder_weights_is_not_used(exported, runtime, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(exported[0], model)
    one = tmp_path / "one.txt"
    one.write_text(TEXTS[0] + "\n")
    argv = ["predict", str(model), "--input", str(one), "--runtime", runtime, "--precision", "fp32", "-q"]
    assert main(argv) == 0
    capsys.readouterr()
    weights = model / "encoder" / "model.safetensors"
    state = load_file(str(weights))
    key = next(k for k in state if k.endswith("query.weight"))
    state[key] = state[key] * 2
    save_file(state, str(weights), metadata={"format": "pt"})  # valid safetensors, other weights
    assert main(argv) == 2
    line = one_line(capsys)
    assert "changed since the export was made" in line and f"bertheads export {model} --to onnx" in line, line
    assert main([*argv[:4], "--runtime", "torch", "-q"]) == 2
    assert "do not match the manifest's encoder_hash" in one_line(capsys)


def test_code_planted_beside_an_export_never_runs(exported, tmp_path, capsys, monkeypatch):
    model = tmp_path / "model"
    shutil.copytree(exported[0], model)
    marker = tmp_path / "ran"
    plant_custom_code(model / "encoder", marker)
    one = tmp_path / "one.txt"
    one.write_text(TEXTS[0] + "\n")
    monkeypatch.setattr("builtins.input", lambda *_: "y")
    assert main(["predict", str(model), "--input", str(one), "--runtime", "onnx", "--no-verify", "-q"]) == 2
    assert "never runs code" in one_line(capsys) and not marker.exists()


# -- 7. predictions line up with their input lines ----------------------------------------------------
@pytest.mark.parametrize("chunk", ["1", "2048"])
def test_blank_lines_keep_their_place(model_dir, tmp_path, capsys, chunk):
    plain = tmp_path / "in.txt"
    plain.write_text(f"\n{TEXTS[0]}\n\n  \n{TEXTS[1]}\n{TEXTS[2]}\n\n")
    dense = tmp_path / "dense.txt"
    dense.write_text("".join(t + "\n" for t in TEXTS))
    for command in (["predict", str(model_dir), "--head", "sentiment"], ["predict", str(model_dir), "--head", "ner"],
                    ["analyze", str(model_dir)]):
        assert main([*command, "--input", str(dense), "--chunk-size", chunk, "-q"]) == 0
        expected = capsys.readouterr().out.splitlines()
        assert main([*command, "--input", str(plain), "--chunk-size", chunk, "-q"]) == 0
        got = capsys.readouterr().out.splitlines()
        assert len(got) == 7  # one output line per input line
        blank = [json.dumps({"line": n, "skipped": "blank"}) for n in (1, 3, 4, 7)]
        assert [got[i] for i in (0, 2, 3, 6)] == blank
        assert [got[i] for i in (1, 4, 5)] == expected  # the predictions themselves are unchanged


# -- 8. errors point at the right place, on one line -------------------------------------------------
def test_a_byte_that_is_not_utf8_is_reported_at_its_line(model_dir, tmp_path, capsys):
    table = tmp_path / "latin1.tsv"
    table.write_bytes(b"sentence\tlabel\n" + b"".join(f"{t}\t1\n".encode() for t in TEXTS)
                      + "caf\u00e9 au lait\t0\n".encode("latin-1"))
    assert main(["evaluate", str(model_dir), "--head", "sentiment", "--data", str(table)]) == 2
    assert f"{table}:5: not UTF-8 text (byte 4 of the line, 0xe9)" in one_line(capsys)
    assert main(["predict", str(model_dir), "--head", "sentiment", "--input", str(table), "-q"]) == 2
    assert f"{table}:5: not UTF-8" in one_line(capsys)


def test_a_head_name_with_a_line_break_is_refused_on_one_line(model_dir, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    assert main(["combine", str(model_dir), str(other), "--out", str(tmp_path / "c"), "--names", "sentiment\n", "ner",
                 "b", "c"]) == 2
    assert "not a valid head name" in one_line(capsys)
    manifest = json.loads((other / "bertheads.json").read_text())
    manifest["heads"]["sentiment\n"] = manifest["heads"].pop("sentiment")
    (other / "bertheads.json").write_text(json.dumps(manifest))
    (other / "heads" / "sentiment.safetensors").rename(other / "heads" / "sentiment\n.safetensors")
    one = tmp_path / "one.txt"
    one.write_text(TEXTS[0] + "\n")
    assert main(["predict", str(other), "--input", str(one), "-q"]) == 2
    assert "'sentiment\\n' is not a valid head name" in one_line(capsys)


# -- 9. a killed run's leftovers are removed by the next run ---------------------------------------
@pytest.mark.slow  # a process killed with SIGKILL
def test_a_killed_predict_leaves_nothing_the_next_run_keeps(saved, tmp_path, capsys):
    plain = tmp_path / "in.txt"
    plain.write_text("".join(t + "\n" for t in TEXTS) * 5000)
    out = tmp_path / "preds.jsonl"
    argv = ["predict", str(saved), "--head", "sentiment", "--input", str(plain), "--output", str(out), "-q"]
    run = subprocess.Popen([sys.executable, "-m", "bertheads", *argv, "--chunk-size", "1"],
                           env={**os.environ, "PYTHONPATH": SRC}, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".preds.jsonl.*.tmp")) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        run.kill()  # SIGKILL, mid-write
        run.wait()
    assert run.returncode == -9 and list(tmp_path.glob(".preds.jsonl.*.tmp")) and not out.exists()
    plain.write_text("".join(t + "\n" for t in TEXTS))
    assert main(argv) == 0
    assert len(out.read_text().splitlines()) == 3 and dot_files(tmp_path) == []
