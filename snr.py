"""Gradient decomposition per reward-variance bucket: task vs entropy vs KL gradient norms (paper §3.3, Fig. 3).

The SNR argument (paper §3, Theorems 1-2) says the task gradient of a prompt scales with sqrt(RV) while the
regularisers (KL, entropy) do not depend on the reward at all, so low-RV prompts contribute gradients dominated by
input-agnostic terms. Figure 3 shows it on a real batch: groups are bucketed by RV and, per bucket, the norm of
each loss component's gradient is measured separately,

    g_task = ∇ L_pg,   g_ent = ∇(−β_H · H),   g_KL = ∇(β_KL · KL),   g_reg = g_ent + g_KL,

expected: ‖g_task‖ rises with the bucket's RV, ‖g_reg‖ stays flat.

What this file implements:
  split_into_buckets   groups -> `all` + bucket_1..bucket_n (low -> high RV): `quantile` (equal counts, the last
                       bucket takes the remainder, the official code) or `fixed_rv` (reward-std intervals
                       [0,1), [1,2), ..., [5, inf), designed for Sokoban's reward scale).
  component_grad_norms one forward per micro-batch, one `torch.autograd.grad` per component (retain_graph), the
                       component gradients accumulated separately; then the global L2 norm of each. No optimizer
                       step, the model's .grad is left untouched.
  bucket_report        all buckets of one training batch -> a flat metrics dict (train.py logs it under grad/).
  report_table         that dict as a Markdown table.
A library: the probe CLI (one batch of a fresh or trained policy) is experiments/snr_probe.py, the figure is
report.plot_buckets.

Deliberate differences from the official code (docs/paper-vs-code.md):
  * every bucket's loss is normalised by the bucket's OWN token count (sequence count under the seq-mean-*
    aggregations), so norms are comparable across buckets of different sizes. The reference divides by the
    nominal mini-batch accumulation count, which makes a small bucket's raw norm shrink with its size
    (the official code "subtlety").
  * the analysed batch is the UNFILTERED batch with plain advantages (no soft reweighting / loss scaling; under
    DAPO the first rollout round, before dynamic sampling): the figure is about every prompt's gradient, and a
    filter would remove the low-RV buckets it is meant to show. The reference analyses the filtered batch by
    default (`gradient_analysis_log_prefilter` adds the unfiltered one).
  * the analysis runs before the step's critic and actor updates (the reference: after the critic update), so
    PPO's advantages come from the same critic the update uses.
  * the task term is the clipped surrogate at ratio exactly 1 (old log-probs = the analysis forward's own,
    detached), i.e. the advantage-weighted score function.

Memory: three parameter-sized fp32 buffers (task, entropy, KL) besides the model: ~1.6 GB for SmolLM2-135M,
~36 GB for a 3B model (switch components off with a zero coefficient, or probe on a smaller batch).

Leaves out: the separate analysis-only rollout shape of the reference (run the probe with other --groups instead)
and the reference's truncation of buckets to multiples of the GPU count (not needed: we reduce exactly).

Run:  python experiments/snr_probe.py --model tiny --env bandit --algo grpo --groups 12 --group-size 4  (seconds)
      python experiments/snr_probe.py --from-run runs/demo-<date> --step 8 --plot fig3.png   (a trained policy)
      python train.py ... --grad-analysis-every 20 [--grad-buckets 6 --grad-bucket-mode quantile]  (inside a run)
"""
from __future__ import annotations

import math

import torch

import algos
import config
import policy
import update

BUCKET_MODES = ("quantile", "fixed_rv")
FIXED_RV_EDGES = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)        # reward-std units; last bucket is [5, inf)
COMPONENTS = ("task", "entropy", "kl")


def split_into_buckets(std: torch.Tensor, n_buckets: int = 6, mode: str = "quantile") -> list[tuple[str, list[int]]]:
    """Group indices per bucket, `all` first, then bucket_1 (lowest RV) .. bucket_n; empty buckets omitted.

    std (P,): each group's reward std (the reference buckets by std; quantile buckets are the same for variance).
    quantile: sort ascending (ties: lower group index first), nb = min(n_buckets, P), per = P // nb; bucket b gets
    `per` groups and the last one also the remainder: 8 groups, 6 buckets -> sizes 1, 1, 1, 1, 1, 3.
    """
    if mode not in BUCKET_MODES:
        raise ValueError(f"bucket mode must be one of {', '.join(BUCKET_MODES)}, got {mode!r}")
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1, got {n_buckets}")
    std = torch.as_tensor(std, dtype=torch.float64).reshape(-1)
    P = len(std)
    out = [("all", list(range(P)))]
    if P == 0:
        return out
    if mode == "quantile":
        order = torch.sort(std, stable=True).indices.tolist()
        nb = min(n_buckets, P)
        per = P // nb
        for b in range(nb):
            members = order[b * per:(b + 1) * per] if b < nb - 1 else order[b * per:]
            out.append((f"bucket_{b + 1}", sorted(members)))
    else:
        edges = list(FIXED_RV_EDGES) + [math.inf]
        for b in range(len(FIXED_RV_EDGES)):
            members = [g for g in range(P) if edges[b] <= float(std[g]) < edges[b + 1]]
            if members:
                out.append((f"bucket_{b + 1}", members))
    return out


