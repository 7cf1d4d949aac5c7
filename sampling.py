"""Sampling for the rollout: batched `generate` per turn, finished rows leave the batch, KV states kept between turns.

Sampling for the rollout: one batch per turn through transformers' `model.generate` (left padding, temperature,
top-p, no top-k), stopping each row at `</answer>` or its end-of-turn token, with an exact record of every row's
sampled ids and their temperature-1 log-probs. `KVStore` keeps each row's KV states between turns, so a turn
encodes only its new tokens and a group's shared first prompt is encoded once (the reference re-encodes the whole
conversation every turn). Measured CPU speedups, each replacing a transformers default and said so where it
happens (docs/speed.md has the numbers):
- the KV store (2x at 3 turns x 8 rows, more with longer episodes);
- a static KV cache instead of the growing DynamicCache, carved from memory an earlier turn already touched
  (`_PooledStaticLayer`: a fresh multi-GB cache costs seconds of page faults every turn);
- finished rows leave the running batch: generate runs in chunks of `drop_every` steps and continues from its
  cache (transformers keeps a finished row computing padding until the last row stops);
- inverse-CDF sampling instead of torch.multinomial;
- in bf16, a bf16 copy of the weights (policy.bf16_copy, refreshed when the weights change) instead of autocast,
  so the KV cache is bf16 too (under autocast K stays fp32 and is cast on every decode step), and its decode
  steps attend with decode_attention.py (grouped matmuls) instead of SDPA, which reads a bf16 cache slowly.
Samples are identical with and without the KV store and for any `drop_every` (tested).

What it leaves out: paged attention / vLLM, speculative decoding, attention that reads a group's shared prompt once
(cascade attention; docs/speed.md measures what it would save).

Run: used by rollout.py (`rollout(..., generate_fn=sampling.generate)`); `python bench/rollout.py` and
`python bench/phases.py` measure it.
"""
from __future__ import annotations

import torch
from transformers import (Cache, DynamicCache, GenerationConfig, LogitsProcessor, StoppingCriteria,
                          StopStringCriteria, TemperatureLogitsWarper, TopPLogitsWarper)
from transformers.cache_utils import StaticLayer

from policy import autocast, bf16_copy, bf16_default, position_ids_from_mask


class KVStore:
    """KV states of tokens a row has already been encoded with, kept between `generate` calls (turns).

    entries[key] = (ids, kv): the row's first len(ids) context tokens and, per layer, their (K, V), each
    (kv_heads, len(ids), head_dim). Next turn only the new tokens are encoded (the reference re-encodes the
    whole conversation every turn, which on a CPU costs more than generating). Rows that start with the same
    prompt (a group on turn 1) share one encoding.
    """

    def __init__(self):
        self.entries = {}
        self.buffers = {}  # (layer, "k" | "v") -> flat tensor the batch caches of later turns are carved from

    def drop(self, key):
        """Forget a finished row (frees its memory)."""
        self.entries.pop(key, None)


