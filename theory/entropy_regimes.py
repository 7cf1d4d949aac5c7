"""E1. Entropy identity, the four regimes, template mixing, and the in-batch MI estimators on exact log-probs.

Claims checked (RAGEN-2, arXiv 2604.06268; the labels in the result name the theorems):
* Shannon identity H(Z) = H(Z|X) + I(X;Z) (eq. 2, v1 App. E);
* template mixing contracts MI: p_a = (1-a) pi + a q  =>  I_a <= (1-a) I (Lemma I.1; review: Lemma J.1);
* four regimes (Fig. 1): entropy H(Z|X) cannot tell "diverse" from "template collapse" apart, I(X;Z) can;
* in-batch cross-scoring (v1 Table 1, §2.3): MI-Est / MI-Seq-Est / Retrieval-Acc computed from sampled pairs
  converge to the exact uniform-batch quantities, and to 0 / chance 1/P under collapse.
The estimators are `mi_metrics.collapse_metrics`, the function the LLM trainer logs, applied to exact
log-probability matrices L[i, j] = log pi(z_i | x_j) of a tabular policy (row = sampled reasoning, column = prompt),
so the toy checks the very implementation the diagnostic uses.

Reasonings of T tokens are T i.i.d. draws from pi(.|x); T = 1 checks MI-Est against I(X;Z); T = 3 shows what the
per-token MI-Est converges to under the paper's length-normalised marginal (I(X;Z^T)/T) and under the official
code's marginal over per-token means (a different number, computed exactly by enumerating all K^T sequences).

What would falsify: an identity residual above 1e-10, a mixing ratio I_a / ((1-a) I) above 1, estimators that do
not approach the exact values as G grows, or retrieval above chance under exact collapse.
Left out: scorers other than the evaluated policy (the frozen-scorer control lives in mi_proxy.py).
Run: `python theory/entropy_regimes.py` (seconds; prints a table, saves theory/figures/entropy_regimes.png).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):                      # run as a script: make `theory` and repo modules importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from theory import toy
import mi_metrics  # shared estimator: mi_metrics.collapse_metrics (same code as the LLM diagnostic)

NAME = "entropy_regimes"
REGIMES = ("diverse", "template collapse", "compressed", "low-entropy collapse")


def regime_policies(P: int = 8, m: int = 4, floor: float = 0.02, seed: int = 0) -> dict[str, np.ndarray]:
    """The four regimes of Fig. 1 as (P, K = P m) policies.

    A high-entropy block distribution q_high and a peaked one q_low over m outcomes; "diverse" / "compressed"
    put prompt x's block on outcomes [x m, (x+1) m), the collapse regimes put every prompt on block 0.
    A uniform floor keeps every log-probability finite. Diverse and template collapse hold the same multiset of
    probabilities in every row, so their H(Z|X) is identical by construction.
    """
    rng = np.random.default_rng(seed)
    K = P * m
    q_high = toy.softmax(0.3 * rng.standard_normal(m))                       # near-uniform over a block
    q_low = np.full(m, 0.02 / (m - 1))
    q_low[0] = 0.98                                                          # near-deterministic
    out = {}
    for name, q, own_block in [("diverse", q_high, True), ("template collapse", q_high, False),
                               ("compressed", q_low, True), ("low-entropy collapse", q_low, False)]:
        pi = np.full((P, K), floor / K)
        for x in range(P):
            b = x if own_block else 0
            pi[x, b * m:(b + 1) * m] += (1.0 - floor) * q
        out[name] = pi
    return out


def sequence_logprobs(pi: np.ndarray, T: int) -> np.ndarray:
    """log p(z_1..z_T | x) for every sequence of T i.i.d. tokens: (K^T, P)."""
    logpi = np.log(pi).T                                                     # (K, P)
    L = np.zeros((1, pi.shape[0]))
    for _ in range(T):
        L = (L[:, None, :] + logpi[None, :, :]).reshape(-1, pi.shape[0])
    return L


def exact_targets(pi: np.ndarray, T: int) -> dict[str, float]:
    """Exact limits of the estimators: I(X;Z^T), the per-token MI under both marginals, Bayes retrieval."""
    P = pi.shape[0]
    L = sequence_logprobs(pi, T)                                             # (S, P) S = K^T sequences
    w = np.exp(L) / P                                                        # joint p(x, z) (S, P)
    mix = np.logaddexp.reduce(L, axis=1) - np.log(P)                         # log p(z) (S,)
    mix_tok = np.logaddexp.reduce(L / T, axis=1) - np.log(P)                 # code's per-token marginal
    first_best = np.argmax(L, axis=1)                                        # ties -> lowest column, as argsort
    return {"I_seq": float(np.sum(w * (L - mix[:, None]))),
            "mi_tok_paper": float(np.sum(w * (L - mix[:, None]))) / T,
            "mi_tok_code": float(np.sum(w * (L / T - mix_tok[:, None]))),
            "retrieval": float(sum(w[first_best == x, x].sum() for x in range(P)))}


def sampled_metrics(pi: np.ndarray, G: int, T: int, rng: np.random.Generator, token_marginal: str) -> dict:
    """collapse_metrics on one batch: P prompts x G sampled T-token reasonings, scored under all P prompts."""
    P, K = pi.shape
    z = np.stack([rng.choice(K, size=(G, T), p=pi[x]) for x in range(P)])   # (P, G, T) token ids
    logpi = np.log(pi)                                                       # (P, K) log pi(z | x_j)
    L_seq = logpi[:, z.reshape(P * G, T)].sum(axis=2).T                      # (M = P G, N = P)
    true_col = np.repeat(np.arange(P), G)                                    # row i came from prompt i // G
    return mi_metrics.collapse_metrics(L_seq / T, L_seq, true_col, lengths=np.full(P * G, T),
                                     token_marginal=token_marginal)


def main(size: str = "full", seed: int = 0, fig_dir=toy.FIG_DIR) -> dict:
    toy.check_size(size)
    rng = np.random.default_rng(seed)
    n_random, Gs, reps = (2000, (2, 8, 32, 128), 40) if size == "full" else (200, (2, 16, 64), 12)
    policies = regime_policies(seed=seed)
    P = next(iter(policies.values())).shape[0]

    # 1. identity on the regimes and on random Dirichlet policies (I computed as mean KL, not as a difference)
    pool = list(policies.values()) + [rng.dirichlet(np.full(rng.integers(2, 12), rng.uniform(0.1, 2.0)),
                                                    size=rng.integers(2, 9)) for _ in range(n_random)]
    residual = max(abs(toy.marginal_entropy(p) - toy.conditional_entropy(p) - toy.mutual_information(p))
                   for p in pool)

    # 2. template mixing lemma on random policies, templates and mixing weights
    ratios = []
    for p in pool[4:]:
        q, a = rng.dirichlet(np.ones(p.shape[1])), rng.uniform(0.01, 0.99)
        ratios.append(toy.mutual_information(toy.mix_template(p, q, a)) / ((1 - a) * toy.mutual_information(p)))
    ratios = np.array(ratios)

    # 3. regimes: exact quantities and the sampled in-batch estimators as G grows (T = 1)
    exact = {r: exact_targets(pi, 1) for r, pi in policies.items()}
    curves = {r: {} for r in REGIMES}                                        # regime -> G -> (mi, acc) arrays
    for r, pi in policies.items():
        for G in Gs:
            runs = [sampled_metrics(pi, G, 1, rng, "paper") for _ in range(reps)]
            curves[r][G] = (np.array([m["mi_estimate"] for m in runs]),
                            np.array([m["retrieval_accuracy"] for m in runs]))
    G_max = Gs[-1]

    # 4. T = 3 on the diverse regime: MI-Seq-Est vs I(X;Z^3); per-token MI-Est under both marginals
    ex3 = exact_targets(policies["diverse"], 3)
    paper3 = [sampled_metrics(policies["diverse"], G_max, 3, rng, "paper") for _ in range(reps)]
    code3 = [sampled_metrics(policies["diverse"], G_max, 3, rng, "code") for _ in range(reps)]
    seq_est = np.array([m["mi_seq_estimate"] for m in paper3])
    tok_paper, tok_code = (np.array([m["mi_estimate"] for m in runs]) for runs in (paper3, code3))

    numbers = {"identity max |H(Z) - H(Z|X) - I|": residual,
               "mixing max I_a / ((1-a) I)": ratios.max(), "mixing median I_a / ((1-a) I)": np.median(ratios)}
    for r, pi in policies.items():
        mi, acc = curves[r][G_max]
        numbers[f"{r}: H(Z|X), I(X;Z)"] = f"{toy.conditional_entropy(pi):.4f}, {abs(exact[r]['I_seq']):.4f}"
        numbers[f"{r}: MI-Est (G={G_max}) mean +/- std"] = f"{mi.mean():.4f} +/- {mi.std(ddof=1):.4f}"
        numbers[f"{r}: Retrieval-Acc vs exact (chance {1 / P:.3f})"] = \
            f"{acc.mean():.4f} vs {exact[r]['retrieval']:.4f}"
    numbers["diverse T=3: I(X;Z^3) vs MI-Seq-Est"] = f"{ex3['I_seq']:.4f} vs {seq_est.mean():.4f}"
    numbers["diverse T=3: MI-Est paper marginal vs I/T"] = f"{tok_paper.mean():.4f} vs {ex3['mi_tok_paper']:.4f}"
    numbers["diverse T=3: MI-Est code marginal vs its limit"] = f"{tok_code.mean():.4f} vs {ex3['mi_tok_code']:.4f}"

    def converges(est, target):                                              # within 4 standard errors
        return abs(est.mean() - target) <= 4 * est.std(ddof=1) / np.sqrt(est.size) + 1e-12
    conv = all(converges(curves[r][G_max][0], exact[r]["I_seq"]) and
               converges(curves[r][G_max][1], exact[r]["retrieval"]) for r in REGIMES)
    shrinks = all(np.sqrt(np.mean((curves[r][Gs[-1]][0] - exact[r]["I_seq"]) ** 2)) <
                  np.sqrt(np.mean((curves[r][Gs[0]][0] - exact[r]["I_seq"]) ** 2)) for r in ("diverse", "compressed"))
    collapse = [curves[r][G_max] for r in ("template collapse", "low-entropy collapse")]
    at_chance = all(np.allclose(acc, 1 / P) and np.allclose(mi, 0, atol=1e-12) for mi, acc in collapse)
    dH = abs(toy.conditional_entropy(policies["diverse"]) - toy.conditional_entropy(policies["template collapse"]))
    dI = exact["diverse"]["I_seq"] - exact["template collapse"]["I_seq"]
    gap_code = abs(ex3["mi_tok_code"] - ex3["mi_tok_paper"])
    claims = [
        toy.claim("H(Z) = H(Z|X) + I(X;Z)", residual < 1e-10, f"max residual {residual:.1e} over {len(pool)} policies"),
        toy.claim("template mixing: I_a <= (1-a) I", ratios.max() <= 1 + 1e-9,
                  f"max ratio {ratios.max():.6f}, median {np.median(ratios):.3f} over {ratios.size} mixtures"),
        toy.claim("entropy cannot tell diverse from template collapse; I can", dH < 1e-12 and dI > 1.0,
                  f"|dH(Z|X)| = {dH:.1e}, dI = {dI:.3f} nats (log P = {np.log(P):.3f})"),
        toy.claim("in-batch MI-Est and Retrieval-Acc converge to the exact uniform-batch values", conv and shrinks,
                  f"all 4 regimes within 4 SE at G={G_max} ({reps} batches); RMSE falls with G: {shrinks}"),
        toy.claim("under collapse: MI-Est = 0 and Retrieval-Acc = chance 1/P", at_chance,
                  f"template / low-entropy collapse: accuracy {collapse[0][1].mean():.4f}, "
                  f"{collapse[1][1].mean():.4f}; MI-Est {collapse[0][0].mean():.1e}"),
        toy.claim("per-token MI-Est estimates I(X;Z^T)/T (paper marginal); the code's marginal does not",
                  converges(tok_paper, ex3["mi_tok_paper"]) and converges(tok_code, ex3["mi_tok_code"])
                  and gap_code > 0.01,
                  f"T=3: paper {tok_paper.mean():.4f} -> {ex3['mi_tok_paper']:.4f}; code {tok_code.mean():.4f} -> "
                  f"{ex3['mi_tok_code']:.4f} (differs by {gap_code:.3f} nats)"),
    ]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a0, a1, a2) = plt.subplots(1, 3, figsize=(15, 4))
    for c, (r, pi) in enumerate(policies.items()):
        kw = {"color": f"C{c}", "label": r}
        a0.scatter(toy.conditional_entropy(pi), exact[r]["I_seq"], s=60, **kw)
        a2.plot(Gs, [curves[r][G][1].mean() for G in Gs], "o-", **kw)
        if exact[r]["I_seq"] > 1e-9:                                         # collapse regimes: error is 0
            a1.loglog(Gs, [np.sqrt(np.mean((curves[r][G][0] - exact[r]["I_seq"]) ** 2)) for G in Gs], "o-", **kw)
    a1.loglog(Gs, 0.3 / np.sqrt(np.array(Gs)), "k:", label="~ 1/sqrt(G)")
    a0.set(xlabel="H(Z|X) (nats)", ylabel="I(X;Z) (nats)", title="four regimes (exact)")
    a1.set(xlabel="samples per prompt G", ylabel="RMSE of MI-Est vs exact I",
           title=f"in-batch MI-Est, P={P} (collapse: exactly 0)")
    a2.axhline(1 / P, color="k", ls=":", label="chance 1/P")
    a2.set(xscale="log", xlabel="samples per prompt G", ylabel="Retrieval-Acc", title="retrieval accuracy")
    a0.legend(fontsize=7, loc="center")       # the four points sit in the corners: the centre is free
    for ax in (a1, a2):
        ax.legend(fontsize=7)
    return {"check": "E1", "name": NAME, "title": "Entropy identity, regimes, template mixing, in-batch estimators",
            "labels": "eq. 2, Fig. 1, Lemma I.1 (review J.1), v1 Table 1 / §2.3",
            "claim": "H(Z)=H(Z|X)+I(X;Z); mixing contracts MI; in-batch estimators track the exact MI; "
                     "entropy cannot see template collapse.",
            "numbers": numbers, "claims": claims, "verdict": toy.overall_verdict(claims),
            "figure": toy.save_figure(fig, fig_dir, NAME),
            "data": {"residual": residual, "mixing_max_ratio": float(ratios.max())}}


if __name__ == "__main__":
    print(toy.format_result(main(**toy.cli_kwargs(__doc__))))
