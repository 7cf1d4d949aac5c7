"""E8. End-to-end toy of the filter tables: a linear-softmax contextual bandit trained with and without
SNR-Aware Filtering, with a control arm that tests whether filtering is just diluted regularisation.

What it mirrors (RAGEN-2; check E8 of theory/RESULTS.md): the filter-ablation table (v1 Table 9 / review
Table 5: no filter vs top-p 0.9), the RV-quartile ablation (v1 Table 6 / review Table 8: Q1-only vs Q4-only), the
entropy / KL sweeps (App. L-M), and the paper's causal story: zero-RV groups contribute only regulariser gradient,
which erodes I(X;Z); filtering them out keeps the policy input-dependent and improves success.
The decisive control (not in the paper): the filter keeps a fraction f of the groups and averages the loss over
the kept ones, so relative to the task signal its entropy term is weighted ~ f times less than without
filtering. Arm "control" runs *no filter* with the entropy coefficient multiplied by the top-p arm's mean kept
fraction (same seed). If control ~ top-p, the filter's benefit is diluted regularisation, not selection.

Toy: a pool of prompts x with features phi(x) in R^D (D < pool size, one shared bias feature: interference),
pi(.|x) = softmax(W phi(x)) over K actions, W (K, D) trained from an input-dependent random init W0.
Prompt types: learnable (reward 1 for its own target action, else 0), hopeless (always 0), trivial (always 1);
hopeless and trivial prompts have RV = 0 forever. Each step: P = 8 prompts, G = 16 actions each, group-mean
REINFORCE advantages, exact entropy bonus (or exact KL-to-init) of the kept prompts, loss averaged over kept
groups, Adam. Selection uses filter.py (group_scores, select_groups, select_quartile): one implementation for the
toy and the LLM trainer. Exact success and I(X;Z) over the whole pool are logged.

Arms: no filter; top-p 0.9 (paper's mass rule on RV = variance, include_zero False); the official main-table
setting (softmax nucleus over std, include_zero True); control (no filter, entropy x mean kept fraction);
entropy 0; KL-to-init instead of entropy; Q1-only; Q4-only. Several seeds, mean +/- std for every arm.
What would falsify the paper's story here: top-p no better than no filter, or no better than the control; Q1 no
better than Q4; I(X;Z) not eroded without filtering. All are empirical: the verdicts are paired t-tests over seeds.
Left out: multi-turn credit assignment, clipping/PPO ratios, sampled entropy estimators.
Run: `python theory/filter_bandit.py` (seconds; saves theory/figures/filter_bandit.png).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):                      # run as a script: make `theory` and filter.py importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from theory import toy
import filter as rv_filter  # shared selection rules (same code as the LLM trainer)

NAME = "filter_bandit"
ARMS = ("no filter", "top-p 0.9", "top-p 0.9 softmax/std (code)", "control", "entropy 0", "KL-to-init",
        "Q1 only", "Q4 only")
COLORS = dict(zip(ARMS, ("tab:blue", "tab:orange", "tab:purple", "tab:green", "tab:gray", "tab:brown", "tab:olive",
                         "tab:red")))      # one colour per arm in every panel (control is green in both rows)
T_CRIT = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}  # 95 %, two-sided


def make_pool(rng, n_prompts: int, D: int, K: int, init_scale: float) -> dict:
    """Prompt pool: features (N, D) with a bias column, outcome rewards (N, K), type labels, init W0 (K, D)."""
    phi = rng.standard_normal((n_prompts, D)) / np.sqrt(D - 1)
    phi[:, 0] = 1.0                                                          # shared bias feature
    kind = rng.permutation(np.repeat(["learnable", "hopeless", "trivial"],
                                     [n_prompts // 2, n_prompts // 4, n_prompts - n_prompts // 2 - n_prompts // 4]))
    R = np.zeros((n_prompts, K))
    R[kind == "trivial"] = 1.0
    learn = np.flatnonzero(kind == "learnable")
    R[learn, rng.integers(0, K, size=learn.size)] = 1.0                      # one target action each
    return {"phi": phi, "R": R, "learnable": kind == "learnable",
            "W0": init_scale * rng.standard_normal((K, D))}


def evaluate(W, pool) -> tuple[float, float, float, float]:
    """Exact (success over all prompts, success over learnable prompts, I(X;Z), H(Z|X)) over the pool."""
    pi = toy.linear_policy(W, pool["phi"])
    success = np.sum(pi * pool["R"], axis=1)
    return (float(success.mean()), float(success[pool["learnable"]].mean()),
            toy.mutual_information(pi), toy.conditional_entropy(pi))


def select(arm: str, rewards: np.ndarray) -> np.ndarray:
    """Kept group indices for one arm from the (P, G) rewards, through filter.py."""
    r = torch.as_tensor(rewards)
    P = rewards.shape[0]
    if arm == "top-p 0.9":
        s = rv_filter.group_scores(r, "reward_variance")
        return rv_filter.select_groups(s, "top_p", 0.9, mode="linear", include_zero=False, eps=0.01).numpy()
    if arm.startswith("top-p 0.9 softmax"):
        s = rv_filter.group_scores(r, "reward_std")
        return rv_filter.select_groups(s, "top_p", 0.9, mode="softmax", include_zero=True, eps=0.01).numpy()
    if arm in ("Q1 only", "Q4 only"):
        s = rv_filter.group_scores(r, "reward_variance")
        return rv_filter.select_quartile(s, int(arm[1]), include_zero=True).numpy()
    return np.arange(P)                                                      # no filter / control / entropy 0 / KL


def train(arm: str, pool: dict, cfg: dict, rng, lam_ent: float) -> dict:
    """One run; returns curves (eval steps, success, success_learnable, I, H) and the mean kept fraction."""
    phi, R, W0 = pool["phi"], pool["R"], pool["W0"]
    P, G, K = cfg["P"], cfg["G"], R.shape[1]
    W, m, v = W0.copy(), np.zeros_like(W0), np.zeros_like(W0)               # Adam state
    b1, b2, lr = 0.9, 0.999, cfg["lr"]
    pi0_pool = toy.linear_policy(W0, phi)                                    # reference for the KL arm
    kept_frac, curve = [], [(0,) + evaluate(W, pool)]
    t_adam = 0
    for step in range(1, cfg["steps"] + 1):
        idx = rng.choice(len(phi), size=P, replace=False)
        pi = toy.linear_policy(W, phi[idx])                                  # (P, K)
        z = (rng.random((P, G, 1)) > np.cumsum(pi, axis=1)[:, None, :]).sum(axis=2)   # (P, G) actions
        z = np.minimum(z, K - 1)                                             # guard against cumsum rounding
        rewards = R[idx[:, None], z]                                         # (P, G)
        kept = select(arm, rewards)
        kept_frac.append(len(kept) / P)
        if len(kept) > 0:
            A = rewards - rewards.mean(axis=1, keepdims=True)                # group-mean advantages (P, G)
            cell = (np.arange(P)[:, None] * K + z).ravel()                   # flat (prompt, action) index
            w = np.bincount(cell, weights=A.ravel() / G, minlength=P * K).reshape(P, K)
            g_logits = w - w.sum(axis=1, keepdims=True) * pi                 # (P, K) sampled task gradient
            if arm == "KL-to-init":
                g_logits = g_logits - cfg["lam_kl"] * toy.kl_gradient(pi, pi0_pool[idx])
            else:
                g_logits = g_logits + lam_ent * toy.entropy_gradient(pi)
            grad = toy.to_linear(g_logits[kept], phi[idx[kept]]) / len(kept)   # mean over kept groups (K, D)
            t_adam += 1                                                      # Adam ascent step
            m = b1 * m + (1 - b1) * grad
            v = b2 * v + (1 - b2) * grad ** 2
            W = W + lr * (m / (1 - b1 ** t_adam)) / (np.sqrt(v / (1 - b2 ** t_adam)) + 1e-8)
        if step % cfg["eval_every"] == 0:
            curve.append((step,) + evaluate(W, pool))
    c = np.array(curve)
    return {"steps": c[:, 0], "success": c[:, 1], "success_learn": c[:, 2], "I": c[:, 3], "H": c[:, 4],
            "kept_frac": float(np.mean(kept_frac))}


def paired(a, b) -> tuple[float, float, float]:
    """Paired difference a - b over seeds: (mean, standard error, t critical value at 95 %)."""
    d = np.asarray(a) - np.asarray(b)
    se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("inf")
    return float(d.mean()), se, T_CRIT.get(d.size - 1, 2.0)


def run_arms(arms, lam_ent: float, pools, cfg, seed: int) -> dict:
    """Train every arm on every seed's pool (paired design, common random numbers): arm -> list of runs."""
    runs = {arm: [] for arm in arms}
    for s, pool in enumerate(pools):
        for arm in arms:                                                     # "top-p 0.9" precedes "control"
            lam = {"entropy 0": 0.0, "KL-to-init": 0.0}.get(arm, lam_ent)
            if arm == "control":
                lam = lam_ent * runs["top-p 0.9"][-1]["kept_frac"]           # same seed's mean kept fraction
            run = train(arm, pool, cfg, np.random.default_rng([seed + s, 1]), lam)
            run["lam_ent"] = lam
            runs[arm].append(run)
    return runs


