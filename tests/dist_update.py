"""Helper for tests/test_train.py: PPO updates (critic, KL, entropy, global whitening, mini-batches that span
processes) on a fixed scripted global batch, run under `torchrun --nproc_per_node {1,2} tests/dist_update.py OUT
MODE`; rank 0 saves the updated parameters to OUT. With 2 processes each process owns one group; the result must
equal the single-process update. MODE "all": 2 groups, no filter. MODE "filtered": 4 groups and the paper's
top-p filter, which drops both groups of process 1 in the first update (it then holds no kept trajectory).
The updates run through the accelerate-prepared modules (distributed.Dist.prepared: DDP, or FSDP2 with
NANORAGEN_CPU_FSDP=1). Before and after the updates (DDP only), the snr.py gradient analysis runs on the same
batch; its norms must match too.
NANORAGEN_TEST_CUDA=1: one GPU per process (NCCL) instead of CPU processes (gloo); bench/gpu_first_run.sh uses it."""
import copy
import os
import sys

import torch

import config
import distributed
import filter as rvfilter
import policy
import train
import update as upd
from test_train import scripted_batch

acc = distributed.make_accelerator(cpu=os.environ.get("NANORAGEN_TEST_CUDA") != "1")   # NANORAGEN_CPU_FSDP=1: FSDP2
dist = train.Dist(acc)
model, tok = policy.load("tiny", seed=0, device=acc.device)
init = {k: v.clone() for k, v in model.state_dict().items()}
ref = copy.deepcopy(model).requires_grad_(False)
mode = sys.argv[2]
groups = [[(" Left", 1.0), (" Right", 0.0), (" Up", 0.5), (" Left please", 1.0)],
          [(" Down", 0.2), (" Right", 0.0), (" Left Left", 0.7), (" Up", 0.1)]]
if mode == "filtered":      # groups 2, 3 (process 1's half) have zero RV: the filter drops them
    groups += [[(" Up", 0.3)] * 4, [(" Down", -0.1), (" Left", -0.1), (" Up", -0.1), (" Right", -0.1)]]
args, _ = config.resolve(["--model", "tiny", "--algo", "ppo", "--groups", str(len(groups)), "--group-size", "4",
                          "--filter", "none" if mode == "all" else "top_p", "--mini-batch", "3", "--micro-batch", "1",
                          "--lr", "1e-3", "--critic-lr", "1e-3", "--entropy-coef", "0.01", "--kl-coef", "0.01",
                          "--no-bf16"])
trajs, R = scripted_batch(tok, groups)
P = len(groups)
owner = torch.arange(P) * dist.world // P                          # W=1: all 0; W=2: first half 0, second 1
local = [t for t in trajs if int(owner[t.group]) == dist.rank]
critic = policy.make_critic(model)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
copt = torch.optim.AdamW(critic.parameters(), lr=args.critic_lr)
dist.prepared(model, policy.TokenLogprobs, opt)          # as train.build_learner: DDP / FSDP wrappers first
dist.prepared(critic, None, copt)
# snr gradient analysis first (it must leave the update unchanged): with 4 groups every bucket holds one group, so
# in "filtered" mode each process has buckets without a single local row and still joins every all-reduce
analysis = (lambda: {}) if dist.fsdp else (    # FSDP: refused by distributed.check_world (gradients are sharded)
    lambda: train.grad_analysis(local, local, R, owner, model, critic, ref, tok, args, dist))
grad = analysis()
for _ in range(2):
    fres = rvfilter.apply_filter(R, config.filter_config(args))
    assert mode == "all" or fres.kept_groups.tolist() == [0, 1]
    batch = upd.prepare_batch(local, R, owner, fres, model, critic, ref, tok, args, dist)
    stats = upd.update(model, critic, opt, copt, batch, args, dist)
# the analysis again after DDP-wrapped updates: its forward runs on the plain modules, outside DDP's gradient hooks
grad_after = analysis()
params = distributed.fsdp_state(model, opt, dist)[0] if dist.fsdp else model.state_dict()   # FSDP: gathered on rank 0
if dist.main:
    torch.save({"params": {k: v.cpu() for k, v in params.items()},
                "init": {k: v.cpu() for k, v in init.items()}, "grad": grad, "grad_after": grad_after, "stats": stats,
                "wrappers": [type(dist.prepared(m)).__name__ for m in (model, critic)]}, sys.argv[1])
acc.wait_for_everyone()
