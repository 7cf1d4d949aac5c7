"""In-batch cross-scoring MI proxy for template collapse (RAGEN-2 §2.3, v1 Table 1; App. F).

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

Pair sampling follows the official code: first-turn pairs (one candidate per trajectory, columns = distinct
groups) and trajectory-uniform pairs (Pr(m, t) = 1/M * 1/T_m, each pair its own column, duplicate prompts share a
signature so they count as the same answer).  X = the turn's full context ending with "<think>" (Turn.x_ids,
so at turn t > 1 it includes the earlier turns; the label of a trajectory pair is its own turn context, the
label of a first-turn pair its group's prompt); Z = the reasoning between the tags (Turn.z_ids: sampled ids or
re-tokenised text, as rollout.py's `z_tokens` chose).

Left out: the official code's DP-world-size row padding and its once-per-column `compute_log_prob` calls
(replaced by the prefix-KV-cache scorer below), W&B tables, and the disabled turn-uniform sampler.
Run the tests: `.venv/bin/python -m pytest tests/test_mi_proxy.py -q`; speed: `.venv/bin/python bench/mi_proxy.py`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

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
    `{name}_null_std` (population), `{name}_null_z` = (observed - mean) / std (nan if std = 0) and
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
        out[f"{name}_null_z"] = (obs - mean) / std if std > 0 else float("nan")
        out[f"{name}_null_p"] = float((1 + (values >= obs - 1e-12).sum()) / (n_perm + 1))
    return out


# ----------------------------------------------------------------------------------------------------------
# Pair sampling from rollout records (rollout.Trajectory: .group, .turns[t].x_ids, .turns[t].z_ids)
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Pairs:
    """Sampled (x, z) pairs: row i = reasonings[i], its own prompt = prompts[true_col[i]]."""
    prompts: list             # N prompts (token id lists), one per column
    reasonings: list          # M reasonings (token id lists), one per row
    true_col: list            # (M,) column of each row's own prompt
    signatures: list          # (N,) tuple(prompt ids): equal prompts count as the same answer
    group_of_row: list        # (M,) rollout group of each row's trajectory
    num_total: int            # candidates before dropping empty reasoning
    num_valid: int            # candidates with non-empty reasoning
    valid_thinking_rate: float


def _check_sampling(num_samples, rng) -> None:
    if num_samples is not None and (not isinstance(num_samples, (int, np.integer)) or num_samples < 1):
        raise ValueError(f"num_samples must be a positive int or None (= all), got {num_samples!r}")
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator (np.random.default_rng(seed))")


def first_turn_pairs(trajs, num_samples, rng: np.random.Generator) -> Pairs:
    """One candidate per trajectory (its first turn); columns = distinct groups (ascending group id).

    Empty reasonings are dropped and counted; if more valid candidates than num_samples remain, num_samples
    are drawn without replacement.  All sampled members of a group must share the same prompt (ValueError
    otherwise); the column's prompt is that prompt.
    """
    _check_sampling(num_samples, rng)
    valid = [m for m, tr in enumerate(trajs) if tr.turns and len(tr.turns[0].z_ids) > 0]
    chosen = valid
    if num_samples is not None and num_samples < len(valid):
        chosen = sorted(rng.choice(valid, size=num_samples, replace=False).tolist())
    groups = sorted({trajs[m].group for m in chosen})
    prompts = {}
    for m in chosen:
        x = list(trajs[m].turns[0].x_ids)
        if prompts.setdefault(trajs[m].group, x) != x:
            raise ValueError(f"first-turn prompts differ inside group {trajs[m].group} (trajectory {m}); "
                             "groups must reset with one seed")
    col_of = {g: j for j, g in enumerate(groups)}
    return Pairs(prompts=[prompts[g] for g in groups],
                 reasonings=[list(trajs[m].turns[0].z_ids) for m in chosen],
                 true_col=[col_of[trajs[m].group] for m in chosen],
                 signatures=[tuple(prompts[g]) for g in groups],
                 group_of_row=[trajs[m].group for m in chosen],
                 num_total=len(trajs), num_valid=len(valid),
                 valid_thinking_rate=len(valid) / len(trajs) if trajs else 0.0)


def trajectory_pairs(trajs, num_samples, rng: np.random.Generator) -> Pairs:
    """Trajectory-uniform pairs: Pr(m, t) = 1/M * 1/T_m over turns with non-empty reasoning, with replacement.

    As in the official code: min(num_samples, sum_m T_m) draws; a draw hitting a trajectory with T_m = 0 is
    discarded (so fewer pairs may result); each pair is its own column, signature = its prompt tokens.
    """
    _check_sampling(num_samples, rng)
    turns_ok = [[t for t, turn in enumerate(tr.turns) if len(turn.z_ids) > 0] for tr in trajs]   # T_m lists
    n_valid, n_total = sum(map(len, turns_ok)), sum(len(tr.turns) for tr in trajs)
    n_draw = n_valid if num_samples is None else min(int(num_samples), n_valid)
    picked = []
    for _ in range(n_draw if trajs else 0):
        m = int(rng.integers(len(trajs)))
        if turns_ok[m]:
            picked.append((m, turns_ok[m][int(rng.integers(len(turns_ok[m])))]))
    prompts = [list(trajs[m].turns[t].x_ids) for m, t in picked]
    return Pairs(prompts=prompts, reasonings=[list(trajs[m].turns[t].z_ids) for m, t in picked],
                 true_col=list(range(len(picked))), signatures=[tuple(x) for x in prompts],
                 group_of_row=[trajs[m].group for m, _ in picked],
                 num_total=n_total, num_valid=n_valid,
                 valid_thinking_rate=n_valid / n_total if n_total else 0.0)


FAMILIES = {"first_turn": first_turn_pairs, "trajectory": trajectory_pairs}


# ----------------------------------------------------------------------------------------------------------
# Cross-scoring: L_seq[i, j] = log q(z_i | x_j) by teacher forcing, for all M x N pairs
# ----------------------------------------------------------------------------------------------------------

def _as_id_lists(seqs, name: str, allow_empty: bool) -> list:
    if not isinstance(seqs, (list, tuple)):
        raise ValueError(f"{name} must be a list of token-id lists, got {type(seqs).__name__}")
    out = [[int(t) for t in (s.tolist() if hasattr(s, "tolist") else s)] for s in seqs]
    for k, s in enumerate(out):
        if not s and not allow_empty:
            raise ValueError(f"{name}[{k}] is empty: a prompt needs at least one token to condition on")
    return out


def _logprobs_at(head, h: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int = 256):
    """log softmax(head(h) / T)[target] for n hidden states, fp32, `chunk` rows at a time.  (n, d) -> (n,)

    Hand-written (instead of model(...).logits) so that only scored positions go through the LM head and no
    (B, T, V) fp32 tensor is ever built: at most (chunk, V) at a time.
    """
    out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    for s in range(0, h.shape[0], chunk):
        logits = head(h[s:s + chunk]).float() / temperature                  # (c, V), fp32 even under autocast
        out[s:s + chunk] = logits.log_softmax(-1).gather(1, targets[s:s + chunk, None])[:, 0]
    return out


def _naive_scores(model, prompts, reasonings, rows, temperature, device) -> torch.Tensor:
    """Reference path: one full forward of [x_j | z_i] per pair, plain log_softmax over all positions."""
    L_seq = torch.zeros(len(reasonings), len(prompts), dtype=torch.float64)
    for i in rows:
        for j, x in enumerate(prompts):
            ids = torch.tensor([x + reasonings[i]], device=device)                           # (1, |x| + |z|)
            logp = (model(input_ids=ids).logits[0].float() / temperature).log_softmax(-1)    # (T, V)
            # position t predicts token t + 1: z occupies positions |x| .. T-1, predicted from |x|-1 .. T-2
            L_seq[i, j] = logp[len(x) - 1:-1].gather(1, ids[0, len(x):, None]).sum().double().cpu()
    return L_seq


def _cached_scores(model, prompts, reasonings, rows, temperature, device, micro_batch, prompt_batch):
    """Prefix-reusing path: encode each prompt once, score every reasoning against its KV cache.

    Prompts are sorted by length and encoded `prompt_batch` at a time (right-padded, so a reasoning always
    continues right after its prompt's last real token, whose hidden state predicts z[0]).  The remaining
    tokens z[1:] are scored by running z[:-1] on top of the cached prefix: the block's per-layer keys/values
    are gathered row-wise into a fresh DynamicCache for a micro-batch of (prompt, reasoning) pairs, with the
    attention mask = [prompt mask | reasoning mask] and position ids = |x_j| + t.
    """
    from transformers import DynamicCache          # deferred: pure-metric users never import transformers
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    L_seq = torch.zeros(len(reasonings), len(prompts), dtype=torch.float64)
    first = torch.tensor([reasonings[i][0] for i in rows], device=device)          # (R,) first tokens
    # rows with >= 2 tokens need a decoder pass; longest first so micro-batches hold similar lengths
    rest = sorted((i for i in rows if len(reasonings[i]) >= 2), key=lambda i: -len(reasonings[i]))
    order = sorted(range(len(prompts)), key=lambda j: -len(prompts[j]))
    for b0 in range(0, len(order), prompt_batch):
        block = order[b0:b0 + prompt_batch]                                        # b prompt columns
        plen = torch.tensor([len(prompts[j]) for j in block], device=device)       # (b,)
        x = torch.zeros(len(block), int(plen.max()), dtype=torch.long, device=device)          # (b, Lp)
        for r, j in enumerate(block):
            x[r, :len(prompts[j])] = torch.tensor(prompts[j], device=device)
        pmask = (torch.arange(x.shape[1], device=device)[None, :] < plen[:, None]).long()   # (b, Lp)
        pre = decoder(input_ids=x, attention_mask=pmask, use_cache=True,
                      position_ids=torch.arange(x.shape[1], device=device).expand_as(x))
        h_last = pre.last_hidden_state[torch.arange(len(block), device=device), plen - 1]    # (b, d)
        lp_first = (head(h_last).float() / temperature).log_softmax(-1)[:, first]       # (b, R)
        L_seq[np.ix_(rows, block)] += lp_first.T.double().cpu()
        kv = [(layer.keys, layer.values) for layer in pre.cache.layers]  # each (b, H, Lp, D)
        pairs = [(r, i) for i in rest for r in range(len(block))]
        for s in range(0, len(pairs), micro_batch):
            chunk = pairs[s:s + micro_batch]
            sel = torch.tensor([r for r, _ in chunk], device=device)               # (B,) prompt of each pair
            Lz = max(len(reasonings[i]) - 1 for _, i in chunk)
            z_in = torch.zeros(len(chunk), Lz, dtype=torch.long, device=device)    # (B, Lz) inputs z[:-1]
            z_out = torch.zeros_like(z_in)                                         # (B, Lz) targets z[1:]
            for b, (_, i) in enumerate(chunk):
                z = torch.tensor(reasonings[i], device=device)
                z_in[b, :len(z) - 1], z_out[b, :len(z) - 1] = z[:-1], z[1:]
            zlen = torch.tensor([len(reasonings[i]) - 1 for _, i in chunk], device=device)
            zmask = (torch.arange(Lz, device=device)[None, :] < zlen[:, None]).long()          # (B, Lz)
            cache = DynamicCache(ddp_cache_data=[(k[sel], v[sel]) for k, v in kv])  # prefix rows, copied
            h = decoder(input_ids=z_in, attention_mask=torch.cat([pmask[sel], zmask], 1),
                        position_ids=plen[sel, None] + torch.arange(Lz, device=device)[None, :],
                        cache=cache, use_cache=True).last_hidden_state    # (B, Lz, d)
            keep = zmask.bool()
            lp = _logprobs_at(head, h[keep], z_out[keep], temperature)             # (n_tokens,)
            per_pair = torch.zeros(len(chunk), dtype=torch.float64, device=device)
            per_pair.index_add_(0, keep.nonzero()[:, 0], lp.double())              # (B,) sum over tokens
            idx = (torch.tensor([i for _, i in chunk]), torch.tensor([block[r] for r, _ in chunk]))
            L_seq.index_put_(idx, per_pair.cpu(), accumulate=True)
    return L_seq


@torch.no_grad()
def cross_log_probs(model, prompts, reasonings, *, micro_batch: int = 32, prompt_batch: int = 8,
                    naive: bool = False, temperature: float = 1.0):
    """(L_tok, L_seq), each (M, N) float64 on cpu: row i = reasonings[i], column j = prompts[j].

    L_seq[i, j] = sum_t log q(z_i[t] | x_j, z_i[:t]) (teacher forcing, temperature-scaled softmax in fp32);
    L_tok = L_seq / max(|z_i|, 1).  An empty reasoning gets 0 (length 0) and costs nothing.  naive=True runs
    one full forward per pair (the reference for tests); otherwise each prompt is encoded once and reused
    through its KV cache (see `_cached_scores`).  Works under bf16 autocast (the caller's `policy.autocast`);
    the model should be in eval mode.  micro_batch = (prompt, reasoning) pairs per forward; prompt_batch =
    prompts encoded together (sorted by length, right-padded).
    """
    prompts = _as_id_lists(prompts, "prompts", allow_empty=False)
    reasonings = _as_id_lists(reasonings, "reasonings", allow_empty=True)
    for name, v in (("micro_batch", micro_batch), ("prompt_batch", prompt_batch)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    device = next(model.parameters()).device
    rows = [i for i, z in enumerate(reasonings) if z]                  # empty reasoning: row of zeros
    if not rows or not prompts:
        L_seq = torch.zeros(len(reasonings), len(prompts), dtype=torch.float64)
    elif naive:
        L_seq = _naive_scores(model, prompts, reasonings, rows, temperature, device)
    else:
        L_seq = _cached_scores(model, prompts, reasonings, rows, temperature, device, micro_batch, prompt_batch)
    n = torch.tensor([max(len(z), 1) for z in reasonings], dtype=torch.float64)
    return L_seq / n[:, None], L_seq


# ----------------------------------------------------------------------------------------------------------
# One call for train.py: sample -> cross-score -> metrics (-> permutation null)
# ----------------------------------------------------------------------------------------------------------

def mi_report(model, trajs, *, family: str, num_samples, rng: np.random.Generator, ema: ZScoreEMA | None,
              n_perm: int = 0, scorer_name: str = "policy", micro_batch: int = 32, prompt_batch: int = 8,
              pairs: Pairs | None = None, token_marginal: str = "paper", null_unit: str = "row",
              bf16: bool | None = None) -> dict:
    """Unprefixed metrics of one family ("first_turn" | "trajectory") scored by `model`.

    Keys: num_total, num_valid, valid_thinking_rate, num_pairs (sampling, always present), then the
    collapse_metrics keys (+ permutation-null keys if n_perm > 0, + time_s), prefixed "<scorer_name>/"
    unless scorer_name == "policy".  To log policy and frozen scorers side by side on the *same* pairs,
    sample once (`FAMILIES[family](trajs, num_samples, rng)`) and pass `pairs=` to both calls.
    null_unit: "row" (shuffle labels across rows) or "group" (cluster permutation by rollout group).
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {tuple(FAMILIES)}, got {family!r}")
    if null_unit not in ("row", "group"):
        raise ValueError(f"null_unit must be 'row' or 'group', got {null_unit!r}")
    if not isinstance(n_perm, int) or n_perm < 0:
        raise ValueError(f"n_perm must be an int >= 0, got {n_perm!r}")
    if token_marginal not in TOKEN_MARGINALS:
        raise ValueError(f"token_marginal must be one of {TOKEN_MARGINALS}, got {token_marginal!r}")
    if pairs is None:
        pairs = FAMILIES[family](trajs, num_samples, rng)
    out = {"num_total": float(pairs.num_total), "num_valid": float(pairs.num_valid),
           "valid_thinking_rate": float(pairs.valid_thinking_rate), "num_pairs": float(len(pairs.reasonings))}
    if len(pairs.prompts) < 2 or not pairs.reasonings:
        return out                                                      # N < 2: nothing to compare
    import policy                                   # deferred: keeps the metric half free of model code
    t0 = time.perf_counter()
    with policy.autocast(next(model.parameters()).device, enabled=bf16):   # None: where the hardware has bf16
        L_tok, L_seq = cross_log_probs(model, pairs.prompts, pairs.reasonings,
                                       micro_batch=micro_batch, prompt_batch=prompt_batch)
    lengths = [len(z) for z in pairs.reasonings]
    m = collapse_metrics(L_tok, L_seq, pairs.true_col, pairs.signatures, ema,
                         lengths=lengths, token_marginal=token_marginal)
    if n_perm > 0:
        m.update(permutation_null(L_tok, L_seq, pairs.true_col, pairs.signatures, n_perm, rng,
                                  pairs.group_of_row if null_unit == "group" else None,
                                  lengths=lengths, token_marginal=token_marginal))
    m["time_s"] = time.perf_counter() - t0
    prefix = "" if scorer_name == "policy" else f"{scorer_name}/"
    out.update({prefix + k: v for k, v in m.items()})
    return out