def main(size: str = "full", seed: int = 0, fig_dir=toy.FIG_DIR, lam_ents=(0.05, 0.2, 0.5), lam_main: float = 0.2,
         lam_kl: float = 0.05) -> dict:
    toy.check_size(size)
    if lam_main not in lam_ents:
        raise ValueError(f"lam_main={lam_main} must be one of lam_ents={lam_ents}")
    n_seeds, cfg = (6, {"steps": 300, "eval_every": 20, "pool": 64}) if size == "full" else \
                   (3, {"steps": 40, "eval_every": 20, "pool": 32})
    cfg.update(P=8, G=16, lr=0.05, lam_kl=lam_kl, D=10, K=8, init_scale=1.0)
    pools = [make_pool(np.random.default_rng([s, 0]), cfg["pool"], cfg["D"], cfg["K"], cfg["init_scale"])
             for s in range(seed, seed + n_seeds)]
    sweep_arms = ("no filter", "top-p 0.9", "control")
    runs = {lam: run_arms(ARMS if lam == lam_main else sweep_arms, lam, pools, cfg, seed) for lam in lam_ents}

    def final(lam, arm, key):                                                # per-seed value at the last eval
        return np.array([r[key][-1] for r in runs[lam][arm]])
    first = runs[lam_main]["no filter"]
    numbers = {"seeds, steps, pool size, P x G, lr": f"{n_seeds}, {cfg['steps']}, {cfg['pool']}, "
                                                     f"{cfg['P']} x {cfg['G']}, {cfg['lr']}",
               "initial success, I(X;Z), H(Z|X) (mean over seeds)": ", ".join(
                   f"{np.mean([r[k][0] for r in first]):.3f}" for k in ("success", "I", "H"))}
    for lam in lam_ents:
        for arm in runs[lam]:
            vals = [final(lam, arm, k) for k in ("success", "success_learn", "I", "H")]
            vals.append(np.array([r["kept_frac"] for r in runs[lam][arm]]))
            tag = f"lam_ent={runs[lam][arm][0]['lam_ent']:.3g}" if arm == "control" else f"lam_ent={lam:g}"
            if arm in ("entropy 0", "KL-to-init"):
                tag = "lam_ent=0" + (f", lam_KL={lam_kl:g}" if arm == "KL-to-init" else "")
            numbers[f"[{tag}] {arm}: success | learnable | I | H(Z|X) | kept"] = " | ".join(
                f"{x.mean():.3f}+/-{x.std(ddof=1):.3f}" for x in vals)

    def test(text, lam, a, b, key):
        d, se, t = paired(final(lam, a, key), final(lam, b, key))
        return toy.claim(f"[lam_ent={lam:g}] {text}", d > t * se,
                         f"{a} - {b} = {d:+.3f} +/- {se:.3f} SE over {n_seeds} seeds; resolved when |difference| > "
                         f"{t} SE (t critical value, 95 %, two-sided)", contradicted=d < -t * se)

    def falls(lam):
        d, se, t = paired(final(lam, "no filter", "I"), np.array([r["I"][0] for r in runs[lam]["no filter"]]))
        return toy.claim(f"[lam_ent={lam:g}] without filtering I(X;Z) falls during training", d < -t * se,
                         f"final - initial I = {d:+.3f} +/- {se:.3f} SE; resolved when |difference| > {t} SE "
                         f"(t critical value, 95 %)", contradicted=d > t * se)
    claims = []
    for lam in lam_ents:
        claims += [test("top-p 0.9 beats no filter on success", lam, "top-p 0.9", "no filter", "success"),
                   test("top-p 0.9 beats the diluted-entropy control (selection, not dilution)", lam, "top-p 0.9",
                        "control", "success"),
                   falls(lam)]
    claims += [test("top-p 0.9 keeps more I(X;Z) than no filter", lam_main, "top-p 0.9", "no filter", "I"),
               test("Q1-only beats Q4-only on success (quartile ablation)", lam_main, "Q1 only", "Q4 only", "success"),
               test("KL-to-init keeps more I(X;Z) than the entropy bonus", lam_main, "KL-to-init", "no filter", "I")]

    def collapse(lam, arm):                # the toy's template collapse: I(X;Z) falls while H(Z|X) rises (means)
        I0, I1 = (np.mean([r["I"][i] for r in runs[lam][arm]]) for i in (0, -1))
        H0, H1 = (np.mean([r["H"][i] for r in runs[lam][arm]]) for i in (0, -1))
        return bool(I1 < 0.5 * I0 and H1 > H0)
    for lam in lam_ents:
        for arm in runs[lam]:
            if collapse(lam, arm):
                I0, I1 = (np.mean([r["I"][i] for r in runs[lam][arm]]) for i in (0, -1))
                H0, H1 = (np.mean([r["H"][i] for r in runs[lam][arm]]) for i in (0, -1))
                numbers[f"[lam_ent={lam:g}] {arm}: template collapse (I falls below half, H(Z|X) rises)"] = (
                    f"I {I0:.2f} -> {I1:.2f} while H(Z|X) {H0:.2f} -> {H1:.2f}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = [(lam_main, ARMS, axes[0])] + [(max(lam_ents), sweep_arms, axes[1])]
    for lam, arms, row in panels:
        for arm in arms:
            steps = runs[lam][arm][0]["steps"]
            label = arm + (" (template collapse: I falls, H(Z|X) rises)" if collapse(lam, arm) else "")
            for ax, key in zip(row, ("success", "I", "H")):
                y = np.array([r[key] for r in runs[lam][arm]])
                ax.plot(steps, y.mean(axis=0), label=label, color=COLORS[arm])
                ax.fill_between(steps, y.mean(0) - y.std(0), y.mean(0) + y.std(0), alpha=0.15, color=COLORS[arm])
        for ax, lab in zip(row, ("exact success (all prompts)", "I(X;Z) (nats)", "H(Z|X) (nats)")):
            ax.set(xlabel="step", ylabel=lab, title=f"lam_ent = {lam:g}, {n_seeds} seeds, mean +/- std")
        row[0].legend(fontsize=7)
    fig.tight_layout()
    return {"check": "E8", "name": NAME, "title": "End-to-end filter toy with a dilution control",
            "labels": "v1 Table 9 (review Table 5), v1 Table 6 (review Table 8), App. L-M sweeps",
            "claim": "Top-p RV filtering improves success and keeps I(X;Z); the gain is selection, "
                     "not diluted entropy.",
            "numbers": numbers, "claims": claims, "verdict": toy.overall_verdict(claims),
            "figure": toy.save_figure(fig, fig_dir, NAME),
            "data": {"runs": runs, "cfg": cfg, "lam_ents": tuple(lam_ents), "lam_main": lam_main}}


if __name__ == "__main__":
    print(toy.format_result(main(**toy.cli_kwargs(__doc__))))
