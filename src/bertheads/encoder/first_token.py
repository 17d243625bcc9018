"""The `[CLS]`-only last layer: when every head reads the first token of the last layer alone,
that layer computes the first token's query against every key and value instead of the whole
sequence, per checkpoint family (BERT's layout, DistilBERT's, DeBERTa-v2/v3's relative
positions); other families keep the full pass.
"""

from __future__ import annotations

import functools
import threading

import torch
import torch.nn.functional as F
from torch import nn


def install_first_token_layer(model: nn.Module, flag: threading.local) -> bool:
    """Let the last layer of the encoder run for the first token only while `flag.on` is set
    (per thread, so a server's concurrent requests do not mix).

    The layer's forward is wrapped on the instance: weights, state dict and saved checkpoints
    are unchanged. Layers built like BERT's (BERT, RoBERTa, XLM-R, ELECTRA, MiniLM) and
    DistilBERT's and DeBERTa-v2/v3's get it; the others keep the full pass: ModernBERT (pre-norm
    layers with a fused query/key/value projection, rotary positions and local attention on
    most layers, and a classify head that may mean-pool every token), and any architecture not
    listed.
    """
    found = first_token_target(model)
    if found is None:
        return False
    layer, fast = found
    full_forward = layer.forward

    @functools.wraps(full_forward)
    def forward(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, *args, **kwargs):
        if not getattr(flag, "on", False):
            return full_forward(hidden_states, attention_mask, *args, **kwargs)
        if fast == "deberta":
            return deberta_first_token_layer(layer, hidden_states, attention_mask, kwargs.get("relative_pos"),
                                             kwargs.get("rel_embeddings"))
        if fast == "distilbert":
            return distilbert_first_token_layer(layer, hidden_states, attention_mask)
        return first_token_layer(layer, hidden_states, attention_mask)

    layer.forward = forward
    return True


def first_token_target(model: nn.Module):
    """(last layer, which first-token forward: "bert", "distilbert" or "deberta") for the
    architectures that have one, else None."""
    config = model.config
    if getattr(config, "is_decoder", False):
        return None
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if isinstance(layers, nn.ModuleList) and len(layers):  # BERT-style
        layer = layers[-1]
        attention = getattr(layer, "attention", None)
        self_attention = getattr(attention, "self", None)
        if (all(isinstance(getattr(self_attention, n, None), nn.Linear) for n in ("query", "key", "value"))
                and hasattr(attention, "output") and hasattr(layer, "feed_forward_chunk")
                and hasattr(self_attention, "attention_head_size")
                and getattr(config, "position_embedding_type", "absolute") == "absolute"):
            return layer, "bert"
        if (config.model_type == "deberta-v2" and hasattr(self_attention, "query_proj")
                and hasattr(self_attention, "disentangled_attention_bias")
                and (len(layers) > 1 or getattr(model.encoder, "conv", None) is None)):
            return layer, "deberta"
        return None
    layers = getattr(getattr(model, "transformer", None), "layer", None)
    if config.model_type == "distilbert" and isinstance(layers, nn.ModuleList) and len(layers):
        layer = layers[-1]
        attention = getattr(layer, "attention", None)
        if all(isinstance(getattr(attention, n, None), nn.Linear) for n in ("q_lin", "k_lin", "v_lin", "out_lin")) \
                and hasattr(layer, "sa_layer_norm") and hasattr(layer, "output_layer_norm"):
            return layer, "distilbert"
    return None


def first_token_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The attention mask of the first query: `[batch, 1, 1, tokens]` (boolean or additive)."""
    if mask is None:
        return None
    if mask.dim() == 2:  # [batch, tokens] of 0/1
        return mask[:, None, None, :].bool()
    return mask[:, :, :1, :]  # [batch, 1, queries, tokens]


def first_token_attention(hidden: torch.Tensor, mask, query: nn.Linear, key: nn.Linear, value: nn.Linear,
                          heads: int, dropout: float) -> torch.Tensor:
    """Scaled dot-product attention of position 0 over every position: `[batch, 1, hidden]`."""
    batch, length, _ = hidden.shape
    size = query.out_features // heads
    q = query(hidden[:, :1]).view(batch, 1, heads, size).transpose(1, 2)
    k = key(hidden).view(batch, length, heads, size).transpose(1, 2)
    v = value(hidden).view(batch, length, heads, size).transpose(1, 2)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=first_token_mask(mask), dropout_p=dropout,
                                             scale=size**-0.5)
    return context.transpose(1, 2).reshape(batch, 1, heads * size)


def first_token_layer(layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A BERT layer computed for position 0 only: `[batch, 1, hidden]`."""
    attention = layer.attention.self
    context = first_token_attention(hidden, mask, attention.query, attention.key, attention.value,
                                    attention.num_attention_heads,
                                    attention.dropout.p if layer.training else 0.0)
    return layer.feed_forward_chunk(layer.attention.output(context, hidden[:, :1]))


