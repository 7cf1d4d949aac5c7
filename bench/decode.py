"""Attention of the bf16 sampling copy, transformers' SDPA call vs decode_attention.py: ops and a decode step.

Two measurements, both precisions where bf16 is native, back to back in one process (so a busy machine slows both
sides alike), with the copy bandwidth and the fp32 matmul peak of the same run:
  op      one layer's attention for B rows x 1 query over a ctx-token KV cache (SmolLM2: 9 query heads, 3 KV
          heads, head dim 64), as transformers calls SDPA for it (GQA packed: 3 query rows per KV head, a padding
          mask) and as decode_attention does; the floor is reading K and V once at the copy bandwidth. The
          prefill op: `--prefill` new tokens per row under a causal + padding mask (transformers: repeat_kv, then
          SDPA; ours: SDPA with GQA, the same numbers).
  step    one decode step of `sampling.generate` (bench/phases.py's decode phase: backbone, LM head, KV cache of
          ctx tokens; the turn's first forward left out) on the bf16 sampling copy with each attention; the floor
          is bench/phases.py's roofline: max(weights + KV bytes / copy bandwidth, FLOPs / bf16 matmul peak).

Run:  python bench/decode.py                 (defaults: 64 rows, ctx 128 and 1024, 1 and 2 threads)
      python bench/decode.py --threads 1 --ctx 1024 --rows 64 --steps 4
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import decode_attention  # noqa: E402
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
    fns = {"sdpa": lambda: sdpa_attention_forward(_Heads(), q, k, v, mask),           # "grouped" = ours
           "grouped": ((lambda: (decode_attention.grouped_decode(q, k, v, mask), None)) if Q == 1 else   # the kernel,
                       (lambda: decode_attention.decode_attention(_Heads(), q, k, v, mask)))}  # even in fp32
    err = (fns["sdpa"]()[0].float() - fns["grouped"]()[0].float()).abs().max().item()
    out = {}
    for name, f in fns.items():
        f()
        out[name] = min(phases._timed(f) for _ in range(reps))
    return dict(B=B, ctx=ctx, Q=Q, dtype=str(dtype).split(".")[-1], bytes=2 * k.numel() * k.element_size(), err=err,
                **out)


def step_row(model, tok, B: int, ctx: int, steps: int) -> dict:
    shape = phases.Shape(model, elt=2)
    copy16 = policy.bf16_copy(model)
    out = {}
    for impl in ("sdpa", decode_attention.NAME, "sdpa", decode_attention.NAME):   # twice each, best kept
        copy16.set_attn_implementation(impl)
        row = phases.phase_decode(model, tok, shape, B, ctx, steps, torch.Generator().manual_seed(0), bf16=True)[0]
        out[impl] = min(out.get(impl, float("inf")), row["sec"])
    copy16.set_attn_implementation(decode_attention.NAME)     # what bf16_copy installs
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
                      "| measurement | shape | transformers' SDPA ms | ours ms | speed-up | floor ms | ours / floor | "
                      "max abs diff |", "|---|---|---|---|---|---|---|---|"]
            for dtype in ([torch.float32, torch.bfloat16] if native else [torch.float32]):
                for ctx, Q in [(c, 1) for c in a.ctx] + ([(a.ctx[-1], a.prefill)] if a.prefill > 1 else []):
                    r = op_row(a.rows, ctx, dtype, a.reps, Q)
                    floor = r["bytes"] / bw / 1e9                  # bytes at the copy bandwidth, as bench/phases.py
                    what = "decode op" if Q == 1 else f"prefill op, {Q} new tokens"
                    bound = (f"{1e3 * floor:.2f} | {r['grouped'] / floor:.1f}" if Q == 1 else " | ")   # decode: bytes
                    lines.append(f"| {what}, {r['dtype']} | {a.rows} rows x ctx {ctx}, one layer | {1e3 * r['sdpa']:.2f} |"
                                 f" {1e3 * r['grouped']:.2f} | {r['sdpa'] / r['grouped']:.2f}x | {bound} | "
                                 f"{r['err']:.1e} |")
            if native:
                for ctx in a.ctx:
                    r = step_row(model, tok, a.rows, ctx, a.steps)
                    floor = max(r["bytes"] / bw, r["flops"] / peak16) / 1e9    # phases.table's roofline
                    s, g = r["sdpa"], r[decode_attention.NAME]
                    lines.append(f"| decode step, bf16 copy | {a.rows} rows x ctx {ctx}, all layers + head | "
                                 f"{1e3 * s:.0f} | {1e3 * g:.0f} | {s / g:.2f}x | {1e3 * floor:.0f} | {g / floor:.1f} | |")
            lines.append("")
    finally:
        torch.set_num_threads(threads0)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
