"""vLLM rollouts (`train.py --rollout-backend vllm`): the same records as `sampling.generate`, from vLLM's offline
engine, with the policy's current weights copied into the engine before every step's rollout.

UNTESTED ON A GPU: written against vLLM's documented offline API (`LLM`, `SamplingParams`, token-id prompts) and
the in-process weight-sync pattern TRL uses in its "colocate" mode (the engine's model `load_weights(...)`, with
`VLLM_ENABLE_V1_MULTIPROCESSING=0` so the engine lives in this process). The machine it was written on has no
GPU and no vllm; the tests only check that the backend is refused cleanly without them
(tests/test_rollout_vllm.py). Run `bench/gpu_first_run.sh` on a GPU machine first: it compares this backend with
HF generate on the same contexts.

What it implements (paper §2 rollouts, App. E; the reference RAGEN samples with vLLM too):
- `VLLMGenerator(model, tokenizer, source)`: one colocated engine (bf16, prefix caching on, a share of the GPU's
  memory: `gpu_memory_utilization`), started from the policy's model directory `source` (an HF id or a local
  directory; `policy.smollm2_dir()` for the embedded model; `tiny` is written to a temporary directory).
- `sync(model)`: the policy's current weights -> the engine, every step (a LoRA policy is sent merged:
  W + s B A per adapted layer, computed without touching the policy's own weights).
- `__call__(model, tokenizer, contexts, *, max_new_tokens, temperature, top_p, stop, ...)`: the signature of
  `sampling.generate`, so `rollout.rollout(..., generate_fn=gen)` needs nothing else. Each row returns
  (gen_ids, gen_logp): the sampled token ids including the token that ended the row (an end-of-turn id, or the
  token completing `</answer>`), and their temperature-1 log-probs (vLLM's default `logprobs_mode`
  "raw_logprobs": log-softmax of the raw logits, before temperature / top-p), exactly the record
  `sampling.generate` keeps. Stop reasons are therefore the same three: end-of-turn id, stop string, length.
  One seed per row is drawn from torch's RNG, so a run stays a function of (seed, step).

Differences from HF generate to expect: vLLM computes in bf16 with its own kernels, so samples and log-probs
differ from the fp32 HF path by bf16 rounding (the update recomputes old log-probs itself when it needs them,
so only the sampling distribution is affected). Prefix caching replaces our KVStore (`kv` / `keys` are
accepted and ignored).

Leaves out: a separate vLLM server (TRL's "server" mode), tensor-parallel engines, sleep mode / memory offload
between rollout and update, multi-process runs (each process would need its own engine on its own GPU:
untested).

Run: `python train.py --rollout-backend vllm --preset paper --model Qwen/Qwen2.5-3B` on a CUDA machine with
`pip install vllm` (a version built for this torch); the default `--rollout-backend hf` works everywhere.
"""
from __future__ import annotations

import importlib.util
import os
import tempfile

import torch

import sampling


def check_available() -> None:
    """ValueError naming --rollout-backend when vllm or a CUDA GPU is missing (config.validate says the same
    before any work)."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("--rollout-backend vllm: vllm is not installed (optional: pip install vllm, on a CUDA "
                         "machine); the default --rollout-backend hf works everywhere")
    if not torch.cuda.is_available():
        raise ValueError("--rollout-backend vllm: needs a CUDA GPU (none is visible); "
                         "the default --rollout-backend hf works everywhere")


def merged_state(model):
    """(name, tensor) pairs of the policy's weights under the base model's parameter names. A peft LoRA policy
    is merged on the fly: name.weight = base_layer.weight + get_delta_weight (= s B A), adapters left as they are."""
    import policy

    if not policy.is_lora(model):
        yield from model.state_dict().items()
        return
    base = model.get_base_model()
    lora = {n: m for n, m in base.named_modules() if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer")}
    for name, t in base.state_dict().items():
        if ".lora_" in name:
            continue
        if ".base_layer." in name:
            mod = name.split(".base_layer.")[0]
            name = name.replace(".base_layer.", ".")
            if name.endswith(".weight") and mod in lora:
                t = t + lora[mod].get_delta_weight(lora[mod].active_adapters[0]).to(t.dtype)
        yield name, t


def _engine_model(llm):
    """The torch module inside a colocated engine (the path differs between vLLM's V1 and V0 engines)."""
    ex = llm.llm_engine.model_executor
    for path in ("driver_worker.worker.model_runner.model", "driver_worker.model_runner.model"):
        obj = ex
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    raise RuntimeError("could not reach the model inside this vLLM engine for the weight sync; "
                       "this vLLM version is not supported by rollout_vllm.py (use --rollout-backend hf)")


class VLLMGenerator:
    """A colocated vLLM engine with `sampling.generate`'s call signature (see the module docstring)."""

    def __init__(self, model, tokenizer, source: str, *, gpu_memory_utilization: float = 0.3,
                 max_model_len: int = 8192, seed: int = 0):
        check_available()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # engine in this process (TRL colocate)
        from vllm import LLM

        self._tmp = None
        if source == "smollm2-135m":               # the embedded model's float cache is an ordinary HF directory
            import policy
            source = str(policy.smollm2_dir())
        elif source == "tiny":                       # a random model has no directory: write one for the engine
            import policy
            self._tmp = tempfile.TemporaryDirectory(prefix="nanoragen-vllm-")
            base = model.get_base_model() if policy.is_lora(model) else model
            base.save_pretrained(self._tmp.name)
            tokenizer.save_pretrained(self._tmp.name)
            source = self._tmp.name
        self.llm = LLM(model=source, dtype="bfloat16", enable_prefix_caching=True, seed=seed,
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len)

    @torch.no_grad()
    def sync(self, model) -> None:
        """Copy the policy's current weights into the engine (call before every rollout) and drop cached
        prefixes computed with the old weights."""
        _engine_model(self.llm).load_weights(merged_state(model))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()

    def __call__(self, model, tokenizer, contexts: list, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop=("</answer>",), bf16=None, kv=None, keys=None) -> list:
        """[(gen_ids, gen_logp)] per context, as `sampling.generate` (bf16, kv, keys: ignored, see above)."""
        from vllm import SamplingParams

        if not contexts:
            return []
        if any(len(c) == 0 for c in contexts):
            raise ValueError("every context needs at least one token")
        eos = sorted(sampling.eos_ids(model, tokenizer))
        seeds = torch.randint(0, 2**31 - 1, (len(contexts),)).tolist()      # from the step's torch seed
        params = [SamplingParams(n=1, temperature=float(temperature), top_p=float(top_p) if temperature > 0 else 1.0,
                                 max_tokens=max_new_tokens, stop=list(stop), include_stop_str_in_output=True,
                                 stop_token_ids=eos, skip_special_tokens=False, logprobs=0, seed=int(s))
                  for s in seeds]
        outs = self.llm.generate([{"prompt_token_ids": list(c)} for c in contexts], params, use_tqdm=False)
        records = []
        for o in outs:                                          # same order as the prompts
            c = o.outputs[0]
            ids = list(c.token_ids)
            logp = [float(step[t].logprob) for t, step in zip(ids, c.logprobs)]
            records.append((ids, logp))
        return records
