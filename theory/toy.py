"""Exact tools for toy softmax policies: the shared kernel of the theory checks E1-E8.

A toy policy is a matrix `pi` of shape (P, K): row x is pi(.|x) over K outcomes ("reasonings") for prompt x, and
the prompt distribution is uniform over the P rows (the paper's in-batch estimators use the same uniform-over-batch
distribution, the RAGEN-2 paper). Two parametrisations are used:

* tabular softmax: pi(.|x) = softmax(theta_x), theta (P, K); the score is s(z;x) = e_z - pi(.|x) (wrt theta_x);
* linear softmax:  pi(.|x) = softmax(W phi(x)), W (K, D), phi (P, D); the score is (e_z - pi(.|x)) phi(x)^T (wrt W).
  Every gradient below is first written in logit space (P, K); `to_linear` applies the chain rule to W.

What is exact here (float64, no sampling), with the paper's labels (v1 numbering, later revision's in brackets where it differs; docs/paper-map.md):
* H(Z|X), H(Z), I(X;Z) (eq. 2; I computed as E_x KL(pi_x || p), independently of the identity it is checked against);
  template mixing (Lemma I.1); the KL-closeness bound f(eps) (Thm L.1 / App. M);
* task gradient g_task(x) = E[A s] = pi * (R - pi.R) (Thm H.2 / I.2), E||s||^2 = 1 - ||pi||^2, RV(x);
* gradients of the KL term KL(pi || pi_ref), of the entropy term H(pi) and of I(X;Z) itself;
* mean and noise E||g_hat - E g_hat||^2 of the sampled group estimator (1/G) sum_k A_k s_k for deterministic
  outcome rewards, by enumerating every multiset of G outcomes: group-mean baseline, GRPO std-normalised
  advantages, or the true baseline E[R|x] (Thm H.3, Thm J.1, Prop. N.1);

Deliberately left out: autograd (softmax gradients are closed form), non-uniform prompt distributions, and any
printing (scripts print; this module returns numbers). Run the checks with `python theory/run_all.py`.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np

SIZES = ("full", "small")
FIG_DIR = Path(__file__).resolve().parent / "figures"                # the committed figures (full size)
SCRATCH = Path(__file__).resolve().parents[1] / "runs" / "theory-small"   # gitignored: small-size outputs
VERDICTS = ("holds", "holds with caveat", "partly contradicted", "contradicted")


# --------------------------------------------------------------------------------------------- input checks
def check_size(size: str) -> str:
    """Validate the `size` flag every check's main() takes."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    return size


def _as_policy(pi, name: str = "pi") -> np.ndarray:
    """(P, K) float64 array whose rows are probability distributions; ValueError naming `name` otherwise."""
    pi = np.asarray(pi, dtype=np.float64)
    if pi.ndim != 2 or pi.shape[1] < 2:
        raise ValueError(f"{name} must have shape (P, K) with K >= 2, got {pi.shape}")
    if np.any(pi < 0) or np.max(np.abs(pi.sum(axis=1) - 1.0)) > 1e-9:
        raise ValueError(f"{name} rows must be probability distributions (non-negative, summing to 1)")
    return pi


