"""Attention of the bf16 sampling copy, transformers' SDPA call vs decode_attention.py: ops and a decode step.

Two measurements, both precisions where bf16 is native, back to back in one process (so a busy machine slows both
sides alike), with the copy bandwidth and the fp32 matmul peak of the same run:
  op      one layer's attention for B rows x 1 query over a ctx-token KV cache (SmolLM2: 9 query heads, 3 KV
          heads, head dim 64), as transformers calls SDPA for it (GQA packed: 3 query rows per KV head, a padding
          mask), as decode_attention's batched matmuls do it (decode_kernel.py off; in the step rows that means
          SDPA for fp32, as decode_attention routes it without the kernel) and as decode_kernel.py does it; the floor is reading K and V once at the copy bandwidth. The prefill op: `--prefill` new tokens per
          row under a causal + padding mask (transformers: repeat_kv, then SDPA; ours: SDPA with GQA, the same
          numbers; no kernel column).
  step    one decode step of `sampling.generate` (bench/phases.py's decode phase: backbone, LM head, KV cache of
          ctx tokens; the turn's first forward left out), fp32 and on the bf16 sampling copy, with each attention;
          the floor is bench/phases.py's roofline: max(weights + KV bytes / copy bandwidth, FLOPs / matmul peak).

Run:  python bench/decode.py                 (defaults: 64 rows, ctx 128 and 1024, 1 and 2 threads)
      python bench/decode.py --threads 1 --ctx 1024 --rows 64 --steps 4
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import decode_attention  # noqa: E402
import decode_kernel  # noqa: E402
import policy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import phases  # noqa: E402


class _Heads:                                              # what transformers' attention functions read off a module
    num_key_value_groups = 3
    is_causal = True


def op_row(B: int, ctx: int, dtype, reps: int, Q: int = 1) -> dict:
    H, KVH, D = 9, 3, 64
    q = torch.randn(B, H, Q, D, dtype=dtype)
    k, v = torch.randn(B, KVH, ctx, D, dtype=dtype), torch.randn(B, KVH, ctx, D, dtype=dtype)
    mask = torch.tril(torch.ones(Q, ctx, dtype=torch.bool), diagonal=ctx - Q)[None, None].repeat(B, 1, 1, 1)
    mask[::2, ..., : ctx // 8] = False                       # causal, and left padding on half the rows
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    ours = ((lambda: (decode_attention.grouped_decode(q, k, v, mask), None)) if Q == 1 else    # even in fp32
            (lambda: decode_attention.decode_attention(_Heads(), q, k, v, mask)))
    fns = {"sdpa": lambda: sdpa_attention_forward(_Heads(), q, k, v, mask), "matmul": ours}
    if Q == 1 and decode_kernel.op() is not None:
        fns["kernel"] = ours                                             # grouped_decode takes the kernel when on
    out, got = {}, {}
    for name, f in fns.items():
        with (decode_kernel.off() if name == "matmul" else contextlib.nullcontext()):
            got[name] = f()[0].float()
            out[name] = min(phases._timed(f) for _ in range(reps))
    best = "kernel" if "kernel" in out else "matmul"
    err = (got["sdpa"] - got[best]).abs().max().item()
    return dict(B=B, ctx=ctx, Q=Q, dtype=str(dtype).split(".")[-1], bytes=2 * k.numel() * k.element_size(), err=err,
                best=best, **out)


def step_row(model, tok, B: int, ctx: int, steps: int, bf16: bool) -> dict:
    """Seconds per decode step with SDPA, decode_attention's matmuls and the kernel (twice each, best kept)."""
    shape = phases.Shape(model, elt=2 if bf16 else 4)
    run = policy.bf16_copy(model) if bf16 else model
    ways = [("sdpa", "sdpa"), ("matmul", decode_attention.NAME)]
    ways += [("kernel", decode_attention.NAME)] if decode_kernel.op() is not None else []
    out = {}
    try:
        for name, impl in ways + ways:
            run.set_attn_implementation(impl)
            with (decode_kernel.off() if name == "matmul" else contextlib.nullcontext()):
                row = phases.phase_decode(model, tok, shape, B, ctx, steps, torch.Generator().manual_seed(0),
                                          bf16=bf16)[0]
            out[name] = min(out.get(name, float("inf")), row["sec"])
    finally:
        run.set_attn_implementation(decode_attention.NAME)     # what policy.load / bf16_copy install
    return dict(B=B, ctx=ctx, bytes=row["bytes"], flops=row["flops"], **out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--ctx", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=4, help="decode steps per step measurement")
    ap.add_argument("--prefill", type=int, default=64, help="new tokens per row of the prefill op (0: skip it)")
    ap.add_argument("--reps", type=int, default=10, help="repetitions of the op measurement (best kept)")
    ap.add_argument("--model", default="smollm2-135m")
    a = ap.parse_args(argv)
    native = policy.bf16_supported("cpu")
    model, tok = policy.load(a.model)
    model.eval()
    lines = [f"`python bench/decode.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
             f"({a.model}, torch {torch.__version__}, {platform.machine()}, native bf16: {native}, "
             f"decode_kernel: {decode_kernel.status()}, "
             f"{time.strftime('%Y-%m-%d')})", ""]
    threads0 = torch.get_num_threads()          # restored: a caller's later work (a test suite) keeps its threads
    try:
        for threads in a.threads:
            torch.set_num_threads(threads)
            bw, peak = phases.copy_bandwidth(), phases.matmul_peak()
            peak16 = phases.matmul_peak(dtype=torch.bfloat16) if native else float("nan")
            load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
            lines += [f"**{threads} thread(s)**: copy bandwidth {bw:.1f} GB/s, fp32 / bf16 matmul peak {peak:.0f} / "
                      f"{peak16:.0f} GFLOP/s, load average {load}", "",
                      "| measurement | shape | transformers' SDPA ms | ours without the kernel ms | ours, kernel ms | "
                      "SDPA / best of ours | floor ms | best of ours / floor | max abs diff (best of ours vs SDPA) |",
                      "|---|---|---|---|---|---|---|---|---|"]

            def cells(r, floor):
                best = r.get("kernel", r["matmul"])
                kernel = f"{1e3 * r['kernel']:.2f}" if "kernel" in r else "-"
                bound = f"{1e3 * floor:.2f} | {best / floor:.1f}" if floor else " | "
                return f"{1e3 * r['sdpa']:.2f} | {1e3 * r['matmul']:.2f} | {kernel} | {r['sdpa'] / best:.2f}x | {bound}"
            for dtype in ([torch.float32, torch.bfloat16] if native else [torch.float32]):
                for ctx, Q in [(c, 1) for c in a.ctx] + ([(a.ctx[-1], a.prefill)] if a.prefill > 1 else []):
                    r = op_row(a.rows, ctx, dtype, a.reps, Q)
                    floor = r["bytes"] / bw / 1e9 if Q == 1 else 0    # bytes at the copy bandwidth, as phases.py
                    what = "decode op" if Q == 1 else f"prefill op, {Q} new tokens"
                    lines.append(f"| {what}, {r['dtype']} | {a.rows} rows x ctx {ctx}, one layer | {cells(r, floor)} | "
                                 f"{r['err']:.1e} |")
            for bf16 in ([False, True] if native else [False]):
                for ctx in a.ctx:
                    r = step_row(model, tok, a.rows, ctx, a.steps, bf16)
                    floor = max(r["bytes"] / bw, r["flops"] / (peak16 if bf16 else peak)) / 1e9   # phases' roofline
                    lines.append(f"| decode step, {'bf16 copy' if bf16 else 'fp32'} | {a.rows} rows x ctx {ctx}, "
                                 f"all layers + head | {cells(r, floor)} | |")
            lines.append("")
    finally:
        torch.set_num_threads(threads0)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