def component_losses(logp, ent, batch, r, args) -> dict[str, torch.Tensor]:
    """update.loss_terms for micro-batch rows r, each WITH its coefficient and sign (the caller weights them by
    their share of the bucket's normaliser); old log-probs = this forward's own, so the ratio is exactly 1."""
    mask = batch["loss_mask"][r].to(logp.device)
    terms = update.loss_terms(logp, ent, logp.detach(), batch, r, mask, args)
    out = {"task": terms["pg"]}
    if args.entropy_coef > 0:
        out["entropy"] = -args.entropy_coef * terms["entropy"]
    if args.kl_coef > 0:
        out["kl"] = args.kl_coef * terms["kl"]
    return out


def component_grad_norms(model, batch, rows: list[int], args, dist) -> dict[str, float]:
    """‖∇‖ of each loss component over the local `rows` of `batch` (all processes together: `dist` sums the
    normaliser and the gradients). The loss of each component is aggregated over the bucket exactly as
    update.update aggregates a mini-batch. Returns {task, entropy, kl (those switched on), reg = ‖g_ent + g_kl‖}."""
    dev = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    rows_t = torch.tensor(rows, dtype=torch.long)
    denom = float(dist.sum_(torch.tensor([float(algos.agg_count(batch["loss_mask"][rows_t], args.loss_agg))],
                                         dtype=torch.float64))[0])          # the bucket's global normaliser
    names = [c for c in COMPONENTS if c == "task" or (c == "entropy" and args.entropy_coef > 0)
             or (c == "kl" and args.kl_coef > 0)]
    grads = {c: [torch.zeros_like(p) for p in params] for c in names}       # fp32, like the parameters
    was_training = model.training
    model.train()
    for s in range(0, len(rows), args.micro_batch):
        r = rows_t[s:s + args.micro_batch]
        ids, attn, mask = (batch[k][r].to(dev) for k in ("input_ids", "attention_mask", "loss_mask"))
        share = float(algos.agg_count(mask, args.loss_agg)) / max(denom, 1.0)
        with policy.autocast(dev, enabled=config.bf16(args)):
            logp, ent = policy.token_logprobs(model, ids, attn, mask, with_entropy=True, temperature=args.temperature)
        losses = component_losses(logp, ent, batch, r, args)
        for i, c in enumerate(names):
            gs = torch.autograd.grad(losses[c] * share, params, retain_graph=i < len(names) - 1, allow_unused=True)
            used = [(a, g) for a, g in zip(grads[c], gs) if g is not None]
            if used:
                torch._foreach_add_([a for a, _ in used], [g for _, g in used])
    model.train(was_training)
    sq = {}                                                                  # squared norms and the cross term
    for c in names:
        for g in grads[c]:
            dist.sum_(g)
        sq[c] = sum(float(torch.sum(g.double() ** 2)) for g in grads[c])
    out = {c: math.sqrt(v) for c, v in sq.items()}
    reg = [c for c in names if c != "task"]
    if reg:     # ‖e + k‖² = ‖e‖² + ‖k‖² + 2<e, k>, without a fourth parameter-sized buffer
        cross = (2 * sum(float(torch.sum(e.double() * k.double())) for e, k in zip(grads["entropy"], grads["kl"]))
                 if len(reg) == 2 else 0.0)
        out["reg"] = math.sqrt(max(sum(sq[c] for c in reg) + cross, 0.0))
    return out


def bucket_report(model, batch, R: torch.Tensor, args, dist, n_buckets: int = 6, mode: str = "quantile") -> dict:
    """Every bucket of the batch (rows carry global trajectory ids batch["gidx"] = group * G + member).
    R (P, G) returns. Keys: grad/<bucket>/{task,entropy,kl,reg,task_over_reg,groups,trajs,rv_mean,std_mean}."""
    G = R.shape[1]
    std = R.std(dim=1)                                                          # (P,) unbiased, as the filter
    group_of_row = (batch["gidx"] // G).tolist()
    out = {}
    for name, groups in split_into_buckets(std, n_buckets, mode):
        members = set(groups)
        rows = [i for i, g in enumerate(group_of_row) if g in members]
        norms = component_grad_norms(model, batch, rows, args, dist)
        pre = f"grad/{name}/"
        out.update({pre + k: v for k, v in norms.items()})
        if "reg" in norms:
            out[pre + "task_over_reg"] = norms["task"] / max(norms["reg"], 1e-12)
        out[pre + "groups"] = float(len(groups))
        out[pre + "trajs"] = float(len(groups) * G)
        out[pre + "rv_mean"] = float((std[groups] ** 2).mean())
        out[pre + "std_mean"] = float(std[groups].mean())
    return out


def report_table(m: dict) -> str:
    """Markdown table of a bucket_report dict."""
    names = sorted({k.split("/")[1] for k in m}, key=lambda b: (b != "all", int(b.split("_")[1]) if "_" in b else 0))
    cols = ["groups", "std_mean", "rv_mean", "task", "entropy", "kl", "reg", "task_over_reg"]
    lines = ["| bucket | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for b in names:
        cells = [f"{m[f'grad/{b}/{c}']:.4g}" if f"grad/{b}/{c}" in m else "-" for c in cols]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
