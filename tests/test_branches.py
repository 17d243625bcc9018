"""Branches (`--tune-layers N`): a head's own copy of the encoder's top N layers on the frozen,
shared trunk below them; heads added to a model leave the others' predictions as they were; the
ONNX export holds the trunk once and each head's branch, and the gate checks every head."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers_multi import EncoderCalls, build_task, save_heads

import bertheads
from bertheads.cli.main import main
from bertheads.compute.runner import run_heads
from bertheads.encoder.branches import Branch, lower_part
from bertheads.encoder.pretrained import Encoder, encoder_hash
from bertheads.export.hf import export_hf
from bertheads.model import BertHeads, attach_branch
from bertheads.saved import bundle
from bertheads.training.joint import settle_branch

SENTIMENT = "sentence\tlabel\n" + "".join(f"a good fun film number {i}\t1\nan awful dull bore {i} times over\t0\n"
                                          for i in range(8))
TOPIC = "sentence\tlabel\n" + "".join(f"the match and the goal {i}\tsport\nthe vote in the house {i}\tpolitics\n"
                                      for i in range(8))
TEXTS = ["a good film", "the vote was close", "an awful bore of a match"]


def tiny_configs():
    from transformers import (
        BertConfig,
        DebertaV2Config,
        DistilBertConfig,
        ElectraConfig,
        ModernBertConfig,
        RobertaConfig,
    )

    size = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 32}
    return {"bert": BertConfig(**size), "roberta": RobertaConfig(**size),
            "electra": ElectraConfig(**size, embedding_size=8),
            "deberta-v2": DebertaV2Config(**size, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                          position_biased_input=False),
            "distilbert": DistilBertConfig(vocab_size=64, dim=16, n_layers=2, n_heads=2, hidden_dim=32),
            "modernbert": ModernBertConfig(**size, global_attn_every_n_layers=2, local_attention=4, pad_token_id=0,
                                           bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)}


def test_a_branch_computes_the_top_layers_of_every_family():
    """The trunk's lower part up to layer k, then a branch of the checkpoint's layers k..L-1,
    gives the whole encoder's last layer, for every split and family (positions the mask keeps)."""
    from transformers import AutoModel

    torch.manual_seed(0)
    ids = torch.randint(3, 64, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    for family, config in tiny_configs().items():
        model = AutoModel.from_config(config).eval()
        with torch.no_grad():
            whole = model(input_ids=ids, attention_mask=mask).last_hidden_state
            for split in range(2):
                states = lower_part(model, max(split, 1))(input_ids=ids, attention_mask=mask,
                                                          output_hidden_states=True).hidden_states[split]
                branch = Branch(config, split).start_from(model).eval()
                got = branch(states, {"attention_mask": mask})
                assert torch.allclose(got[mask.bool()], whole[mask.bool()], atol=1e-5), (family, split)
        assert len(model.get_submodule("layers" if family == "modernbert" else
                                       "transformer.layer" if family == "distilbert" else "encoder.layer")) == 2


@pytest.mark.parametrize("kind,spec", [("classify", {"labels": ["neg", "pos"]}),
                                       ("tag", {"tags": ["O", "B-LOC", "I-LOC"]})])
def test_all_layers_tuned_is_fine_tuning_and_none_is_features_mode(tiny_bert, kind, spec):
    """At the start, a head that tunes every layer gives what the fine-tuned head gives; one that
    tunes none reads the last layer, as a features-mode head does."""
    encoder = Encoder.load(tiny_bert)
    count = encoder.info.num_layers
    plain = build_task(encoder, kind, 1, spec)
    tasks = {"plain": plain}
    for name, tuning in (("tuned", count), ("none", 0)):
        given = bundle.task_class(kind).spec_type(**spec, tune_layers=tuning)
        settle_branch(given, count)  # (as `make_spec` does before the head is built)
        task = build_task(encoder, kind, 1, vars(given))
        tasks[name] = task
        attach_branch(task.head, task.spec, encoder, fresh=True)
    assert tasks["tuned"].spec.layers == [0] and tasks["tuned"].spec.mode == "features"
    assert tasks["none"].spec.layers == [count] and not hasattr(tasks["none"].head, "branch")
    net = BertHeads(encoder, tasks).eval()
    features = encoder.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = net(dict(features), ["plain", "tuned", "none"])
    assert torch.allclose(out["tuned"], out["plain"], atol=1e-5)
    assert torch.equal(out["none"], out["plain"])


def test_branch_heads_train_alone_and_are_added_without_changing_the_others(tiny_bert, write, tmp_path):
    """Training changes the branch, not the trunk (saved as a reference); a head added `--into` a
    model, or retrained there, leaves the other heads' predictions byte for byte; one pass of the
    trunk serves every head; a fine-tuned model takes no head."""
    checkpoint = encoder_hash(Encoder.load(tiny_bert))
    quick = bertheads.TrainSettings(epochs=1, batch_size=8, progress=False)
    a = bertheads.train("classify", write("a.tsv", SENTIMENT), None, tmp_path / "a", model=tiny_bert,
                        settings=quick, tune_layers=1)
    start = Encoder.load(tiny_bert).model.encoder.layer[1].state_dict()
    trained = a.net.heads["classify"].branch.model.encoder.layer[0].state_dict()
    assert not all(torch.equal(v, start[k]) for k, v in trained.items())
    assert encoder_hash(a.net.encoder) == checkpoint and not (tmp_path / "a" / "encoder").exists()
    before = a.predict(TEXTS)
    topic_rows = write("t.tsv", TOPIC)
    assert main(["train", "classify", "--train", topic_rows, "--head-name", "topic", "--tune-layers", "2", "--into",
                 str(tmp_path / "a"), "--out", str(tmp_path / "ab"), "--epochs", "1", "--no-progress"]) == 0
    ab = bertheads.load(tmp_path / "ab")
    assert sorted(ab.heads) == ["classify", "topic"] and ab.predict(TEXTS, head="classify") == before
    assert bundle.read_manifest(tmp_path / "ab")["encoder_hash"] == checkpoint
    calls = EncoderCalls(ab.net)
    rows = ab.analyze(TEXTS)
    assert calls.count == 1 and [r["classify"] for r in rows] == before
    topic = ab.predict(TEXTS, head="topic")
    exported = export_hf(tmp_path / "ab", tmp_path / "hf", head="topic")  # the checkpoint with its own layers on top
    assert exported["class"] == "BertForSequenceClassification" and exported["max_abs_diff"] <= 1e-4
    config = write("add.yaml", f"tasks:\n  topic: {{kind: classify, train: {topic_rows}, tune_layers: 2}}\n")
    bertheads.train_multi(config, tmp_path / "abb", into=tmp_path / "ab", settings=quick, seed=7, tune_layers=1)
    abb = bertheads.load(tmp_path / "abb")  # the topic head retrained, with another split
    assert abb.predict(TEXTS, head="classify") == before and abb.predict(TEXTS, head="topic") != topic
    assert abb.net.heads["topic"].branch.split == 0  # (the task's own tune_layers: 2 wins over the keyword)
    tuned = save_heads(tiny_bert, tmp_path / "tuned", {"s": ("classify", 1, {"labels": ["0", "1"]})})  # (its own encoder)
    with pytest.raises(bertheads.UserError, match="tune_layers"):
        bertheads.train_multi(config, tmp_path / "x", into=tuned, settings=quick)



@pytest.mark.nightly  # an export of its own (~7 s); test_export's model has branches, so the fast suite checks
# the graph (the trunk once), ONNX Runtime's outputs and int8 of branch heads there
def test_export_with_branches_gates_every_head_and_openvino_agrees(tiny_bert, write, tmp_path):
    """`export --to onnx --quantize int8` of a model with a head on the trunk's last layer and
    branches split at layers 1 and 0: the gate's verdict on each graph (ONNX Runtime int8, the
    OpenVINO QDQ graph) has every head, and OpenVINO's IR gives torch's outputs for each."""
    heads = {"whole": ("classify", 1, {"labels": [0, 1], "mode": "features"}),
             "top1": ("classify", 2, {"labels": [0, 1], "tune_layers": 1}),
             "top2": ("classify", 3, {"labels": [0, 1], "tune_layers": 2})}
    model = save_heads(tiny_bert, tmp_path / "model", heads)
    dev = write("dev.tsv", "sentence\tlabel\n" + "".join(f"a good film {i}\t1\nan awful bore {i}\t0\n"
                                                         for i in range(100)))
    assert main(["export", str(model), "--to", "onnx", "--quantize", "int8", "--gate-data", dev, "-q"]) == 0
    meta = json.loads((model / "onnx" / "export.json").read_text())
    assert meta["graphs"]["fp32"]["fusions"]["ops"]["Attention"] == 2 + 1 + 2  # the trunk once, each branch
    assert meta["graphs"]["openvino"]["max_abs_diff_vs_torch"] < 1e-4
    verdicts = json.loads((model / "gate.json").read_text())["machines"]
    checked = {mode: set(record["heads"]) for records in verdicts.values() for mode, record in records.items()}
    assert checked == {"onnx/int8": set(heads), "openvino/int8": set(heads)}
    ours, theirs = bertheads.load(model), bertheads.load(model, runtime="openvino", precision="fp32")
    examples = ours.task("whole").reading.from_inputs(TEXTS + ["a vote on the film " * 9])
    features, _ = ours.task("whole").modeling.encode_for_inference(examples, ours.net.encoder.tokenizer)
    want, got = run_heads(ours.net, features, list(heads)), run_heads(theirs.net, features, list(heads))
    for name in heads:
        np.testing.assert_allclose(np.stack(got[name]), np.stack(want[name]), atol=1e-4, rtol=0, err_msg=name)
    assert np.abs(np.stack(want["top1"]) - np.stack(want["whole"])).max() > 1e-3  # (the branch is its own)
