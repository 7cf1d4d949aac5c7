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
  so the KV cache is bf16 too (under autocast K stays fp32 and is cast on every decode step);
- decode steps (fp32 or bf16) attend with decode_attention.py (decode_kernel.py's fused kernel where it is built,
  else grouped matmuls) instead of SDPA, which reads a KV cache slowly;
- a group's shared first prompt is kept ONCE, not once per row, in the KV store and in every turn's batch cache
  (`share_prompts`, on where decode_attention.py is the model's attention on a CPU), and the decode steps read it
  once per group (cascade attention, decode_attention.cascade_decode): at G = 8 rows a prompt of ~45 % of a
  multi-turn context costs 1/8 of its per-row reads. Its own: transformers' caches hold one sequence per row.
Samples are identical with and without the KV store and for any `drop_every` (tested); sharing the prompt changes
the order of floating-point sums only (tested against `share_prompts=False`).

What it leaves out: paged attention / vLLM, speculative decoding, sharing a prompt's states between rows of
different groups (only identical first prompts are shared).

Run: used by rollout.py (`rollout(..., generate_fn=sampling.generate)`); `python bench/rollout.py` and
`python bench/phases.py` measure it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import (Cache, DynamicCache, GenerationConfig, LogitsProcessor, StoppingCriteria,
                          StopStringCriteria, TemperatureLogitsWarper, TopPLogitsWarper)
from transformers.cache_utils import StaticLayer

import decode_attention
from policy import autocast, bf16_copy, bf16_default, position_ids_from_mask


class Prompt(NamedTuple):
    """A first prompt several rows start with, encoded once: ids and, per layer, (K, V) each (kv_heads, len(ids),
    head_dim)."""
    ids: tuple
    kv: list


class Entry(NamedTuple):
    """What the KV store keeps for a row: its first len(ids) context tokens and, per layer, (K, V) of those after
    the shared prompt (all of them when prompt is None), each (kv_heads, len(ids) - len(prompt.ids), head_dim)."""
    ids: tuple
    kv: list
    prompt: Prompt | None = None

    def full(self) -> list:
        """Per layer (K, V) of all len(ids) tokens (the shared prompt's states copied in front)."""
        if self.prompt is None:
            return self.kv
        return [(torch.cat([pk, k], dim=1), torch.cat([pv, v], dim=1))
                for (pk, pv), (k, v) in zip(self.prompt.kv, self.kv)]


class KVStore:
    """KV states of tokens a row has already been encoded with, kept between `generate` calls (turns).

    entries[key] = Entry(ids, kv, prompt). Next turn only the new tokens are encoded (the reference re-encodes the
    whole conversation every turn, which on a CPU costs more than generating). Rows that start with the same
    prompt (a group on turn 1) share one encoding, and with `share_prompts` one copy of it for good (`Prompt`):
    their entries keep only what follows it.
    """

    def __init__(self):
        self.entries = {}
        self.buffers = {}  # (layer, "k" | "v") -> flat tensor the batch caches of later turns are carved from

    def drop(self, key):
        """Forget a finished row (frees its memory)."""
        self.entries.pop(key, None)


def _encode_prefixes(model, contexts, rows, kv: KVStore, keys, batch: int = 16, share: bool = False):
    """Encode contexts[i][:-1] for `rows` (without cache) and store them; identical prefixes once, and with
    `share` kept once (a Prompt) where two or more rows start with it."""
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
            states = [(layer.keys[j, :, L - len(p):], layer.values[j, :, L - len(p):]) for layer in cache.layers]
            if share and len(unique[p]) > 1:  # copies: a view would keep the whole padded chunk alive with it
                entry = Entry(p, [(k[:, :0], v[:, :0]) for k, v in states],
                              Prompt(p, [(k.clone(), v.clone()) for k, v in states]))
            else:
                entry = Entry(p, states)
            for i in unique[p]:
                kv.entries[keys[i]] = entry


class _PooledStaticLayer(StaticLayer):
    """transformers' StaticLayer (fixed (rows, kv_heads, slots, head_dim) tensors written in place), except that the
    two tensors are carved from `buffers`, which outlive the turn (KVStore.buffers): a later turn writes into memory
    the process has already touched. A fresh tensor of this size is paid in page faults on first touch (measured:
    ~10 s to allocate and zero the batch cache of 64 rows x 1000 tokens on 2 CPU cores, ~1 GB/s); resident memory
    is zeroed at copy speed. A new buffer reserves 4x what it needs (virtual memory: only touched pages count), so
    the growing contexts of the next turns fit in it. Our own subclass: transformers' caches allocate per call.
    With `prefix` (a decode_attention.SharedPrefix), every row's sequence starts with one of its shared prompts:
    positions [0, Lp) are the prompt (stored once per prompt), the layer's slots hold positions Lp onwards, and the
    keys it hands to the attention carry the prompt (decode_attention.attach)."""
    HEADROOM = 4

    def __init__(self, max_cache_len: int, buffers: dict, idx: int, prefix=None):
        super().__init__(max_cache_len)
        self.buffers, self.idx, self.prefix = buffers, idx, prefix
        self.offset = prefix.k.shape[2] if prefix is not None else 0   # Lp: the prompt's positions come first

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        return (decode_attention.attach(keys, self.prefix) if self.prefix is not None else keys), values

    def get_seq_length(self):
        return self.offset + (self.cumulative_length if self.is_initialized else 0)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.offset + self.max_cache_len, 0   # the mask covers [prompt | slots]

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


def _batch_cache(model, kvs, cached, S, max_len, buffers: dict, prefixes=None):
    """A static cache (Cache of _PooledStaticLayer) of max_len slots whose first S hold the per-row (K, V) states,
    left-padded (the pad slots are masked out). Static, not Dynamic: DynamicCache grows by torch.cat, copying the
    whole cache every step (measured: 754 vs 243 ms per decode step at batch 32, 700-token contexts, 2 CPU cores).
    kvs[i] = row i's per-layer (K, V), each (kv_heads, cached[i], head_dim), or None (nothing cached).
    prefixes: None, or per layer a decode_attention.SharedPrefix the rows' sequences start with (then the slots
    hold what follows it)."""
    n_layers = model.config.get_text_config().num_hidden_layers
    cache = Cache(layers=[_PooledStaticLayer(max_len, buffers, i, prefixes[i] if prefixes else None)
                          for i in range(n_layers)])
    some = next((kv_i for kv_i in kvs if kv_i is not None), None)
    if some is None and prefixes:  # only prompts cached: empty slots of the prompts' dtype
        some = [(p.k[0], p.v[0]) for p in prefixes]
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
    prefix = cache.layers[0].prefix
    if prefix is not None:                    # one PrefixRows for all layers
        prefix.rows.index(prefix.rows.group[torch.tensor(stay, dtype=torch.long)])
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
             keys=None, drop_every: int = DROP_EVERY, share_prompts: bool = True) -> list:
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
    share_prompts (with kv, where the model attends with decode_attention.py on a CPU): a first prompt that several
    rows start with is stored once (KVStore's Prompt) and its Lp slots precede the batch:
    [pad | prompt][pad | cached ids][pad | new ids], the prompt part held once per prompt (cascade attention).
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
    share = share_prompts and kv is not None and _shares_prompts(model, device)
    if kv is not None:
        keys = list(keys)
        for i, k in enumerate(keys):  # a stale entry (context changed) is dropped and re-encoded
            ids = kv.entries[k].ids if k in kv.entries else ()
            if k in kv.entries and not (len(ids) < len(contexts[i]) and tuple(contexts[i][:len(ids)]) == ids):
                kv.drop(k)
        missing = [i for i, k in enumerate(keys) if k not in kv.entries and len(contexts[i]) > 1]
        with autocast(device, bf16):
            _encode_prefixes(model, contexts, missing, kv, keys, share=share)
    entries = [kv.entries.get(k) if kv is not None else None for k in keys or [None] * n]
    if not share:  # a prompt stored once goes back in front of the row's own states
        entries = [e if e is None or e.prompt is None else Entry(e.ids, e.full()) for e in entries]
    prompts = {}  # id(Prompt) -> Prompt: this batch's shared prompts, in order of first use
    for e in entries:
        if e is not None and e.prompt is not None:
            prompts.setdefault(id(e.prompt), e.prompt)
    lp = [len(e.prompt.ids) if e is not None and e.prompt is not None else 0 for e in entries]  # prompt part
    cached = [len(e.ids) - l if e is not None else 0 for e, l in zip(entries, lp)]  # own cached part
    Lp, S = max(lp), max(cached)
    U = max(len(c) - l - m for c, l, m in zip(contexts, lp, cached))
    input_ids = torch.full((n, Lp + S + U), pad, dtype=torch.long)  # (n, Lp + S + U)
    attention = torch.zeros((n, Lp + S + U), dtype=torch.long)
    for i, (c, l, m) in enumerate(zip(contexts, lp, cached)):
        input_ids[i, Lp - l:Lp], attention[i, Lp - l:Lp] = torch.tensor(c[:l], dtype=torch.long), 1
        input_ids[i, Lp + S - m:Lp + S] = torch.tensor(c[l:l + m], dtype=torch.long)
        attention[i, Lp + S - m:Lp + S] = 1
        input_ids[i, Lp + S + U - (len(c) - l - m):] = torch.tensor(c[l + m:], dtype=torch.long)
        attention[i, Lp + S + U - (len(c) - l - m):] = 1
    # Static cache (see _batch_cache), never auto-compiled (shapes change every turn); rows with nothing cached
    # (one-token contexts) get all-pad slots
    prefixes = _shared_prefixes(entries, prompts, Lp) if prompts else None
    cache = _batch_cache(model, [e.kv if m else None for e, m in zip(entries, cached)], cached, S,
                         S + U + max_new_tokens, kv.buffers if kv is not None else {}, prefixes)
    row_prompts = [e.prompt if e is not None else None for e in entries]
    del entries
    if kv is not None:
        for k in keys:  # the states now live in the batch cache
            kv.drop(k)
    step_logp = _StepLogp()
    rec = _StopAndRecord(tokenizer, stop, eos, step_logp, n, Lp + S + U, device)
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
        new = ids[leave, Lp + S + U:].cpu()
        for j, (i, length) in enumerate(zip(rows[leave].tolist(), lengths)):
            gen[i] = new[j, :length].tolist()
        if kv is not None:
            _store_rows(cache, kv, leave.tolist(), rows[leave].tolist(), lengths, keys, contexts, cached, S, U, new,
                        steps, row_prompts)
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


def _store_rows(cache, kv, batch_rows, orig_rows, lengths, keys, contexts, cached, S, U, new, steps, prompts):
    """Rows leaving the batch: keep (copies of) the states of their context + sampled tokens but the last (never
    fed back). Batch row batch_rows[j] is original row orig_rows[j] with lengths[j] sampled ids new[j, :lengths[j]];
    after its shared prompt (prompts[i], or None) its real tokens sit in two slot ranges, [S - m, S) (cached) and
    [S + U - u, S + U + length - 1) (new + sampled)."""
    Lp = cache.layers[0].offset
    if cache.get_seq_length() != Lp + S + U + steps - 1:
        raise RuntimeError(f"unexpected KV length {cache.get_seq_length()} != {Lp + S + U + steps - 1}")
    for j, (b, i, length) in enumerate(zip(batch_rows, orig_rows, lengths)):
        l = len(prompts[i].ids) if prompts[i] is not None else 0
        m, u = cached[i], len(contexts[i]) - l - cached[i]
        states = [tuple(torch.cat([t[b, :, S - m:S], t[b, :, S + U - u:S + U + length - 1]], dim=1)
                        for t in (layer.keys, layer.values)) for layer in cache.layers]
        kv.entries[keys[i]] = Entry(tuple(contexts[i]) + tuple(new[j, :length - 1].tolist()), states, prompts[i])


def _shares_prompts(model, device) -> bool:
    """Whether this model's attention reads a shared prompt (decode_attention.py on a CPU)."""
    return device.type == "cpu" and getattr(model.config, "_attn_implementation", None) == decode_attention.NAME


def _shared_prefixes(entries, prompts: dict, Lp: int) -> list:
    """Per layer a decode_attention.SharedPrefix: the batch's shared prompts (id -> Prompt, in order), each left
    padded to Lp slots (zeros, masked), and which row starts with which (a row without one points at prompt 0,
    masked)."""
    index = {key: j for j, key in enumerate(prompts)}
    group = torch.tensor([index[id(e.prompt)] if e is not None and e.prompt is not None else 0 for e in entries],
                         dtype=torch.long)
    rows = decode_attention.PrefixRows(group, len(prompts))
    first = next(iter(prompts.values()))
    out = []
    for layer, (K0, V0) in enumerate(first.kv):
        k = K0.new_zeros(len(prompts), K0.shape[0], Lp, K0.shape[-1])     # (Np, KVH, Lp, D)
        v = V0.new_zeros(len(prompts), V0.shape[0], Lp, V0.shape[-1])
        for j, p in enumerate(prompts.values()):
            pk, pv = p.kv[layer]
            k[j, :, Lp - pk.shape[1]:], v[j, :, Lp - pv.shape[1]:] = pk, pv
        out.append(decode_attention.SharedPrefix(k, v, rows))
    return out