def _encode_prefixes(model, contexts, rows, kv: KVStore, keys, batch: int = 16):
    """Encode contexts[i][:-1] for `rows` (without cache) and store them; identical prefixes once."""
    unique = {}  # prefix -> rows sharing it
    for i in rows:
        unique.setdefault(tuple(contexts[i][:-1]), []).append(i)
    prefixes = list(unique)
    device = next(model.parameters()).device
    for start in range(0, len(prefixes), batch):
        chunk = prefixes[start:start + batch]
        L = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), L), 0, dtype=torch.long)  # left padded (c, L)
        attn = torch.zeros((len(chunk), L), dtype=torch.long)
        for j, p in enumerate(chunk):
            ids[j, L - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[j, L - len(p):] = 1
        cache = DynamicCache(config=model.config)
        model.get_decoder()(input_ids=ids.to(device), attention_mask=attn.to(device),
                            position_ids=position_ids_from_mask(attn).to(device), cache=cache, use_cache=True)
        for j, p in enumerate(chunk):  # keep the real (non-pad) positions of each prefix
            entry = (p, [(layer.keys[j, :, L - len(p):], layer.values[j, :, L - len(p):]) for layer in cache.layers])
            for i in unique[p]:
                kv.entries[keys[i]] = entry


class _PooledStaticLayer(StaticLayer):
    """transformers' StaticLayer (fixed (rows, kv_heads, slots, head_dim) tensors written in place), except that the
    two tensors are carved from `buffers`, which outlive the turn (KVStore.buffers): a later turn writes into memory
    the process has already touched. A fresh tensor of this size is paid in page faults on first touch (measured:
    ~10 s to allocate and zero the batch cache of 64 rows x 1000 tokens on 2 CPU cores, ~1 GB/s); resident memory
    is zeroed at copy speed. A new buffer reserves 4x what it needs (virtual memory: only touched pages count), so
    the growing contexts of the next turns fit in it. Our own subclass: transformers' caches allocate per call."""
    HEADROOM = 4

    def __init__(self, max_cache_len: int, buffers: dict, idx: int):
        super().__init__(max_cache_len)
        self.buffers, self.idx = buffers, idx

    def _carve(self, kind: str, like: torch.Tensor) -> torch.Tensor:
        shape = (like.shape[0], like.shape[1], self.max_cache_len, like.shape[-1])
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        buf = self.buffers.get((self.idx, kind))
        if buf is None or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = self.buffers[(self.idx, kind)] = torch.empty(self.HEADROOM * numel, dtype=like.dtype,
                                                               device=like.device)
        return buf[:numel].view(shape).zero_()  # pads and future slots must hold finite values (they are masked)

    def lazy_initialization(self, key_states, value_states):
        """StaticLayer.lazy_initialization with carved tensors (and no torch.compile address marking: we never
        compile a turn's generate, its shapes change every turn)."""
        self.device = key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        self.keys, self.values = self._carve("k", key_states), self._carve("v", value_states)
        self.cumulative_length = self.cumulative_length.to(self.device)
        self.is_initialized = True


def _batch_cache(model, kvs, cached, S, max_len, buffers: dict):
    """A static cache (Cache of _PooledStaticLayer) of max_len slots whose first S hold the per-row (K, V) states,
    left-padded (the pad slots are masked out). Static, not Dynamic: DynamicCache grows by torch.cat, copying the
    whole cache every step (measured: 754 vs 243 ms per decode step at batch 32, 700-token contexts, 2 CPU cores).
    kvs[i] = row i's per-layer (K, V), each (kv_heads, cached[i], head_dim), or None (nothing cached)."""
    n_layers = model.config.get_text_config().num_hidden_layers
    cache = Cache(layers=[_PooledStaticLayer(max_len, buffers, i) for i in range(n_layers)])
    some = next((kv_i for kv_i in kvs if kv_i is not None), None)
    if some is None:  # nothing cached: generate's first forward initialises the layers
        return cache
    for layer, (K0, V0) in zip(cache.layers, some):  # under bf16 autocast V is bf16, K fp32 (RoPE): keep each dtype
        layer.lazy_initialization(K0.new_empty(len(kvs), K0.shape[0], 0, K0.shape[-1]),
                                  V0.new_empty(len(kvs), V0.shape[0], 0, V0.shape[-1]))
    for i, (m, kv_i) in enumerate(zip(cached, kvs)):
        for layer, (K, V) in zip(cache.layers, kv_i or []):
            layer.keys[i, :, S - m:S], layer.values[i, :, S - m:S] = K, V
    for layer in cache.layers:
        layer.cumulative_length.add_(S)  # slots [0, S) are filled
    return cache


def _keep_rows(cache, stay: list) -> None:
    """Keep batch rows `stay` (ascending) of every layer, moved to the front in place (row s to position j <= s,
    in increasing j, never overwrites a row still to be moved): no new memory (see _PooledStaticLayer)."""
    for layer in cache.layers:
        for j, s in enumerate(stay):
            if j != s:
                layer.keys[j].copy_(layer.keys[s])
                layer.values[j].copy_(layer.values[s])
        layer.keys, layer.values = layer.keys[:len(stay)], layer.values[:len(stay)]


class _StepLogp(LogitsProcessor):
    """Keeps log_softmax of the raw next-token logits. Custom processors run first, so this is the policy at
    temperature 1, whatever the sampling temperature / top-p. Returns the scores unchanged."""

    def __call__(self, input_ids, scores):
        self.logp = torch.log_softmax(scores.float(), dim=-1)  # (n, V)
        return scores


class _SampleInverseCDF(LogitsProcessor):
    """Samples the next token and returns scores that are 0 there and -inf elsewhere, so generate's greedy
    argmax emits the sample. Inverse-CDF sampling: k = first index with cdf_k > u, u ~ U[0, 1) * cdf_V, which
    draws k with probability softmax(scores)_k exactly (tokens removed by top-p have an empty interval).
    Our own code instead of generate's do_sample, whose torch.multinomial over the 49k vocabulary took 112 ms
    per step at batch 64 on 2 CPU cores (about a quarter of a decode step); this takes ~19 ms.
    Each step draws one uniform per row of the ORIGINAL batch and uses those of the rows still running (`rows`),
    so removing finished rows from the batch (`generate`) never changes what the other rows sample."""

    def __init__(self, n: int):
        self.n, self.rows = n, torch.arange(n)  # rows[j] = original index of batch row j

    def __call__(self, input_ids, scores):
        cdf = torch.softmax(scores.float(), dim=-1).double().cumsum(-1)  # (n', V), fp64 against rounding
        u = torch.rand(self.n, 1, dtype=torch.float64, device=scores.device)[self.rows.to(scores.device)]
        k = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=scores.shape[-1] - 1)  # (n', 1)
        return torch.full_like(scores, float("-inf")).scatter_(-1, k, 0.0)


