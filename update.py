"""One update from a kept batch: training tensors, old/reference log-probs and values, advantages, and the
mini-batch PPO-style optimizer steps (paper §2.1, §4.1).

train.py calls `prepare_batch` then `update` once per step, after the filter. The formulas are in algos.py
(advantages, clipped surrogate, aggregation, KL, entropy, value loss); this file is the machinery around them:

  prepare_batch   kept trajectories -> (B, T) tensors in GLOBAL kept order; old log-probs at the rollout temperature
                  (skipped when the update is one pass over one mini-batch: then old = current exactly, and the
                  update's own forward supplies them, as TRL does), reference log-probs (KL on), values (PPO);
                  GAE (+ whitening over every process's tokens) or group advantages (GRPO / Dr.GRPO), times the
                  filter's soft weights and loss scale.
  plan            mini-batches cut from the global kept order, each with its global normaliser (tokens or
                  sequences, algos.agg_count), as local micro-batch row lists, padded so that every process runs
                  the same number of micro-batches.
  update          --ppo-epochs passes over the plan: every micro-batch loss is weighted by its share of the
                  mini-batch's global normaliser; forward and backward run through the accelerate-prepared model
                  (DDP or FSDP2 under torchrun), which sums the gradients over processes at a mini-batch's last
                  micro-batch; then clip and step; non-finite norms skip the step (same decision everywhere).

Distributed (DDP or FSDP2 through `accelerate`, distributed.Dist.prepared): the filter leaves processes with
different numbers of kept trajectories (possibly none), while DDP and FSDP need every process in the same backward.
So the plan pads each process to the same number of micro-batches with zero-weight ones (`padding_backward`),
gradients accumulate locally under `no_sync` until the mini-batch's last micro-batch, and losses are scaled by the
number of processes (the wrappers average; the global normalisers already divide). The result equals the
single-process update on the same global batch (tests/test_train.py, tests/dist_update.py).
Leaves out: the reference's padding of the kept batch by duplicated rows, critic warm-up, value-head pretraining.
Run the tests: `.venv/bin/python -m pytest tests/test_train.py -q`.
"""
from __future__ import annotations

import contextlib

import torch

import algos
import config
import policy
import rollout


def group_advantages(R: torch.Tensor, keep2d: torch.Tensor, normalize_std: bool) -> torch.Tensor:
    """GRPO / Dr.GRPO advantages (P', G), statistics over the kept members of each group (all of them at prompt
    level; the top-k + bottom-k at trajectory level)."""
    adv = torch.zeros_like(R)
    for g in range(R.shape[0]):
        idx = keep2d[g].nonzero().squeeze(1)
        if len(idx):
            adv[g, idx] = algos.grpo_advantages(R[g, idx][None], normalize_std=normalize_std)[0]
    return adv


def whiten_global(adv: torch.Tensor, mask: torch.Tensor, dist) -> torch.Tensor:
    """algos.whiten with mean/unbiased variance over the masked tokens of ALL processes."""
    m = mask.to(torch.float64)
    a = adv.to(torch.float64)
    s = dist.sum_(torch.stack([(a * m).sum(), m.sum()]))                # two passes: the one-pass formula
    if s[1] < 2:                                                       # goes negative for constant advantages
        raise ValueError(f"whitening needs >= 2 generated tokens in the batch, got {int(s[1])}")
    mean = s[0] / s[1]
    var = dist.sum_((((a - mean) ** 2) * m).sum()[None])[0] / (s[1] - 1)
    return ((a - mean) * torch.rsqrt(var + 1e-8) * m).to(adv.dtype)


def plan(batch, args, dist) -> list:
    """Mini-batches cut from the GLOBAL kept order (so the update is the same for any number of processes), each
    as (global normaliser, [local micro-batch row indices]). The old-log-prob pass uses the same micro-batches,
    so a row is always scored together with the same rows (with prefix sharing under bf16 that keeps the first
    PPO ratio at exactly 1)."""
    agg = args.loss_agg
    counts = dict(zip(dist.gather(batch["gidx"].tolist()),
                      dist.gather([float(algos.agg_count(m[None], agg)) for m in batch["loss_mask"]])))
    pos = {g: i for i, g in enumerate(batch["gidx"].tolist())}          # global id -> local row
    order = sorted(counts)                                             # global kept trajectory ids
    out = []
    for s in range(0, len(order), args.mini_batch):
        mb = order[s:s + args.mini_batch]
        rows = [pos[g] for g in mb if g in pos]
        out.append((max(sum(counts[g] for g in mb), 1.0),
                    [torch.tensor(rows[u:u + args.micro_batch]) for u in range(0, len(rows), args.micro_batch)]))
    # every process runs the same number of micro-batches per mini-batch (DDP's collectives run in lock step):
    # the ones a process lacks are padding (None), a zero-weight forward/backward (`padding_backward`)
    width = [max(col) for col in zip(*dist.gather([[len(micros) for _, micros in out]]))] if out else []
    return [(denom, micros + [None] * (w - len(micros))) for (denom, micros), w in zip(out, width)]


