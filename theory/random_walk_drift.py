"""E4. Drift without signal: zero-mean updates move the parameters ~ sqrt(T), and what that does to I(X;Z).

Claims checked (RAGEN-2, arXiv 2604.06268; the labels in the result name the theorems):
* Thm H.4 (review: Thm I.4): theta_{t+1} = theta_t + eta xi_t with independent xi_t, E xi_t = 0, E||xi_t||^2 = v
  gives E||theta_T - theta_0||^2 = eta^2 T v (cross terms vanish), i.e. RMS drift ~ sqrt(T).
  The same argument only needs E[xi_t | past] = 0 (a martingale), so it also covers the realistic signal-free
  update of an RV = 0 prompt under a noisy critic, xi = -delta (1/G) sum_k s(z_k; x) with z_k ~ pi_theta_t: there
  E||theta_T - theta_0||^2 = eta^2 sum_t E||xi_t||^2 although E||xi_t||^2 changes with theta_t.
* The paper's reading that signal-free updates erode input dependence (§3.2: "updates that are pure
  regularisation, lowering I(X;Z)"). Drift by itself has no preferred direction, so we measure E[Delta I] under
  two kinds of zero-mean drift of a tabular policy's logits theta (P, K):
    independent : every prompt's logits take their own random step (prompts drift apart),
    shared      : every prompt's logits take the same random step (an input-agnostic direction).
  Their signs can differ; neither sign is a theorem, so the numbers are recorded, not asserted.

What would falsify: a drift ratio E||theta_T - theta_0||^2 / (eta^2 T v) away from 1 beyond Monte-Carlo error.
Left out: optimiser state (Adam rescales steps; the identity is for plain SGD steps).
Run: `python theory/random_walk_drift.py` (seconds; saves theory/figures/random_walk_drift.png).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):                      # run as a script: make `theory` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from theory import toy

NAME = "random_walk_drift"


def gaussian_walk(rng, n_runs: int, d: int, T: int, eta: float, v: float, checkpoints) -> dict[int, float]:
    """Monte-Carlo mean of ||theta_t - theta_0||^2 at the checkpoints; xi_t ~ N(0, (v/d) I_d)."""
    delta = np.zeros((n_runs, d))
    out = {}
    for t in range(1, T + 1):
        delta += eta * np.sqrt(v / d) * rng.standard_normal((n_runs, d))
        if t in checkpoints:
            out[t] = float(np.mean(np.sum(delta ** 2, axis=1)))
    return out


def critic_noise_walk(rng, theta0, n_runs: int, T: int, eta: float, G: int, critic_std: float):
    """Signal-free updates of RV = 0 prompts under a noisy critic, for n_runs independent copies.

    Each step, for every prompt: z_1..z_G ~ pi_theta(.|x), critic error delta ~ N(0, critic_std^2), and
    xi_x = -delta (1/G) sum_k (e_{z_k} - pi_x). Returns (mean ||theta_T - theta_0||^2, eta^2 sum_t mean ||xi_t||^2).
    """
    P, K = theta0.shape
    theta = np.broadcast_to(theta0, (n_runs, P, K)).copy()
    step_sq = 0.0
    for _ in range(T):
        pi = toy.softmax(theta, axis=-1)                                     # (n, P, K)
        u = rng.random((n_runs, P, G, 1))
        z = (u > np.cumsum(pi, axis=-1)[:, :, None, :]).sum(axis=-1)         # inverse-CDF draws (n, P, G)
        counts = (z[..., None] == np.arange(K)).sum(axis=2)                  # (n, P, K)
        delta = critic_std * rng.standard_normal((n_runs, P, 1))
        xi = -delta * (counts / G - pi)                                      # (1/G) sum_k s_k = counts/G - pi
        step_sq += float(np.mean(np.sum(xi ** 2, axis=(1, 2))))
        theta += eta * xi
    return float(np.mean(np.sum((theta - theta0) ** 2, axis=(1, 2)))), eta ** 2 * step_sq


def mi_drift(rng, theta0, n_runs: int, T: int, eta: float, kind: str, checkpoints) -> dict[int, np.ndarray]:
    """Delta I(X;Z) per run at the checkpoints under zero-mean Gaussian logit drift, per-prompt step variance 1."""
    P, K = theta0.shape
    I0 = toy.mutual_information(toy.softmax(theta0, axis=1))
    theta = np.broadcast_to(theta0, (n_runs, P, K)).copy()
    out = {}
    for t in range(1, T + 1):
        shape = (n_runs, P, K) if kind == "independent" else (n_runs, 1, K)  # shared: one step for all x
        theta += eta * rng.standard_normal(shape) / np.sqrt(K)
        if t in checkpoints:
            out[t] = np.array([toy.mutual_information(toy.softmax(th, axis=1)) for th in theta]) - I0
    return out


def main(size: str = "full", seed: int = 0, fig_dir=toy.FIG_DIR) -> dict:
    toy.check_size(size)
    rng = np.random.default_rng(seed)
    n_runs, n_mi, T = (4000, 400, 400) if size == "full" else (1500, 100, 100)
    checkpoints = [T // 16, T // 4, T]
    P, K, eta, v = 8, 6, 0.1, 1.0

    # 1. Thm H.4 with i.i.d. Gaussian steps
    walk = gaussian_walk(rng, n_runs, P * K, T, eta, v, checkpoints)
    ratios = {t: walk[t] / (eta ** 2 * t * v) for t in checkpoints}
    slope = float(np.polyfit(np.log(checkpoints), 0.5 * np.log([walk[t] for t in checkpoints]), 1)[0])

    # 2. martingale version: noisy-critic updates of RV = 0 prompts (state-dependent step size)
    theta0 = 1.5 * np.random.default_rng([seed, 7]).standard_normal((P, K))
    n_mart = 1000                                                            # runs of the martingale check
    moved, predicted = critic_noise_walk(rng, theta0, n_mart, T // 4, 1.0, 16, 0.5)
    mart_ratio = moved / predicted

    # 3. what drift does to I(X;Z): independent vs shared zero-mean logit drift
    I0 = toy.mutual_information(toy.softmax(theta0, axis=1))
    dI = {kind: mi_drift(rng, theta0, n_mi, T, 0.2, kind, checkpoints) for kind in ("independent", "shared")}

    numbers = {f"E|dtheta|^2 / (eta^2 T v) at T={t}": ratios[t] for t in checkpoints}
    numbers["log-log slope of RMS drift vs T (theory 0.5)"] = slope
    numbers["noisy-critic RV=0 updates: E|dtheta|^2 / (eta^2 sum_t E|xi_t|^2)"] = mart_ratio
    numbers["initial I(X;Z) (nats; log P = %.3f)" % np.log(P)] = I0
    for kind in dI:
        for t in checkpoints:
            d = dI[kind][t]
            numbers[f"{kind} drift, T={t}: mean dI +/- SE, frac(dI<0)"] = (
                f"{d.mean():+.4f} +/- {d.std(ddof=1) / np.sqrt(d.size):.4f}, {np.mean(d < 0):.2f}")

    def sign_claim(kind):                                                    # mean dI < 0 at 3 SE: "lowers"
        d = dI[kind][T]
        se = d.std(ddof=1) / np.sqrt(d.size)
        return toy.claim(f"signal-free {kind} drift lowers I(X;Z) (paper's reading)", d.mean() < -3 * se,
                         f"mean dI at T={T}: {d.mean():+.4f} +/- {se:.4f} (SE), {np.mean(d < 0):.0%} of runs lower",
                         contradicted=d.mean() > 3 * se)
    claims = [
        toy.claim("E||theta_T - theta_0||^2 = eta^2 T v", all(abs(r - 1) < 0.05 for r in ratios.values()),
                  "ratios " + ", ".join(f"T={t}: {r:.4f}" for t, r in ratios.items())),
        toy.claim("RMS drift ~ sqrt(T)", abs(slope - 0.5) < 0.02, f"log-log slope {slope:.4f}"),
        toy.claim("same identity for state-dependent (martingale) signal-free updates", abs(mart_ratio - 1) < 0.05,
                  f"ratio {mart_ratio:.4f} (noisy critic, RV = 0, {n_mart} runs)"),
        sign_claim("independent"), sign_claim("shared"),
    ]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    a0.loglog(checkpoints, [walk[t] for t in checkpoints], "o", label="Monte-Carlo E||theta_T - theta_0||^2")
    a0.loglog(checkpoints, [eta ** 2 * t * v for t in checkpoints], "k--", label="eta^2 T v")
    a0.set(xlabel="T", ylabel="squared drift", title="Thm H.4")
    a0.legend(fontsize=8)
    for kind in dI:
        m = [dI[kind][t].mean() for t in checkpoints]
        se = [dI[kind][t].std(ddof=1) / np.sqrt(n_mi) for t in checkpoints]
        a1.errorbar(checkpoints, m, yerr=se, fmt="o-", capsize=3, label=f"{kind} drift")
    a1.axhline(0, color="k", lw=0.8)
    a1.set(xscale="log", xlabel="T", ylabel="E[I_T - I_0] (nats)", title=f"zero-mean logit drift, P={P}, K={K}")
    a1.legend(fontsize=8)
    return {"check": "E4", "name": NAME, "title": "Drift without signal",
            "labels": "Thm H.4 (review Thm I.4), §3.2",
            "claim": "Zero-mean updates give E||theta_T - theta_0||^2 = eta^2 T v; signal-free updates lower I(X;Z).",
            "numbers": numbers, "claims": claims, "verdict": toy.overall_verdict(claims),
            "figure": toy.save_figure(fig, fig_dir, NAME),
            "data": {"ratios": ratios, "martingale_ratio": mart_ratio, "slope": slope}}


if __name__ == "__main__":
    print(toy.format_result(main(**toy.cli_kwargs(__doc__))))
