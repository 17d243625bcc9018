"""Packing by each tokenizer's own rules: its pair template (RoBERTa and XLM-R: `<s> A </s></s> B
</s>`), segment ids only for models that have them, the model's real length limit (the position
table less the family's offset, the tokenizer's own limit) and special tokens found by role,
never by name."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from families_matrix import FAMILIES, tiny_checkpoint, train_tokenizer

from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.encoder.pretrained import Encoder, max_tokens, position_limit
from bertheads.tasks.qa.spans import shared_window_loss
from bertheads.tasks.tag.head import special_layout
from bertheads.text.encoding import encode_texts, encode_windows
from bertheads.training.flags import kind_defaults, task_class
from bertheads.training.joint import make_spec

SRC = Path(__file__).resolve().parents[1] / "src" / "bertheads"


@pytest.fixture(scope="module")
def tokenizers():
    return {family: train_tokenizer(kind, family) for family, (kind, _) in FAMILIES.items()}


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: Encoder.load(tiny_checkpoint(family, root / family)) for family in FAMILIES}


def test_pairs_take_the_tokenizers_template(tokenizers):
    for family, tok in tokenizers.items():
        (f,) = encode_texts(tok, ["good film"], ["what a bore"])
        a, b = tok.tokenize("good film"), tok.tokenize("what a bore")
        if family in ("roberta", "xlm-roberta", "mpnet"):
            want = ["<s>", *a, "</s>", "</s>", *b, "</s>"]
        else:
            want = ["[CLS]", *a, "[SEP]", *b, "[SEP]"]
        assert tok.convert_ids_to_tokens(f["input_ids"]) == want, family
        assert f["input_ids"][0] == tok.cls_token_id  # the position classify heads read
        assert special_layout(tok) == (1, 1)
        windows, owner = encode_windows(tok, ["good film"], [" ".join(["what a bore"] * 20)], max_length=24, stride=4)
        assert len(windows) > 1 and owner == [0] * len(windows)
        for w in windows:
            tokens = tok.convert_ids_to_tokens(w["input_ids"])
            assert len(tokens) <= 24 and tokens[: len(a) + 2] == want[: len(a) + 2] and tokens[-1] == want[-1]


def test_segment_ids_reach_only_models_that_have_them(encoders):
    """RoBERTa and XLM-R (one segment), DeBERTa-v3, DistilBERT, ModernBERT and MPNet (none) never see
    segment ids, so a pair's ones neither index out of range nor change anything."""
    with_types = {family for family, e in encoders.items() if e.info.uses_token_types}
    assert with_types == {"bert", "electra"}
    for family, encoder in encoders.items():
        encoder.eval()
        (f,) = encode_texts(encoder.tokenizer, ["good film"], ["what a bore"])
        ids = torch.tensor([f["input_ids"]])
        mask = torch.ones_like(ids)
        with torch.no_grad():
            zeros = encoder(ids, mask, torch.zeros_like(ids))
            ones = encoder(ids, mask, torch.ones_like(ids))
        assert torch.equal(zeros, ones) == (family not in with_types), family