_STOP_CACHE = {}  # (id(tokenizer), stop strings) -> (tokenizer, StopStringCriteria); building one scans the vocab


def _stop_criterion(tokenizer, stop: tuple):
    key = (id(tokenizer), stop)
    if key not in _STOP_CACHE or _STOP_CACHE[key][0] is not tokenizer:
        _STOP_CACHE[key] = (tokenizer, StopStringCriteria(tokenizer, list(stop)))
    return _STOP_CACHE[key][1]


class _StopAndRecord(StoppingCriteria):
    """The stopping rule (a stop string or an end-of-turn token) plus a record of each row's sampled length and
    the T=1 log-prob of each sampled token, indexed by ORIGINAL row (`rows` maps the running batch to it). Being
    THE criterion that stops rows, its record is exact: after a row stops, generate only appends padding."""

    def __init__(self, tokenizer, stop, eos, step_logp, n, prompt_len, device):
        self.stop = _stop_criterion(tokenizer, tuple(stop)) if stop else None
        self.eos = torch.tensor(sorted(eos), dtype=torch.long, device=device)
        self.step_logp, self.prompt_len = step_logp, prompt_len
        self.rows = torch.arange(n, device=device)  # rows[j] = original index of batch row j
        self.finished = torch.zeros(n, dtype=torch.bool, device=device)
        self.lengths = torch.full((n,), -1, dtype=torch.long, device=device)
        self.logps = []  # per step (n,); 0 for rows that have left the batch

    def __call__(self, input_ids, scores, **kwargs):
        tok = input_ids[:, -1]  # (n',) the token sampled this step
        logp = torch.zeros(len(self.finished), device=tok.device)
        logp[self.rows] = self.step_logp.logp.gather(-1, tok[:, None]).squeeze(-1)
        self.logps.append(logp)
        done = torch.isin(tok, self.eos)
        if self.stop is not None:
            done |= self.stop(input_ids, scores)
        new = done & ~self.finished[self.rows]
        self.lengths[self.rows[new]] = input_ids.shape[1] - self.prompt_len
        self.finished[self.rows] |= done
        return done


def turn_end_id(tokenizer) -> int | None:
    """The special token the chat template closes an assistant turn with (e.g. `<|im_end|>`), or None. Base
    checkpoints often have a different eos (Qwen2.5 base: `<|endoftext|>`), and without this id in the stop set a
    turn would run on into an invented next user turn."""
    mark = "QZXJ-END-OF-CONTENT"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": mark}],
                                             tokenize=False)
    except Exception:                                  # no chat template: nothing to add
        return None
    if mark not in text:
        return None
    ids = tokenizer.encode(text.split(mark, 1)[1], add_special_tokens=False)
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return ids[0] if ids and ids[0] in special else None


