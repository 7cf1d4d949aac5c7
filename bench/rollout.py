"""Rollout throughput: generated tokens per second and seconds per rollout, fp32 vs bf16 autocast.

Measures `rollout.rollout` end to end (env resets, prompt rendering, one batched `generate` per turn, parsing,
env steps) for P x G envs on each environment and precision, and separately the time spent inside
`generate`. "Generated tokens" counts sampled tokens only (what lands under the loss mask), not the padding
that finished rows carry while the rest of the batch is still generating.

Reference point (issue 3): TRL's GRPOTrainer (bf16, same SmolLM2-135M) takes about 65 s for one single-turn
step of 64 completions x 64 tokens on a 2-core CPU machine, generation plus update: at most
4096 / 65 = 63 generated tokens/s. Our rollouts should be clearly faster per generated token.

bf16 here means `policy.autocast(device, enabled=True)`: weights stay fp32, matmuls run in bf16. On a CPU
without AVX512-BF16/AMX (e.g. AMD Zen 3) bf16 is emulated and usually SLOWER than fp32; `policy.autocast`
therefore only turns it on automatically where `policy.bf16_supported` says the hardware has it.

KV reuse (`RolloutConfig.reuse_kv`, default on): each row keeps its KV states between turns, so a turn encodes
only its new tokens (and a group's shared first prompt once, kept once and read once per decode step:
sampling.generate's share_prompts); "kv-noshare" keeps a copy of that prompt per row (share_prompts=False);
"nokv" re-encodes the whole conversation every turn, as the reference does. The mean context length shows how
much would be re-encoded.

Left out: vLLM / paged attention, speculative decoding, torch.compile (slow to warm up on CPU).

Run (full, ~tens of minutes on 2 cores):  python bench/rollout.py
Quick check:  python bench/rollout.py --groups 2 --group-size 2 --max-new-tokens 16 --max-turns 2 --configs fp32:kv
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere
import decode_attention  # noqa: E402
import policy  # noqa: E402
import sampling  # noqa: E402
import rollout  # noqa: E402

TRL_REFERENCE = {"tokens": 64 * 64, "seconds": 65.0}  # GRPOTrainer bf16, gen + update, 2-core CPU (issue 3)


def timed_generate(stats: dict):
    """Wrap sampling.generate to accumulate wall time, calls and batch rows spent inside generate."""

    def gen(model, tokenizer, contexts, **kw):
        t0 = time.perf_counter()
        out = sampling.generate(model, tokenizer, contexts, drop_every=stats["drop_every"],
                                share_prompts=stats["share_prompts"], **kw)
        stats["gen_s"] += time.perf_counter() - t0
        stats["calls"] += 1
        stats["rows"] += len(contexts)
        stats["prompt_tokens"] += sum(len(c) for c in contexts)
        return out

    return gen


def bench_one(model, tok, env: str, bf16: bool, reuse_kv: bool, args, attention: str = "",
              share_prompts: bool = True) -> dict:
    """One full P x G rollout; returns its timings and counts. attention: the bf16 sampling copy's attention
    implementation for this rollout ("sdpa" = transformers' own; "" = what policy.bf16_copy installs);
    share_prompts: sampling.generate's (a group's first prompt stored and read once)."""
    if bf16:
        copy16 = policy.bf16_copy(model)
        copy16.set_attn_implementation(attention or decode_attention.NAME)
    cfg = rollout.RolloutConfig(env=env, max_new_tokens=args.max_new_tokens, max_turns=args.max_turns or None,
                                bf16=bf16, reuse_kv=reuse_kv)
    seeds = [args.seed + i for i in range(args.groups)]
    stats = {"gen_s": 0.0, "calls": 0, "rows": 0, "prompt_tokens": 0, "drop_every": args.drop_every,
             "share_prompts": share_prompts}
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    trajs = rollout.rollout(model, tok, cfg, seeds, args.group_size, generate_fn=timed_generate(stats))
    total = time.perf_counter() - t0
    gen_tokens = sum(len(t.gen_ids) for tr in trajs for t in tr.turns)
    m = rollout.rollout_metrics(trajs)
    return {"env": env, "precision": ("bf16" if bf16 else "fp32") + (f" ({attention})" if attention else ""),
            "kv_reuse": reuse_kv, "share_prompts": share_prompts and reuse_kv, "seconds": total, "gen_seconds": stats["gen_s"],
            "generated_tokens": gen_tokens, "tokens_per_s": gen_tokens / total,
            "gen_tokens_per_s": gen_tokens / max(stats["gen_s"], 1e-9), "generate_calls": stats["calls"],
            "mean_prompt_tokens": stats["prompt_tokens"] / max(stats["rows"], 1),
            "turns_per_episode": m["turns"], "tokens_per_turn": m["response_tokens"], "success": m["success"],
            "format_ok_rate": m["format_ok_rate"]}


def markdown(rows: list, args) -> str:
    head = ("| env | precision | KV reuse | s / rollout | generated tokens | tokens/s (end to end) "
            "| tokens/s (in generate) | generate calls | mean context tokens | tokens / turn | format ok |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        kv = ("yes, prompt once" if r.get("share_prompts") else "yes") if r["kv_reuse"] else "no"
        lines.append(f"| {r['env']} | {r['precision']} | {kv} | {r['seconds']:.1f} | "
                     f"{r['generated_tokens']} | "
                     f"{r['tokens_per_s']:.1f} | {r['gen_tokens_per_s']:.1f} | {r['generate_calls']} | "
                     f"{r['mean_prompt_tokens']:.0f} | {r['tokens_per_turn']:.1f} | {r['format_ok_rate']:.2f} |")
    ref = TRL_REFERENCE["tokens"] / TRL_REFERENCE["seconds"]
    lines.append(f"| TRL GRPOTrainer (reference: 1 step, 64 x 64 tokens, gen + update) | bf16 | no | "
                 f"{TRL_REFERENCE['seconds']:.0f} | {TRL_REFERENCE['tokens']} | <= {ref:.0f} | | | | 64 | |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="policy.load name")
    ap.add_argument("--envs", nargs="+", default=["frozenlake", "sokoban"])
    ap.add_argument("--configs", nargs="+", default=["fp32:kv", "fp32:nokv", "bf16:kv"],
                    choices=["fp32:kv", "fp32:nokv", "fp32:kv-noshare", "bf16:kv", "bf16:nokv", "bf16:kv-noshare",
                             "bf16-sdpa:kv"],
                    help="precision:KV reuse across turns (nokv = re-encode the conversation every turn; kv-noshare "
                    "= KV reuse with a group's first prompt stored per row, share_prompts=False); "
                    "bf16-sdpa = the bf16 copy with transformers' SDPA for decode instead of decode_attention.py")
    ap.add_argument("--groups", type=int, default=8, help="P")
    ap.add_argument("--group-size", type=int, default=8, help="G")
    ap.add_argument("--max-new-tokens", type=int, default=120, help="per turn (paper: 400)")
    ap.add_argument("--max-turns", type=int, default=0, help="0 = the env's default (5)")
    ap.add_argument("--seed", type=int, default=10000, help="first env seed and torch seed")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch default)")
    ap.add_argument("--drop-every", type=int, default=sampling.DROP_EVERY,
                    help="decode steps between removals of finished rows from the batch (0 = never)")
    ap.add_argument("--out", default="bench/out/rollout.json", help="JSON results (gitignored folder)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = policy.load(args.model)
    device = next(model.parameters()).device
    # warm-up: the first generate call pays one-off costs (kernels, stop-string tables)
    sampling.generate(model, tok, [tok.encode("Hello")], max_new_tokens=2)
    rows = []
    for env in args.envs:
        for config in args.configs:
            precision, kv = config.split(":")
            rows.append(bench_one(model, tok, env, precision.startswith("bf16"), kv != "nokv", args,
                                  "sdpa" if precision == "bf16-sdpa" else "",   # SDPA cannot share a prompt
                                  share_prompts=kv == "kv" and precision != "bf16-sdpa"))
            print(json.dumps(rows[-1]), flush=True)
    cmd = "python bench/rollout.py " + " ".join(sys.argv[1:] if argv is None else argv)
    info = (f"{args.model}, P x G = {args.groups} x {args.group_size}, max_new_tokens {args.max_new_tokens}, "
            f"drop_every {args.drop_every}, device {device}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, "
            f"{platform.processor() or platform.machine()}, native bf16: {policy.bf16_supported(device)}")
    print(f"\n`{cmd.strip()}`  ({info})\n")
    print(markdown(rows, args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": cmd.strip(), "info": info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