def padding_backward(fwd, vfwd, dev, args) -> None:
    """A zero-weight micro-batch (one 2-token row, loss x 0): the process runs the same forward/backward as the
    others, so the wrapper's collectives (DDP's all-reduce, FSDP's reduce-scatter) have a partner; it adds exactly 0
    to every gradient."""
    ids = torch.zeros(1, 2, dtype=torch.long, device=dev)
    attn, mask = torch.ones_like(ids), torch.tensor([[0, 1]], device=dev)
    with policy.autocast(dev, enabled=config.bf16(args)):
        logp, ent = fwd(ids, attn, mask, with_entropy=True, temperature=args.temperature)
    (0.0 * (logp.sum() + ent.sum())).backward()
    if vfwd is not None:
        with policy.autocast(dev, enabled=config.bf16(args)):
            v = vfwd(ids, attn)
        (0.0 * v.sum()).backward()


def loss_terms(logp, ent, old_logp, batch, r, mask, args) -> dict[str, torch.Tensor]:
    """The policy's loss terms for micro-batch rows r, aggregated by --loss-agg and WITHOUT coefficients:
    pg (clipped surrogate), entropy (the bonus H), kl (only when --kl-coef > 0). Also snr.py's components."""
    dev, agg = logp.device, args.loss_agg
    out = {"pg": algos.policy_loss(logp, old_logp, batch["adv"][r].to(dev), mask, args.clip_low, args.clip_high,
                                   agg, args.clip_c, norm_len=config.loss_norm_len(args)),
           "entropy": algos.entropy_bonus(ent, mask, agg, norm_len=config.loss_norm_len(args))}
    if args.kl_coef > 0:
        out["kl"] = algos.agg_loss(algos.kl_term(logp, batch["ref_logp"][r].to(dev), args.kl_kind), mask, agg,
                                   norm_len=config.loss_norm_len(args))
    return out


@contextlib.contextmanager
def accumulate(dist, modules, last: bool):
    """Gradients of every micro-batch but a mini-batch's last one accumulate locally (no communication)."""
    with contextlib.ExitStack() as stack:
        for m in modules:
            if m is not None:
                stack.enter_context(dist.no_sync(m, skip=not last))
        yield


def micro_backward(fwd, vfwd, batch, r, denom, dev, args, W: int, share_prefix: bool) -> torch.Tensor:
    """Forward and backward of micro-batch rows r: the objective (and the critic's value loss) weighted by the
    micro-batch's share of the mini-batch's global normaliser, x W (the wrapper averages over W processes).
    Returns its share of the logged statistics: pg, entropy, kl, value_loss, clipfrac, ppo_kl, then the raw sum
    of token entropies over its loss-mask tokens and their count (train/token_entropy: nats/token whatever the
    aggregation; `entropy` is the bonus H in the aggregation's units, e.g. nats/sequence under Dr.GRPO's
    seq-mean-token-sum)."""
    agg = args.loss_agg
    ids, attn, mask = (batch[k][r].to(dev) for k in ("input_ids", "attention_mask", "loss_mask"))
    share = float(algos.agg_count(mask, agg)) / denom  # micro-batch's part of the global normaliser
    out = torch.zeros(8, dtype=torch.float64)
    with policy.autocast(dev, enabled=config.bf16(args)):
        logp, ent = fwd(ids, attn, mask, with_entropy=True, temperature=args.temperature, share_prefix=share_prefix)
    adv = batch["adv"][r].to(dev)
    old = logp.detach() if batch["old_logp"] is None else batch["old_logp"][r].to(dev)
    terms = loss_terms(logp, ent, old, batch, r, mask, args)
    pg, h = terms["pg"], terms["entropy"]
    loss = algos.objective(pg, h, terms.get("kl"), args.entropy_coef, args.kl_coef)  # pg - b_H*H + b_KL*KL
    (loss * share * W).backward()
    ps = algos.policy_loss_stats(logp.detach(), old, adv, mask, args.clip_low, args.clip_high, args.clip_c)
    out[[0, 1, 4, 5]] = torch.tensor([float(pg.detach()), float(h.detach()), ps["pg_clipfrac"], ps["ppo_kl"]],
                                     dtype=torch.float64) * share        # entropy logged whatever its coefficient
    m = algos._mask_like(mask, ent, "entropy").detach().double()
    out[6], out[7] = float((ent.detach().double() * m).sum()), float(m.sum())           # token-mean entropy parts
    if args.kl_coef > 0:
        out[2] = float(terms["kl"].detach()) * share
    if vfwd is not None:
        with policy.autocast(dev, enabled=config.bf16(args)):
            v = vfwd(ids, attn, share_prefix=share_prefix)
        vl = algos.value_loss(v, batch["values"][r].to(dev), batch["returns_tok"][r].to(dev), mask,
                              args.value_clip, agg, norm_len=config.loss_norm_len(args))
        (vl * share * W).backward()
        out[3] = float(vl.detach()) * share
    return out


