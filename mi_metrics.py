"""Collapse metrics on a cross-scoring matrix: MI-Est, retrieval, H(Z|X), MI-ZScore(-EMA), permutation null
(RAGEN-2 §2.3, v1 Table 1; App. F).

Template collapse = reasoning Z that stays diverse (high H(Z|X)) but stops depending on the input X
(I(X;Z) -> 0). The paper measures the second half on the training batch itself: sample M (x, z) pairs,
score every reasoning z_i under every prompt x_j by teacher forcing,

    L_seq[i, j] = log q(z_i | x_j)          L_tok[i, j] = L_seq[i, j] / |z_i|           (M, N)

and read off (col(i) = the column of z_i's own prompt, N columns, uniform mixture over them):

    matched_i  = L[i, col(i)]                      marginal_i = log (1/N) sum_j exp L[i, j]
    MI-Est     = mean_i(matched_i - marginal_i) <= log N,      H(Z|X) ~ -mean(matched), H(Z) ~ -mean(marginal)
    Retrieval  = mean_i 1[argmax_j L[i, j] = col(i)]  (chance 1/N), Recall@k for k in 2, 4, 8
    MI-ZScore  = mean_i (matched_i - marginal_i) / (std(marginal) + eps), and its EMA-of-std variant.

Paper vs official code (both behind `token_marginal`, default = paper):
  * paper  : per-token marginal_i = (1/|z_i|) log (1/N) sum_j exp L_seq[i, j]  (length-normalised log of the
             mixture of *sequence* likelihoods); per-token MI = mean_i (seq term_i) / |z_i|.
  * code   : per-token marginal_i = logsumexp_j L_tok[i, j] - log N  (mixture of per-token *mean* log-likelihoods,
             `ragen/trainer/collapse_metrics.py`).  Sequence-level metrics and retrieval are identical in both.

Controls the paper lacks (referee: "self-referential proxy", "teacher-forcing floor"): the scorer q can be a
frozen copy of the initial model (`mi_report(frozen_model, ...)`), and `permutation_null` recomputes retrieval
accuracy and MI with the reasoning->prompt labels shuffled.  What the null keeps and destroys: it keeps the whole
score matrix L (scorer sharpness, prompts that make every text likely, length effects, and the teacher-forcing
carry-over already baked into L[i, col(i)]) and the label frequencies; it destroys only which prompt each
reasoning came from.  So the null mean is the estimator's own floor when labels carry no information (MI-Est is
typically *negative* there, by Jensen), and a large z-score says the pairing is recoverable from L.  It does NOT
remove the teacher-forcing floor: z_i was generated after x_col(i), so surface carry-over (copied state tokens,
format spans) raises L[i, col(i)] even for semantically input-agnostic reasoning, and that raise is in the
observed value and absent from the null.  A significant z-score therefore means "some detectable dependence,
possibly only carry-over", never "genuine input-dependent reasoning".

This file is the pure metric side (numpy; torch tensors accepted): it knows nothing of models or rollouts, so the
toy checks in theory/ use the same estimator as the LLM diagnostic. mi_proxy.py builds the matrices (pair sampling,
teacher-forced cross-scoring) and calls it.
Left out: the official code's W&B tables.
Run the tests: `.venv/bin/python -m pytest tests/test_mi_proxy.py -q`.
"""
from __future__ import annotations

import math

import numpy as np
import torch

TOP_KS = (2, 4, 8)      # Recall@k reported besides top-1 (k_max = min(8, N), as in the official code)
STD_EPS = 1e-3          # eps in MI-ZScore = mean((matched - marginal) / (std + eps))
TOKEN_MARGINALS = ("paper", "code")


# ----------------------------------------------------------------------------------------------------------
# Metrics on a score matrix (pure numpy; no model)
# ----------------------------------------------------------------------------------------------------------

