"""Advantages and losses of the four algorithms the paper compares: PPO, DAPO, GRPO and Dr.GRPO.

Paper: RAGEN-2 (arXiv 2604.06268) §2.1, the regularised objective
    L(θ) = E_{x,τ}[A(τ, x)] − λ_KL·KL(π_θ ‖ π_ref) + λ_H·H(π_θ),
and §4.1 / App. B (PPO with GAE γ = λ = 1 and token-mean; DAPO; GRPO; Dr.GRPO; entropy 0.001).
The exact formulas follow the official code (RAGEN on verl 0.6.1, `core_algos.py`, mll-lab-nu/RAGEN
§3): one small pure function per equation, the equation in its docstring. No model, no optimiser here.

Tensor layout (CONTRIBUTING.md): token tensors are (B, T) and aligned with the input tokens: x[b, t] belongs
to token t, and mask[b, t] = 1 exactly on generated tokens (ragged rows, observation gaps between turns,
right padding). GRPO-family advantages are per trajectory (B,); `token_advantages` broadcasts them.

Deliberately left out: SNR filtering, soft reweighting and loss scaling by the kept ratio (filter.py); the
loop, critic network, mini-batching and gradient accumulation (train.py); verl's other estimators (RLOO,
REINFORCE++, ...), `bi_level_gae`, KL-in-reward, the KL types `abs`/`full` and the `+` straight-through
variants; DAPO's overlong reward shaping (dynamic sampling is a flag here, carried out by train.py).

Run the checks: `python -m pytest tests/test_algos.py -q`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3")
ADV_ESTIMATORS = ("gae", "grpo")


def _mask_like(mask: torch.Tensor, x: torch.Tensor, name: str = "x") -> torch.Tensor:
    """Check that `x` has the (B, T) shape of `mask`; return the mask as a float tensor of x's dtype."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    if x.shape != mask.shape:
        raise ValueError(f"{name} must have the shape of mask {tuple(mask.shape)}, got {tuple(x.shape)}")
    dtype = x.dtype if x.is_floating_point() else torch.float32
    return mask.to(dtype)


