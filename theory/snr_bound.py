"""E3. The SNR upper bound sqrt(G) sqrt(RV)/sigma, a sharper version, and RV as an SNR proxy.

Claims checked (RAGEN-2, arXiv 2604.06268; the labels in the result name the theorems):
* Thm H.3 (review: Thm I.3): reward R = mu(x, z) + eps, E[eps | x, z] = 0, Var(eps | x, z) = sigma^2(x)
  (Assumption H.1); g_hat = (1/G) sum_k A_k s_k with b = E[R|x] and i.i.d. z_k. Then
      SNR(x) = ||g|| / sqrt(E||g_hat - g||^2) <= sqrt(G) sqrt(RV(x)) / sigma(x).
  Because RV = Var(mu) + sigma^2 includes the noise, the right side is >= sqrt(G) for every prompt, so the bound
  cannot show SNR -> 0 as the signal vanishes. Replacing RV by Var(mu(x, Z) | x) gives a sharper valid bound
  (||g|| <= sqrt(Var mu) sqrt(E||s||^2) by Cauchy-Schwarz on mu - E mu, and the same noise floor).
* The paper's premise that high RV marks high-SNR prompts (§3.3; boundary condition: the FrozenLake slip sweep,
  v1 Fig. 9 / review Fig. 11). With the same sigma for every prompt RV ranks prompts by signal; when sigma varies
  across prompts RV ranks them by noise, so top-RV filtering keeps the noisiest prompts.
SNR is computed exactly (closed form of E||g_hat - g||^2, toy.true_baseline_noise) and by Monte Carlo (empirical
mean and spread of g_hat over independent groups with Gaussian noise). The group-mean baseline (what GRPO /
the filter use) is shown beside it for information; the theorem is about b = E[R|x].

What would falsify: an exact SNR above either bound, a Monte-Carlo SNR above 1.05 x the paper's bound.
Left out: sampled RV (RV here is exact); the filter itself (E8). Run: `python theory/snr_bound.py`.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):                      # run as a script: make `theory` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from theory import toy

NAME = "snr_bound"


def exact_snr(pi_x, mu_x, sigma: float, G: int) -> float:
    """||g|| / sqrt(E||g_hat - g||^2) for b = E[R|x] (closed form, no sampling)."""
    g = toy.task_gradient(pi_x, mu_x)
    return float(np.linalg.norm(g) / np.sqrt(toy.true_baseline_noise(pi_x, mu_x, sigma, G)))


def bounds(pi_x, mu_x, sigma: float, G: int) -> tuple[float, float]:
    """(paper bound sqrt(G) sqrt(RV)/sigma, sharper bound sqrt(G) sqrt(Var mu)/sigma)."""
    var_mu = float(toy.reward_variance(pi_x, mu_x))
    return float(np.sqrt(G * (var_mu + sigma ** 2)) / sigma), float(np.sqrt(G * var_mu) / sigma)


def mc_snr(rng, pi_x, mu_x, sigma: float, G: int, n: int, baseline: str = "true") -> float:
    """Monte-Carlo SNR from n independent groups: ||mean g_hat|| / sqrt(mean ||g_hat - mean g_hat||^2)."""
    K = pi_x.size
    z = rng.choice(K, size=(n, G), p=pi_x)                                   # (n, G)
    r = mu_x[z] + sigma * rng.standard_normal((n, G))
    A = r - (r.mean(axis=1, keepdims=True) if baseline == "mean" else pi_x @ mu_x)
    w = np.zeros((n, K))
    np.add.at(w, (np.repeat(np.arange(n), G), z.ravel()), A.ravel() / G)    # sum_k A_k e_{z_k} / G
    g_hat = w - w.sum(axis=1, keepdims=True) * pi_x[None, :]                 # (n, K)
    mean = g_hat.mean(axis=0)
    return float(np.linalg.norm(mean) / np.sqrt(np.mean(np.sum((g_hat - mean) ** 2, axis=1))))


def random_prompt(rng, K: int, signal: float):
    """A random tabular prompt: policy pi (K,), signal mu (K,) scaled by `signal`."""
    return toy.softmax(rng.uniform(0.2, 2.5) * rng.standard_normal(K)), signal * rng.standard_normal(K)


def main(size: str = "full", seed: int = 0, fig_dir=toy.FIG_DIR) -> dict:
    toy.check_size(size)
    rng = np.random.default_rng(seed)
    n_prompts, n_mc, n_pop = (400, 4000, 256) if size == "full" else (60, 1500, 64)
    G, K = 16, 5

    # 1. exact and Monte-Carlo SNR against both bounds on random prompts (log-uniform signal and noise)
    rows = []
    for i in range(n_prompts):
        pi, mu = random_prompt(rng, K, 10 ** rng.uniform(-2, 0.5))
        sigma = 10 ** rng.uniform(-1.5, 0.5)
        paper, sharp = bounds(pi, mu, sigma, G)
        mc = mc_snr(rng, pi, mu, sigma, G, n_mc) if i < n_prompts // 4 else np.nan   # MC on a subset (cost)
        mc_mean = mc_snr(rng, pi, mu, sigma, G, n_mc, "mean") if i < n_prompts // 4 else np.nan
        rows.append((exact_snr(pi, mu, sigma, G), paper, sharp, mc, mc_mean))
    exact, paper, sharp, mc, mc_mean = (np.array(c) for c in zip(*rows))      # each (n_prompts,)
    has_mc = ~np.isnan(mc)
    # ratios SNR / bound: <= 1 is the theorem; the median says how loose each bound is
    r_paper, r_sharp, r_mc = exact / paper, exact / sharp, mc[has_mc] / paper[has_mc]
    resolvable = has_mc & (exact > 0.1)                                      # MC floor is ~1/sqrt(n_mc)
    r_mc_exact = mc[resolvable] / exact[resolvable]

    # 2. vanishing signal: exact SNR -> 0, sharp bound -> 0, paper bound stays >= sqrt(G)
    # one prompt, sigma = 1, signal mu scaled from 1e-3 to ~3
    pi0, mu0 = random_prompt(np.random.default_rng([seed, 1]), K, 1.0)
    scales = np.logspace(-3, 0.5, 15)
    sweep = np.array([(exact_snr(pi0, s * mu0, 1.0, G),) + bounds(pi0, s * mu0, 1.0, G) for s in scales])

    # 3. RV as SNR proxy across a population: homogeneous vs heterogeneous noise
    # the same prompts (signals) under two noise models; only sigma differs between the cases
    pop = [random_prompt(rng, K, 10 ** rng.uniform(-1.5, 0.5)) for _ in range(n_pop)]
    proxy = {}
    for case, sigmas in [("homogeneous sigma", np.full(n_pop, 0.5)),
                         ("heterogeneous sigma", 10 ** rng.uniform(-1.5, 0.7, size=n_pop))]:
        rv = np.array([float(toy.reward_variance(p, m)) + s ** 2 for (p, m), s in zip(pop, sigmas)])
        snr = np.array([exact_snr(p, m, s, G) for (p, m), s in zip(pop, sigmas)])
        top = np.argsort(-rv, kind="stable")[: n_pop // 4]                   # top-25 % by RV
        rest = np.setdiff1d(np.arange(n_pop), top)
        proxy[case] = (*toy.spearman_test(rv, snr, rng), float(np.median(snr[top])), float(np.median(snr[rest])),
                       toy.spearman(rv, sigmas) if case.startswith("het") else float("nan"))

    # ---- report
    numbers = {"exact SNR / paper bound: max, median": f"{r_paper.max():.4f}, {np.median(r_paper):.4f}",
               "exact SNR / sharp bound: max, median": f"{r_sharp.max():.4f}, {np.median(r_sharp):.4f}",
               "MC SNR / paper bound: max": r_mc.max(),
               "MC SNR / exact SNR where exact > 0.1: min, max": f"{r_mc_exact.min():.3f}, {r_mc_exact.max():.3f}",
               "group-mean baseline MC SNR / paper bound: max": float(np.max(mc_mean[has_mc] / paper[has_mc])),
               "min paper bound over prompts (>= sqrt(G) = 4)": paper.min(),
               f"signal x{scales[0]:g}: exact SNR, paper bound, sharp bound": ", ".join(f"{v:.4f}" for v in sweep[0]),
               f"signal x{scales[-1]:.3g}: exact SNR, paper bound, sharp bound":
                   ", ".join(f"{v:.4f}" for v in sweep[-1])}
    for case, (rho, p, top_med, rest_med, rho_sig) in proxy.items():
        numbers[f"{case}: Spearman(RV, SNR)"] = f"{rho:.3f} (permutation p = {p:.3g})"
        numbers[f"{case}: median SNR top-25% RV vs rest"] = f"{top_med:.3f} vs {rest_med:.3f}"
    numbers["heterogeneous sigma: Spearman(RV, sigma)"] = proxy["heterogeneous sigma"][4]
    homo, het = proxy["homogeneous sigma"], proxy["heterogeneous sigma"]
    claims = [
        toy.claim("SNR <= sqrt(G) sqrt(RV) / sigma (exact)", r_paper.max() <= 1 + 1e-9,
                  f"max exact/bound {r_paper.max():.4f} over {n_prompts} prompts"),
        toy.claim("Monte-Carlo SNR <= 1.05 x bound", r_mc.max() <= 1.05,
                  f"max MC/bound {r_mc.max():.4f} over {int(has_mc.sum())} prompts x {n_mc} groups"),
        toy.claim("sharper bound with Var(mu) in place of RV is valid", r_sharp.max() <= 1 + 1e-9,
                  f"max exact/sharp {r_sharp.max():.4f}; median {np.median(r_sharp):.3f} vs paper's "
                  f"{np.median(r_paper):.3f}"),
        toy.claim("the paper's bound can show SNR -> 0 as signal -> 0", sweep[0, 1] < 1.0,
                  f"at signal x{scales[0]:g}: SNR {sweep[0, 0]:.1e}, paper bound {sweep[0, 1]:.2f} (>= sqrt(G)), "
                  f"sharp bound {sweep[0, 2]:.1e}"),
        toy.correlation_claim("RV ranks prompts by SNR (homogeneous noise)", homo[0], homo[1], +1,
                              what="Spearman(RV, SNR)"),
        toy.correlation_claim("RV ranks prompts by SNR (heterogeneous noise)", het[0], het[1], +1,
                              what="Spearman(RV, SNR)",
                              note=f"top-RV quarter median SNR {het[2]:.2f} vs rest {het[3]:.2f}"),
    ]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    a0.loglog(scales, sweep[:, 0], "o-", label="exact SNR")
    a0.loglog(scales, sweep[:, 1], "s--", label="paper bound sqrt(G RV)/sigma")
    a0.loglog(scales, sweep[:, 2], "^--", label="sharp bound sqrt(G Var mu)/sigma")
    a0.set(xlabel="signal scale", ylabel="SNR", title=f"Thm H.3, G={G}, sigma=1")
    a0.legend(fontsize=8)
    a1.scatter(paper, exact, s=8, label="exact SNR")
    a1.scatter(paper[has_mc], mc[has_mc], s=8, marker="x", label="Monte-Carlo SNR")
    lim = [paper.min(), paper.max()]
    a1.loglog(lim, lim, "k--", label="SNR = bound")
    a1.set(xlabel="paper bound", ylabel="SNR", title="all prompts lie below the diagonal")
    a1.legend(fontsize=8)
    return {"check": "E3", "name": NAME, "title": "SNR bound and RV as an SNR proxy",
            "labels": "Thm H.3 (review Thm I.3), Assumption H.1, FrozenLake slip sweep (v1 Fig. 9 / review Fig. 11)",
            "claim": "SNR(x) <= sqrt(G) sqrt(RV(x))/sigma(x); high RV marks high-SNR prompts.",
            "numbers": numbers, "claims": claims, "verdict": toy.overall_verdict(claims),
            "figure": toy.save_figure(fig, fig_dir, NAME),
            "data": {"max_exact_ratio": float(r_paper.max()), "max_sharp_ratio": float(r_sharp.max()),
                     "max_mc_ratio": float(r_mc.max()), "rho_homogeneous": homo[0], "rho_heterogeneous": het[0]}}


if __name__ == "__main__":
    print(toy.format_result(main(**toy.cli_kwargs(__doc__))))
