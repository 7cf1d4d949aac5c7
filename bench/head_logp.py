"""log p(y) + entropy of the LM head's logits, forward + backward: autograd's formulation vs head_logp.py.

The elementwise part of policy.token_logprobs after the head matmul, on n scored tokens x SmolLM2's 49 152-token
vocabulary (random logits, T = 1, loss = sum logp + 0.01 sum entropy), in bf16 and fp32 logits, best of --reps,
with the largest difference of each output from autograd's. Never asserted in tests (tests/test_head_logp.py
checks the values and gradients against fp64).

Run:  python bench/head_logp.py                 (n = 800, 2 threads)
      python bench/head_logp.py --rows 1600 --threads 1
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import head_logp  # noqa: E402
import policy  # noqa: E402  (training's allocator setting: huge pages where the kernel offers them)


def autograd_version(z, y, T, with_entropy):
    """What policy._head_logp computed before head_logp.py (autograd does the backward)."""
    la = F.log_softmax(z.float() / T, dim=-1)
    lp = la.gather(-1, y[:, None]).squeeze(-1)
    return lp, (-(la.exp() * la).sum(-1) if with_entropy else lp.new_empty(0))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=800, help="scored tokens n")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=4)
    a = ap.parse_args(argv)
    for name, v in (("--rows", a.rows), ("--vocab", a.vocab), ("--threads", a.threads), ("--reps", a.reps)):
        if v < 1:
            ap.error(f"{name} must be >= 1, got {v}")
    before = torch.get_num_threads()
    torch.set_num_threads(a.threads)
    try:
        g = torch.Generator().manual_seed(0)
        print(f"n = {a.rows} x V = {a.vocab}, {a.threads} threads, {platform.processor() or platform.machine()}, "
              f"torch {torch.__version__}, huge pages: {policy.huge_pages()}")
        print("| logits | autograd ms | head_logp.py ms | speed-up | max diff logp / entropy / grad |")
        print("|---|---|---|---|---|")
        for dtype in (torch.bfloat16, torch.float32):
            z0 = (torch.randn(a.rows, a.vocab, generator=g) * 3).to(dtype)
            y = torch.randint(0, a.vocab, (a.rows,), generator=g)
            res = {}
            for name, fn in (("autograd", autograd_version), ("ours", head_logp.logp_entropy)):
                def step():
                    z = z0.clone().requires_grad_(True)
                    lp, ent = fn(z, y, 1.0, True)
                    (lp.sum() + 0.01 * ent.sum()).backward()
                    return lp.detach(), ent.detach(), z.grad
                step()
                best = float("inf")
                for _ in range(a.reps):
                    t = time.perf_counter()
                    out = step()
                    best = min(best, time.perf_counter() - t)
                res[name] = (best, out)
            diffs = " / ".join(f"{(u.float() - v.float()).abs().max().item():.1e}"
                               for u, v in zip(res["autograd"][1], res["ours"][1]))
            print(f"| {str(dtype).split('.')[-1]} | {res['autograd'][0] * 1e3:.1f} | {res['ours'][0] * 1e3:.1f} | "
                  f"{res['autograd'][0] / res['ours'][0]:.2f}x | {diffs} |")
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__":
    main()