# ----------------------------------------------------------------------------------- advantages
def grpo_advantages(rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages of GRPO (normalize_std=True) and Dr.GRPO (normalize_std=False).

        A_{p,g} = (R_{p,g} − mean_g R_{p,·}) / (std_g R_{p,·} + eps)     GRPO
        A_{p,g} =  R_{p,g} − mean_g R_{p,·}                              Dr.GRPO
    with the *unbiased* std (divide by G − 1). A group of size 1 gets mean 0 and std 1, as in verl (so its
    advantage is R/(1 + eps), or R). A zero-variance group gets A = 0: no task gradient at all (paper §3.2).
    rewards (P, G) episode returns, group p = one prompt -> (P, G).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (P, G), got shape {tuple(rewards.shape)}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    rewards = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    if rewards.shape[1] == 1:
        # verl's convention for a lone sample: mean 0, std 1 (no baseline can be formed).
        mean, std = torch.zeros_like(rewards), torch.ones_like(rewards)
    else:
        mean = rewards.mean(dim=1, keepdim=True)  # (P, 1)
        std = rewards.std(dim=1, unbiased=True, keepdim=True)  # (P, 1)
    if normalize_std:
        return (rewards - mean) / (std + eps)
    return rewards - mean


def token_advantages(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast one advantage per trajectory to its tokens: A[b, t] = A_b · mask[b, t].  (B,) -> (B, T)."""
    if adv.dim() != 1 or mask.dim() != 2 or adv.shape[0] != mask.shape[0]:
        raise ValueError(f"adv must be (B,) and mask (B, T) with the same B, got {tuple(adv.shape)} "
                         f"and {tuple(mask.shape)}")
    return adv[:, None] * mask.to(adv.dtype)


def terminal_token_rewards(returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token rewards with the episode return on the last generated token, zeros elsewhere.

        r[b, t] = R_b if t = max{t' : mask[b, t'] = 1} else 0
    (reference §3.1: `token_level_rewards` hold the episode reward + penalty at the last trained position).
    returns (B,), mask (B, T) -> (B, T). A row without any generated token is an error.
    """
    if returns.dim() != 1 or mask.dim() != 2 or returns.shape[0] != mask.shape[0]:
        raise ValueError(f"returns must be (B,) and mask (B, T) with the same B, got "
                         f"{tuple(returns.shape)} and {tuple(mask.shape)}")
    B, T = mask.shape
    pos = torch.arange(T, device=mask.device).expand(B, T)  # (B, T)
    last = torch.where(mask > 0, pos, torch.full_like(pos, -1)).max(dim=1).values  # (B,)
    if bool((last < 0).any()):
        raise ValueError(f"mask has rows without generated tokens: {torch.nonzero(last < 0).flatten().tolist()}")
    dtype = returns.dtype if returns.is_floating_point() else torch.float32
    rewards = torch.zeros(B, T, dtype=dtype, device=mask.device)
    rewards[torch.arange(B, device=mask.device), last] = returns.to(dtype)
    return rewards


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Whiten over all masked entries of the batch (verl `masked_whiten`, shift_mean=True):

        μ = Σ m·x / Σ m,   σ² = Σ m·(x − μ)² / (Σ m − 1)   (Bessel),   x̂ = (x − μ) / sqrt(σ² + eps).
    The mean is *not* added back. Every entry is transformed (masked-out ones too; losses ignore them).
    x, mask (B, T) -> (B, T). Needs at least two masked entries (as verl).
    """
    m = _mask_like(mask, x)
    n = m.sum()
    if n < 2:
        raise ValueError(f"whiten needs at least 2 masked entries, mask has {int(n)}")
    mean = (x * m).sum() / n
    var = ((x - mean) ** 2 * m).sum() / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps)


@torch.no_grad()
def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                   lam: float = 1.0, *, whiten_adv: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a multi-turn sequence (Schulman et al. 2016; verl GAE).

    Backward over every position t = T−1 … 0, with V ← V·mask first:
        δ_t = r_t + γ·V_next − V_t,     A_t = δ_t + γλ·A_next,
        on generated tokens (mask = 1):  V_next ← V_t,  A_next ← A_t;
        elsewhere (observation / padding):  V_next and A_next are carried through unchanged,
    so observation tokens between turns are skipped: A on a generated token is ordinary GAE over the
    sequence of generated tokens only. Rewards on non-generated positions are dropped (put them on a
    generated token, e.g. with `terminal_token_rewards`). returns = A + V (before whitening; the critic's
    target). Then A is whitened over all generated tokens of the batch (`whiten`) when whiten_adv.
    With γ = λ = 1 and a single terminal reward R: A_t = R − V_t and returns_t = R on every generated token.
    rewards, values, mask (B, T) -> (adv (B, T), returns (B, T)), both detached.
    """
    m = _mask_like(mask, rewards, "rewards")
    _mask_like(mask, values, "values")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}")
    values = values.to(rewards.dtype) * m  # the reference multiplies critic values by the response mask
    B, T = rewards.shape
    next_value = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)  # V_next (B,)
    lastgaelam = torch.zeros_like(next_value)  # A_next (B,)
    adv = torch.zeros_like(rewards)  # (B, T)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * lastgaelam
        # carry through non-generated positions (the blend is exact for a 0/1 mask, as in verl)
        next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
        lastgaelam = gae_t * m[:, t] + (1 - m[:, t]) * lastgaelam
        adv[:, t] = lastgaelam
    returns = adv + values
    if whiten_adv:
        adv = whiten(adv, m)
    return adv, returns


