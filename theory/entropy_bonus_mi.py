"""E6. The entropy bonus and I(X;Z): the exact identity, and entropy-ascent steps that *raise* MI.

Claims checked (RAGEN-2, arXiv 2604.06268; the labels in the result name the theorems):
* Thm M.2 (review: App. N): with Delta_in = H_theta(Z|X) - H_0(Z|X) and Delta_marg = H_theta(Z) - H_0(Z),
      I_theta - I_0 = Delta_marg - Delta_in      (an identity),
  so I strictly drops whenever Delta_in > Delta_marg.
* The paper's argument (not a proof) that an entropy bonus raises per-prompt dispersion more than marginal
  diversity and therefore lowers I(X;Z). We follow the exact entropy-ascent direction d theta = grad H(Z|X)
  (the bonus of every prompt, uniform prompts) and compute the first-order change dI/d eta = <grad I, grad H(Z|X)>
  with toy.mi_gradient (checked against central finite differences). A constructed counterexample: two prompts
  share a dominant "template" outcome and differ only in their minority outcomes; spreading mass off the template
  moves it onto prompt-specific outcomes, so Delta_marg > Delta_in and I rises before it eventually falls to 0
  (the uniform policy). Random policies show how common each sign is; that fraction is an empirical number.

What would falsify: an identity residual above 1e-10, a sign of Delta I that disagrees with Delta_marg - Delta_in,
or (for the paper's argument) the absence of any MI-raising entropy step.
Left out: the sampled entropy estimators of LLM training (exact entropies only).
Run: `python theory/entropy_bonus_mi.py` (seconds; saves theory/figures/entropy_bonus_mi.png).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):                      # run as a script: make `theory` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from theory import toy

NAME = "entropy_bonus_mi"


def deltas(pi0, pi1) -> tuple[float, float, float]:
    """(I_1 - I_0, Delta_marg, Delta_in) with I from the KL formula (independent of the identity)."""
    dI = toy.mutual_information(pi1) - toy.mutual_information(pi0)
    return (dI, toy.marginal_entropy(pi1) - toy.marginal_entropy(pi0),
            toy.conditional_entropy(pi1) - toy.conditional_entropy(pi0))


def entropy_direction(theta) -> np.ndarray:
    """d H(Z|X) / d theta for tabular logits (P, K): each prompt's entropy gradient, weighted 1/P."""
    return toy.entropy_gradient(toy.softmax(theta, axis=1)) / theta.shape[0]


def dI_along_entropy(theta) -> float:
    """First-order change of I(X;Z) per unit step along the entropy-ascent direction."""
    return float(np.sum(toy.mi_gradient(toy.softmax(theta, axis=1)) * entropy_direction(theta)))


def fd_mi_gradient(theta, h: float = 1e-6) -> np.ndarray:
    """Central finite-difference gradient of I(X;Z) wrt the logits (independent check of toy.mi_gradient)."""
    g = np.zeros_like(theta)
    for idx in np.ndindex(theta.shape):
        e = np.zeros_like(theta)
        e[idx] = h
        g[idx] = (toy.mutual_information(toy.softmax(theta + e, axis=1)) -
                  toy.mutual_information(toy.softmax(theta - e, axis=1))) / (2 * h)
    return g


def template_counterexample() -> np.ndarray:
    """Two prompts, K = 5: shared dominant outcome 0; prompt 0's minority mass on {1, 2}, prompt 1's on {3, 4}."""
    return np.array([[4.0, 1.0, 1.0, -4.0, -4.0],
                     [4.0, -4.0, -4.0, 1.0, 1.0]])


def entropy_ascent(theta0, eta: float, steps: int) -> np.ndarray:
    """I(X;Z) along exact entropy ascent theta += eta grad H(Z|X): (steps + 1,)."""
    theta, out = np.array(theta0, dtype=np.float64), []
    for _ in range(steps + 1):
        out.append(toy.mutual_information(toy.softmax(theta, axis=1)))
        theta = theta + eta * entropy_direction(theta)
    return np.array(out)