class ZScoreEMA:
    """EMA of the batch std of `marginal`, one store per scale ("tok" = per-token, "seq" = per-sequence).

    sigma_EMA <- decay * sigma_EMA + (1 - decay) * sigma_batch, initialised to the first value (no zero-init,
    no bias correction), exactly as the official `_update_ema_std`.  Keep one object per metric family and
    scorer (first-turn and trajectory EMAs are independent); `state_dict` makes it checkpointable.
    """

    def __init__(self, decay: float = 0.9, eps: float = 1e-3):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.decay, self.eps = float(decay), float(eps)
        self.values: dict[str, float | None] = {"tok": None, "seq": None}

    def update(self, key: str, sigma: float) -> float:
        """Fold one batch std into store `key` ("tok" or "seq") and return the new EMA value."""
        if key not in self.values:
            raise ValueError(f"key must be one of {tuple(self.values)}, got {key!r}")
        old = self.values[key]
        self.values[key] = float(sigma) if old is None else self.decay * old + (1 - self.decay) * float(sigma)
        return self.values[key]

    def state_dict(self) -> dict:
        return {"decay": self.decay, "eps": self.eps, "values": dict(self.values)}

    def load_state_dict(self, state: dict) -> None:
        self.decay, self.eps = float(state["decay"]), float(state["eps"])
        self.values = {"tok": state["values"].get("tok"), "seq": state["values"].get("seq")}


def _as_matrix(x, name: str) -> np.ndarray:
    a = x.detach().cpu().double().numpy() if torch.is_tensor(x) else np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (M, N) matrix, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or inf")
    return a


def _logmeanexp_rows(L: np.ndarray) -> np.ndarray:
    """log (1/N) sum_j exp L[i, j] for every row, stabilised by the row max.  (M, N) -> (M,)"""
    mx = L.max(axis=1, keepdims=True)
    return (mx + np.log(np.exp(L - mx).mean(axis=1, keepdims=True)))[:, 0]


def _inverse_lengths(L_tok: np.ndarray, L_seq: np.ndarray, lengths) -> np.ndarray:
    """1 / max(|z_i|, 1) per row, from `lengths` or inferred from L_tok = L_seq / |z| (checked).  (M,)"""
    M = L_seq.shape[0]
    if lengths is not None:
        n = np.asarray(lengths, dtype=np.float64)
        if n.shape != (M,) or (n < 0).any():
            raise ValueError(f"lengths must be M={M} non-negative numbers, got shape {n.shape}")
        return 1.0 / np.maximum(n, 1.0)
    j = np.abs(L_seq).argmax(axis=1)                        # the most informative column of each row
    den = L_seq[np.arange(M), j]
    inv = np.where(den != 0, L_tok[np.arange(M), j] / np.where(den != 0, den, 1.0), 1.0)
    if not np.allclose(L_tok, inv[:, None] * L_seq, rtol=1e-4, atol=1e-5):
        raise ValueError("token_marginal='paper' needs L_tok = L_seq / |z_i| row-wise; pass lengths= "
                         "or token_marginal='code' (valid values: 'paper', 'code')")
    return inv


def _marginals(L_tok: np.ndarray, L_seq: np.ndarray, lengths, token_marginal: str):
    """(marginal per token, marginal per sequence), each (M,): log of the uniform mixture over the N columns."""
    marginal_seq = _logmeanexp_rows(L_seq)              # log (1/N) sum_j exp L_seq[i, j]
    if token_marginal == "paper":                       # the same, divided by |z_i|
        return marginal_seq * _inverse_lengths(L_tok, L_seq, lengths), marginal_seq
    return _logmeanexp_rows(L_tok), marginal_seq        # official: logsumexp_j L_tok[i, j] - log N


def _check_labels(true_col, signatures, M: int, N: int) -> tuple[np.ndarray, np.ndarray]:
    """true_col (M,) ints in [0, N); signatures -> integer signature id per column (N,)."""
    col = np.asarray(true_col, dtype=np.int64).reshape(-1)
    if col.shape != (M,) or (M and (col.min() < 0 or col.max() >= N)):
        raise ValueError(f"true_col must be M={M} column indices in [0, {N}), got {np.asarray(true_col)}")
    if signatures is None:                                  # every column its own answer
        return col, np.arange(N)
    if len(signatures) != N:
        raise ValueError(f"signatures must have one entry per column (N={N}), got {len(signatures)}")
    ids: dict = {}
    return col, np.array([ids.setdefault(s, len(ids)) for s in signatures], dtype=np.int64)