# ----------------------------------------------------------------------------------- aggregation
def agg_loss(x: torch.Tensor, mask: torch.Tensor, mode: str, *, norm_len: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss x (B, T) to a scalar. With m = mask, n_b = Σ_t m[b, t] (tokens of sequence b)
    and B' = #{b : n_b > 0} (sequences with at least one token; empty rows are excluded, as verl 0.6.1):

        token-mean              Σ_{b,t} m·x / Σ_{b,t} m          every token of the batch weighs the same
        seq-mean-token-mean     (1/B') Σ_b (Σ_t m·x) / n_b       every sequence weighs the same (GRPO paper)
        seq-mean-token-sum      (1/B') Σ_b  Σ_t m·x              long sequences weigh more (RAGEN's "DrGRPO")
        seq-mean-token-sum-norm (1/B') Σ_b  Σ_t m·x / C          C = norm_len, a fixed constant (Dr.GRPO paper)

    "Dr.GRPO" means two things. The Dr.GRPO paper (Liu et al. 2025, "Understanding R1-Zero-like training")
    drops the std normalisation *and* replaces GRPO's per-sequence 1/|o_i| by one constant (MAX_TOKENS, the
    generation budget): that is seq-mean-token-sum-norm with norm_len = the fixed max response length. verl
    and RAGEN's DrGRPO run use seq-mean-token-sum (no constant: same direction, gradient larger by C). verl
    0.6.1's own `seq-mean-token-sum-norm` is Σ_{b,t} m·x / T with T the padded width of the micro-batch (no
    1/B, and T varies with the batch); we do not reproduce that variant. All normalisers are per call: under
    gradient accumulation token-mean is a mean of micro-batch means (the caller's choice, as verl).
    An all-zero mask gives 0 (kept in the graph). Entries outside the mask are ignored, even inf/nan.
    """
    m = _mask_like(mask, x)
    xm = torch.where(m > 0, x, torch.zeros_like(x)) * m  # (B, T), padding garbage cannot leak in
    if mode == "token-mean":
        return xm.sum() / m.sum().clamp(min=1)
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {mode!r}")
    n_tok = m.sum(dim=1)  # n_b (B,)
    has = (n_tok > 0).to(xm.dtype)  # (B,) sequences that count
    n_seq = has.sum().clamp(min=1)  # B'
    seq_sum = xm.sum(dim=1)  # Σ_t m·x (B,)
    if mode == "seq-mean-token-mean":
        return (seq_sum / n_tok.clamp(min=1) * has).sum() / n_seq
    if mode == "seq-mean-token-sum":
        return (seq_sum * has).sum() / n_seq
    if norm_len is None or not norm_len > 0:
        raise ValueError("norm_len (the fixed max response length C) must be a positive number for "
                         f"loss_agg_mode='seq-mean-token-sum-norm', got {norm_len!r}")
    return (seq_sum * has).sum() / n_seq / norm_len


def agg_count(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The normaliser behind agg_loss: tokens (token-mean) or sequences with >= 1 token (seq-mean-*). Callers
    that split a batch into micro-batches weight each micro-batch's agg_loss by its agg_count / the total."""
    return mask.sum() if mode == "token-mean" else (mask.sum(1) > 0).sum()


# ----------------------------------------------------------------------------------- policy loss
def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float,
                      clip_high: float, clip_c: float | None = 3.0) -> torch.Tensor:
    """Per-token PPO loss with separate clip bounds (clip-higher) and dual clip (verl `compute_policy_loss`).

        ratio = exp(clamp(logπ − logπ_old, −20, 20))
        L1 = −A·ratio,   L2 = −A·clip(ratio, 1 − ε_low, 1 + ε_high),   Lc = max(L1, L2)
        dual clip (Ye et al. 2020), only where A < 0:  L = min(Lc, −A·c)      (clip_c = c > 1; None = off)
    Lc is the pessimistic (upper) bound of the surrogate: for A > 0 the ratio gains nothing above 1 + ε_high,
    for A < 0 nothing below 1 − ε_low; the dual clip caps the loss of a negative-advantage token whose ratio
    has run past c. All inputs (B, T) (adv may also be (B,), broadcast) -> per-token loss (B, T).
    """
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, "
                         f"clip_high={clip_high}")
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"clip_c (dual-clip bound) must be > 1 or None, got {clip_c}")
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp)
    if not (logp.shape == old_logp.shape == adv.shape):
        raise ValueError(f"logp, old_logp and adv must share one (B, T) shape, got {tuple(logp.shape)}, "
                         f"{tuple(old_logp.shape)}, {tuple(adv.shape)}")
    ratio = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))  # π/π_old (B, T)
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    if clip_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_c), loss)
    return loss


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                clip_low: float, clip_high: float, agg: str, clip_c: float | None = 3.0, *,
                norm_len: float | None = None) -> torch.Tensor:
    """Task loss  L_pg = agg(clipped_surrogate(logπ, logπ_old, A), mask)  (see both docstrings).

    At ratio 1 its gradient is −agg(A·∇logπ): for token-mean, −(1/N) Σ_{b,t} m·A·∇logπ (the policy gradient
    of §2.1 with N generated tokens). Scalar, differentiable in logp.
    """
    loss = clipped_surrogate(logp, old_logp, adv, clip_low, clip_high, clip_c)
    return agg_loss(loss, _mask_like(mask, logp, "logp"), agg, norm_len=norm_len)


