"""What makes a CPU training step cheaper without changing what it computes: dropout masks from
a quarter of the random draws, on the hidden states and on the attention weights."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertheads.encoder.dropout import (
    MaskedAttentionDropout,
    MaskedDropout,
    attention,
    dropout,
    install_masked_dropout,
    keep_mask,
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_mask_keeps_one_minus_p_with_values_zero_and_one(dtype):
    torch.manual_seed(0)
    mask = keep_mask(torch.Size((400, 1000)), 0.1, dtype)
    assert mask.dtype == dtype and mask.shape == (400, 1000)
    assert set(mask.float().unique().tolist()) == {0.0, 1.0}
    assert abs(mask.float().mean().item() - 0.9) < 0.003  # 400,000 draws: the spread is 0.0005
    rows = mask.float().mean(dim=1)  # no lane of a 64-bit draw is stuck (every column keeps about 0.9)
    assert abs(mask.float().mean(dim=0) - 0.9).max() < 0.1 and abs(rows - 0.9).max() < 0.05
    assert abs(keep_mask(torch.Size((200_000,)), 0.5, dtype).float().mean().item() - 0.5) < 0.006


def test_dropout_scales_what_it_keeps_and_its_gradient_is_the_same_mask():
    x = torch.randn(64, 48, dtype=torch.bfloat16, requires_grad=True)
    torch.manual_seed(1)
    y = dropout(x, 0.2, True)
    kept = y != 0
    assert 0.7 < kept.float().mean().item() < 0.9
    assert torch.equal(y[kept], (x[kept].float() / 0.8).to(torch.bfloat16))
    y.float().sum().backward()
    assert torch.equal(x.grad != 0, kept) and torch.allclose(x.grad[kept].float(), torch.full_like(x.grad[kept].float(), 1 / 0.8), rtol=1e-2)
    torch.manual_seed(1)
    assert torch.equal(dropout(x, 0.2, True), y)  # the same generator: a seeded run repeats
    assert torch.equal(dropout(x, 0.2, False), x) and torch.equal(dropout(x, 0.0, True), x)


def test_the_encoder_trains_with_the_cheap_masks_and_its_weights_are_unchanged():
    layers = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Sequential(nn.Dropout(0.3), nn.ReLU()))
    before = {k: v.clone() for k, v in layers.state_dict().items()}
    layers[2].eval()
    assert install_masked_dropout(layers) == 2
    assert isinstance(layers[1], MaskedDropout) and layers[2][0].p == 0.3
    assert layers[1].training and not layers[2][0].training  # each keeps its mode (a loaded model is in eval)
    assert all(torch.equal(v, before[k]) for k, v in layers.state_dict().items())
    layers.eval()
    x = torch.randn(3, 4)
    assert torch.equal(layers(x), torch.relu(layers[0](x)))


def test_the_tiny_encoder_uses_the_cheap_masks(tiny_bert):
    from bertheads.encoder.pretrained import Encoder

    encoder = Encoder.load(tiny_bert)
    dropouts = [m for m in encoder.model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(type(m) is MaskedDropout for m in dropouts)


def test_attention_written_out_matches_torchs_and_drops_weights_in_training():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    keep[0, :, :, 3:] = False  # the first input's last two tokens are padding
    additive = torch.zeros(2, 1, 1, 5).masked_fill(~keep, float("-inf"))
    for mask in (None, keep, additive):
        assert torch.allclose(attention(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                              atol=1e-5)
    with MaskedAttentionDropout():
        same = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # no dropout: torch's own call
        torch.manual_seed(3)
        dropped = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=0.5)
    assert torch.equal(same, F.scaled_dot_product_attention(q, k, v, attn_mask=keep))
    torch.manual_seed(3)
    assert torch.equal(dropped, attention(q, k, v, keep, 0.5))  # the written-out attention with the cheap mask
    assert not torch.allclose(dropped, same, atol=1e-3)


def test_a_training_pass_of_the_encoder_takes_the_written_out_attention(tiny_bert, monkeypatch):
    from bertheads.encoder import dropout as module
    from bertheads.encoder.pretrained import Encoder

    calls = []
    def counted(q, k, v, mask, p, scale):
        calls.append(p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale)

    monkeypatch.setattr(module, "attention", counted)
    encoder = Encoder.load(tiny_bert)
    ids = encoder.tokenizer(["a fine film", "dull"], padding=True, return_tensors="pt")
    encoder.eval()
    with torch.no_grad():
        encoder(ids["input_ids"], ids["attention_mask"])
    assert calls == []  # inference: torch's attention
    encoder.train()
    encoder(ids["input_ids"], ids["attention_mask"]).sum().backward()
    assert calls and set(calls) == {encoder.config.attention_probs_dropout_prob}
