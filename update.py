"""One update from a kept batch: training tensors, old/reference log-probs and values, advantages, and the
mini-batch PPO-style optimizer steps (paper §2.1, §4.1).

train.py calls `prepare_batch` then `update` once per step, after the filter. The formulas are in algos.py
(advantages, clipped surrogate, aggregation, KL, entropy, value loss); this file is the machinery around them:

  prepare_batch   kept trajectories -> (B, T) tensors in GLOBAL kept order; old log-probs at the rollout temperature
                  (skipped when the update is one pass over one mini-batch: then old = current exactly, and the
                  update's own forward supplies them, as TRL does), reference log-probs (KL on), values (PPO); GAE (+ whitening over every process's tokens) or group
                  advantages (GRPO / Dr.GRPO), times the filter's soft weights and loss scale.
  plan            mini-batches cut from the global kept order, each with its global normaliser (tokens or
                  sequences, algos.agg_count), as local micro-batch row lists.
  update          --ppo-epochs passes over the plan: every micro-batch loss is weighted by its share of the
                  mini-batch's global normaliser, gradients are summed over processes, clipped, stepped; non-finite
                  norms skip the step (same decision everywhere).

Why by hand and not DDP: the filter leaves processes with different numbers of kept trajectories (possibly none),
which DDP's lock-step backward cannot express; `dist` (train.Dist) supplies the few collectives, and the result
equals the single-process update on the same global batch (tests/test_train.py, tests/dist_update.py).
Leaves out: the reference's padding of the kept batch by duplicated rows, critic warm-up, value-head pretraining.
Run the tests: `.venv/bin/python -m pytest tests/test_train.py -q`.
"""
from __future__ import annotations

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
    return out


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


def update(model, critic, opt, copt, batch, args, dist) -> dict:
    """Mini-batch PPO-style updates on the kept batch (batch["plan"], see `plan`). Every loss term of a micro-batch
    is weighted by its share of the mini-batch's global normaliser, so gradient accumulation over micro-batches
    and the sum over processes reproduce the aggregation mode exactly. Returns statistics reduced over processes."""
    dev = next(model.parameters()).device
    agg = args.loss_agg
    stats = torch.zeros(8, dtype=torch.float64)  # pg, entropy, kl, value_loss, clipfrac, ppo_kl, grad_norm, skipped
    n_updates, critic_skipped = 0, 0
    for _ in range(args.ppo_epochs):
        for denom, micros in batch["plan"]:
            for r in micros:
                ids, attn, mask = (batch[k][r].to(dev) for k in ("input_ids", "attention_mask", "loss_mask"))
                share = float(algos.agg_count(mask, agg)) / denom  # micro-batch's part of the global normaliser
                with policy.autocast(dev, enabled=None if args.bf16 else False):
                    logp, ent = policy.token_logprobs(model, ids, attn, mask, with_entropy=True,
                                                      temperature=args.temperature)
                adv = batch["adv"][r].to(dev)
                old = logp.detach() if batch["old_logp"] is None else batch["old_logp"][r].to(dev)
                terms = loss_terms(logp, ent, old, batch, r, mask, args)
                pg, h = terms["pg"], terms["entropy"]
                loss = algos.objective(pg, h, terms.get("kl"), args.entropy_coef, args.kl_coef)   # pg - b_H*H + b_KL*KL
                stats[1] += float(h.detach()) * share                 # logged whatever the coefficient
                if args.kl_coef > 0:
                    stats[2] += float(terms["kl"].detach()) * share
                (loss * share).backward()
                ps = algos.policy_loss_stats(logp.detach(), old, adv, mask,
                                             args.clip_low, args.clip_high, args.clip_c)
                stats[0] += float(pg.detach()) * share
                stats[4] += ps["pg_clipfrac"] * share
                stats[5] += ps["ppo_kl"] * share
                if critic is not None:
                    with policy.autocast(dev, enabled=None if args.bf16 else False):
                        v = critic.values(ids, attn)
                    vl = algos.value_loss(v, batch["values"][r].to(dev), batch["returns_tok"][r].to(dev), mask,
                                          args.value_clip, agg, norm_len=config.loss_norm_len(args))
                    (vl * share).backward()
                    stats[3] += float(vl.detach()) * share
            for module, optim in ((model, opt), (critic, copt)):
                if module is None:
                    continue
                dist.sync_grads(module)
                norm = torch.nn.utils.clip_grad_norm_(module.parameters(), args.grad_clip)
                if torch.isfinite(norm):
                    optim.step()
                elif module is model:                                  # same norm on every process: same skip
                    stats[7] += 1
                else:
                    critic_skipped += 1
                optim.zero_grad(set_to_none=True)
                if module is model:
                    stats[6] += float(norm)
            n_updates += 1
    stats[:6] = dist.sum_(stats[:6].clone())
    n = max(n_updates, 1)
    names = ["pg_loss", "entropy", "kl", "value_loss", "clipfrac", "ppo_kl"]
    out = {f"train/{k}": float(stats[i]) / n for i, k in enumerate(names)}
    out.update({"train/grad_norm": float(stats[6]) / n, "train/skipped_nonfinite": float(stats[7]),
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
    for sl in [r for _, micros in batch["plan"] for r in micros] if (old_now or ref is not None or critic is not None) else []:
        a = (ids[sl].to(dev), attn[sl].to(dev), mask[sl].to(dev))
        with policy.autocast(dev, enabled=None if args.bf16 else False):
            # log-probs of the sampling policy: logits / rollout temperature (as verl); 1.0 by default
            if old_now:
                old[sl] = policy.token_logprobs(model, *a, temperature=args.temperature)[0].cpu()
            if ref is not None:
                refl[sl] = policy.token_logprobs(ref, *a, temperature=args.temperature)[0].cpu()
            if critic is not None:
                vals[sl] = critic.values(a[0], a[1]).cpu()
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
