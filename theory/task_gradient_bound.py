"""E2. The Cauchy-Schwarz task-gradient bound, and the RV-bucket gradient-norm figure in miniature.

Claims checked (RAGEN-2, arXiv 2604.06268; the labels in the result name the theorems):
* Thm H.2 (review: Thm I.2; the main text cites it as "Theorem G.1"): with b(x) = E[R|x],
      ||g_task(x)|| <= sqrt(RV(x)) sqrt(E||s(z;x)||^2),   g_task(x) = E[(R - b) grad log pi(z|x)].
  For a tabular softmax g_task = pi * A and E||s||^2 = 1 - ||pi||^2; equality holds for every K = 2 policy.
* Fig. 3 (RV buckets): prompts split into 6 equal-size quantile buckets of the group reward variance;
  (a) the task-gradient norm rises with bucket RV; (c) the regulariser norm ||lambda g_ent||, ||lambda g_KL||
  is flat across buckets; (b) near RV = 0 a sizeable sampled task-gradient norm can remain. The toy shows where
  (b) comes from: with the group-mean baseline (GRPO-style) the sampled gradient of an RV = 0 group is exactly
  zero, while a critic baseline V(x) = E[R|x] + delta (PPO-style) leaves -delta (1/G) sum_k s_k: zero mean, norm^2
  delta^2 E||s||^2 / G. That noise carries no signal.
The bucket experiment is a linear-softmax bandit pi(.|x) = softmax(W phi(x)) with shared features (the per-prompt
gradients are (K, D) matrices (e_z - pi) phi^T) and rewards R(x, z) = 1[z in S_x] for random outcome sets S_x
(empty or full sets give RV = 0).

What would falsify: a ratio above 1 (beyond rounding), a K = 2 ratio different from 1, task norms falling with
RV, or a non-zero group-mean gradient at RV = 0. Left out: clipping and importance ratios (on-policy only).
Run: `python theory/task_gradient_bound.py` (seconds; saves theory/figures/task_gradient_bound.png).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):                      # run as a script: make `theory` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from theory import toy

NAME = "task_gradient_bound"


def bound_ratio(pi, R) -> np.ndarray:
    """||g_task|| / (sqrt(RV) sqrt(E||s||^2)) per prompt from the tabular closed forms: (P, K) -> (P,)."""
    g = toy.task_gradient(pi, R)
    return np.linalg.norm(g, axis=-1) / np.sqrt(toy.reward_variance(pi, R) * toy.expected_sq_score(pi))


def generic_ratio(pi_x, R_x, phi_x) -> tuple[float, float]:
    """The same ratio for a linear-softmax prompt from explicit score matrices s_z = (e_z - pi) phi^T (no closed
    forms), and the residual of the tabular closed form g = pi * A against the explicit sum."""
    A = R_x - pi_x @ R_x                                                     # (K,) advantages, b = E[R|x]
    s = toy.scores(pi_x)[:, :, None] * phi_x[None, None, :]                  # (K, K, D): s_z for every z
    g = np.einsum("z,z,zkd->kd", pi_x, A, s)                                 # E[A s] (K, D)
    es2 = float(np.einsum("z,zkd,zkd->", pi_x, s, s))                        # E||s||^2
    rv = float(pi_x @ A ** 2)
    closed = np.outer(toy.task_gradient(pi_x, R_x), phi_x)
    return float(np.linalg.norm(g) / np.sqrt(rv * es2)), float(np.abs(g - closed).max())


def sampled_group_gradient(rng, pi_x, R_x, phi_x, G: int, baseline: str, critic_error: float = 0.0):
    """One draw of (1/G) sum_k A_k s(z_k;x) as a (K, D) matrix; baseline "mean" (group mean) or "critic"
    (V = E[R|x] + critic_error). Returns (gradient, sampled unbiased reward variance)."""
    z = rng.choice(pi_x.size, size=G, p=pi_x)
    r = R_x[z]
    A = r - (r.mean() if baseline == "mean" else pi_x @ R_x + critic_error)
    w = np.bincount(z, weights=A, minlength=pi_x.size) / G                   # (K,) sum_k A_k e_{z_k} / G
    return np.outer(w - w.sum() * pi_x, phi_x), float(r.var(ddof=1))


def main(size: str = "full", seed: int = 0, fig_dir=toy.FIG_DIR, lam_ent: float = 0.01, lam_kl: float = 0.01,
         critic_std: float = 0.1) -> dict:
    toy.check_size(size)
    rng = np.random.default_rng(seed)
    n_random, n_prompts, n_mc = (5000, 1200, 4000) if size == "full" else (500, 240, 800)
    G, K, D, n_buckets = 16, 6, 8, 6

    # 1. bound on random tabular policies (K in 2..10, random logit scale, Gaussian or 0/1 rewards)
    ratios, ratios_k2 = [], []
    for _ in range(n_random):
        k = int(rng.integers(2, 11))
        pi = toy.softmax(rng.uniform(0.1, 4.0) * rng.standard_normal(k))
        R = rng.standard_normal(k) if rng.random() < 0.5 else (rng.random(k) < 0.5).astype(float)
        if toy.reward_variance(pi, R) < 1e-14:
            continue                                                         # 0/0: bound and gradient both 0
        (ratios_k2 if k == 2 else ratios).append(bound_ratio(pi, R))
    ratios, ratios_k2 = np.array(ratios), np.array(ratios_k2)
    generic = [generic_ratio(toy.softmax(2 * rng.standard_normal(K)), rng.standard_normal(K),
                             rng.standard_normal(D)) for _ in range(200)]
    generic_r = np.array([g[0] for g in generic])
    closed_resid = max(g[1] for g in generic)

    # 2. Fig. 3 in miniature: linear-softmax bandit, 6 quantile buckets of the sampled group RV
    W = rng.standard_normal((K, D)) * 1.5 / np.sqrt(D)
    W_ref = W + 0.5 * rng.standard_normal((K, D)) / np.sqrt(D)               # reference for the KL term
    phi = rng.standard_normal((n_prompts, D))                                # (N, D) shared features
    pi, pi_ref = toy.linear_policy(W, phi), toy.linear_policy(W_ref, phi)    # (N, K)
    sizes = rng.integers(0, K + 1, size=n_prompts)                           # |S_x| in 0..K (0, K: RV = 0)
    R = np.array([np.isin(np.arange(K), rng.permutation(K)[:s]).astype(float) for s in sizes])  # (N, K)
    phi_norm = np.linalg.norm(phi, axis=1)
    task = np.linalg.norm(toy.task_gradient(pi, R), axis=1) * phi_norm      # exact per-prompt ||g_task||_F
    ent = lam_ent * np.linalg.norm(toy.entropy_gradient(pi), axis=1) * phi_norm
    kl = lam_kl * np.linalg.norm(toy.kl_gradient(pi, pi_ref), axis=1) * phi_norm
    delta = critic_std * rng.standard_normal(n_prompts)                      # per-prompt critic error
    mean_g, critic_g, rv_hat = np.zeros(n_prompts), np.zeros(n_prompts), np.zeros(n_prompts)
    for x in range(n_prompts):
        rng_x = np.random.default_rng([seed, x])                             # same draws for both baselines
        g_m, rv_hat[x] = sampled_group_gradient(rng_x, pi[x], R[x], phi[x], G, "mean")
        rng_x = np.random.default_rng([seed, x])
        g_c, _ = sampled_group_gradient(rng_x, pi[x], R[x], phi[x], G, "critic", delta[x])
        mean_g[x], critic_g[x] = np.linalg.norm(g_m), np.linalg.norm(g_c)
    buckets = np.array_split(np.argsort(rv_hat, kind="stable"), n_buckets)  # low -> high sampled RV
    per_prompt = {"rv": rv_hat, "task": task, "mean_g": mean_g, "critic_g": critic_g, "ent": ent, "kl": kl}
    per_bucket = {k: np.array([v[b].mean() for b in buckets]) for k, v in per_prompt.items()}   # (6,) each
    rho_task = toy.spearman(np.arange(n_buckets), per_bucket["task"])
    reg = per_bucket["ent"] + per_bucket["kl"]
    reg_spread = float((reg.max() - reg.min()) / reg.mean())
    task_spread = float((per_bucket["task"].max() - per_bucket["task"].min()) / per_bucket["task"].mean())

    # 3. RV = 0 (empty or full reward set): group-mean gradient is exactly 0; critic gradient is pure noise
    zero = np.flatnonzero((sizes == 0) | (sizes == K))
    zero_mean_max = max(float(mean_g[x]) for x in zero)
    x0 = int(zero[0])
    d0 = critic_std
    draws = [sampled_group_gradient(rng, pi[x0], R[x0], phi[x0], G, "critic", d0)[0] for _ in range(n_mc)]
    sq = np.array([float(np.sum(g * g)) for g in draws])
    predicted = d0 ** 2 * toy.expected_sq_score(pi[x0]) * phi_norm[x0] ** 2 / G
    mc_ratio = float(sq.mean() / predicted)
    mean_norm_signal = float(np.linalg.norm(np.mean(draws, axis=0)) / np.sqrt(sq.mean()))

    numbers = {"random policies (K>2): max ratio": f"{ratios.max():.6f}", "random policies (K>2): median ratio":
               np.median(ratios), "K=2 policies: max |ratio - 1|": np.abs(ratios_k2 - 1).max(),
               "linear-softmax explicit scores: max ratio": generic_r.max(),
               "closed form g = pi*A vs explicit sum: max residual": closed_resid}
    for i in range(n_buckets):
        numbers[f"bucket {i + 1}: RV_hat, |g_task|, |g_hat| mean/critic, |lam g_ent|, |lam g_KL|"] = ", ".join(
            f"{per_bucket[k][i]:.4f}" for k in ("rv", "task", "mean_g", "critic_g", "ent", "kl"))
    numbers.update({"Spearman(bucket, |g_task|)": rho_task, "regulariser (max-min)/mean over buckets": reg_spread,
                    "task norm (max-min)/mean over buckets": task_spread,
                    "RV=0 prompts: max |group-mean g_hat|": zero_mean_max,
                    f"RV=0 critic (delta={d0}): E|g_hat|^2 / (delta^2 E|s|^2 / G)": mc_ratio,
                    "RV=0 critic: |mean g_hat| / rms |g_hat| (signal fraction)": mean_norm_signal})
    claims = [
        toy.claim("||g_task|| <= sqrt(RV) sqrt(E||s||^2)", max(ratios.max(), generic_r.max()) <= 1 + 1e-9,
                  f"max ratio {max(ratios.max(), generic_r.max()):.6f} over "
                  f"{ratios.size + ratios_k2.size + generic_r.size} prompts"),
        toy.claim("equality for K = 2", np.abs(ratios_k2 - 1).max() < 1e-9,
                  f"max |ratio - 1| = {np.abs(ratios_k2 - 1).max():.1e} over {ratios_k2.size} policies"),
        toy.claim("Fig. 3a: task-gradient norm rises with bucket RV", rho_task >= 0.9,
                  f"Spearman {rho_task:.2f} over {n_buckets} buckets", contradicted=rho_task < 0),
        toy.claim("Fig. 3c: regulariser norm flat across RV buckets", reg_spread < 0.25,
                  f"(max - min)/mean = {reg_spread:.3f} vs {task_spread:.2f} for the task norm "
                  f"(reward sets drawn independently of pi)", contradicted=reg_spread >= task_spread),
        toy.claim("Fig. 3b: group-mean g_hat = 0 at RV = 0; a noisy critic leaves signal-free norm",
                  zero_mean_max == 0.0 and abs(mc_ratio - 1) < 0.1 and mean_norm_signal < 0.1,
                  f"group-mean max norm {zero_mean_max:g}; critic E||g||^2 / formula = {mc_ratio:.3f}, "
                  f"mean/rms = {mean_norm_signal:.3f}"),
    ]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    a0.hist(np.concatenate([ratios, ratios_k2]), bins=50)
    a0.axvline(1.0, color="k", ls="--")
    a0.set(xlabel="||g_task|| / (sqrt(RV) sqrt(E||s||^2))", ylabel="policies", title="Thm H.2 ratio (<= 1)")
    xs = np.arange(1, n_buckets + 1)
    for key, lab in [("task", "exact ||g_task||"), ("mean_g", "sampled, group-mean"),
                     ("critic_g", f"sampled, critic (std {critic_std})"), ("ent", f"||{lam_ent} g_ent||"),
                     ("kl", f"||{lam_kl} g_KL||")]:
        a1.plot(xs, per_bucket[key], "o-", label=lab)
    a1.set(xlabel="RV bucket (1 = lowest sampled RV)", ylabel="per-prompt gradient norm",
           title=f"Fig. 3 in miniature (G={G}, {n_prompts} prompts)")
    a1.legend(fontsize=8)
    return {"check": "E2", "name": NAME, "title": "Cauchy-Schwarz task-gradient bound and RV buckets",
            "labels": "Thm H.2 (review Thm I.2, main text 'Theorem G.1'), Fig. 3",
            "claim": "||g_task(x)|| <= sqrt(RV(x)) sqrt(E||s||^2); task norm rises with RV, regulariser norm flat.",
            "numbers": numbers, "claims": claims, "verdict": toy.overall_verdict(claims),
            "figure": toy.save_figure(fig, fig_dir, NAME),
            "data": {"max_ratio": float(max(ratios.max(), generic_r.max())),
                     "k2_max_dev": float(np.abs(ratios_k2 - 1).max()), "closed_resid": closed_resid,
                     "zero_mean_max": zero_mean_max, "critic_mc_ratio": mc_ratio}}


if __name__ == "__main__":
    print(toy.format_result(main(**toy.cli_kwargs(__doc__))))
