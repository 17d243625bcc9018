"""Loading checkpoints: the embedded default, other BERT-family directories, clear errors."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bertheads
from bertheads.encoder import Encoder, default_model_path, resolve_model
from bertheads.errors import UserError


def test_default_is_the_embedded_minilm():
    path = resolve_model("default")
    assert path == default_model_path() and Path(path, "model.safetensors").is_file()
    enc = Encoder.load("default")
    assert (enc.info.hidden_size, enc.info.num_layers, enc.info.uses_token_types) == (384, 6, True)
    assert enc.pooler_state is not None and enc.pooler_state["weight"].shape == (384, 384)
    ids = enc.tokenizer("Hello there", return_tensors="pt")
    with torch.no_grad():
        out = enc(ids["input_ids"], ids["attention_mask"], ids["token_type_ids"])
    assert out.shape == (1, 4, 384)
    layers = enc(ids["input_ids"], ids["attention_mask"], layers=(0, -1))
    assert len(layers) == 2 and torch.allclose(layers[1], out, atol=1e-5)


def test_pooler_weights_are_reused_by_the_classify_head():
    from bertheads.tasks.classify import ClassifySpec, ClassifyTask

    enc = Encoder.load("default")
    task = ClassifyTask.build(ClassifySpec(labels=[0, 1]), enc, enc.pooler_state)
    assert torch.equal(task.head.pooler.weight, enc.pooler_state["weight"])


@pytest.mark.parametrize("kind", ["roberta", "distilbert", "electra"])
def test_other_bert_family_directories_train_and_predict(kind, tmp_path, default_model_dir, write):
    from transformers import AutoTokenizer, DistilBertConfig, ElectraConfig, RobertaConfig

    small = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    config = {
        "roberta": RobertaConfig(**small, type_vocab_size=1, pad_token_id=0),
        "distilbert": DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64),
        "electra": ElectraConfig(**small, embedding_size=16),
    }[kind]
    from transformers import AutoModel

    d = tmp_path / kind
    AutoModel.from_config(config).save_pretrained(d)
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(d)
    enc = Encoder.load(str(d))
    assert enc.info.uses_token_types == (kind == "electra")
    train = write("t.tsv", "sentence1\tsentence2\tlabel\n" + "a\tb\t1\nc\td\t0\n" * 4)
    model = bertheads.train("classify", train, None, tmp_path / "m", model=str(d),
                            settings=bertheads.TrainSettings(epochs=1, batch_size=4, progress=False))
    assert model.net.encoder.model.config.model_type == kind
    assert len(model.predict([("a", "b")])) == 1


@pytest.mark.parametrize("name,needle", [
    ("/definitely/not/here", "no such directory"),
    ("./relative/missing", "no such directory"),
])
def test_missing_paths(name, needle):
    with pytest.raises(UserError, match=needle):
        resolve_model(name)


def test_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert", "hidden_size": 32}')
    with pytest.raises(UserError, match="cannot load"):
        Encoder.load(str(tmp_path))


def test_torchrun_two_processes(tiny_bert, tmp_path):
    """The same command runs under torchrun: two processes share the batches, one saves."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python")
    data = tmp_path / "t.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"good {i}\t1\nbad {i}\t0\n" for i in range(16)))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [torchrun, "--nproc_per_node", "2", "--master_port", "29531", "-m", "bertheads.cli", "train", "classify",
         "--train", str(data), "--dev", str(data), "--out", str(tmp_path / "m"), "--model", tiny_bert,
         "--epochs", "1", "--batch-size", "4", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = (tmp_path / "m" / "metrics.json").read_text()
    assert '"accuracy"' in metrics
    assert proc.stdout.count("epoch 1:") == 1  # only the main process evaluates and saves
    assert proc.stdout.count("saved") == 2  # both processes finished the command
