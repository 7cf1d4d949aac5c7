"""Attention on the CPU: bf16 decode steps as two grouped matmuls, masked prefills as SDPA with GQA.

What it implements: softmax(q K^T / sqrt(d) + mask) V, two ways, instead of transformers' SDPA call:
- a single new token per row in bf16 (the decode steps of the bf16 sampling copy): the query heads of one KV head
  batched as rows of one matmul, (B, KVH, G, D) @ (B, KVH, D, T), so each K and V slot is read once per step,
  softmax in fp32;
- several tokens per row under a padding mask, outside autograd (a turn's new tokens over the cached
  conversation, MI scoring, old log-probs, evaluation): torch's SDPA with `enable_gqa=True`, where transformers
  first copies K and V once per query head (`repeat_kv`: it only uses torch's GQA when there is no mask). The
  result is the same to the bit (tested), without the copies.
Anything else (fp32 decode, any forward with gradients, no mask, GPU tensors, dropout, position biases,
soft-capping) goes to transformers' `sdpa_attention_forward` unchanged. So in fp32 every number is what
transformers computes (fp32 sampled log-probs still equal a recomputation exactly).

Why our own (issue 21, docs/speed.md): on the CPU, PyTorch's SDPA for one query row over a ~1k-token bf16 KV
cache (what transformers calls with its GQA packing: 3 query rows per KV head, a padding mask) reads the cache at
a fraction of the copy bandwidth; the two matmuls run near it. For a turn's ~100 new tokens per row over a ~1k-token
cache, `repeat_kv` triples the K and V traffic. Measured by `python bench/decode.py`.
It is registered as a transformers attention implementation (`AttentionInterface`, with SDPA's mask function)
and set on every CPU model `policy.load` returns and on the bf16 copy that samples (`policy.bf16_copy`); in bf16
the grouped decode differs from SDPA by bf16 rounding (~4e-3 on an attention output, the order of the bf16 path's
own sampled-vs-recomputed gap). `save_pretrained` does not write the implementation's name (export is unchanged).

What it leaves out: a fused kernel (score, mask and softmax are separate ops), reading a group's shared prompt
once (cascade attention), anything but CPU decode (on a GPU keep SDPA / flash attention).
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "nanoragen_decode"


def grouped_decode(query, key, value, attention_mask, scaling=None):
    """One query token per row: query (B, H, 1, D), key / value (B, KVH, T, D), attention_mask None, bool (B, 1, 1, T)
    with True = attend, or additive float; returns (B, 1, H, D). Query head h reads KV head h // (H / KVH)."""
    B, H, _, D = query.shape
    KVH = key.shape[1]
    scale = scaling if scaling is not None else D ** -0.5
    qg = query.reshape(B, KVH, H // KVH, D)                          # (B, KVH, G, D): a KV head's query heads
    s = torch.matmul(qg, key.transpose(-1, -2)).float() * scale      # (B, KVH, G, T), fp32 from here
    if attention_mask is not None:
        m = attention_mask[..., -key.shape[2]:]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
    p = torch.softmax(s, dim=-1).to(value.dtype)
    out = torch.matmul(p, value)                                     # (B, KVH, G, D)
    return out.reshape(B, 1, H, D)                                   # heads in the order of q's reshape


def decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     is_causal=None, **kwargs):
    """transformers' attention-function signature; query (B, H, q, D), key / value (B, KVH, T, D); returns
    ((B, q, H, D), None). On the CPU: q = 1 in bf16: grouped_decode; q > 1 with a mask, outside autograd: SDPA
    with GQA; anything else (fp32 decode, a forward with gradients, no mask, any GPU call): transformers' own."""
    B, H, q, D = query.shape
    plain = (not dropout and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
             and query.device.type == "cpu")                         # on a GPU: transformers' SDPA / flash
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))   # the update, LoRA too
    if plain and q > 1 and attention_mask is not None and key.shape[1] != H and not grad:   # masked prefill, GQA
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                               scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    if q != 1 or not plain or query.dtype == torch.float32:              # fp32 decode: SDPA is faster there
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    return grouped_decode(query, key, value, attention_mask, scaling), None


def install(model) -> bool:
    """Make `model` use decode_attention; False where the model cannot switch attention implementation (then it
    keeps its own)."""
    try:
        model.set_attn_implementation(NAME)
    except (AttributeError, ValueError):
        return False
    return True


AttentionInterface.register(NAME, decode_attention)    # at import: a model that names it always finds it
AttentionMaskInterface.register(NAME, sdpa_mask)         # (SDPA's mask function)
