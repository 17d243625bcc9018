"""Model directories that were tampered with, truncated or hand-edited: each load fails with
one line naming the file and the field (exit 2 from the CLI), never a silent random init."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers_multi import edit_manifest, load_error, save_heads
from safetensors.torch import load_file, save_file

import bertheads
from bertheads.cli.main import main


@pytest.fixture(scope="module")
def saved(tiny_bert, tmp_path_factory) -> Path:
    heads = {"sentiment": ("classify", 1, {"labels": ["negative", "positive"]}),
             "ner": ("tag", 2, {"tags": ["O", "B-LOC", "I-LOC"]})}
    return save_heads(tiny_bert, tmp_path_factory.mktemp("files") / "model", heads)


@pytest.fixture
def model_dir(saved, tmp_path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(saved, out)
    return out


def edit_safetensors(path: Path, change) -> None:
    state = load_file(str(path))
    change(state)
    save_file(state, str(path), metadata={"format": "pt"})


def test_an_untouched_model_loads(model_dir):
    assert bertheads.load(model_dir).heads == {"sentiment": "classify", "ner": "tag"}


def test_a_removed_encoder_tensor_is_an_error_not_a_random_init(model_dir, capsys):
    key = "encoder.layer.0.attention.self.query.weight"
    edit_safetensors(model_dir / "encoder" / "model.safetensors", lambda s: s.pop(key))
    assert main(["predict", str(model_dir), "--head", "sentiment", "--question", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "encoder weights missing from the weight files" in err and key in err
    assert "missing from the weight files" in load_error(model_dir, verify=False)  # not a hash question


def test_an_unexpected_encoder_tensor_is_an_error(model_dir):
    edit_safetensors(model_dir / "encoder" / "model.safetensors", lambda s: s.update(extra=torch.zeros(2)))
    assert "encoder weights not in the model: extra" in load_error(model_dir, verify=False)


def test_changed_encoder_values_fail_the_hash_unless_no_verify(model_dir, capsys):
    def nudge(state):
        state["embeddings.word_embeddings.weight"][5, 0] += 0.5

    edit_safetensors(model_dir / "encoder" / "model.safetensors", nudge)
    message = load_error(model_dir)
    assert "do not match the manifest's encoder_hash" in message and "verify=False" in message
    assert bertheads.load(model_dir, verify=False).heads  # people who edit weights on purpose
    data = model_dir / "in.txt"
    data.write_text("a fine film\n")
    assert main(["predict", str(model_dir), "--head", "sentiment", "--input", str(data)]) == 2
    assert main(["predict", str(model_dir), "--head", "sentiment", "--input", str(data), "--no-verify"]) == 0
    assert main(["evaluate", str(model_dir), "--head", "sentiment", "--data", str(data)]) == 2


def test_pickle_weights_are_not_loaded(model_dir):
    encoder = model_dir / "encoder"
    torch.save(load_file(str(encoder / "model.safetensors")), encoder / "pytorch_model.bin")
    (encoder / "model.safetensors").unlink()
    message = load_error(model_dir)
    assert "pytorch_model.bin (a pickle)" in message and "safetensors only" in message


@pytest.mark.parametrize("which", ["encoder/model.safetensors", "heads/sentiment.safetensors"])
def test_truncated_or_corrupt_safetensors(model_dir, which):
    path = model_dir / which
    path.write_bytes(path.read_bytes()[:200])
    message = load_error(model_dir)
    assert str(path.parent if which.startswith("encoder") else path) in message
    path.write_bytes(b"\xff" * 64)
    assert load_error(model_dir)


@pytest.mark.parametrize("name", ["/etc/passwd", "../../x", "..", "a/b", ".hidden", ""])
def test_head_names_that_are_paths_are_rejected(model_dir, name):
    edit_manifest(model_dir, lambda m: m["heads"].update({name: m["heads"].pop("sentiment")}))
    assert "is not a valid head name" in load_error(model_dir)


def test_head_name_rule_is_the_multi_task_rule():
    from bertheads.saved import manifest
    from bertheads.training import config as multitask

    assert multitask.HEAD_NAME is manifest.HEAD_NAME


MANIFEST_EDITS = [
    (lambda m: m.update(heads=list(m["heads"])), "heads: expected an object"),
    (lambda m: m["heads"]["sentiment"].pop("spec"), "heads.sentiment.spec: expected an object"),
    (lambda m: m["heads"]["sentiment"].update(kind="regress"), "heads.sentiment.kind: expected one of"),
    (lambda m: m["heads"]["sentiment"]["spec"].update(labels=["a", "b", "c"]),
     "out.weight has shape [2, 32] but the manifest's spec (single_label, 3 labels: 3 outputs) makes [3, 32]"),
    (lambda m: m["heads"]["ner"]["spec"].update(tags=["O"]), "(1 tags)"),
    (lambda m: m["heads"]["sentiment"]["spec"].update(max_length="long"),
     "heads.sentiment.spec.max_length: expected an integer, got 'long'"),
    (lambda m: m["heads"]["sentiment"]["spec"].update(layers=[-1.5]), "spec.layers: expected a list of integers"),
    (lambda m: m["heads"]["ner"]["spec"].update(stride=0), "spec.stride: expected a positive integer"),
    (lambda m: m.update(format_version="1"), "unsupported manifest"),
    (lambda m: m.update(encoder_hash=42), "encoder_hash: expected 64 hexadecimal digits"),
]


@pytest.mark.parametrize("change,message", MANIFEST_EDITS)
def test_manifest_checked_against_its_schema(model_dir, change, message):
    edit_manifest(model_dir, change)
    assert message in load_error(model_dir)


@pytest.mark.parametrize("content,message", [
    (b'{"format_version": 1, "heads": {"x\xff": 1}}', "not UTF-8 text (byte 34)"),
    (b"[" * 100_000, "JSON nested too deeply"),
    (b'{"format_version": 1,', "malformed JSON"),
    (b"[]", "expected a JSON object, got a list"),
])
def test_manifest_that_is_not_json_text(model_dir, content, message, capsys):
    (model_dir / "bertheads.json").write_bytes(content)
    assert message in load_error(model_dir)
    assert main(["predict", str(model_dir), "--question", "q", "--context", "c"]) == 2
    assert capsys.readouterr().err.startswith("bertheads: error: ")


def test_head_file_with_other_tensors(model_dir):
    edit_safetensors(model_dir / "heads" / "sentiment.safetensors", lambda s: s.pop("out.bias"))
    assert "tensors do not match the head the manifest describes (missing out.bias)" in load_error(model_dir)
    (model_dir / "heads" / "sentiment.safetensors").unlink()
    assert "sentiment.safetensors: missing head weights" in load_error(model_dir)
