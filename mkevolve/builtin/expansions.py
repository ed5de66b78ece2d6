"""Traceable rewrites of the torch.nn attention layers, so the builtin decomposer sees their operations.

nn.MultiheadAttention, nn.TransformerEncoderLayer and nn.TransformerDecoderLayer hide their work behind
fast paths with data-dependent checks that torch.fx cannot trace, and F.scaled_dot_product_attention is one
opaque call. Each function here computes the same values (the layers' documented math, fp32) from the
layer's own parameters and submodules, with plain torch calls a kernel agent can write one by one:
projections, reshapes between heads, Q K^T times the scale, the mask, softmax, times V, the output
projection, and, for the transformer layers, residuals, layer norms and the feed-forward.

The tracer calls them in place of the layer's forward while it traces; the layer itself stays in the
module, so a subproblem rebuilds it by its constructor and reads its parameters.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

_ORIGINAL_SDPA = F.scaled_dot_product_attention


def attention_core(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                   scale: float | None = None, training: bool = True):
    """softmax(Q K^T * scale + mask) V over the last two dimensions, as separate operations."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:
        # Built from the scores, not from sizes: a traced size cannot make a new tensor.
        causal = torch.ones_like(scores, dtype=torch.bool).tril()
        scores = scores.masked_fill(causal.logical_not(), float("-inf"))
    if attn_mask is not None:
        scores = _apply_mask(scores, attn_mask)
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0 and training:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, v)


def _apply_mask(scores, mask):
    # A boolean mask marks the positions that take part (SDPA's convention); a float mask is added.
    if mask.dtype == torch.bool:
        return scores.masked_fill(mask.logical_not(), float("-inf"))
    return scores + mask


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if enable_gqa:
        raise NotImplementedError("scaled_dot_product_attention(enable_gqa=True) is not expanded")
    if attn_mask is not None:
        # SDPA gives 0 to a query whose keys the mask leaves none of, where softmax gives NaN: a mask keeps the
        # call whole, to mean what the original means (the builtin generator writes it as one attention).
        return _ORIGINAL_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale)
    return attention_core(query, key, value, attn_mask, dropout_p, is_causal, scale)


def multihead_attention(m: nn.MultiheadAttention, query, key, value, key_padding_mask=None, need_weights=True,
                        attn_mask=None, average_attn_weights=True, is_causal=False):
    """nn.MultiheadAttention's forward without its fast path. Returns (output, None): the averaged attention
    weights are not computed, so a forward that reads them does not trace here. Variants it does not cover
    raise NotImplementedError before any operation, and the layer stays whole."""
    if m.bias_k is not None or m.add_zero_attn or not m._qkv_same_embed_dim:
        raise NotImplementedError("MultiheadAttention with add_bias_kv, add_zero_attn or kdim/vdim is not expanded")
    if key_padding_mask is not None:
        raise NotImplementedError("MultiheadAttention with key_padding_mask is not expanded")
    heads, width = m.num_heads, m.head_dim
    self_attention = query is key and key is value
    if m.batch_first:
        query = query.transpose(0, 1)
        key, value = (query, query) if self_attention else (key.transpose(0, 1), value.transpose(0, 1))
    if self_attention:
        # Self-attention: one projection to Q, K and V at once.
        # Indexed, not unpacked: a traced chunk is one value that cannot be iterated.
        qkv = F.linear(query, m.in_proj_weight, m.in_proj_bias).chunk(3, dim=-1)
        q, k, v = qkv[0], qkv[1], qkv[2]
    else:
        weights = m.in_proj_weight.chunk(3)
        biases = m.in_proj_bias.chunk(3) if m.in_proj_bias is not None else None
        q, k, v = (F.linear(t, weights[i], None if biases is None else biases[i])
                   for i, t in enumerate((query, key, value)))
    length, batch = query.size(0), query.size(1)
    # (L, N, E) -> (N, heads, L, head_dim)
    q, k, v = (t.reshape(t.size(0), batch * heads, width).transpose(0, 1).reshape(batch, heads, t.size(0), width)
               for t in (q, k, v))
    mask = None if attn_mask is None else _float_mask(attn_mask, batch, heads)
    out = attention_core(q, k, v, mask, m.dropout, is_causal and attn_mask is None, training=m.training)
    out = out.permute(2, 0, 1, 3).reshape(length, batch, heads * width)
    out = F.linear(out, m.out_proj.weight, m.out_proj.bias)
    if m.batch_first:
        out = out.transpose(0, 1)
    return out, None


def _float_mask(mask, batch: int, heads: int):
    # MultiheadAttention's boolean masks mark the positions that are left out (the opposite of SDPA's).
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(mask, float("-inf"))
    if mask.dim() == 3:
        mask = mask.reshape(batch, heads, mask.size(-2), mask.size(-1))
    return mask


def encoder_layer(m: nn.TransformerEncoderLayer, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
    def self_attention(x):
        out = m.self_attn(x, x, x, attn_mask=src_mask, key_padding_mask=src_key_padding_mask,
                          need_weights=False, is_causal=is_causal)[0]
        return m.dropout1(out)

    def feed_forward(x):
        return m.dropout2(m.linear2(m.dropout(m.activation(m.linear1(x)))))

    x = src
    if m.norm_first:
        x = x + self_attention(m.norm1(x))
        return x + feed_forward(m.norm2(x))
    x = m.norm1(x + self_attention(x))
    return m.norm2(x + feed_forward(x))


def decoder_layer(m: nn.TransformerDecoderLayer, tgt, memory, tgt_mask=None, memory_mask=None,
                  tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False,
                  memory_is_causal=False):
    def self_attention(x):
        out = m.self_attn(x, x, x, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask,
                          need_weights=False, is_causal=tgt_is_causal)[0]
        return m.dropout1(out)

    def cross_attention(x):
        out = m.multihead_attn(x, memory, memory, attn_mask=memory_mask, key_padding_mask=memory_key_padding_mask,
                               need_weights=False, is_causal=memory_is_causal)[0]
        return m.dropout2(out)

    def feed_forward(x):
        return m.dropout3(m.linear2(m.dropout(m.activation(m.linear1(x)))))

    x = tgt
    if m.norm_first:
        x = x + self_attention(m.norm1(x))
        x = x + cross_attention(m.norm2(x))
        return x + feed_forward(m.norm3(x))
    x = m.norm1(x + self_attention(x))
    x = m.norm2(x + cross_attention(x))
    return m.norm3(x + feed_forward(x))


# Layer type -> traceable forward taking the layer first.
EXPANSIONS: dict[type, Callable[..., Any]] = {
    nn.MultiheadAttention: multihead_attention,
    nn.TransformerEncoderLayer: encoder_layer,
    nn.TransformerDecoderLayer: decoder_layer,
}

# Layers that only hold other layers once expanded: their children are what a subproblem rebuilds.
# nn.TransformerEncoder/Decoder are not among them: they deep-copy one template layer, so every copy starts
# with the template's weights, which no sequence of constructor calls in subproblems reproduces.
CONTAINERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def expanded_sdpa():
    """F.scaled_dot_product_attention as its operations while a forward is traced. The patch is process-wide:
    another thread that calls it meanwhile gets the same values, computed step by step; the lock keeps two
    traces from restoring it under each other."""
    with _PATCH_LOCK:
        F.scaled_dot_product_attention = _sdpa
        try:
            yield
        finally:
            F.scaled_dot_product_attention = _ORIGINAL_SDPA