# --------------------------------------------------------------------------------------------- policies
def softmax(logits, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along `axis`."""
    logits = np.asarray(logits, dtype=np.float64)
    e = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def linear_policy(W, phi) -> np.ndarray:
    """pi(.|x) = softmax(W phi(x)) for every prompt: W (K, D), phi (P, D) -> (P, K)."""
    return softmax(np.asarray(phi) @ np.asarray(W).T, axis=1)


def to_linear(grad_logits, phi, weights=None) -> np.ndarray:
    """Chain rule logits -> W: sum_x w_x grad_logits[x] phi(x)^T, (P, K) x (P, D) -> (K, D); w_x = 1 by default."""
    grad_logits = np.asarray(grad_logits, dtype=np.float64)
    if weights is not None:
        grad_logits = grad_logits * np.asarray(weights, dtype=np.float64)[:, None]
    return grad_logits.T @ np.asarray(phi, dtype=np.float64)


# --------------------------------------------------------------------------------------------- information
def _xlogy(x, y) -> np.ndarray:
    """x * log(y) with the convention 0 * log(anything) = 0."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(np.where(x > 0, y, 1.0)), 0.0)


def entropy(p, axis: int = -1) -> np.ndarray:
    """Shannon entropy (nats) of the distributions along `axis`."""
    return -np.sum(_xlogy(p, p), axis=axis)


def kl(p, q, axis: int = -1) -> np.ndarray:
    """KL(p || q) along `axis` (inf where q = 0 < p)."""
    return np.sum(_xlogy(p, p) - _xlogy(p, q), axis=axis)


def marginal(pi) -> np.ndarray:
    """p(z) = (1/P) sum_x pi(z|x): (P, K) -> (K,)."""
    return _as_policy(pi).mean(axis=0)


def conditional_entropy(pi) -> float:
    """H(Z|X) = (1/P) sum_x H(pi(.|x)): within-input diversity (what entropy monitors track)."""
    return float(entropy(_as_policy(pi), axis=1).mean())


def marginal_entropy(pi) -> float:
    """H(Z) of the marginal p(z)."""
    return float(entropy(marginal(pi)))


def mutual_information(pi) -> float:
    """I(X;Z) = (1/P) sum_x KL(pi(.|x) || p): input dependence, computed without the identity H(Z) - H(Z|X)."""
    pi = _as_policy(pi)
    return float(kl(pi, marginal(pi)[None, :], axis=1).mean())


def mix_template(pi, q, alpha: float) -> np.ndarray:
    """Template mixing of Lemma I.1: p_a(z|x) = (1 - a) pi(z|x) + a q(z), q prompt-independent."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    return (1.0 - alpha) * _as_policy(pi) + alpha * np.asarray(q, dtype=np.float64)[None, :]


def h2(d) -> np.ndarray:
    """Binary entropy h2(d) = -d log d - (1-d) log(1-d) in nats."""
    d = np.asarray(d, dtype=np.float64)
    return -(_xlogy(d, d) + _xlogy(1.0 - d, 1.0 - d))


def kl_closeness_bound(eps, n_x: int, n_z: int) -> np.ndarray:
    """f(eps) = 2 (delta log(|X||Z| - 1) + h2(delta)), delta = sqrt(eps / 2) (Thm L.1 / review App. M).

    Pinsker gives TV <= delta and the Fannes-Audenaert inequality is used for H(X,Z) and H(Z); it needs
    delta <= 1 - 1/|Z| (the stricter of the two dimensions), so outside that range the bound is returned as +inf
    (vacuous) rather than as a number the theorem does not cover.
    """
    delta = np.sqrt(np.asarray(eps, dtype=np.float64) / 2.0)
    f = 2.0 * (delta * math.log(n_x * n_z - 1) + h2(np.minimum(delta, 1.0)))
    return np.where(delta <= 1.0 - 1.0 / n_z, f, np.inf)


# --------------------------------------------------------------------------------------------- scores, gradients
def scores(pi_x) -> np.ndarray:
    """Tabular scores s(z;x) = e_z - pi(.|x) for every outcome z: (K,) -> (K, K), row z = s(z;x)."""
    pi_x = np.asarray(pi_x, dtype=np.float64)
    return np.eye(pi_x.size) - pi_x[None, :]


def expected_sq_score(pi) -> np.ndarray:
    """E_z ||s(z;x)||^2 = 1 - ||pi(.|x)||^2 for the tabular softmax, per prompt: (P, K) -> (P,)."""
    pi = np.asarray(pi, dtype=np.float64)
    return 1.0 - np.sum(pi * pi, axis=-1)


def reward_variance(pi, R, sigma=0.0) -> np.ndarray:
    """RV(x) = Var(R|x) = Var_pi(mu) + sigma^2 for reward R = mu(z) + noise (Def. E.4 / F.4): -> (P,)."""
    pi, R = np.asarray(pi, dtype=np.float64), np.asarray(R, dtype=np.float64)
    mean = np.sum(pi * R, axis=-1, keepdims=True)
    return np.sum(pi * (R - mean) ** 2, axis=-1) + np.asarray(sigma, dtype=np.float64) ** 2


def task_gradient(pi, R) -> np.ndarray:
    """g_task(x) = E_z[(R - b) s] = pi * (R - pi.R) in logit space, for any baseline b(x): -> (P, K).

    The baseline drops out of the expectation because E_z[s] = 0 (Def. E.3); noise on R drops out likewise.
    """
    pi, R = np.asarray(pi, dtype=np.float64), np.asarray(R, dtype=np.float64)
    return pi * (R - np.sum(pi * R, axis=-1, keepdims=True))


def entropy_gradient(pi) -> np.ndarray:
    """d H(pi(.|x)) / d theta_x = -pi * (log pi + H): ascent direction of the entropy bonus, (P, K)."""
    pi = np.asarray(pi, dtype=np.float64)
    logp = np.log(np.where(pi > 0, pi, 1.0))
    return -pi * (logp + entropy(pi, axis=-1)[..., None])


def kl_gradient(pi, pi_ref) -> np.ndarray:
    """d KL(pi(.|x) || pi_ref(.|x)) / d theta_x = pi * (log pi - log pi_ref - KL), (P, K)."""
    pi, pi_ref = np.asarray(pi, dtype=np.float64), np.asarray(pi_ref, dtype=np.float64)
    d = np.log(pi) - np.log(pi_ref)                                          # (P, K) log-ratio
    return pi * (d - np.sum(pi * d, axis=-1, keepdims=True))


def mi_gradient(pi) -> np.ndarray:
    """d I(X;Z) / d theta (tabular, uniform prompts) = d H(Z)/d theta - d H(Z|X)/d theta, (P, K).

    d H(Z) / d pi(z|x) = -(log p(z) + 1) / P, pushed through the softmax Jacobian of prompt x;
    d H(Z|X) / d theta_x = entropy_gradient(pi)[x] / P.
    """
    pi = _as_policy(pi)
    logm = np.log(marginal(pi))                                              # (K,)
    d_hz = -pi * (logm[None, :] - (pi @ logm)[:, None])                      # (P, K), times 1/P below
    return (d_hz - entropy_gradient(pi)) / pi.shape[0]


# --------------------------------------------------------------------------------------------- group estimators
def compositions(K: int, G: int) -> np.ndarray:
    """All count vectors n in N^K with sum G (stars and bars): (C(G+K-1, K-1), K) int array."""
    if K < 1 or G < 1:
        raise ValueError(f"K and G must be >= 1, got K={K}, G={G}")
    bars = np.array(list(itertools.combinations(range(G + K - 1), K - 1)), dtype=np.int64).reshape(-1, K - 1)
    edges = np.concatenate([np.full((len(bars), 1), -1), bars, np.full((len(bars), 1), G + K - 1)], axis=1)
    return np.diff(edges, axis=1) - 1                                        # gaps between bars = counts


def multinomial_pmf(counts, pi_x) -> np.ndarray:
    """Probability of each count vector under G i.i.d. draws from pi_x: (C, K) -> (C,)."""
    counts, pi_x = np.asarray(counts), np.asarray(pi_x, dtype=np.float64)
    G = int(counts[0].sum())
    log_fact = np.array([math.lgamma(c + 1) for c in range(G + 1)])         # log c! for c = 0..G
    log_coef = log_fact[G] - log_fact[counts].sum(axis=1)
    return np.exp(log_coef + np.sum(_xlogy(counts, pi_x[None, :]), axis=1))


ADVANTAGES = ("mean", "grpo", "true")


def group_advantages(R_k, advantage: str = "mean", eps: float = 1e-6, baseline=None) -> np.ndarray:
    """Advantages of G sampled rewards (..., G): R - mean ("mean"), (R - mean)/(std_unbiased + eps) ("grpo"),
    or R - baseline with a given baseline such as E[R|x] or a critic's value ("true")."""
    R_k = np.asarray(R_k, dtype=np.float64)
    if advantage == "true":
        if baseline is None:
            raise ValueError("advantage='true' needs baseline (E[R|x] or a critic value)")
        return R_k - np.asarray(baseline, dtype=np.float64)[..., None]
    centred = R_k - R_k.mean(axis=-1, keepdims=True)
    if advantage == "mean":
        return centred
    if advantage == "grpo":
        return centred / (R_k.std(axis=-1, ddof=1, keepdims=True) + eps)
    raise ValueError(f"advantage must be one of {ADVANTAGES}, got {advantage!r}")


def group_estimator_moments(pi_x, R_x, G: int, advantage: str = "mean", eps: float = 1e-6):
    """Exact mean (K,) and noise E||g_hat - E g_hat||^2 of g_hat = (1/G) sum_k A_k s(z_k; x) in logit space.

    R_x (K,) is a deterministic reward per outcome; the estimator depends on the G draws only through their
    counts n (K,), so E[.] is a finite sum over all multisets with multinomial weights (no sampling).
    g_hat(n) = (1/G) sum_z n_z A_z(n) (e_z - pi).
    """
    if advantage not in ADVANTAGES:
        raise ValueError(f"advantage must be one of {ADVANTAGES}, got {advantage!r}")
    pi_x, R_x = np.asarray(pi_x, dtype=np.float64), np.asarray(R_x, dtype=np.float64)
    n = compositions(pi_x.size, G)                                           # (C, K) counts
    prob = multinomial_pmf(n, pi_x)                                          # (C,)
    mean_r = n @ R_x / G                                                     # (C,) group mean reward
    A = R_x[None, :] - mean_r[:, None]                                       # (C, K) advantage of outcome z
    if advantage == "grpo":
        var_r = (n * A ** 2).sum(axis=1) / (G - 1)                           # unbiased sample variance
        A = A / (np.sqrt(var_r)[:, None] + eps)
    elif advantage == "true":
        A = np.broadcast_to(R_x - pi_x @ R_x, n.shape)
    w = n * A / G                                                            # (C, K) weight of each score e_z - pi
    g_hat = w - w.sum(axis=1, keepdims=True) * pi_x[None, :]                 # (C, K) = sum_z w_z (e_z - pi)
    mean = prob @ g_hat
    noise = float(prob @ np.sum((g_hat - mean) ** 2, axis=1))
    return mean, noise


def true_baseline_noise(pi_x, mu_x, sigma: float, G: int) -> float:
    """Closed form of E||g_hat - g||^2 for b = E[R|x] and R = mu(z) + N(0, sigma^2) noise (Thm H.3 setting):
    (1/G) (E[A^2 ||s||^2] - ||g||^2), with E[A^2 | z] = (mu_z - pi.mu)^2 + sigma^2 and ||s_z||^2 = ||e_z - pi||^2."""
    pi_x, mu_x = np.asarray(pi_x, dtype=np.float64), np.asarray(mu_x, dtype=np.float64)
    a2 = (mu_x - pi_x @ mu_x) ** 2 + sigma ** 2                              # (K,)
    s2 = np.sum(scores(pi_x) ** 2, axis=1)                                   # (K,)
    g = task_gradient(pi_x, mu_x)
    return float((pi_x @ (a2 * s2) - g @ g) / G)


# --------------------------------------------------------------------------------------------- statistics, output
def spearman(a, b) -> float:
    """Spearman's rho with average ranks for ties (numpy only; scipy is not a dependency)."""
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))) or np.size(a) != np.size(b):
        raise ValueError("spearman needs two finite sequences of equal length")
    def ranks(v):
        v = np.asarray(v, dtype=np.float64)
        order = np.argsort(v, kind="stable")
        r = np.empty(v.size)
        r[order] = np.arange(v.size, dtype=np.float64)
        for value in np.unique(v):                                           # average ranks of ties
            tie = v == value
            r[tie] = r[tie].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb / denom) if denom > 0 else float("nan")


