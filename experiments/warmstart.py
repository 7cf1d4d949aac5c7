"""A shared warm start for the multi-turn protocol: supervised fine-tuning on scripted FrozenLake episodes.

Why: RL cannot start on FrozenLake from the untrained SmolLM2. With the protocol's prompt (3 turns x 48 tokens) it
wrote no valid move in 96 turns at temperature 0.7 or 1.0 (it copies the prompt's "[Your answer]" placeholder), so
every return is -0.3, every group has zero reward variance and GRPO / Dr.GRPO advantages are all 0 (the command in
experiments/multiturn.md). Every arm and seed therefore starts from one checkpoint in which the format is learnt.

What it implements: a teacher that reads the observation text the model sees (the last Player / Goal / Holes
lines of the context), plans the shortest hole-free path (envs.lake_path) and writes a turn
`<think> ...facts of this map and the plan... </think> <answer>a1 || a2</answer>`, its wording drawn from a few
phrasings (seeded), so the reasoning depends on the input and is not one fixed string. Its episodes are produced by
rollout.rollout itself (generate_fn = the teacher), on maps never used for training or validation (seeds from
1_000_000), so the prompts, chat template and token masks are exactly the rollout's. Then a few epochs of
next-token cross-entropy on the sampled (teacher) tokens only, AdamW, fp32, and `save_pretrained` of model and
tokenizer into a directory that `train.py --model DIR` loads (the frozen MI scorer and the KL reference of the
arms are then this warm start). `warmstart.json` records how it was made, the sha256 of the weights file and, per
tensor, the L2 norm of what the fine-tuning changed (||w - w_base||): the same command gives the same sha256 on one
kind of CPU and, on another, update norms equal to rounding (`same_warm_start`; the norms of the weights
themselves would not do: the base model's are within 1e-3 of the warm start's).

What it leaves out: other envs (the teacher is FrozenLake's); slips (the plan assumes the ice is not slippery:
under slip it replans every turn from the observed position, which is what it reads); LoRA.

Run: python experiments/warmstart.py OUT_DIR [--model smollm2-135m] [--episodes 64] [--epochs 2] [--lr 1e-4]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))       # the project's modules live at the root
import envs  # noqa: E402
import policy  # noqa: E402
import rollout  # noqa: E402

DEMO_SEED = 1_000_000                        # far from --train-seed 10000 + s*P and --val-seed 123 (+ i)
INFO = "warmstart.json"
CELL = r"\((\d+), (\d+)\)"
OPENINGS = ["I am at {p} and the goal is at {g}.", "The player stands on {p}; the goal is {g}.",
            "Position {p}, goal {g}."]
HOLES = ["Holes to avoid: {h}.", "The holes are at {h}.", "I must not step on {h}."]
NO_HOLES = ["There are no holes.", "No holes on this board."]
PLANS = ["A safe shortest path is {path}, so I move {now}.", "Shortest safe route: {path}. Next: {now}.",
         "Going {path} reaches the goal without a hole; now {now}."]


ROUNDING = 1e-3  # relative: two builds of one warm start on different CPU kinds differ by fp32 rounding only
NEGLIGIBLE = 1e-6  # absolute, on an update norm: a tensor the fine-tuning moved by less is not compared relatively


def same_warm_start(old: dict, new: dict) -> str:
    """How two warmstart.json records compare: "identical" (same sha256), "rounding" (same flags and demonstrations,
    the losses and, where both records have them, the per-tensor update norms within ROUNDING relative: fp32
    rounding of another CPU's kernels), or "" (another warm start)."""
    if old.get("sha256") and old.get("sha256") == new.get("sha256"):
        return "identical"
    close = lambda a, b, atol=0.0: abs(a - b) <= ROUNDING * max(abs(a), abs(b)) + atol  # noqa: E731
    keys = ("model", "seed", "env_options", "max_turns", "max_new_tokens", "episodes", "demo_seeds", "epochs", "lr",
            "micro_batch", "teacher_tokens")
    if any(old.get(k) != new.get(k) for k in keys) or len(old.get("loss_per_epoch", [])) != len(new["loss_per_epoch"]):
        return ""
    if not all(close(a, b) for a, b in zip(old["loss_per_epoch"], new["loss_per_epoch"])):
        return ""
    d_old, d_new = old.get("delta_norms"), new.get("delta_norms")
    if d_old is not None and d_new is not None and (
            d_old.keys() != d_new.keys() or not all(close(d_old[k], d_new[k], NEGLIGIBLE) for k in d_old)):
        return ""
    return "rounding"


def update_norms(base: dict, model) -> dict:
    """Per tensor, ||w - w_base|| (7 significant digits): what the fine-tuning changed."""
    return {k: float(f"{(v.float() - base[k].float()).norm():.7g}") for k, v in sorted(model.state_dict().items())}


def read_state(text: str) -> tuple:
    """(size, player, goal, holes) from the LAST observation in `text` (the grid_coord block of FrozenLake)."""
    size = int(re.findall(r"Board size: (\d+) rows", text)[-1])
    obs = text[text.rfind("Board size:"):]
    cell = lambda name: tuple(int(x) for x in re.search(rf"\n{name}: {CELL}", obs).groups())  # noqa: E731
    player = cell("Player")
    goal = cell("Goal")
    m = re.search(r"\nHoles: (.*)\n", obs)
    holes = [tuple(int(x) for x in c) for c in re.findall(CELL, m.group(1))] if m else []
    return size, player, goal, holes


def teacher_turn(text: str, per_turn: int, rng: random.Random, fits=lambda s: True) -> str:
    """One teacher reply (after the forced "<think>") for the observation at the end of `text`: the most detailed
    of (opening, holes, plan) / (opening, plan) / (plan) / (the bare moves) for which fits(reply) holds (the
    token budget of a turn)."""
    size, player, goal, holes = read_state(text)
    grid = np.zeros((size, size), dtype=bool)
    for h in holes:
        grid[h] = True
    path = envs.lake_path(grid, player, goal) or []
    now = path[:per_turn]
    fmt = lambda c: f"({c[0]}, {c[1]})"  # noqa: E731
    opening = rng.choice(OPENINGS).format(p=fmt(player), g=fmt(goal))
    hole = rng.choice(HOLES).format(h=", ".join(fmt(h) for h in holes)) if holes else rng.choice(NO_HOLES)
    plan = rng.choice(PLANS).format(path=", ".join(path) or "none", now=" then ".join(now) or "nowhere")
    answer = f" </think> <answer>{' || '.join(now)}</answer>"
    for parts in ([opening, hole, plan], [opening, plan], [plan], [f"Next: {' then '.join(now) or 'nowhere'}."]):
        reply = f" {' '.join(parts)}{answer}"
        if fits(reply):
            break
    return reply


def demonstrations(model, tok, cfg: rollout.RolloutConfig, n: int, seed: int = 0) -> list:
    """n teacher episodes (rollout.Trajectory, one per map DEMO_SEED + i), rendered by the rollout itself."""
    rng = random.Random(seed)
    per_turn = envs.make_env(cfg.env, **rollout.stated_env_options(cfg)).max_actions_per_turn

    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    fits = lambda s: len(enc(s)) + 1 <= cfg.max_new_tokens   # + the end-of-turn token  # noqa: E731

    def teacher(model, tokenizer, contexts, **kw):
        out = []
        for c in contexts:
            ids = enc(teacher_turn(tokenizer.decode(c), per_turn, rng, fits))
            out.append((ids, [0.0] * len(ids)))
        return out
    return rollout.rollout(model, tok, cfg, [DEMO_SEED + i for i in range(n)], 1, generate_fn=teacher)


def sft(model, tok, trajs, *, epochs: int, lr: float, micro_batch: int = 8, seed: int = 0) -> list:
    """Next-token cross-entropy on the loss-masked (teacher) tokens, one AdamW step per micro-batch; returns the
    mean loss of every epoch (nats/token)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(epochs):
        order, total, count = torch.randperm(len(trajs), generator=g).tolist(), 0.0, 0
        for s in range(0, len(order), micro_batch):
            b = rollout.to_tensors([trajs[i] for i in order[s:s + micro_batch]], tok.pad_token_id)
            lp, _ = policy.token_logprobs(model, b["input_ids"], b["attention_mask"], b["loss_mask"])   # (B, T)
            n_tok = b["loss_mask"].sum()
            loss = -lp.sum() / n_tok
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            total, count = total + loss.item() * int(n_tok), count + int(n_tok)
        losses.append(total / max(count, 1))
    model.eval()
    return losses


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", help="new directory for the warm-started model (train.py --model OUT_DIR)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seed", type=int, default=0, help="tiny-model init, phrasing draws and batch order")
    ap.add_argument("--env-options", default="{}", help="FrozenLake options, JSON (as train.py)")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48, help="the protocol's per-turn cap (stated in the "
                    "prompt; the teacher's turns are shorter)")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--micro-batch", type=int, default=8)
    a = ap.parse_args(argv)
    for name in ("max_turns", "max_new_tokens", "episodes", "epochs", "micro_batch"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not a.lr > 0:
        ap.error(f"--lr must be > 0, got {a.lr}")
    out = Path(a.out_dir)
    if out.exists() and any(out.iterdir()):
        ap.error(f"{out} exists and is not empty; choose another directory")
    try:
        options = json.loads(a.env_options)
        cfg = rollout.RolloutConfig(env="frozenlake", env_options=options, max_turns=a.max_turns,
                                    max_new_tokens=a.max_new_tokens, bf16=False)
        envs.make_env("frozenlake", **rollout.stated_env_options(cfg))
    except ValueError as e:
        ap.error(f"--env-options / --max-turns: {e}")
    torch.manual_seed(a.seed)
    t0 = time.perf_counter()
    model, tok = policy.load(a.model, seed=a.seed)
    trajs = demonstrations(model, tok, cfg, a.episodes, a.seed)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    losses = sft(model, tok, trajs, epochs=a.epochs, lr=a.lr, micro_batch=a.micro_batch, seed=a.seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    weights = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    info = {"sha256": weights, "delta_norms": update_norms(base, model), "model": a.model, "seed": a.seed, "env": "frozenlake", "env_options": options, "max_turns": a.max_turns,
            "max_new_tokens": a.max_new_tokens, "episodes": a.episodes, "demo_seeds": [DEMO_SEED, DEMO_SEED + a.episodes],
            "epochs": a.epochs, "lr": a.lr, "micro_batch": a.micro_batch, "loss_per_epoch": losses,
            "teacher_success": sum(t.success for t in trajs) / len(trajs),
            "teacher_tokens": sum(sum(t.loss_mask) for t in trajs), "seconds": time.perf_counter() - t0}
    (out / INFO).write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))
    return out


if __name__ == "__main__":
    main()
