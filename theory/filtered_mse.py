"""E7. Filtering as noise control: the MSE of the filtered estimator and the GRPO variance floor.

Claims checked (RAGEN-2, arXiv 2604.06268; the labels in the result name the theorems):
* Thm J.1 (review: Thm K.1): independent group estimators g_hat_i = g_i + e_i with E||e_i||^2 = sigma_i^2 and a
  kept set S of n groups give E||g_hat_S - g_bar_S||^2 = (1/n^2) sum_{i in S} sigma_i^2. Removing group j lowers
  it iff sigma_j^2 > (2n - 1)/n^2 sum_{i in S} sigma_i^2 (about twice the mean noise).
* The paper's gloss (App. J): dropping "high-noise (low-RV)" groups lowers that error. Whether low-RV groups are
  the noisy ones depends on the advantage: we compute sigma_i^2 exactly (enumerating every multiset of G = 16
  outcomes, toy.group_estimator_moments) for Bernoulli-reward prompts under (a) the group-mean baseline and (b)
  GRPO's std-normalised advantages, then drop the lowest-RV groups and track (1/n^2) sum sigma_i^2 and the SNR of
  the kept mean, ||g_bar_S|| / sqrt(MSE). (The main text, §5.2, instead calls filtering "signal-enhancement rather
  than noise-control".) Control: drop the same number of *random* learnable groups instead of the lowest-RV ones
  (many random draws), so that "filtering raises the MSE" can be told apart from "averaging fewer groups" (the
  1/n^2 factor alone raises it). Correlation verdicts carry a permutation p-value (toy.correlation_claim).
* Prop. N.1 (review: App. O): with A~ = A / sqrt(RV(x)) and Assumption H.1,
      E||g_hat_GRPO - g_GRPO||^2 >= (1/G) (sigma^2 / RV) E||s||^2.
Prompts are tabular softmax policies over K = 4 outcomes, reward 1[z = 0], success probability p ~ Beta(0.5, 0.5)
(many prompts near 0 or 1, as in agentic RL), plus hopeless (reward 0) and trivial (reward 1) prompts with RV = 0.
Each prompt owns its logits, so the group gradients live in orthogonal blocks and ||g_bar_S||^2 = sum ||g_i||^2/n^2.
Groups are ranked by their exact RV (the filter in E8 uses sampled RV).

What would falsify: a Monte-Carlo MSE away from the formula, the removal rule disagreeing with the recomputed MSE,
or a GRPO variance below the floor. Which way filtering moves the MSE is measured, not assumed.
Run: `python theory/filtered_mse.py` (seconds; saves theory/figures/filtered_mse.png).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):                      # run as a script: make `theory` and filter.py importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from theory import toy
import filter as rv_filter  # shared top-p mass rule (filter.select_groups), same code as the LLM trainer

NAME = "filtered_mse"
G, K = 16, 4


def bernoulli_prompts(rng, n_learn: int, n_zero: int):
    """Policies (P, K) and outcome rewards (P, K): n_learn prompts with reward 1[z = 0] and p ~ Beta(.5, .5),
    clipped to [1e-3, 1 - 1e-3], then n_zero hopeless and n_zero trivial prompts (constant reward, RV = 0)."""
    pis, Rs = [], []
    for i in range(n_learn + 2 * n_zero):
        p = np.clip(rng.beta(0.5, 0.5), 1e-3, 1 - 1e-3) if i < n_learn else rng.uniform(0.1, 0.9)
        rest = rng.dirichlet(np.ones(K - 1)) * (1 - p)
        pis.append(np.concatenate([[p], rest]))
        Rs.append(np.eye(K)[0] if i < n_learn else np.full(K, float(i >= n_learn + n_zero)))
    return np.array(pis), np.array(Rs)


def removal_rule_agrees(sig2: np.ndarray) -> bool:
    """For every prefix S (sorted order) and its last member j: the rule sigma_j^2 > (2n-1)/n^2 sum_S sigma^2
    predicts exactly when dropping j lowers (1/n^2) sum sigma^2 (checked where the two sides are not tied)."""
    ok = True
    for n in range(2, sig2.size + 1):
        s = sig2[:n]
        before, after = s.sum() / n ** 2, s[:-1].sum() / (n - 1) ** 2
        lhs, rhs = s[-1], (2 * n - 1) / n ** 2 * s.sum()
        if abs(lhs - rhs) > 1e-12 * max(rhs, 1e-300):
            ok &= (lhs > rhs) == (after < before)
    return bool(ok)


def mc_filtered_mse(rng, pis, Rs, S, n_mc: int) -> float:
    """Monte-Carlo E||g_hat_S - g_bar_S||^2 (group-mean baseline) for a fixed kept set S."""
    err = np.zeros(n_mc)
    for i in S:
        z = rng.choice(K, size=(n_mc, G), p=pis[i])
        A = toy.group_advantages(Rs[i][z], "mean")                           # (n_mc, G)
        w = np.zeros((n_mc, K))
        np.add.at(w, (np.repeat(np.arange(n_mc), G), z.ravel()), A.ravel() / G)
        g_hat = w - w.sum(axis=1, keepdims=True) * pis[i][None, :]
        mean = toy.task_gradient(pis[i], Rs[i]) * (1 - 1 / G)               # exact E g_hat (group-mean)
        err += np.sum((g_hat - mean) ** 2, axis=1)                           # blocks are orthogonal
    return float(err.mean() / len(S) ** 2)


def main(size: str = "full", seed: int = 0, fig_dir=toy.FIG_DIR) -> dict:
    toy.check_size(size)
    rng = np.random.default_rng(seed)
    n_learn, n_zero, n_mc, n_floor, n_rand = (40, 4, 3000, 500, 2000) if size == "full" else (12, 2, 800, 100, 500)
    pis, Rs = bernoulli_prompts(rng, n_learn, n_zero)
    P = len(pis)
    rv = toy.reward_variance(pis, Rs)                                        # exact RV (P,)
    moments = {adv: [toy.group_estimator_moments(pis[i], Rs[i], G, adv) for i in range(P)]
               for adv in ("mean", "grpo")}
    sig2 = {adv: np.array([m[1] for m in ms]) for adv, ms in moments.items()}          # sigma_i^2 (P,)
    sig_norm2 = {adv: np.array([m[0] @ m[0] for m in ms]) for adv, ms in moments.items()}  # ||E g_hat_i||^2
    order = np.argsort(-rv, kind="stable")                                   # highest RV first

    def mse(adv, n):                                                         # keep the n highest-RV groups
        return sig2[adv][order[:n]].sum() / n ** 2

    def snr(adv, n):
        return float(np.sqrt(sig_norm2[adv][order[:n]].sum() / sig2[adv][order[:n]].sum()))

    kept_p = rv_filter.select_groups(rv, "top_p", 0.9, mode="linear", include_zero=False, eps=0.01).numpy()
    n_top_p = len(kept_p)
    kept_sets = {"all groups": P, f"top-p 0.9 mass ({n_top_p})": n_top_p, "top 50%": P // 2, "top 25%": P // 4}

    # Thm J.1 by Monte Carlo on the top-p kept set; removal rule on every prefix of the RV ranking
    mc = mc_filtered_mse(rng, pis, Rs, order[:n_top_p], n_mc)
    mc_ratio = mc / mse("mean", n_top_p)
    rule_ok = all(removal_rule_agrees(sig2[adv][order]) for adv in sig2)

    # Prop. N.1: GRPO with the true-RV normaliser on Gaussian-noise prompts (closed-form variance)
    floor_ratio = []
    for _ in range(n_floor):
        pi = toy.softmax(rng.uniform(0.3, 2.5) * rng.standard_normal(5))
        mu, sigma = 10 ** rng.uniform(-2, 0.5) * rng.standard_normal(5), 10 ** rng.uniform(-1.5, 0.5)
        rv_x = float(toy.reward_variance(pi, mu)) + sigma ** 2
        var_grpo = toy.true_baseline_noise(pi, mu, sigma, G) / rv_x          # g_hat / sqrt(RV): variance / RV
        floor_ratio.append(sigma ** 2 / rv_x * float(toy.expected_sq_score(pi)) / G / var_grpo)
    floor_ratio = np.array(floor_ratio)

    learn = rv > 1e-12                                                       # RV = 0 up to rounding
    snr_i = {adv: sig_norm2[adv][learn] / sig2[adv][learn] for adv in sig2}  # per-group SNR^2, learnable
    # control: the top-p set keeps n_top_p learnable groups; keep n_top_p random learnable groups instead
    learn_idx = np.flatnonzero(learn)
    n_keep = min(n_top_p, learn_idx.size)                                   # top-p never keeps an RV-0 group
    rand_sets = [rng.choice(learn_idx, size=n_keep, replace=False) for _ in range(n_rand)]

    def rand_stats(adv):                                                     # (MSE, SNR) per random set
        return np.array([(sig2[adv][S].sum() / n_keep ** 2, np.sqrt(sig_norm2[adv][S].sum() / sig2[adv][S].sum()))
                         for S in rand_sets])
    rand = {adv: rand_stats(adv) for adv in sig2}
    rho = {adv: toy.spearman_test(rv[learn], sig2[adv][learn], rng) for adv in sig2}
    numbers = {"groups (learnable / RV=0)": f"{int(learn.sum())} / {int((~learn).sum())}",
               "Spearman(RV, sigma^2), group-mean": f"{rho['mean'][0]:.3f} (permutation p = {rho['mean'][1]:.3g})",
               "Spearman(RV, sigma^2), GRPO": f"{rho['grpo'][0]:.3f} (permutation p = {rho['grpo'][1]:.3g})",
               "Spearman(RV, per-group SNR), group-mean": toy.spearman(rv[learn], snr_i["mean"]),
               "Spearman(RV, per-group SNR), GRPO": toy.spearman(rv[learn], snr_i["grpo"]),
               "Thm J.1 Monte-Carlo / formula (top-p set, group-mean)": mc_ratio,
               "removal rule agrees with recomputed MSE": rule_ok,
               "Prop. N.1: max floor / variance": floor_ratio.max()}
    for label, n in kept_sets.items():
        numbers[f"{label}: MSE mean-baseline, MSE GRPO"] = f"{mse('mean', n):.3e}, {mse('grpo', n):.3e}"
        numbers[f"{label}: SNR of kept mean, mean-baseline / GRPO"] = f"{snr('mean', n):.3f} / {snr('grpo', n):.3f}"
    for adv, lab in (("mean", "mean-baseline"), ("grpo", "GRPO")):
        r = rand[adv]
        numbers[f"random {n_top_p} learnable groups ({n_rand} draws), {lab}: MSE median, SNR median"] = (
            f"{np.median(r[:, 0]):.3e}, {np.median(r[:, 1]):.3f}")

    def versus_random(adv):
        """Is the lowest-RV drop better than a random drop of as many learnable groups? (fraction of random
        draws at least as good = a permutation p-value)"""
        lab = "group-mean" if adv == "mean" else "GRPO"
        top_mse, top_snr = mse(adv, n_top_p), snr(adv, n_top_p)
        p_snr = float((1 + np.sum(rand[adv][:, 1] >= top_snr)) / (n_rand + 1))
        p_mse = float((1 + np.sum(rand[adv][:, 0] <= top_mse)) / (n_rand + 1))
        return toy.claim(f"RV ranking beats dropping as many random learnable groups, SNR of kept mean ({lab})",
                         p_snr < 0.05, f"SNR top-p {top_snr:.3f} vs random median {np.median(rand[adv][:, 1]):.3f} "
                         f"(p = {p_snr:.3g}); MSE top-p {top_mse:.3e} vs random median "
                         f"{np.median(rand[adv][:, 0]):.3e}, x{top_mse / np.median(rand[adv][:, 0]):.2f} (fraction of random "
                         f"draws with MSE <= top-p's: {p_mse:.3g}); random dropping alone raises the MSE "
                         f"x{np.median(rand[adv][:, 0]) / mse(adv, P):.2f} over all groups",
                         contradicted=np.mean(rand[adv][:, 1] >= top_snr) > 0.95)

    def direction(adv):
        full, top = mse(adv, P), mse(adv, n_top_p)
        return toy.claim(f"dropping low-RV groups lowers the MSE ({'group-mean' if adv == 'mean' else 'GRPO'})",
                         top < full, f"MSE all {full:.3e} -> top-p {top:.3e} (x{top / full:.2f}); SNR "
                         f"{snr(adv, P):.3f} -> {snr(adv, n_top_p):.3f}")
    claims = [
        toy.claim("E||g_hat_S - g_bar_S||^2 = (1/n^2) sum sigma_i^2", abs(mc_ratio - 1) < 0.05,
                  f"Monte-Carlo / formula = {mc_ratio:.4f} ({n_mc} draws)"),
        toy.claim("removal lowers the MSE iff sigma_j^2 > (2n-1)/n^2 sum sigma^2", rule_ok,
                  "every prefix, both advantages"),
        toy.claim("GRPO variance floor (sigma^2/RV) E||s||^2 / G", floor_ratio.max() <= 1 + 1e-9,
                  f"max floor/variance {floor_ratio.max():.4f} over {n_floor} prompts"),
        toy.correlation_claim("low-RV groups are the noisiest (group-mean)", *rho["mean"], -1,
                              what="Spearman(RV, sigma^2)"),
        toy.correlation_claim("low-RV groups are the noisiest (GRPO)", *rho["grpo"], -1, what="Spearman(RV, sigma^2)"),
        direction("mean"), direction("grpo"), versus_random("mean"), versus_random("grpo"),
        toy.claim("dropping low-RV groups raises the SNR of the kept mean (signal enhancement, §5.2)",
                  snr("mean", n_top_p) > snr("mean", P) and snr("grpo", n_top_p) > snr("grpo", P),
                  f"group-mean x{snr('mean', n_top_p) / snr('mean', P):.2f}, "
                  f"GRPO x{snr('grpo', n_top_p) / snr('grpo', P):.2f}",
                  contradicted=snr("mean", n_top_p) < snr("mean", P) and snr("grpo", n_top_p) < snr("grpo", P)),
    ]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    for adv, m, col in [("mean", "o", "C0"), ("grpo", "s", "C1")]:
        lab = "group-mean" if adv == "mean" else "GRPO"
        a0.scatter(rv, sig2[adv], marker=m, s=14, color=col, label=lab)
        ns = np.arange(1, P + 1)
        a1.plot(ns / P, [mse(adv, n) / mse(adv, P) for n in ns], color=col, label=f"MSE, {lab}")
        a1.plot(ns / P, [snr(adv, n) / snr(adv, P) for n in ns], color=col, ls="--", label=f"SNR of kept mean, {lab}")
    a0.set(xlabel="RV(x) = p(1-p)", ylabel="sigma_i^2 (exact)", yscale="log", title=f"group noise, G={G}")
    a0.legend(fontsize=8)
    a1.axvline(n_top_p / P, color="k", ls=":", label="top-p 0.9")
    a1.set(xlabel="kept fraction (highest RV first)", ylabel="relative to no filter", yscale="log",
           title="filtered estimator (Thm J.1)")
    a1.legend(fontsize=8)
    return {"check": "E7", "name": NAME, "title": "Filtering as noise control",
            "labels": "Thm J.1 (review Thm K.1), Prop. N.1 (review App. O), §5.2",
            "claim": "E||g_hat_S - g_bar_S||^2 = (1/n^2) sum sigma_i^2; dropping low-RV (high-noise) groups lowers it.",
            "numbers": numbers, "claims": claims, "verdict": toy.overall_verdict(claims),
            "figure": toy.save_figure(fig, fig_dir, NAME),
            "data": {"mc_ratio": mc_ratio, "rule_ok": rule_ok, "floor_max": float(floor_ratio.max()),
                     "mse_mean": (mse("mean", P), mse("mean", n_top_p)),
                     "mse_grpo": (mse("grpo", P), mse("grpo", n_top_p))}}


if __name__ == "__main__":
    print(toy.format_result(main(**toy.cli_kwargs(__doc__))))
