"""Label names, the mode-aware learning rate, and fast warm features-mode runs (dev states
from the cache, remembered checkpoint hashes, head-only model directories)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.encoder import pretrained as encoder_module
from bertheads.encoder.pretrained import Encoder
from bertheads.saved import bundle
from bertheads.store import encoder_refs
from bertheads.training.loop import FEATURES_LR, FINETUNE_LR

ROWS = "".join(f"a good fun film number {i}\t1\nan awful dull bore {i} times over\t0\n" for i in range(8))


@pytest.fixture
def data(write):
    dev = "".join(ROWS.splitlines(True)[:6])
    return write("train.tsv", "sentence\tlabel\n" + ROWS), write("dev.tsv", "sentence\tlabel\n" + dev)


def train_cli(tiny_bert, train, dev, out, *flags) -> int:
    return main(["train", "classify", "--train", train, "--dev", dev, "--out", str(out), "--model", tiny_bert,
                 "--epochs", "1", "--batch-size", "8", "--no-progress", *flags])


# -- label names ---------------------------------------------------------------------------------
def test_label_names_reach_predict_evaluate_and_the_server(tiny_bert, data, tmp_path, write, capsys):
    train, dev = data
    out = tmp_path / "m"
    assert train_cli(tiny_bert, train, dev, out, "--label-names", "negative,positive") == 0
    spec = bundle.read_manifest(out)["heads"]["classify"]["spec"]
    assert spec["labels"] == [0, 1] and spec["label_names"] == ["negative", "positive"]
    capsys.readouterr()
    assert main(["predict", str(out), "--input", write("in.txt", "a good fun film\nan awful bore\n")]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert all(p["label"] in ("negative", "positive") and set(p["scores"]) == {"negative", "positive"} for p in lines)
    model = bertheads.load(out)
    # evaluate reads files labelled with the values or with the names, alike
    named = write("named.tsv", "sentence\tlabel\n" + ROWS.replace("\t1\n", "\tpositive\n").replace("\t0\n", "\tnegative\n"))
    assert model.evaluate(named)["accuracy"] == model.evaluate(train)["accuracy"]
    from bertheads.serve.app import describe_heads

    assert describe_heads(model)[0]["labels"] == ["negative", "positive"]


def test_label_names_must_fit_the_labels(tiny_bert, data, tmp_path, capsys):
    train, dev = data
    assert train_cli(tiny_bert, train, dev, tmp_path / "m", "--label-names", "a,b,c") == 2
    err = capsys.readouterr().err
    assert "--label-names: 3 names for the 2 labels" in err and "\n" not in err.strip()
    with pytest.raises(SystemExit):  # argparse's own check: exit 2, one line
        train_cli(tiny_bert, train, dev, tmp_path / "m", "--label-names", "pos,pos")
    assert "the names must differ" in capsys.readouterr().err


# -- mode-aware learning rate --------------------------------------------------------------------
def test_the_learning_rate_default_follows_the_mode(tiny_bert, data, tmp_path, capsys):
    train, dev = data
    cache = str(tmp_path / "cache")
    runs = {"finetune": [], "features": ["--mode", "features", "--cache-dir", cache],
            "given": ["--mode", "features", "--cache-dir", cache, "--lr", "2e-4"]}
    used = {}
    for name, flags in runs.items():
        assert train_cli(tiny_bert, train, dev, tmp_path / name, *flags) == 0
        used[name] = json.loads((tmp_path / name / "metrics.json").read_text())["history"][0]["lr"]
    assert used == {"finetune": FINETUNE_LR, "features": FEATURES_LR, "given": 2e-4}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "classify", "--help"])
    help_text = capsys.readouterr().out
    assert "default 5e-05 when fine-tuning, 0.001 with --mode features" in " ".join(help_text.split())


# -- warm runs -----------------------------------------------------------------------------------
def test_a_warm_run_reads_dev_states_from_the_cache_and_hashes_nothing(tiny_bert, data, tmp_path, monkeypatch):
    train, dev = data
    cache = tmp_path / "cache"
    flags = ("--mode", "features", "--cache-dir", str(cache))
    assert train_cli(tiny_bert, train, dev, tmp_path / "cold", *flags) == 0
    metas = [json.loads(p.read_text()) for p in (cache / "features").glob("*/meta.json")]
    assert sorted(m["features"] for m in metas) == [6, 16]  # the dev and the training entry
    cold = json.loads((tmp_path / "cold" / "metrics.json").read_text())["dev"]

    def refuse(*_a, **_k):
        raise AssertionError("a warm run ran the encoder or hashed its weights")

    monkeypatch.setattr(Encoder, "forward", refuse)
    monkeypatch.setattr(encoder_refs, "encoder_hash", refuse)
    monkeypatch.setattr(encoder_module, "load_encoder_model", refuse)  # nor loaded its weights
    assert train_cli(tiny_bert, train, dev, tmp_path / "warm", *flags) == 0
    warm = json.loads((tmp_path / "warm" / "metrics.json").read_text())["dev"]
    assert warm == cold
    monkeypatch.undo()
    # what the cached dev states gave is what the live encoder gives (float16 cache)
    live = bertheads.load(tmp_path / "warm").evaluate(dev)
    assert live["accuracy"] == warm["accuracy"] and live["loss"] == pytest.approx(warm["loss"], abs=1e-3)


def test_a_lazy_encoder_loads_on_first_use_in_the_state_it_was_given(tiny_bert):
    torch = __import__("torch")
    eager = Encoder.load(tiny_bert).eval()
    lazy = Encoder.load(tiny_bert, lazy=True)
    assert not lazy.loaded and lazy.info == eager.info
    assert all(torch.equal(lazy.pooler_state[k], eager.pooler_state[k]) for k in ("weight", "bias"))
    lazy.requires_grad_(False)
    lazy.eval()
    lazy.to(torch.float64)
    ids = torch.tensor([[101, 2307, 3185, 102]])
    out = lazy(ids, torch.ones_like(ids))  # the first use loads the weights
    assert lazy.loaded and not lazy.model.training
    assert all(not p.requires_grad and p.dtype == torch.float64 for p in lazy.model.parameters())
    assert torch.allclose(out.float(), eager(ids, torch.ones_like(ids)), atol=1e-5)
    assert encoder_module.encoder_hash(Encoder.load(tiny_bert, lazy=True)) == encoder_module.encoder_hash(eager)


def test_a_changed_checkpoint_is_hashed_again(tiny_bert, tmp_path):
    root = tmp_path / "memo"
    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_bert, copy)
    first = encoder_refs.checkpoint_hash(Encoder.load(str(copy)), copy, root)
    encoder = Encoder.load(str(copy))
    with __import__("torch").no_grad():
        next(encoder.model.parameters()).add_(1.0)
    encoder.model.save_pretrained(str(copy))
    assert encoder_refs.checkpoint_hash(Encoder.load(str(copy)), copy, root) != first


# -- head-only models ----------------------------------------------------------------------------
def test_head_only_models_load_combine_and_move(tiny_bert, data, tmp_path, write):
    train, dev = data
    cache = str(tmp_path / "cache")
    settings = bertheads.TrainSettings(epochs=1, batch_size=8, progress=False)
    a, b = tmp_path / "a", tmp_path / "b"
    bertheads.train("classify", train, dev, a, model=tiny_bert, settings=settings, mode="features", cache_dir=cache,
                    label_names=["negative", "positive"])
    topic = write("topic.tsv", "sentence\tlabel\n" + "".join(f"soup and bread {i}\tfood\nthe vote {i}\tpolitics\n"
                                                               for i in range(6)))
    bertheads.train("classify", topic, None, b, model=tiny_bert, settings=settings, mode="features", cache_dir=cache)
    for directory in (a, b):
        assert not (directory / "encoder").exists()
        ref = bundle.read_manifest(directory)["encoder"]
        assert ref["path"] == str(Path(tiny_bert).resolve()) and ref["source"] == tiny_bert
    texts = ["a good fun film", "the vote on soup"]
    alone = bertheads.load(a).predict(texts)
    combined = bertheads.combine([a, b], tmp_path / "ab", names=["sentiment", "topic"])
    assert not (tmp_path / "ab" / "encoder").exists()
    both = combined.analyze(texts)
    assert [x["sentiment"]["label"] for x in both] == [p["label"] for p in alone]
    assert {x["topic"]["label"] for x in both} <= {"food", "politics"}

    # moved to a machine without the checkpoint at its path: a copy in DIR/encoder is used, hash checked
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "ab", moved)
    manifest = json.loads((moved / "bertheads.json").read_text())
    manifest["encoder"]["path"] = manifest["encoder"]["source"] = str(tmp_path / "gone")
    (moved / "bertheads.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="is not on this machine; copy that checkpoint to"):
        bertheads.load(moved)
    shutil.copytree(tiny_bert, moved / "encoder")
    assert bertheads.load(moved).analyze(texts) == both
    other = Encoder.load(tiny_bert)
    with __import__("torch").no_grad():
        next(other.model.parameters()).mul_(2.0)
    other.model.save_pretrained(str(moved / "encoder"))
    with pytest.raises(UserError, match="is not the one its heads were trained on"):
        bertheads.load(moved)


def test_limit_stops_reading_the_training_file(tiny_bert, data, tmp_path, write):
    train, dev = data
    rows = Path(train).read_text()
    bad = write("bad_tail.tsv", rows + "a line with no label column\n")  # past the first 16 examples
    assert train_cli(tiny_bert, bad, dev, tmp_path / "all") == 2
    assert train_cli(tiny_bert, bad, dev, tmp_path / "first", "--limit", "16") == 0
    assert bundle.read_manifest(tmp_path / "first")["heads"]["classify"]["spec"]["labels"] == [0, 1]