def spearman_test(a, b, rng: np.random.Generator, n_perm: int = 2000) -> tuple[float, float]:
    """(rho, two-sided permutation p-value): p = (1 + #{|rho_perm| >= |rho|}) / (n_perm + 1)."""
    rho = spearman(a, b)
    if math.isnan(rho):                                  # a constant input: no correlation to test
        return rho, math.nan
    b = np.asarray(b, dtype=np.float64)
    null = np.array([spearman(a, rng.permutation(b)) for _ in range(n_perm)])
    return rho, float((1 + np.sum(np.abs(null) >= abs(rho) - 1e-12)) / (n_perm + 1))


def correlation_claim(text: str, rho: float, p: float, sign: int, alpha: float = 0.05, what: str = "Spearman",
                      note: str = "") -> dict:
    """A correlation verdict with a test: holds if rho has the claimed sign and p < alpha; contradicted if it has
    the opposite sign and p < alpha; otherwise not resolved (a small rho is not evidence either way)."""
    significant = bool(p < alpha)                        # NaN p: not significant
    return claim(text, significant and np.sign(rho) == sign,
                 f"{what} = {rho:+.2f} (permutation p = {p:.3g})" + (f"; {note}" if note else ""),
                 contradicted=significant and np.sign(rho) == -sign)