def _ranked_columns(L_tok: np.ndarray) -> np.ndarray:
    """Columns of each row sorted by decreasing score; ties go to the lower column index (stable).  (M, N)"""
    return np.argsort(-L_tok, axis=1, kind="stable")


def collapse_metrics(L_tok, L_seq, true_col, signatures=None, ema: ZScoreEMA | None = None, *,
                     lengths=None, token_marginal: str = "paper", std_eps: float = STD_EPS) -> dict:
    """All MI-proxy numbers of one (M, N) cross-score matrix, as plain floats with unprefixed keys.

    L_tok, L_seq: (M, N) per-token mean / per-sequence sum of log q(z_i | x_j) (torch or numpy).
    true_col: (M,) column of each row's own prompt.  signatures: N hashables (e.g. prompt token tuples);
    columns with equal signatures count as the same answer in retrieval.  ema: updated in place (once per call).
    lengths: |z_i| (M,), only used by token_marginal='paper' (inferred from L_seq / L_tok when None).
    Returns {} when N < 2 or M == 0 (the family is skipped, as in the official code).
    """
    if token_marginal not in TOKEN_MARGINALS:
        raise ValueError(f"token_marginal must be one of {TOKEN_MARGINALS}, got {token_marginal!r}")
    L_tok, L_seq = _as_matrix(L_tok, "L_tok"), _as_matrix(L_seq, "L_seq")
    if L_tok.shape != L_seq.shape:
        raise ValueError(f"L_tok {L_tok.shape} and L_seq {L_seq.shape} must have the same shape")
    M, N = L_seq.shape
    if N < 2 or M == 0:
        return {}
    col, sig = _check_labels(true_col, signatures, M, N)
    rows = np.arange(M)

    # matched / marginal, per token and per sequence                              all (M,)
    matched, matched_seq = L_tok[rows, col], L_seq[rows, col]
    marginal, marginal_seq = _marginals(L_tok, L_seq, lengths, token_marginal)
    gap, gap_seq = matched - marginal, matched_seq - marginal_seq

    out = {"n_rows": float(M), "n_cols": float(N),
           "mi_estimate": float(gap.mean()), "mi_seq_estimate": float(gap_seq.mean()),
           "mi_upper_bound": math.log(N),
           "matched_log_prob_mean": float(matched.mean()), "marginal_log_prob_mean": float(marginal.mean()),
           "conditional_entropy_est": float(-matched.mean()), "reasoning_entropy_est": float(-marginal.mean()),
           "conditional_entropy_seq_est": float(-matched_seq.mean()),
           "reasoning_entropy_seq_est": float(-marginal_seq.mean())}

    # Retrieval: top-1 / Recall@k on the per-token matrix (same ranking as L_seq: one divisor per row).
    # Chance (official, signature-aware) = mean_i count(sig of true col) / N; chance@k = min(1, chance * k_eff).
    ranked_sig = sig[_ranked_columns(L_tok)[:, :min(8, N)]]          # (M, k_max)
    true_sig = sig[col]                                              # (M,)
    hit = ranked_sig == true_sig[:, None]
    chance = float((np.bincount(sig)[true_sig] / N).mean())
    for k, name in [(1, "")] + [(k, f"@{k}") for k in TOP_KS]:
        k_eff = min(k, min(8, N))
        acc, ch = float(hit[:, :k_eff].any(axis=1).mean()), min(1.0, chance * k_eff)
        out[f"retrieval_accuracy{name}"] = acc
        out[f"retrieval_chance_level{name}"] = ch
        out[f"retrieval_above_chance{name}"] = acc - ch

    # MI-ZScore: gaps in units of the batch spread of the marginal (population std, ddof = 0)
    std, std_seq = float(marginal.std()), float(marginal_seq.std())
    out.update(marginal_std=std, marginal_std_seq=std_seq,
               mi_zscore=float((gap / (std + std_eps)).mean()),
               mi_zscore_seq=float((gap_seq / (std_seq + std_eps)).mean()))
    if ema is not None:                                              # MI-ZScore-EMA: std smoothed over steps
        s, s_seq = ema.update("tok", std), ema.update("seq", std_seq)
        out.update(marginal_std_ema=s, marginal_std_ema_seq=s_seq,
                   mi_zscore_ema=float((gap / (s + ema.eps)).mean()),
                   mi_zscore_ema_seq=float((gap_seq / (s_seq + ema.eps)).mean()))
    return out


