"""Decode attention for the bf16 sampling copy: one query token per row as two grouped matmuls instead of SDPA.

What it implements: softmax(q K^T / sqrt(d) + mask) V for a single new token per row (the decode steps of
`sampling.generate`), with the query heads of one KV head batched as rows of one matmul, (B, KVH, G, D) @
(B, KVH, D, T), so each K and V slot is read once per step, and the softmax in fp32. Any other call (a prompt or
a turn's new tokens, dropout, position biases) goes to transformers' own `sdpa_attention_forward` unchanged.

Why our own (issue 21, docs/speed.md): on the CPU, PyTorch's SDPA for one query row over a ~1k-token bf16 KV
cache (what transformers calls with its GQA packing: 3 query rows per KV head, a padding mask) reads the cache at
a fraction of the copy bandwidth; the two matmuls run near it. Measured by `python bench/decode.py`.
It is registered as a transformers attention implementation (`AttentionInterface`, with SDPA's mask function)
and set only on the bf16 copy that samples (`policy.bf16_copy`): the fp32 path keeps SDPA, so fp32 sampled
log-probs still equal a recomputation exactly; in bf16 the two kernels differ by bf16 rounding (~4e-3 on an
attention output, the order of the bf16 path's own sampled-vs-recomputed gap).

What it leaves out: a fused kernel (score, mask and softmax are separate ops), reading a group's shared prompt
once (cascade attention), anything but CPU decode (on a GPU keep SDPA / flash attention).
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "nanoragen_decode"


def decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     is_causal=None, **kwargs):
    """transformers' attention-function signature; query (B, H, q, D), key / value (B, KVH, T, D); returns
    ((B, q, H, D), None). q = 1 without dropout or position bias: grouped matmuls; anything else: SDPA."""
    B, H, q, D = query.shape
    if q != 1 or dropout or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    KVH = key.shape[1]
    scale = scaling if scaling is not None else D ** -0.5
    qg = query.reshape(B, KVH, H // KVH, D)                          # (B, KVH, G, D): a KV head's query heads
    s = torch.matmul(qg, key.transpose(-1, -2)).float() * scale      # (B, KVH, G, T), fp32 from here
    if attention_mask is not None:                                   # (B, 1, 1, T): True = attend, or additive
        m = attention_mask[..., -key.shape[2]:]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
    p = torch.softmax(s, dim=-1).to(value.dtype)
    out = torch.matmul(p, value)                                     # (B, KVH, G, D)
    return out.reshape(B, 1, H, D), None                              # heads in the order of q's reshape


def install(model) -> bool:
    """Make `model` use decode_attention (registered once, with SDPA's mask); False where the model cannot
    switch attention implementation (then it keeps its own)."""
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except (AttributeError, ValueError):
        return False
    return True