def overall_verdict(claims: list[dict]) -> str:
    """All sub-claims hold -> "holds"; all contradicted -> "contradicted"; some (not all) contradicted ->
    "partly contradicted"; none contradicted but some not resolved -> "holds with caveat". A check with a
    contradicted sub-claim is never summarised as holding."""
    verdicts = {c["verdict"] for c in claims}
    if verdicts == {"holds"}:
        return "holds"
    if verdicts == {"contradicted"}:
        return "contradicted"
    if "contradicted" in verdicts:
        return "partly contradicted"
    return "holds with caveat"


def claim(text: str, ok, evidence: str, contradicted=None) -> dict:
    """One sub-claim with a verdict computed from booleans: holds if `ok`, contradicted if `contradicted`
    (defaults to `not ok`), otherwise "not resolved" (e.g. a difference inside the seed noise)."""
    if contradicted is None:
        contradicted = not ok
    verdict = "holds" if ok else ("contradicted" if contradicted else "not resolved")
    return {"claim": text, "verdict": verdict, "evidence": evidence}


def format_result(result: dict) -> str:
    """Plain-text table of a check's result dict (what each script prints when run directly)."""
    lines = [f"{result['check']}  {result['title']}  [{result['labels']}]", ""]
    width = max(len(k) for k in result["numbers"])
    for key, value in result["numbers"].items():
        lines.append(f"  {key:<{width}}  {fmt(value)}")
    lines.append("")
    for c in result["claims"]:
        lines.append(f"  [{c['verdict']}] {c['claim']}: {c['evidence']}")
    lines.append(f"\n  verdict: {result['verdict']}   figure: {result['figure']}")
    return "\n".join(lines)