@torch.no_grad()
def policy_loss_stats(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                      clip_low: float, clip_high: float, clip_c: float | None = 3.0) -> dict[str, float]:
    """Diagnostics of the clipped surrogate, token-means over the mask (verl's `actor/` names):

        pg_clipfrac        fraction with L2 > L1 (the clip is active) = clip_high_frac + clip_low_frac
        clip_high_frac     A > 0 and ratio > 1 + ε_high        clip_low_frac   A < 0 and ratio < 1 − ε_low
        pg_clipfrac_lower  A < 0 and max(L1, L2) > −A·c (the *dual* clip is active; verl's name)
        ppo_kl             mean of logπ_old − logπ  (k1 estimate of KL(π_old ‖ π) on the sampled tokens)
    """
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp)
    m = _mask_like(mask, logp, "logp")
    ratio = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    c = clip_c if clip_c is not None else float("inf")
    dual = (torch.maximum(loss1, loss2) > -adv * c) & (adv < 0)

    def mean(flags: torch.Tensor) -> float:  # token-mean of a 0/1 tensor over the mask
        return float(agg_loss(flags.to(m.dtype), m, "token-mean"))

    return {"pg_clipfrac": mean(loss2 > loss1),
            "clip_high_frac": mean((adv > 0) & (ratio > 1.0 + clip_high)),
            "clip_low_frac": mean((adv < 0) & (ratio < 1.0 - clip_low)),
            "pg_clipfrac_lower": mean(dual),
            "ppo_kl": float(agg_loss(old_logp - logp, m, "token-mean"))}


# ----------------------------------------------------------------------------------- regularisers
def kl_term(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimator of KL(π_θ ‖ π_ref) from sampled tokens (Schulman 2020, "Approximating KL"):

        k1 = logπ − logπ_ref                          (verl `kl`)       gradient 1
        k2 = ½ (logπ − logπ_ref)²                      (verl `mse`)      gradient logπ − logπ_ref
        k3 = e^u − u − 1,  u = clamp(logπ_ref − logπ, −20, 20), result clamped to [−10, 10]
                                                       (verl `low_var_kl`)  gradient 1 − π_ref/π
    k3 is ≥ 0 and unbiased under samples from π; the clamps follow verl. Shapes (B, T) -> (B, T).
    The loss term is kl_coef · agg(kl_term, mask), with the same aggregation as the task loss.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp must share a shape, got {tuple(logp.shape)} and "
                         f"{tuple(ref_logp.shape)}")
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if kind == "k3":
        u = torch.clamp(ref_logp - logp, -20.0, 20.0)  # log(π_ref/π)
        return torch.clamp(torch.exp(u) - u - 1.0, -10.0, 10.0)
    raise ValueError(f"kl kind must be one of {KL_KINDS}, got {kind!r}")


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, agg: str, *,
                  norm_len: float | None = None) -> torch.Tensor:
    """Aggregated token entropy  H = agg(entropy, mask)  with the task loss's mode (reference §3.5).

    entropy[b, t] is the entropy of the distribution that predicted token t (policy.token_logprobs). The
    total loss is  L_pg − entropy_coef·H (+ kl_coef·agg(KL)); this function returns H, not the product.
    """
    return agg_loss(entropy, _mask_like(mask, entropy, "entropy"), agg, norm_len=norm_len)


