"""Helper for tests/test_train.py: one PPO update (critic, KL, entropy, global whitening, mini-batches that span
processes) on a fixed scripted global batch of 2 groups x 4 trajectories, run under
`torchrun --nproc_per_node {1,2} tests/dist_update.py OUT`; rank 0 saves the updated parameters to OUT.
With 2 processes each process owns one group; the result must equal the single-process update."""
import copy
import sys

import torch
from accelerate import Accelerator

import config
import filter as rvfilter
import policy
import train
from test_train import scripted_batch

acc = Accelerator(cpu=True)
dist = train.Dist(acc)
model, tok = policy.load("tiny", seed=0)
init = {k: v.clone() for k, v in model.state_dict().items()}
ref = copy.deepcopy(model).requires_grad_(False)
args, _ = config.resolve(["--model", "tiny", "--algo", "ppo", "--groups", "2", "--group-size", "4", "--filter", "none",
                          "--mini-batch", "3", "--micro-batch", "1", "--lr", "1e-3", "--critic-lr", "1e-3",
                          "--entropy-coef", "0.01", "--kl-coef", "0.01", "--no-bf16"])
groups = [[(" Left", 1.0), (" Right", 0.0), (" Up", 0.5), (" Left please", 1.0)],
          [(" Down", 0.2), (" Right", 0.0), (" Left Left", 0.7), (" Up", 0.1)]]
trajs, R = scripted_batch(tok, groups)
owner = torch.arange(2) * dist.world // 2                          # W=1: [0, 0]; W=2: [0, 1]
local = [t for t in trajs if int(owner[t.group]) == dist.rank]
critic = policy.make_critic(model)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
copt = torch.optim.AdamW(critic.parameters(), lr=args.critic_lr)
for _ in range(2):
    fres = rvfilter.apply_filter(R, config.filter_config(args))
    batch = train.prepare_batch(local, R, owner, fres, model, critic, ref, tok, args, dist)
    train.update(model, critic, opt, copt, batch, args, dist)
if dist.main:
    torch.save({"params": model.state_dict(), "init": init}, sys.argv[1])
acc.wait_for_everyone()