def fmt(value) -> str:
    """Compact number formatting shared by the printed tables and RESULTS.md."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    v = float(value)
    if v == 0.0 or not math.isfinite(v):
        return f"{v:g}"
    return f"{v:.3e}" if (abs(v) < 1e-3 or abs(v) >= 1e4) else f"{v:.4f}"


def cli_kwargs(doc: str, argv=None) -> dict:
    """Flags shared by every check script (--size, --seed, --fig-dir) as main() keyword arguments."""
    import argparse
    ap = argparse.ArgumentParser(description=" ".join(doc.strip().split("\n\n")[0].split()))   # first paragraph
    ap.add_argument("--size", default="full", choices=SIZES, help="full: the RESULTS.md size; small: the test size")
    ap.add_argument("--seed", type=int, default=0, help="base seed (every check is deterministic given it)")
    ap.add_argument("--fig-dir", default=None, help="folder for the check's figure (default: theory/figures at full "
                    "size, the committed ones; runs/theory-small at small size, so a quick look overwrites nothing)")
    args = ap.parse_args(argv)
    fig_dir = args.fig_dir or str(FIG_DIR if args.size == "full" else SCRATCH)
    return {"size": args.size, "seed": args.seed, "fig_dir": fig_dir}


def save_figure(fig, fig_dir, name: str) -> str:
    """Save a matplotlib figure as <fig_dir>/<name>.png, close it, return the path as a string."""
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    path = fig_dir / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return str(path)