def distilbert_first_token_layer(layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A DistilBERT block computed for position 0 only: `[batch, 1, hidden]`."""
    attention = layer.attention
    context = first_token_attention(hidden, mask, attention.q_lin, attention.k_lin, attention.v_lin,
                                    attention.n_heads, attention.dropout.p if layer.training else 0.0)
    attended = layer.sa_layer_norm(attention.out_lin(context) + hidden[:, :1])
    return layer.output_layer_norm(layer.ffn(attended) + attended)


def deberta_first_token_layer(layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None,
                              relative_pos: torch.Tensor | None = None,
                              rel_embeddings: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
    """A DeBERTa-v2/v3 layer computed for position 0 only: its content and relative-position
    scores (content-to-position and position-to-content) for that one query."""
    att = layer.attention.self
    heads = att.num_attention_heads
    batch, length, _ = hidden.shape
    first = hidden[:, :1]
    query = att.transpose_for_scores(att.query_proj(first), heads)  # [batch * heads, 1, size]
    key = att.transpose_for_scores(att.key_proj(hidden), heads)
    value = att.transpose_for_scores(att.value_proj(hidden), heads)
    factor = 1 + ("c2p" in att.pos_att_type) + ("p2c" in att.pos_att_type)
    scale = torch.sqrt(torch.tensor(query.size(-1), dtype=torch.float) * factor)
    scores = torch.bmm(query, key.transpose(-1, -2) / scale.to(dtype=query.dtype))
    if att.relative_attention:
        scores = scores + deberta_first_token_bias(att, query, key, relative_pos, rel_embeddings, scale)
    scores = scores.view(-1, heads, 1, length)
    if mask is not None:
        keep = mask[:, None, None, :] if mask.dim() == 2 else mask[:, :, :1, :]
        scores = scores.masked_fill(~keep.bool(), torch.finfo(query.dtype).min)
    probs = att.dropout(F.softmax(scores, dim=-1))
    context = torch.bmm(probs.view(-1, 1, length), value).view(batch, heads, 1, -1)
    context = context.permute(0, 2, 1, 3).reshape(batch, 1, -1)
    attended = layer.attention.output(context, first)
    return layer.output(layer.intermediate(attended), attended), None


def deberta_first_token_bias(att: nn.Module, query: torch.Tensor, key: torch.Tensor, relative_pos: torch.Tensor,
                             rel_embeddings: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """DeBERTa's relative-position scores of query 0 over every key: `[batch * heads, 1, tokens]`
    (its `disentangled_attention_bias`, for the first row)."""
    heads, length = att.num_attention_heads, key.size(-2)
    span = att.pos_ebd_size
    positions = relative_pos.reshape(-1, length, length)[0].to(device=query.device, dtype=torch.long)
    rel = att.pos_dropout(rel_embeddings)[0: span * 2, :].unsqueeze(0)
    repeat = query.size(0) // heads
    if att.share_att_key:
        pos_query = att.transpose_for_scores(att.query_proj(rel), heads).repeat(repeat, 1, 1)
        pos_key = att.transpose_for_scores(att.key_proj(rel), heads).repeat(repeat, 1, 1)
    else:
        pos_key = att.transpose_for_scores(att.pos_key_proj(rel), heads).repeat(repeat, 1, 1) \
            if "c2p" in att.pos_att_type else None
        pos_query = att.transpose_for_scores(att.pos_query_proj(rel), heads).repeat(repeat, 1, 1) \
            if "p2c" in att.pos_att_type else None
    score = torch.zeros(query.size(0), 1, length, dtype=query.dtype, device=query.device)
    if "c2p" in att.pos_att_type:  # content of query 0 to the position of each key
        c2p = torch.bmm(query, pos_key.transpose(-1, -2))
        index = torch.clamp(positions[:1] + span, 0, span * 2 - 1).expand(query.size(0), 1, length)
        score = score + torch.gather(c2p, -1, index) / scale.to(dtype=c2p.dtype)
    if "p2c" in att.pos_att_type:  # content of each key to the position of query 0
        p2c = torch.bmm(key, pos_query.transpose(-1, -2))
        index = torch.clamp(-positions[:, :1] + span, 0, span * 2 - 1).expand(query.size(0), length, 1)
        score = score + torch.gather(p2c, -1, index).transpose(-1, -2) / scale.to(dtype=p2c.dtype)
    return score