def objective(pg: torch.Tensor, entropy: torch.Tensor, kl: torch.Tensor | None, entropy_coef: float,
              kl_coef: float) -> torch.Tensor:
    """The loss the policy minimises: the paper's regularised objective (§2.1) with its sign flipped,

        loss = L_pg − λ_H·H + λ_KL·KL,

    pg = the aggregated clipped surrogate (`policy_loss`, i.e. −A·ratio), entropy = `entropy_bonus`, kl = the
    aggregated `kl_term` (None when λ_KL = 0). update.py takes its loss from here (snr.py measures the gradient of
    each of the three terms apart). A coefficient of 0 removes its term exactly (no 0·NaN)."""
    loss = pg
    if entropy_coef > 0:
        loss = loss - entropy_coef * entropy
    if kl_coef > 0:
        if kl is None:
            raise ValueError("objective: kl_coef > 0 needs the kl term")
        loss = loss + kl_coef * kl
    return loss


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.5, agg: str = "token-mean", *,
               norm_len: float | None = None) -> torch.Tensor:
    """Clipped critic loss (verl `compute_value_loss`, reference §3.2, cliprange_value 0.5):

        V_clip = clip(V, V_old − c, V_old + c),   L_V = ½ · agg( max((V − R)², (V_clip − R)²), mask )
    c = clip (None: unclipped ½·agg((V − R)²)). values (new, differentiable), old_values, returns (B, T).
    """
    m = _mask_like(mask, values, "values")
    _mask_like(mask, old_values, "old_values")
    _mask_like(mask, returns, "returns")
    loss = (values - returns) ** 2
    if clip is not None:
        if not clip > 0:
            raise ValueError(f"value clip must be > 0 or None, got {clip}")
        v_clip = torch.clamp(values, old_values - clip, old_values + clip)
        loss = torch.maximum(loss, (v_clip - returns) ** 2)
    return 0.5 * agg_loss(loss, m, agg, norm_len=norm_len)


