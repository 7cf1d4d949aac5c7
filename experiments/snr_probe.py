"""Probe of paper Fig. 3 on one batch: task vs entropy vs KL gradient norms per RV bucket (snr.py, the library).

Rolls out one batch with the given train.py flags (the policy of --from-run's last checkpoint and that run's
flags, if given; otherwise the initial model), analyses every group unfiltered (train.grad_analysis), prints the
bucket table and saves the figure (report.plot_buckets).

Run:  python experiments/snr_probe.py --model tiny --env bandit --algo grpo --groups 12 --group-size 4   (seconds)
      python experiments/snr_probe.py --env bandit --algo grpo --groups 12 --group-size 8 --temperature 0.7
      python experiments/snr_probe.py --from-run runs/demo-<date> --step 8 --plot fig3.png
Leaves out: nothing of the library; it is the command-line wrapper.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                  # config, policy, train, ... live at the repository root

import torch  # noqa: E402

import config  # noqa: E402
import policy  # noqa: E402
import report  # noqa: E402
import runlog  # noqa: E402
import snr  # noqa: E402
import train  # noqa: E402


def main(argv=None) -> dict:
    """Probe: one rollout batch with the given train.py flags (policy from --from-run's checkpoint if given),
    all groups unfiltered, bucket table printed and Fig. 3 saved."""
    ap = argparse.ArgumentParser(prog="snr_probe.py", description=__doc__.split("\n")[0],
                                 epilog="every other flag is a train.py flag (python train.py --help)")
    ap.add_argument("--from-run", default="", help="the policy (and critic) of this run's last checkpoint, and the "
                    "run's config.json for every train.py flag not given here")
    ap.add_argument("--step", type=int, default=0, help="rollout seeds of this training step [0]")
    ap.add_argument("--plot", default="snr_buckets.png", help="figure path ('' = none) [snr_buckets.png]")
    own, rest = ap.parse_known_args(argv)
    from accelerate import Accelerator
    args, _ = config.resolve(rest, base_run=own.from_run)
    if args.group_size < 2:
        raise ValueError(f"--group-size: RV buckets need G >= 2, got {args.group_size}")
    acc = Accelerator(cpu=args.cpu)
    dist = train.Dist(acc)
    train.check_world(args, dist)
    torch.manual_seed(args.seed)
    model, tok = policy.load(args.model, device=acc.device, seed=args.seed)
    critic = policy.make_critic(model) if args.adv == "gae" else None
    ref = None
    if args.kl_coef > 0:                      # KL to the INITIAL model, as in training (copied before loading)
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    if own.from_run:
        ckpt = runlog.load_checkpoint(own.from_run, rank=dist.rank)
        if ckpt is None:
            raise ValueError(f"--from-run: no checkpoint in {own.from_run}/checkpoints/last")
        model.load_state_dict(ckpt["model"])
        if critic is not None and ckpt["critic"] is not None:
            critic.load_state_dict(ckpt["critic"])
    model.eval()
    torch.manual_seed(train.step_seed(args.seed, own.step, dist.rank))
    local, first, R, _, owner, _ = train.collect(own.step, model, tok, args, train.rollout_config(args), dist)
    m = train.grad_analysis(local, first, R, owner, model, critic, ref, tok, args, dist)
    if dist.main:
        print(snr.report_table(m))
        if own.plot:
            report.plot_buckets(m, own.plot)
            print(f"wrote {own.plot}")
    return m


if __name__ == "__main__":
    main()
