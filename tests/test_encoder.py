"""Loading checkpoints: the embedded default, other BERT-family directories, clear errors."""

from pathlib import Path

import pytest
import torch

import bertheads
from bertheads.base.errors import UserError
from bertheads.encoder.pretrained import Encoder, default_model_path, resolve_model


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
    from bertheads.tasks.classify.spec import ClassifySpec
    from bertheads.tasks.classify.task import ClassifyTask

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


FEATURES_UNDER_TORCHRUN = """
import os, sys, torch, bertheads
train, model_dir, cache, out = sys.argv[1:5]
m = bertheads.train("classify", train, None, None, model=model_dir, mode="features", cache_dir=cache,
                    settings=bertheads.TrainSettings(epochs=2, batch_size=4, lr=1e-2, progress=False))
heads = {k: v.detach().clone() for k, v in m.net.heads.state_dict().items()}
world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
torch.save({"heads": heads, "world": world}, os.path.join(out, f"heads-{os.environ['RANK']}.pt"))
"""


@pytest.mark.slow  # runs extra processes (two ranks)
def test_torchrun_features_mode_averages_head_gradients(tiny_bert, tmp_path):
    """Features mode under two processes (as torchrun starts them, forked from one process that
    imported everything: tests/forkserver.py `ranks`): each sees half the batches, and the heads
    stay the same on both (their gradients are averaged), as in fine-tuning."""
    from forkserver import ForkServer

    data = tmp_path / "t.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"good {i}\t1\nbad {i} bad\t0\n" for i in range(16)))
    forks = ForkServer(tmp_path / "forks")
    try:
        proc = forks.ranks([str(data), tiny_bert, str(tmp_path / "cache"), str(tmp_path)],
                           script=FEATURES_UNDER_TORCHRUN)
    finally:
        forks.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = [torch.load(tmp_path / f"heads-{r}.pt") for r in (0, 1)]
    assert [s["world"] for s in saved] == [2, 2]  # the processes did form one group
    first, second = (s["heads"] for s in saved)
    start = bertheads.train("classify", str(data), None, None, model=tiny_bert, mode="features",
                            cache_dir=str(tmp_path / "cache"),
                            settings=bertheads.TrainSettings(epochs=0, progress=False)).net.heads.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(not torch.allclose(first[k], start[k]) for k in first)  # and they did learn


@pytest.mark.parametrize("kind", ["bert", "roberta", "electra", "distilbert"])
def test_first_token_only_last_layer_matches_the_full_pass(kind, tmp_path, default_model_dir):
    """A [CLS] head's fast path (last layer for position 0 alone) gives the full pass's [CLS]
    vector, padding included (the other families: tests/test_families.py)."""
    from transformers import (
        AutoModel,
        AutoTokenizer,
        BertConfig,
        DistilBertConfig,
        ElectraConfig,
        RobertaConfig,
    )

    small = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    config = {"bert": BertConfig(**small), "roberta": RobertaConfig(**small, type_vocab_size=1, pad_token_id=0),
              "electra": ElectraConfig(**small, embedding_size=16),
              "distilbert": DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64)}[kind]
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(tmp_path)
    enc = Encoder.load(str(tmp_path)).eval()
    assert enc.first_token_ready  # DistilBERT's blocks have their own first-token forward
    ids = enc.tokenizer(["a short one", "a rather longer sentence with padding for the other"],
                        padding=True, return_tensors="pt")
    with torch.no_grad():
        full = enc(ids["input_ids"], ids["attention_mask"], ids.get("token_type_ids"))
        first = enc(ids["input_ids"], ids["attention_mask"], ids.get("token_type_ids"), first_token_only=True)
        again = enc(ids["input_ids"], ids["attention_mask"], ids.get("token_type_ids"))
    assert torch.allclose(first[:, 0], full[:, 0], atol=1e-5)
    assert first.shape[1] == (1 if enc.first_token_ready else full.shape[1])
    assert torch.equal(again, full)  # the flag does not leak into the next call
    enc.train()  # gradients flow through the fast path (fine-tuning uses it)
    out = enc(ids["input_ids"], ids["attention_mask"], ids.get("token_type_ids"), first_token_only=True)
    out[:, 0].sum().backward()
    assert all(p.grad is not None for n, p in enc.named_parameters() if "embeddings" in n and "word" in n)


def test_classify_heads_use_the_first_token_path(tiny_bert, tmp_path, write):
    """BertHeads asks for the fast path only when every head reads [CLS] of the last layer."""
    import bertheads.encoder.first_token as encoder_module

    calls = []
    real = encoder_module.first_token_layer
    encoder_module.first_token_layer = lambda *a: calls.append(1) or real(*a)
    try:
        train = write("t.tsv", "sentence\tlabel\n" + "good film\t1\nbad film\t0\n" * 4)
        model = bertheads.train("classify", train, None, tmp_path / "m", model=tiny_bert,
                                settings=bertheads.TrainSettings(epochs=1, batch_size=4, progress=False))
        trained = len(calls)
        model.predict(["good film", "bad"])
    finally:
        encoder_module.first_token_layer = real
    assert trained == 2 and len(calls) == 3  # two training batches, one prediction batch