# ----------------------------------------------------------------------------------- algorithm bundles
@dataclass(frozen=True)
class Algo:
    """Documented defaults of one algorithm; train.py maps `--algo` to one of these, each field overridable.

    | name      | advantages             | critic | loss aggregation    | clip low/high | dyn. sampling | KL  |
    |-----------|------------------------|--------|---------------------|---------------|---------------|-----|
    | ppo       | GAE γ=λ=1, whitened    | yes    | token-mean          | 0.2 / 0.28    | no            | off |
    | dapo      | group, (R−μ)/(σ+ε)     | no     | token-mean          | 0.2 / 0.28    | yes           | off |
    | grpo      | group, (R−μ)/(σ+ε)     | no     | seq-mean-token-mean | 0.2 / 0.28    | no            | off |
    | drgrpo    | group, R−μ             | no     | seq-mean-token-sum  | 0.2 / 0.28    | no            | off |
    | dapo_code | GAE γ=λ=1, whitened    | yes    | token-mean          | 0.2 / 0.28    | no            | off |

    ppo is the paper's PPO (§4.1 and App. B: GAE, γ = λ = 1, token-mean, ε_low 0.2 / ε_high 0.28 listed for
    all runs; pass --clip-high 0.2 for the textbook symmetric clip). The reference's base.yaml also sets
    0.2/0.28 for *all* algorithms, so its "PPO" and "DAPO" runs are configuration-identical:
    `dapo_code` is that run (GAE + critic + clip-higher + token-mean). `dapo` follows the DAPO paper (Yu et
    al. 2025): clip-higher, token-mean, group advantages without a critic, dynamic sampling, no KL (overlong
    shaping not implemented). grpo/drgrpo are the reference's configs (§3.6). Dual clip c = 3 everywhere.
    KL is off (kl_coef 0) as in the main table; when switched on the default estimator is k3 (the paper's
    low-var-kl; the reference's top-p/KL sweep scripts use k1). The entropy coefficient is shared (train.py).
    """
    name: str
    adv_estimator: str  # "gae" (critic) or "grpo" (group baseline)
    normalize_std: bool  # GRPO: divide by the group std; Dr.GRPO: no (unused by GAE)
    loss_agg_mode: str  # one of AGG_MODES
    clip_low: float  # ε_low
    clip_high: float  # ε_high (clip-higher when > ε_low)
    dynamic_sampling: bool  # resample groups until P groups with non-zero RV (DAPO)
    clip_c: float | None = 3.0  # dual-clip bound for A < 0
    gamma: float = 1.0  # GAE discount
    lam: float = 1.0  # GAE λ
    kl_coef: float = 0.0  # λ_KL; 0 = no reference model is loaded
    kl_kind: str = "k3"  # KL estimator when kl_coef > 0

    def validate(self) -> "Algo":
        """Raise ValueError naming the field and its valid values; return self."""
        if self.adv_estimator not in ADV_ESTIMATORS:
            raise ValueError(f"adv_estimator must be one of {ADV_ESTIMATORS}, got {self.adv_estimator!r}")
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {self.loss_agg_mode!r}")
        if self.kl_kind not in KL_KINDS:
            raise ValueError(f"kl_kind must be one of {KL_KINDS}, got {self.kl_kind!r}")
        if not (0.0 <= self.clip_low < 1.0 and self.clip_high >= 0.0):
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.clip_c is not None and not self.clip_c > 1.0:
            raise ValueError(f"clip_c must be > 1 or None, got {self.clip_c}")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError(f"gamma and lam must lie in [0, 1], got {self.gamma}, {self.lam}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        return self

    @property
    def use_critic(self) -> bool:
        """A value head (same init as the policy, trained with value_loss) exists exactly for GAE."""
        return self.adv_estimator == "gae"


ALGOS = {a.name: a for a in (
    Algo("ppo", "gae", False, "token-mean", 0.2, 0.28, dynamic_sampling=False),
    Algo("dapo", "grpo", True, "token-mean", 0.2, 0.28, dynamic_sampling=True),
    Algo("grpo", "grpo", True, "seq-mean-token-mean", 0.2, 0.28, dynamic_sampling=False),
    Algo("drgrpo", "grpo", False, "seq-mean-token-sum", 0.2, 0.28, dynamic_sampling=False),
    Algo("dapo_code", "gae", False, "token-mean", 0.2, 0.28, dynamic_sampling=False),
)}
ALGO_NAMES = tuple(ALGOS)


def get_algo(name: str, **overrides) -> Algo:
    """The bundle of `name` (one of ALGO_NAMES) with fields replaced by `overrides`, validated."""
    if name not in ALGOS:
        raise ValueError(f"algo must be one of {ALGO_NAMES}, got {name!r}")
    fields = {f.name for f in dataclasses.fields(Algo)} - {"name"}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown Algo fields {unknown}; valid fields are {sorted(fields)}")
    return dataclasses.replace(ALGOS[name], **overrides).validate()