def main(size: str = "full", seed: int = 0, fig_dir=toy.FIG_DIR) -> dict:
    toy.check_size(size)
    rng = np.random.default_rng(seed)
    n_pairs, n_random, steps = (4000, 4000, 4000) if size == "full" else (400, 500, 1500)

    # 1. identity and sign rule on random policy pairs
    resid, sign_ok = 0.0, True
    for _ in range(n_pairs):
        P, K = int(rng.integers(2, 8)), int(rng.integers(2, 10))
        th0 = rng.uniform(0.3, 3) * rng.standard_normal((P, K))
        th1 = th0 + rng.uniform(0.01, 2) * rng.standard_normal((P, K))
        dI, d_marg, d_in = deltas(toy.softmax(th0, axis=1), toy.softmax(th1, axis=1))
        resid = max(resid, abs(dI - (d_marg - d_in)))
        sign_ok &= (d_in > d_marg + 1e-12) <= (dI < 0)                       # Delta_in > Delta_marg => I drops

    # 2. exact MI gradient vs finite differences
    fd_err = max(float(np.abs(toy.mi_gradient(toy.softmax(th, axis=1)) - fd_mi_gradient(th)).max())
                 for th in [rng.standard_normal((3, 4)) * 2 for _ in range(5)] + [template_counterexample()])

    # 3. the counterexample: first-order rate, one finite step, and the whole ascent path
    # the rate is <grad I, grad H(Z|X)> at eta = 0; the finite step and the path check it is not a rounding artefact
    theta_c = template_counterexample()
    rate_c = dI_along_entropy(theta_c)
    eta = 0.5
    dI_step, dm_step, din_step = deltas(toy.softmax(theta_c, axis=1),
                                        toy.softmax(theta_c + eta * entropy_direction(theta_c), axis=1))
    path = entropy_ascent(theta_c, 2.0, steps)                               # ends near uniform: I -> 0
    peak = int(path.argmax())                                                # I rises first, then falls

    # 4. how common is each sign on random policies (two logit scales)
    # Gaussian logits: scale 1 ~ flat policies, scale 3 ~ peaked ones (closer to a trained LLM's)
    fractions = {}
    for scale in (1.0, 3.0):
        rates = np.array([dI_along_entropy(scale * rng.standard_normal((int(rng.integers(2, 8)),
                                                                        int(rng.integers(2, 10)))))
                          for _ in range(n_random)])
        fractions[scale] = float(np.mean(rates > 0))

    # ---- report: numbers, then sub-claims phrased as the paper states or argues them
    numbers = {"identity max |dI - (D_marg - D_in)|": resid, "sign rule (D_in > D_marg => dI < 0) holds": sign_ok,
               "mi_gradient vs finite differences: max abs error": fd_err,
               "counterexample: I_0, H(Z|X)_0": f"{path[0]:.4f}, "
                                                f"{toy.conditional_entropy(toy.softmax(theta_c, axis=1)):.4f}",
               "counterexample: dI/d eta along entropy ascent": rate_c,
               f"counterexample: one step eta={eta}: dI, D_marg, D_in":
                   f"{dI_step:+.3e}, {dm_step:+.3e}, {din_step:+.3e}",
               "counterexample path: I_0 -> I_peak (step) -> I_final": f"{path[0]:.4f} -> {path[peak]:.4f} ({peak}) -> "
                                                                       f"{path[-1]:.4f}"}
    for scale, frac in fractions.items():
        numbers[f"random policies, logit scale {scale:g}: fraction with dI/d eta > 0"] = frac
    claims = [
        toy.claim("I_theta - I_0 = Delta_marg - Delta_in", resid < 1e-10,
                  f"max residual {resid:.1e} over {n_pairs} pairs"),
        toy.claim("Delta_in > Delta_marg => I drops", bool(sign_ok), f"sign rule held on all {n_pairs} pairs"),
        toy.claim("an entropy-bonus step always lowers I(X;Z) (paper's argument)", rate_c < 0 and dI_step < 0,
                  f"counterexample: dI/d eta = {rate_c:+.3e}, one step dI = {dI_step:+.3e} (D_marg {dm_step:+.2e} > "
                  f"D_in {din_step:+.2e}); I peaks at step {peak} before decaying"),
        toy.claim("on random policies an entropy step usually lowers I", max(fractions.values()) < 0.5,
                  ", ".join(f"scale {s:g}: {f:.1%} raise I" for s, f in fractions.items()),
                  contradicted=min(fractions.values()) > 0.5),
    ]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.arange(path.size) * 2.0, path)
    ax.axvline(peak * 2.0, color="k", ls=":", label=f"peak I = {path[peak]:.3f}")
    ax.set(xscale="symlog", xlabel="entropy-ascent time (eta x steps)", ylabel="I(X;Z) (nats)",
           title="shared template + prompt-specific minorities")
    ax.set_xlim(left=0)                              # time starts at 0: no (meaningless) negative symlog ticks
    ax.legend(fontsize=8)
    return {"check": "E6", "name": NAME, "title": "Entropy bonus vs MI",
            "labels": "Thm M.2 (review App. N)",
            "claim": "I_theta - I_0 = Delta_marg - Delta_in; an entropy bonus lowers I(X;Z).",
            "numbers": numbers, "claims": claims, "verdict": toy.overall_verdict(claims),
            "figure": toy.save_figure(fig, fig_dir, NAME),
            "data": {"residual": resid, "sign_ok": bool(sign_ok), "fd_err": fd_err, "rate_counterexample": rate_c,
                     "dI_step": dI_step, "fractions": fractions}}


if __name__ == "__main__":
    print(toy.format_result(main(**toy.cli_kwargs(__doc__))))