def _null_labels(col: np.ndarray, group_of_row, n_perm: int, rng: np.random.Generator) -> np.ndarray:
    """n_perm shuffled label vectors.  (n_perm, M)

    group_of_row=None: permute true_col across rows (the label multiset, hence the chance level, is kept).
    group_of_row given: cluster permutation: draw a permutation sigma of the groups; row r of group g takes
    the label of row (r mod size) of group sigma(g), so rows that shared a group stay together.
    """
    if group_of_row is None:
        return np.stack([rng.permutation(col) for _ in range(n_perm)])
    g = np.asarray(group_of_row).reshape(-1)
    if g.shape != col.shape:
        raise ValueError(f"group_of_row must have one entry per row (M={col.size}), got shape {g.shape}")
    members = [np.flatnonzero(g == u) for u in np.unique(g)]        # row indices of each group
    labels = np.empty((n_perm, col.size), dtype=np.int64)
    for b in range(n_perm):
        sigma = rng.permutation(len(members))
        for src, dst in zip(members, sigma):
            donor = members[dst]
            labels[b, src] = col[donor[np.arange(src.size) % donor.size]]
    return labels


def permutation_null(L_tok, L_seq, true_col, signatures, n_perm: int, rng: np.random.Generator,
                     group_of_row=None, *, lengths=None, token_marginal: str = "paper") -> dict:
    """Retrieval accuracy, MI-Est and MI-Seq-Est with the reasoning->prompt labels shuffled n_perm times.

    Returns, for name in (retrieval_accuracy, mi_estimate, mi_seq_estimate): `{name}_null_mean`,
    `{name}_null_std` (population), `{name}_null_z` = (observed - mean) / std (nan if std = 0, i.e. at most
    1e-12 x max(1, |mean|): a constant null up to rounding) and
    `{name}_null_p` = (1 + #{null >= observed}) / (n_perm + 1) (one-sided permutation p-value); plus
    `null_n_perm`.  Only the labels move: L, the marginals and the predictions stay fixed (see module doc
    for what this does and does not control).  {} when collapse_metrics would return {}.
    """
    if not isinstance(n_perm, int) or n_perm < 1:
        raise ValueError(f"n_perm must be a positive int, got {n_perm!r}")
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator (np.random.default_rng(seed))")
    observed = collapse_metrics(L_tok, L_seq, true_col, signatures, lengths=lengths, token_marginal=token_marginal)
    if not observed:
        return {}
    L_tok, L_seq = _as_matrix(L_tok, "L_tok"), _as_matrix(L_seq, "L_seq")
    M, N = L_seq.shape
    col, sig = _check_labels(true_col, signatures, M, N)
    marginal, marginal_seq = _marginals(L_tok, L_seq, lengths, token_marginal)
    labels = _null_labels(col, group_of_row, n_perm, rng)          # (B, M)
    rows = np.arange(M)[None, :]
    pred_sig = sig[_ranked_columns(L_tok)[:, 0]]                    # (M,) predictions do not move
    null = {"retrieval_accuracy": (pred_sig[None, :] == sig[labels]).mean(axis=1),             # (B,)
            "mi_estimate": L_tok[rows, labels].mean(axis=1) - marginal.mean(),
            "mi_seq_estimate": L_seq[rows, labels].mean(axis=1) - marginal_seq.mean()}
    out = {"null_n_perm": float(n_perm)}
    for name, values in null.items():
        mean, std, obs = float(values.mean()), float(values.std()), observed[name]
        out[f"{name}_null_mean"], out[f"{name}_null_std"] = mean, std
        # std 0 up to rounding (a constant null, e.g. every shuffle gives the same accuracy: 5.55e-17) -> nan
        out[f"{name}_null_z"] = (obs - mean) / std if std > 1e-12 * max(1.0, abs(mean)) else float("nan")
        out[f"{name}_null_p"] = float((1 + (values >= obs - 1e-12).sum()) / (n_perm + 1))
    return out