def test_position_limits_of_each_family():
    assert position_limit(transformers.RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    assert position_limit(transformers.XLMRobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    assert position_limit(transformers.MPNetConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    assert position_limit(transformers.BertConfig()) == 512
    assert position_limit(transformers.ElectraConfig()) == 512
    assert position_limit(transformers.DistilBertConfig()) == 512
    assert position_limit(transformers.ModernBertConfig(max_position_embeddings=8192)) == 8192
    v3 = transformers.DebertaV2Config(relative_attention=True, position_biased_input=False)
    assert position_limit(v3) is None  # relative positions only
    assert position_limit(transformers.DebertaV2Config(position_biased_input=True)) == 512

    class Tok:
        model_max_length = int(1e30)  # transformers' "no limit"

    assert max_tokens(v3, Tok()) is None
    assert max_tokens(transformers.RobertaConfig(max_position_embeddings=514, pad_token_id=1), Tok()) == 512
    Tok.model_max_length = 256
    assert max_tokens(v3, Tok()) == 256 and max_tokens(transformers.BertConfig(), Tok()) == 256


def test_tiny_checkpoints_limits(encoders):
    # RoBERTa, XLM-R and MPNet hold 130 position rows (pad id 1): 128 tokens, as the tokenizer says
    assert {family: e.info.max_tokens for family, e in encoders.items()} == dict.fromkeys(FAMILIES, 128)


def test_max_length_beyond_the_model_is_one_line(encoders, tmp_path, capsys, caplog):
    encoder = encoders["roberta"]
    qa = task_class("qa")
    with pytest.raises(UserError, match=r"^max_length=200: the roberta encoder reads at most 128 tokens$"):
        make_spec(qa, {**kind_defaults("qa"), "max_length": 200}, encoder)
    with caplog.at_level(logging.WARNING, logger="bertheads"):
        spec = make_spec(qa, kind_defaults("qa"), encoder)  # qa's default 384: lowered, with a warning
    assert spec.max_length == 128 and "reads at most 128 tokens; using 128" in caplog.text
    assert make_spec(task_class("classify"), kind_defaults("classify"), encoder).max_length == 128
    data = tmp_path / "t.tsv"
    data.write_text("sentence\tlabel\ngood film\t1\nbad film\t0\n")
    source = encoder.checkpoint_dir
    capsys.readouterr()  # what the lines above printed (a handler an earlier test's main left may write there)
    code = main(["train", "classify", "--model", source, "--train", str(data), "--out", str(tmp_path / "m"),
                 "--max-length", "600", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0
    assert "--max-length 600: the roberta encoder reads at most 128 tokens" in err


def test_shared_norm_finds_passages_without_segment_ids():
    """RoBERTa-style pairs have no type-1 tokens: the windows' passage ranges say where passages are."""
    x = torch.tensor([[[5.0, 5.0], [0.0, 0.0], [9.0, 9.0], [0.0, 1.0], [2.0, 3.0], [0.0, 1.0], [9.0, 9.0]],
                      [[5.0, 5.0], [0.0, 0.0], [9.0, 9.0], [1.0, 1.0], [3.0, 3.0], [1.0, 1.0], [9.0, 9.0]]])
    batch = {"token_type_ids": torch.zeros(2, 7, dtype=torch.long), "attention_mask": torch.ones(2, 7, dtype=torch.long),
             "start_positions": torch.tensor([4, 0]), "end_positions": torch.tensor([4, 0]),
             "group": torch.tensor([7, 7]), "passage": torch.tensor([[3, 5], [3, 5]])}
    starts = torch.tensor([0.0, 2.0, 0.0, 1.0, 3.0, 1.0])
    ends = torch.tensor([1.0, 3.0, 1.0, 1.0, 3.0, 1.0])
    want = ((torch.logsumexp(starts, 0) - 2.0) + (torch.logsumexp(ends, 0) - 3.0)) / 2
    assert torch.isclose(shared_window_loss(x, batch), want)
    typed = {k: v for k, v in batch.items() if k != "passage"}
    typed["token_type_ids"] = torch.tensor([[0, 0, 0, 1, 1, 1, 1]] * 2)
    assert torch.isclose(shared_window_loss(x, typed), want)


def string_literals(tree: ast.AST) -> list[str]:
    """Every string constant but docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_special_tokens_are_found_by_role_not_by_name():
    """No string in the code is a special token's name (help texts may speak of [CLS]): the code
    asks the tokenizer for `cls_token_id`, `sep_token_id`, `pad_token_id`, `unk_token`, ..."""
    names = {"[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]", "<s>", "</s>", "<pad>", "<mask>", "<unk>"}
    found = [f"{path.relative_to(SRC)}: {literal}" for path in sorted(SRC.rglob("*.py"))
             for literal in string_literals(ast.parse(path.read_text(encoding="utf-8")))
             if literal.strip() in names or any(f"{n} " in literal and "$" in literal for n in names)]
    assert found == []


def test_special_layout_of_every_family(tokenizers):
    for tok in tokenizers.values():
        enc = tok("good film", return_special_tokens_mask=True)
        assert enc["input_ids"][0] == tok.cls_token_id and enc["input_ids"][-1] == tok.sep_token_id
        assert np.flatnonzero(enc["special_tokens_mask"]).tolist() == [0, len(enc["input_ids"]) - 1]