def update(model, critic, opt, copt, batch, args, dist) -> dict:
    """Mini-batch PPO-style updates on the kept batch (batch["plan"], see `plan`). Every loss term of a micro-batch
    is weighted by its share of the mini-batch's global normaliser, so gradient accumulation over micro-batches
    and the sum over processes reproduce the aggregation mode exactly. The forward/backward runs through the
    accelerate-prepared modules (`dist.prepared`: DDP or FSDP2 under torchrun), which reduce the gradients in the
    backward of a mini-batch's last micro-batch; both average over the W processes, so losses are scaled by W to
    make that average the sum. Returns statistics reduced over processes."""
    dev, W = next(model.parameters()).device, dist.world
    fwd = dist.prepared(model, policy.TokenLogprobs, opt)   # (ids, attn, mask) -> per-token log-probs, entropies
    vfwd = dist.prepared(critic, None, copt) if critic is not None else None    # (ids, attn) -> values
    for module in (model, critic):
        if module is not None:
            dist.reshard(module)             # FSDP: the same clean state on every process (a no-op otherwise)
    stats = torch.zeros(10, dtype=torch.float64)  # pg, entropy, kl, value_loss, clipfrac, ppo_kl, ent_sum, n_tok,
    #                                               grad_norm, skipped
    n_updates, critic_skipped = 0, 0
    for _ in range(args.ppo_epochs):
        for denom, micros in batch["plan"]:
            for i, r in enumerate(micros):
                with accumulate(dist, (fwd, vfwd), last=i == len(micros) - 1):
                    if r is None:                                      # this process has no rows here
                        padding_backward(fwd, vfwd, dev, args)
                    else:
                        stats[:8] += micro_backward(fwd, vfwd, batch, r, denom, dev, args, W, dist.share_prefix)
            for module, optim in ((model, opt), (critic, copt)):       # gradients are now the global sums
                if module is None:
                    continue
                norm = torch.nn.utils.clip_grad_norm_(module.parameters(), args.grad_clip)
                norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm   # FSDP: a replicated DTensor
                if torch.isfinite(norm):
                    optim.step()
                elif module is model:                                  # same norm on every process: same skip
                    stats[9] += 1
                else:
                    critic_skipped += 1
                optim.zero_grad(set_to_none=True)
                if module is model:
                    stats[8] += float(norm)
            n_updates += 1
    for module in (model, critic):
        if module is not None:
            dist.full_weights(module)        # FSDP: whole weights again for the rollout (a no-op otherwise)
    stats[:8] = dist.sum_(stats[:8].clone())
    n = max(n_updates, 1)
    names = ["pg_loss", "entropy", "kl", "value_loss", "clipfrac", "ppo_kl"]
    out = {f"train/{k}": float(stats[i]) / n for i, k in enumerate(names)}
    out["train/token_entropy"] = float(stats[6] / stats[7]) if stats[7] > 0 else float("nan")
    out.update({"train/grad_norm": float(stats[8]) / n, "train/skipped_nonfinite": float(stats[9]),
                "train/optimizer_steps": float(n_updates)})
    if critic is None:
        out.pop("train/value_loss")
    else:
        out["train/critic_skipped_nonfinite"] = float(critic_skipped)
    if args.kl_coef == 0:
        out.pop("train/kl")
    return out