def eos_ids(model, tokenizer) -> set:
    """End-of-turn ids: the model's generation-config eos id(s), the tokenizer's eos, and the chat template's
    turn terminator (turn_end_id)."""
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    ids |= {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    end = turn_end_id(tokenizer)
    return ids | ({end} if end is not None else set())


DROP_EVERY = 16  # decode steps between two removals of finished rows from the running batch (0 = never)


def sampling_model(model, device, bf16: bool | None):
    """(model to sample with, autocast flag for it): in bf16 (bf16=True, or None where bf16 is the default) the
    refreshed bf16 copy of the weights (policy.bf16_copy) with autocast off, so weights, activations and the KV
    cache are all bf16; a model bf16_copy cannot copy samples under autocast; fp32 otherwise."""
    if not (bf16_default(device) if bf16 is None else bf16):
        return model, False
    copy16 = bf16_copy(model)
    return copy16, copy16 is model


@torch.no_grad()
def generate(model, tokenizer, contexts: list, *, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, stop=("</answer>",), bf16: bool | None = None, kv: KVStore | None = None,
             keys=None, drop_every: int = DROP_EVERY) -> list:
    """Sample one continuation per context (a list of ids) with batched `model.generate` calls.

    Stops a row at a stop string or an end-of-turn token; temperature 0 = greedy; top_k is never applied.
    Returns [(gen_ids, gen_logp)], gen_logp = log pi(token | prefix) at temperature 1 for each sampled token.
    kv/keys: reuse and update the KV states of row keys[i] (its context must extend the ids stored under
    that key; otherwise it is re-encoded). Layout of row i in the batch, S = longest cached part, U = longest
    new part: [pad | cached ids][pad | new ids] -> the pads in the middle are masked, and positions count real
    tokens only (cumsum of the attention mask), so every row sees exactly the positions of its own sequence.
    drop_every: generate runs in chunks of this many steps, continuing from its KV cache, and rows that have
    stopped leave the batch between chunks (transformers' generate keeps finished rows computing padding until
    the last row stops: 15-20 % of the decode work of a multi-turn rollout). The samples are the same for any
    drop_every (the sampler draws per original row; tested); 0 = one call for the whole turn.
    """
    if not contexts:
        return []
    if any(len(c) == 0 for c in contexts):
        raise ValueError("every context needs at least one token")
    if drop_every < 0:
        raise ValueError(f"drop_every must be >= 0 (0 = never drop finished rows), got {drop_every}")
    device = next(model.parameters()).device
    n, pad, eos = len(contexts), tokenizer.pad_token_id, eos_ids(model, tokenizer)
    model, bf16 = sampling_model(model, device, bf16)
    if kv is not None:
        keys = list(keys)
        for i, k in enumerate(keys):  # a stale entry (context changed) is dropped and re-encoded
            ids = kv.entries.get(k, ((),))[0]
            if k in kv.entries and not (len(ids) < len(contexts[i]) and tuple(contexts[i][:len(ids)]) == ids):
                kv.drop(k)
        missing = [i for i, k in enumerate(keys) if k not in kv.entries and len(contexts[i]) > 1]
        with autocast(device, bf16):
            _encode_prefixes(model, contexts, missing, kv, keys)
    cached = [len(kv.entries[k][0]) if kv is not None and k in kv.entries else 0 for k in keys or [None] * n]
    S, U = max(cached), max(len(c) - m for c, m in zip(contexts, cached))
    input_ids = torch.full((n, S + U), pad, dtype=torch.long)  # (n, S + U)
    attention = torch.zeros((n, S + U), dtype=torch.long)
    for i, (c, m) in enumerate(zip(contexts, cached)):
        input_ids[i, S - m:S], attention[i, S - m:S] = torch.tensor(c[:m], dtype=torch.long), 1
        input_ids[i, S + U - (len(c) - m):] = torch.tensor(c[m:], dtype=torch.long)
        attention[i, S + U - (len(c) - m):] = 1
    # Static cache (see _batch_cache), never auto-compiled (shapes change every turn); rows with nothing cached
    # (one-token contexts) get all-pad slots
    cache = _batch_cache(model, [kv.entries[k][1] if m else None for k, m in zip(keys or [None] * n, cached)],
                         cached, S, S + U + max_new_tokens, kv.buffers if kv is not None else {})
    if kv is not None:
        for k in keys:  # the states now live in the batch cache
            kv.drop(k)
    step_logp = _StepLogp()
    rec = _StopAndRecord(tokenizer, stop, eos, step_logp, n, S + U, device)
    procs = [step_logp]  # then the sampling transforms, in generate's own order
    if temperature > 0 and temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if temperature > 0 and top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    sampler = _SampleInverseCDF(n) if temperature > 0 else None
    procs += [sampler] if sampler is not None else []
    rows = torch.arange(n)  # rows[j] = original index of running batch row j
    ids, attn = input_ids.to(device), attention.to(device)
    gen, steps = [None] * n, 0  # gen[i]: row i's sampled ids, set when it leaves the batch
    while True:
        chunk = max_new_tokens - steps if drop_every == 0 else min(drop_every, max_new_tokens - steps)
        # do_sample=False: the argmax of _SampleInverseCDF's scores IS the sample. A complete GenerationConfig, so
        # nothing leaks in from the checkpoint's generation defaults (e.g. top_k=50).
        gen_cfg = GenerationConfig(max_new_tokens=chunk, do_sample=False, pad_token_id=pad,
                                   eos_token_id=sorted(eos), use_cache=True, disable_compile=True)
        with autocast(device, bf16):  # continues from `cache`: only the tokens it has not seen are encoded
            out = model.generate(input_ids=ids, attention_mask=attn, cache=cache, generation_config=gen_cfg,
                                 logits_processor=procs, stopping_criteria=[rec])
        grown = out.shape[1] - ids.shape[1]
        ids, attn, steps = out, torch.nn.functional.pad(attn, (0, grown), value=1), steps + grown
        finished = rec.finished[rows.to(device)].cpu()  # (n',)
        last = steps >= max_new_tokens or bool(finished.all())
        leave = (torch.ones_like(finished) if last else finished).nonzero().squeeze(1)  # batch rows leaving now
        lengths = rec.lengths.cpu()[rows[leave]]
        lengths = torch.where(lengths < 0, steps, lengths).tolist()  # unstopped: all steps
        new = ids[leave, S + U:].cpu()
        for j, (i, length) in enumerate(zip(rows[leave].tolist(), lengths)):
            gen[i] = new[j, :length].tolist()
        if kv is not None:
            _store_rows(cache, kv, leave.tolist(), rows[leave].tolist(), lengths, keys, contexts, cached, S, U, new,
                        steps)
        if last:
            break
        stay = (~finished).nonzero().squeeze(1)
        _keep_rows(cache, stay.tolist())  # StaticLayer has no batch_select_indices (DynamicLayer's): by hand
        ids, attn, rows = ids[stay.to(device)], attn[stay.to(device)], rows[stay]
        rec.rows = rows.to(device)
        if sampler is not None:
            sampler.rows = rows
    logps = torch.stack(rec.logps, dim=1).cpu() if rec.logps else torch.zeros(n, 0)  # (n, steps)
    return [(gen[i], logps[i, :len(gen[i])].tolist()) for i in range(n)]


def _store_rows(cache, kv, batch_rows, orig_rows, lengths, keys, contexts, cached, S, U, new, steps):
    """Rows leaving the batch: keep (copies of) the states of their context + sampled tokens but the last (never
    fed back). Batch row batch_rows[j] is original row orig_rows[j] with lengths[j] sampled ids new[j, :lengths[j]];
    its real tokens sit in two slot ranges, [S - m, S) (cached) and [S + U - u, S + U + length - 1) (new + sampled)."""
    if cache.get_seq_length() != S + U + steps - 1:
        raise RuntimeError(f"unexpected KV length {cache.get_seq_length()} != {S + U + steps - 1}")
    for j, (b, i, length) in enumerate(zip(batch_rows, orig_rows, lengths)):
        m, u = cached[i], len(contexts[i]) - cached[i]
        states = [tuple(torch.cat([t[b, :, S - m:S], t[b, :, S + U - u:S + U + length - 1]], dim=1)
                        for t in (layer.keys, layer.values)) for layer in cache.layers]
        kv.entries[keys[i]] = (tuple(contexts[i]) + tuple(new[j, :length - 1].tolist()), states)
