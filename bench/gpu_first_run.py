"""GPU first-run helpers for `bench/gpu_first_run.sh`: an environment report with a bf16 sanity check, and HF
generate vs vLLM rollout throughput on the same envs and seeds.

UNTESTED ON A GPU: written on a machine without one (the `env` step refuses there, with the reason).
Each step prints what it expects next to what it measured; nothing here is asserted by the test suite (speed
lives in bench/).

  env         torch / CUDA / GPU names and count, bf16 support, peft / vllm versions; then the embedded
              SmolLM2's token log-probs on the GPU in fp32 vs bf16 autocast (expected: max |diff| < 0.15 nats,
              bf16 rounding) and vs the CPU (expected: < 1e-3).
  throughput  rollout.rollout on --env with P x G envs, once with HF generate (sampling.generate, bf16 autocast)
              and, when vllm is installed, once with rollout_vllm.VLLMGenerator: generated tokens/s of each
              (expected on one modern GPU with the 135M model: vLLM several times faster than HF generate).

Leaves out: multi-GPU throughput, larger models (pass --model Qwen/Qwen2.5-3B where the hub is reachable).
Run: `python bench/gpu_first_run.py env` and `python bench/gpu_first_run.py throughput --groups 8 --group-size 16`.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import policy  # noqa: E402
import rollout  # noqa: E402


def version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def env_report(args) -> int:
    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, CUDA available {torch.cuda.is_available()}")
    if not torch.cuda.is_available():
        print("error: no CUDA device visible (torch.cuda.is_available() is False): this script is for GPU machines; "
              "install the CUDA build of torch 2.13.0 (see requirements.txt)", file=sys.stderr)
        return 1
    n = torch.cuda.device_count()
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}")
    print(f"bf16 supported: {policy.bf16_supported('cuda')} (expected True on Ampere or newer)")
    print(f"transformers {version('transformers')}, accelerate {version('accelerate')}, peft {version('peft')}, "
          f"vllm {version('vllm')}")
    model, tok = policy.load(args.model, device="cuda")
    ids = torch.tensor([tok.encode("<|im_start|>user\nSolve 2 + 3 and explain.<|im_end|>\n<|im_start|>assistant\n"
                                   "The answer is 5 because two plus three makes five.")], device="cuda")
    attn, mask = torch.ones_like(ids), torch.ones_like(ids)
    mask[:, 0] = 0
    with torch.no_grad():
        fp32, _ = policy.token_logprobs(model, ids, attn, mask)
        with policy.autocast("cuda"):
            bf16, _ = policy.token_logprobs(model, ids, attn, mask)
        cpu_model = model.to("cpu")
        cpu, _ = policy.token_logprobs(cpu_model, ids.cpu(), attn.cpu(), mask.cpu())
    d_bf16 = float((fp32 - bf16).abs().max())
    d_cpu = float((fp32.cpu() - cpu).abs().max())
    print(f"log-probs, GPU fp32 vs GPU bf16 autocast: max |diff| {d_bf16:.4f} nats (expected < 0.15)")
    print(f"log-probs, GPU fp32 vs CPU fp32:          max |diff| {d_cpu:.2e} nats (expected < 1e-3)")
    return 0 if d_bf16 < 0.15 and d_cpu < 1e-3 else 1


def throughput(args) -> int:
    if not torch.cuda.is_available():
        print("error: no CUDA device visible", file=sys.stderr)
        return 1
    model, tok = policy.load(args.model, device="cuda")
    cfg = rollout.RolloutConfig(env=args.env, max_new_tokens=args.max_new_tokens, max_turns=args.max_turns or None)
    seeds = list(range(10000, 10000 + args.groups))
    backends = [("hf generate (bf16 autocast)", None)]
    if importlib.util.find_spec("vllm") is not None:
        import rollout_vllm
        gen = rollout_vllm.VLLMGenerator(model, tok, args.model, gpu_memory_utilization=args.vllm_memory)
        gen.sync(model)
        backends.append(("vllm", gen))
    else:
        print("vllm not installed: only HF generate is measured (pip install vllm to compare)")
    rates = {}
    for name, gen in backends:
        kw = {"generate_fn": gen} if gen else {}
        rollout.rollout(model, tok, cfg, seeds[:1], 2, **kw)                      # warm-up (kernels, engine graphs)
        torch.manual_seed(0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        trajs = rollout.rollout(model, tok, cfg, seeds, args.group_size, **kw)
        torch.cuda.synchronize()
        sec = time.perf_counter() - t
        tokens = sum(sum(tr.loss_mask) for tr in trajs)
        rates[name] = tokens / sec
        m = rollout.rollout_metrics(trajs)
        print(f"{name}: {len(trajs)} episodes, {tokens} generated tokens in {sec:.1f} s = {tokens / sec:.0f} tokens/s "
              f"(success {m['success']:.2f}, format ok {m['format_ok_rate']:.2f})")
    if len(rates) == 2:
        hf, vl = rates.values()
        print(f"vllm / hf generate: {vl / hf:.1f}x (expected: several x on a GPU; < 1x means the engine is "
              "misconfigured or the batch is too small)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["env", "throughput"])
    ap.add_argument("--model", default="smollm2-135m", help="policy.load name")
    ap.add_argument("--env", default="sokoban")
    ap.add_argument("--groups", type=int, default=8, help="P")
    ap.add_argument("--group-size", type=int, default=16, help="G")
    ap.add_argument("--max-new-tokens", type=int, default=400, help="per turn (paper: 400)")
    ap.add_argument("--max-turns", type=int, default=0, help="0 = the env's default")
    ap.add_argument("--vllm-memory", type=float, default=0.3, help="vLLM gpu_memory_utilization")
    args = ap.parse_args(argv)
    return env_report(args) if args.what == "env" else throughput(args)


if __name__ == "__main__":
    sys.exit(main())