@torch.no_grad()
def prepare_batch(local, R, owner, fres, model, critic, ref, tok, args, dist, reuse_old: bool = True):
    """Training tensors for this process's kept trajectories: old log-probs (None when the update supplies them;
    reuse_old=False always computes them), reference log-probs, values, advantages (token level), in the order of
    their global index."""
    G = args.group_size
    dev = next(model.parameters()).device
    kept_set = set(fres.kept_traj.tolist())
    # local trajectories arrive group-contiguous in global group order; rebuild their global index g * G + k
    local_rows = [g for g in range(R.shape[0]) if int(owner[g]) == dist.rank]
    pairs = [(g * G + k, local[i * G + k]) for i, g in enumerate(local_rows) for k in range(G)]
    pairs = [(gi, t) for gi, t in pairs if gi in kept_set]
    if pairs:
        batch = rollout.to_tensors([t for _, t in pairs], tok.pad_token_id)
    else:   # this process kept nothing (another did): zero rows, it still joins every collective of the update
        batch = {k: torch.zeros(0, 1, dtype=torch.long) for k in ("input_ids", "attention_mask", "loss_mask")}
        batch["returns"] = torch.zeros(0)
    batch["gidx"] = torch.tensor([gi for gi, _ in pairs], dtype=torch.long)
    ids, attn, mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    batch["plan"] = plan(batch, args, dist)
    # one pass over one mini-batch: no optimizer step happens before a row's loss, so old = current and the update's
    # forward gives them (ratio exactly 1); otherwise a separate no-grad pass now, on the update's micro-batches
    old_now = not (args.ppo_epochs == 1 and len(batch["plan"]) == 1) or reuse_old is False
    old, refl, vals = torch.zeros(ids.shape), torch.zeros(ids.shape), torch.zeros(ids.shape)
    needed = old_now or ref is not None or critic is not None
    share = dist.share_prefix    # the update's forward path, so the first ratio is exactly 1
    for sl in [r for _, micros in batch["plan"] for r in micros if r is not None] if needed else []:
        a = (ids[sl].to(dev), attn[sl].to(dev), mask[sl].to(dev))
        with policy.autocast(dev, enabled=config.bf16(args)):
            # log-probs of the sampling policy: logits / rollout temperature (as verl); 1.0 by default
            if old_now:
                old[sl] = policy.token_logprobs(model, *a, temperature=args.temperature, share_prefix=share)[0].cpu()
            if ref is not None:
                refl[sl] = policy.token_logprobs(ref, *a, temperature=args.temperature, share_prefix=share)[0].cpu()
            if critic is not None:
                vals[sl] = critic.values(a[0], a[1], share_prefix=share).cpu()
    batch["old_logp"], batch["ref_logp"], batch["values"] = (old if old_now else None), refl, vals * mask
    # advantages: one scalar per trajectory (group estimators) or per token (GAE)
    weight = {int(gi): float(w) for gi, w in zip(fres.kept_traj, fres.adv_weight)}
    w = torch.tensor([weight[int(gi)] for gi in batch["gidx"]]) * fres.loss_scale          # (B,)
    if args.adv == "gae":
        rew = algos.terminal_token_rewards(batch["returns"].float(), mask) if pairs else torch.zeros(ids.shape)
        adv, ret = (algos.gae_advantages(rew, vals * mask, mask, args.gamma, args.lam, whiten_adv=False) if pairs
                    else (torch.zeros(ids.shape), torch.zeros(ids.shape)))
        if args.whiten_adv:
            adv = whiten_global(adv, mask, dist)
        batch["adv"], batch["returns_tok"] = adv * w[:, None], ret
    else:
        keep2d = fres.traj_mask.view(-1, G)
        A = group_advantages(R, keep2d, normalize_std=args.adv == "grpo").reshape(-1)          # (P'*G,)
        batch["adv"] = algos.token_advantages((A[batch["gidx"]] * w).float(), mask)
        batch["returns_tok"] = torch.zeros(ids.shape)
    return batch
