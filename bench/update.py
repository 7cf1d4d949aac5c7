"""The update phase of one step: prepare_batch (+ the separate old-log-prob pass) and update, with and without
reusing the update's own forward for the old log-probs (one epoch over one mini-batch: old = current exactly).

Builds one real batch by rolling out P x G single-turn episodes with the policy, then times, for each setting,
`update.prepare_batch` and `update.update` on a fresh copy of the model (same batch, same starting weights), and
reports the largest parameter difference between the two settings after the update (exactness, not a speed
claim; tests/test_train.py asserts it).

Left out: multi-turn batches (the saving is the same pass, over longer rows), the critic (PPO).
Run: python bench/update.py                                # Countdown, P x G = 8 x 8, 64 tokens (a few minutes)
     python bench/update.py --env bandit --groups 4 --group-size 8 --max-new-tokens 48
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere
import config  # noqa: E402
import filter as rvfilter  # noqa: E402
import policy  # noqa: E402
import rollout  # noqa: E402
import train  # noqa: E402
import update as upd  # noqa: E402


class OneProcess:
    num_processes, process_index, is_main_process, device = 1, 0, True, torch.device("cpu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--env", default="countdown")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="timings per setting (the minimum is reported)")
    args = ap.parse_args(argv)
    targs, _ = config.resolve(["--model", args.model, "--env", args.env, "--algo", "grpo", "--filter", "none",
                               "--groups", str(args.groups), "--group-size", str(args.group_size),
                               "--max-new-tokens", str(args.max_new_tokens), "--mini-batch",
                               str(args.groups * args.group_size), "--micro-batch", str(min(8, args.groups * args.group_size)), "--temperature", "1.0",
                               "--entropy-coef", "0", "--lr", "1e-6"])
    model, tok = policy.load(args.model)
    torch.manual_seed(0)
    trajs = rollout.rollout(model, tok, train.rollout_config(targs), [10000 + i for i in range(args.groups)],
                            args.group_size)
    R = torch.tensor([[t.ret for t in trajs[g * args.group_size:(g + 1) * args.group_size]]
                      for g in range(args.groups)], dtype=torch.float64)
    fres = rvfilter.apply_filter(R, config.filter_config(targs))
    dist, owner = train.Dist(OneProcess()), torch.zeros(args.groups, dtype=torch.long)
    tokens = sum(len(t.gen_ids) for tr in trajs for t in tr.turns)
    rows, finals = [], {}
    for reuse in (False, True):
        best = None
        for _ in range(args.repeats):
            m = copy.deepcopy(model)
            opt = torch.optim.AdamW(m.parameters(), lr=targs.lr)
            t0 = time.perf_counter()
            batch = upd.prepare_batch(trajs, R, owner, fres, m, None, None, tok, targs, dist, reuse_old=reuse)
            t1 = time.perf_counter()
            m.train()
            upd.update(m, None, opt, None, batch, targs, dist)
            t2 = time.perf_counter()
            if best is None or t2 - t0 < best[0] + best[1]:
                best = (t1 - t0, t2 - t1)
            finals[reuse] = torch.cat([p.detach().flatten() for p in m.parameters()])
        rows.append({"old_logp": "from the update's forward" if reuse else "separate pass", "prepare_s": best[0],
                     "update_s": best[1], "total_s": sum(best)})
        print(json.dumps(rows[-1]), flush=True)
    diff = float((finals[True] - finals[False]).abs().max())
    cmd = "python bench/update.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"\n`{cmd.strip()}` ({args.model}, {args.env}, P x G = {args.groups} x {args.group_size}, {tokens} generated "
          f"tokens, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()})\n")
    print("| old log-probs | prepare_batch s | update s | total s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['old_logp']} | {r['prepare_s']:.1f} | {r['update_s']:.1f} | {r['total_s']:.1f} |")
    print(f"\nspeed-up {rows[0]['total_s'] / rows[1]['total_s']:.2f}x; max |parameter difference| after the update: "
          f"{diff:.2e}")


if __name__ == "__main__":
    main()
