"""SNR-Aware Filtering: per-group statistics and the rules that keep or drop whole prompt groups.

Paper: RAGEN-2 §3.3 and App. G (Def. G.1). A batch holds P prompt groups of G rollouts each, laid out
group-contiguously (trajectory i belongs to group i // G). For each group we compute a statistic phi(B_u)
(reward variance "RV" by default), choose a kept set S of groups, and train only on their trajectories.
The paper's main rule ("top-p", linear mass):

    sort groups by RV descending (permutation sigma),   tau = rho * sum_i RV_i - eps
    k* = min{ k : sum_{j<=k} RV_sigma(j) >= tau },      S = {sigma(1), ..., sigma(k*)}
    if tau cannot be reached the step is skipped (S is empty).

The file reads in that order: the paper's rule first (`reward_variance`, `top_p_by_rv`), then the settings and the
entry point train.py calls (`FilterConfig`, `apply_filter`), then the ablations. Every rule of the official code
(mll-lab-nu/RAGEN `rollout_filter.py`) is here,
with the places where it differs from the paper behind a flag whose default is the paper's:
  * metric `reward_variance` = unbiased variance (paper) vs `reward_std` = unbiased std (what the code's
    "reward_variance" really ranks by; its worked examples and the RVs in the tables are stds);
  * top_p `mode="linear"` (paper's mass rule) vs `mode="softmax"` (nucleus over softmax(scores): what the
    main-table scripts run; scale dependent, near no-op on 0/1 rewards with include_zero=True);
  * include_zero False (paper and the filtering guide) vs True (main-table scripts);
  * loss scaling by kept fraction (paper §4.1 says "scaled by rho") vs none (every script).
Variants the paper reports but the code does not ship: trajectory-level selection (top-k and bottom-k rewards
inside every prompt: the trajectory-vs-prompt ablation) and RV-quartile selection (the quartile ablation).

Ties are broken by lower group index everywhere (stable sorts); the reference uses unstable sorts.
Scores are handled in float64, so the worked examples' threshold comparisons are exact.

Deliberately left out: turn-level batches (`episode_ids`), the batch-size padding to a multiple of the
mini-batch (train.py's job), and the gradient-analysis buckets.

Run: `python filter.py 0.25 0.24 0.1 0.05 0 0 0 0 --value 0.9` prints the kept set under every reading of
"top-p 0.9"; `python -m pytest tests/test_filter.py -q` runs the checks.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import torch

METRICS = ("reward_variance", "reward_std", "reward_mean", "reward_sum",
           "entropy", "entropy_variance", "entropy_std", "length")
REWARD_METRICS = ("reward_variance", "reward_std", "reward_mean", "reward_sum")
DISPERSION_METRICS = ("reward_variance", "reward_std", "entropy_variance", "entropy_std")  # need G >= 2
STRATEGIES = ("none", "top_p", "top_k", "top_k_abs", "min_p")
MODES = ("linear", "softmax")
LEVELS = ("prompt", "trajectory")
LOSS_SCALINGS = ("none", "linear", "sqrt")
ZERO_TOL = 1e-10  # |score| <= ZERO_TOL counts as a zero-RV group (the reference's tolerance)


def _choice(name: str, value, valid) -> None:
    """Raise a ValueError naming the argument and its valid values."""
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not valid; expected one of {valid}")


def _matrix(x, name: str) -> torch.Tensor:
    """(P, G) float64 tensor with P, G >= 1 and finite entries."""
    t = torch.as_tensor(x, dtype=torch.float64)
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"{name} must have shape (P, G) with P, G >= 1; got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or inf")
    return t


# ----------------------------------------------------------------------------------------------------------------
# The paper's rule (§3.3, App. G): reward variance per group, then keep the top groups by linear RV mass
# ----------------------------------------------------------------------------------------------------------------
def reward_variance(rewards) -> torch.Tensor:
    """RV of every prompt group: the unbiased variance of its G returns, (P, G) -> (P,) float64."""
    r = _matrix(rewards, "rewards")                    # (P, G)
    if r.shape[1] < 2:
        raise ValueError(f"reward variance needs G >= 2 rollouts per group; got G={r.shape[1]}")
    return r.var(dim=1)


def top_p_by_rv(rv, rho: float = 0.9, eps: float = 0.01) -> torch.Tensor:
    """SNR-Aware Filtering as the paper states it: kept group indices (ascending, possibly empty).

    Zero-RV groups (RV <= 1e-10) are dropped first: they carry no task gradient and are never kept. The rest are
    sorted by RV, largest first, and the smallest prefix whose RV mass reaches tau = rho * sum(RV) - eps is kept;
    when tau <= 0 that prefix is the empty one (tiny RVs with eps > 0), so nothing is kept and the step is
    skipped. rho >= 1 keeps every non-zero group.
    Worked example (App. G, RV = std^2): RV (0.0625, 0.0576, 0.01, 0.0025, 0, 0, 0, 0), rho 0.9, eps 0.01:
    tau = 0.9 * 0.1326 - 0.01 = 0.1093; 0.0625 < tau, 0.0625 + 0.0576 = 0.1201 >= tau -> keep {0, 1}.
    Equal to select_groups(rv, "top_p", rho, mode="linear", include_zero=False, eps=eps) (tests/test_filter.py).
    """
    check_rule("top_p", rho, "linear", eps)
    rv = torch.as_tensor(rv, dtype=torch.float64)
    if rv.dim() != 1 or len(rv) < 1 or not torch.isfinite(rv).all():
        raise ValueError(f"rv must be a finite (P,) tensor with P >= 1; got shape {tuple(rv.shape)}")
    idx = (rv.abs() > ZERO_TOL).nonzero().squeeze(1)   # candidates: non-zero RV, in group order
    if len(idx) == 0 or rho >= 1:
        return idx
    return torch.sort(idx[top_p_linear(rv[idx], rho, eps, largest=True)]).values


def _rank(s: torch.Tensor, largest: bool) -> torch.Tensor:
    """Positions of s, best first (largest or smallest); ties keep the lower position first (stable)."""
    return torch.sort(s if largest else -s, descending=True, stable=True).indices


def top_p_linear(s: torch.Tensor, value: float, eps: float, largest: bool) -> torch.Tensor:
    """Paper's mass rule, exactly as the reference walks it: positions of the kept prefix (maybe empty)."""
    order = _rank(s, largest)
    s_sorted = s[order]                                # (n,) best first
    tau = value * s.sum() - eps                        # sum over all candidates, negatives and zeros included
    # The reference loop stops at the first score <= 0, so only the positive prefix can be accumulated.
    nonpos = (s_sorted <= 0).nonzero()
    m = int(nonpos[0]) if len(nonpos) else len(s_sorted)
    # mass accumulated *before* taking element j, j = 0..m; entry m is the mass of the whole positive prefix
    c_before = torch.cat([s.new_zeros(1), torch.cumsum(s_sorted[:m], 0)])   # (m + 1,)
    reached = (c_before >= tau).nonzero()
    if len(reached) == 0:                              # tau unreachable: empty, the step is skipped
        return order[:0]
    return order[: int(reached[0])]                    # k* = smallest prefix whose mass reaches tau


# ----------------------------------------------------------------------------------------------------------------
# Settings (validated in one place) and the entry point train.py calls
# ----------------------------------------------------------------------------------------------------------------
def check_rule(strategy: str, value, mode: str = "linear", eps: float = 0.0) -> None:
    """Validate one selection rule (the single place: FilterConfig, select_groups and top_p_by_rv call it)."""
    check_value(strategy, value)
    _choice("mode", mode, MODES)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps={eps!r} must be a finite number >= 0")


def check_value(strategy: str, value) -> None:
    """Validate `value` for `strategy` (ValueError naming both and the valid range)."""
    _choice("strategy", strategy, STRATEGIES)
    if strategy == "none":
        return                                         # value is ignored
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"value={value!r} must be a finite number for strategy={strategy!r}")
    if strategy == "top_k_abs":
        if value < 1 or value != int(value):
            raise ValueError(f"value={value!r} is out of range for strategy='top_k_abs': expected an integer >= 1")
    elif not 0 < value <= 1:
        raise ValueError(f"value={value!r} is out of range for strategy={strategy!r}: expected 0 < value <= 1")


@dataclass
class FilterConfig:
    """Every filter flag (train.py maps `--filter-<name>` onto these). Defaults are the paper's main setting."""
    strategy: str = "top_p"          # none | top_p | top_k | top_k_abs | min_p
    value: float = 0.9               # rho for top_p, fraction for top_k, count for top_k_abs, p for min_p
    metric: str = "reward_variance"  # see METRICS; reward_std = the official code's ranking
    mode: str = "linear"             # top_p only: linear (paper mass rule) | softmax (code's scripts)
    include_zero: bool = False       # False: drop zero-score groups before selecting (paper, filtering guide)
    eps: float = 0.01                # slack on the linear threshold tau = rho * sum - eps
    largest: bool = True             # False: keep the smallest scores (diagnostic)
    level: str = "prompt"            # prompt: whole groups | trajectory: also top/bottom traj_k inside kept groups
    traj_k: int = 4                  # level=trajectory: keep top-k and bottom-k rewards per group
    quartile: int | None = None      # 1..4: keep only that score-rank quartile (needs strategy="none")
    soft_reweight: bool = False      # advantage *= RV_g / (max kept RV + 1e-6)
    loss_scaling: str = "none"       # none | linear | sqrt: task advantage *= kept fraction (or its sqrt)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first bad flag and its valid values; no compute happens here."""
        check_rule(self.strategy, self.value, self.mode, self.eps)
        _choice("metric", self.metric, METRICS)
        _choice("level", self.level, LEVELS)
        _choice("loss_scaling", self.loss_scaling, LOSS_SCALINGS)
        for name in ("include_zero", "largest", "soft_reweight"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if isinstance(self.traj_k, bool) or not isinstance(self.traj_k, int) or self.traj_k < 1:
            raise ValueError(f"traj_k={self.traj_k!r} must be an integer >= 1")
        if self.quartile is not None:
            if isinstance(self.quartile, bool) or self.quartile not in (1, 2, 3, 4):
                raise ValueError(f"quartile={self.quartile!r} is not valid; expected None or one of (1, 2, 3, 4)")
            if self.strategy != "none":
                raise ValueError(f"quartile={self.quartile} selects the groups itself; set strategy='none' "
                                 f"(got strategy={self.strategy!r})")


@dataclass
class FilterResult:
    """What one filter call decides. Trajectory indices are in batch order (trajectory i is in group i // G)."""
    kept_groups: torch.Tensor   # (S,) long, ascending
    group_mask: torch.Tensor    # (P,) bool
    traj_mask: torch.Tensor     # (P*G,) bool
    kept_traj: torch.Tensor     # (N,) long, ascending = batch order
    traj_group: torch.Tensor    # (N,) long: group of each kept trajectory
    adv_weight: torch.Tensor    # (N,) float32: soft-reweight factor per kept trajectory (ones if off)
    loss_scale: float           # multiply the task advantage by this (1.0 unless loss_scaling is set)
    scores: torch.Tensor        # (P,) float64 selection scores
    metrics: dict = field(default_factory=dict)   # "filter/..." -> float

    @property
    def empty(self) -> bool:
        """True when nothing is kept: train.py skips the update and counts the empty step."""
        return len(self.kept_traj) == 0


def _masked_var(r: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance of each row of r over its masked entries, (P, G) -> (P,); 0 for rows with < 2."""
    m = mask.to(r.dtype)
    n = m.sum(1)
    mean = (r * m).sum(1) / n.clamp(min=1)
    var = (((r - mean[:, None]) ** 2) * m).sum(1) / (n - 1).clamp(min=1)
    return torch.where(n >= 2, var, torch.zeros_like(var))


def _summary(prefix: str, x: torch.Tensor) -> dict:
    """mean/min/max of a 1-D tensor as plain floats (0.0 for an empty tensor, like the code's chosen_*)."""
    if len(x) == 0:
        return {f"{prefix}_mean": 0.0, f"{prefix}_min": 0.0, f"{prefix}_max": 0.0}
    return {f"{prefix}_mean": float(x.mean()), f"{prefix}_min": float(x.min()), f"{prefix}_max": float(x.max())}


def _spread(x: torch.Tensor) -> float:
    """Std(x)/Mean(x) over groups (population std): the paper's "when filtering helps" diagnostic; 0 if mean 0."""
    mean = float(x.mean())
    return float(x.std(unbiased=False)) / mean if mean > 1e-12 else 0.0


def apply_filter(rewards, cfg: FilterConfig | None = None, traj_stats=None) -> FilterResult:
    """One filter decision for a (P, G) reward matrix: the single entry point train.py calls.

    `traj_stats` is the (P, G) per-trajectory statistic for the entropy/length metrics (see group_scores).
    Metrics: RV is the paper's unbiased variance ("filter/rv_*") and the code's unbiased std
    ("filter/reward_std_*") is logged beside it; "kept_*" values are over kept groups, computed on their kept
    trajectories (so trajectory-level selection shows the RV it forces). Soft reweighting (code-only,
    the official code) weights groups by RV / max kept RV with RV read as std when metric == "reward_std"
    (exactly the code) and as variance otherwise. The loss scale uses the kept trajectory fraction, which
    equals the code's kept-group ratio at prompt level.
    """
    cfg = FilterConfig() if cfg is None else cfg
    cfg.validate()
    r = _matrix(rewards, "rewards")                    # (P, G)
    n_p, n_g = r.shape
    if cfg.soft_reweight and n_g < 2:
        raise ValueError(f"soft_reweight=True needs G >= 2 rollouts per group; got G={n_g}")
    needs_scores = cfg.strategy != "none" or cfg.quartile is not None or cfg.soft_reweight
    # "none" needs no score (and works for G = 1), but logs it where it can be computed, so that a no-filter arm's
    # score statistics compare with a filter arm's
    scorable = needs_scores or ((cfg.metric in REWARD_METRICS or traj_stats is not None)
                                and (n_g >= 2 or cfg.metric not in DISPERSION_METRICS))
    scores = (group_scores(r, cfg.metric, traj_stat=traj_stats) if scorable   # (P,)
              else torch.zeros(n_p, dtype=torch.float64))
    if cfg.quartile is not None:
        kept = select_quartile(scores, cfg.quartile, include_zero=cfg.include_zero)
    else:
        kept = select_groups(scores, cfg.strategy, cfg.value, mode=cfg.mode, include_zero=cfg.include_zero,
                             eps=cfg.eps, largest=cfg.largest)
    group_mask = torch.zeros(n_p, dtype=torch.bool)
    group_mask[kept] = True
    mask2d = group_mask[:, None].expand(n_p, n_g).clone()                  # (P, G) whole groups
    if cfg.level == "trajectory":
        mask2d &= select_trajectories(r, cfg.traj_k)
    traj_mask = mask2d.reshape(-1)                                         # (P*G,) batch order
    kept_traj = traj_mask.nonzero().squeeze(1)
    traj_group = kept_traj // n_g

    # RV per group, before (all members) and after (kept members of kept groups)
    rv = r.var(dim=1) if n_g >= 2 else torch.zeros(n_p, dtype=r.dtype)    # (P,)
    kept_rv = _masked_var(r, mask2d)[kept]                                 # (S,)
    kept_frac_traj = len(kept_traj) / (n_p * n_g)
    loss_scale = {"none": 1.0, "linear": kept_frac_traj, "sqrt": math.sqrt(kept_frac_traj)}[cfg.loss_scaling]

    adv_weight = torch.ones(len(kept_traj), dtype=torch.float32)
    if cfg.soft_reweight and len(kept) > 0:
        rv_w = rv.sqrt() if cfg.metric == "reward_std" else rv             # (P,)
        w_g = rv_w / (rv_w[kept].max() + 1e-6)                             # max over kept groups, like the code
        adv_weight = w_g[traj_group].to(torch.float32)

    kept_group_mean = (r * mask2d).sum(1)[kept] / mask2d.sum(1)[kept].clamp(min=1)
    metrics = {
        "filter/num_groups": float(n_p),
        "filter/kept_groups": float(len(kept)),
        "filter/kept_frac": len(kept) / n_p,
        "filter/kept_trajs": float(len(kept_traj)),
        "filter/kept_traj_frac": kept_frac_traj,
        "filter/empty": float(len(kept_traj) == 0),
        "filter/zero_rv_count": float((rv.abs() <= ZERO_TOL).sum()),
        **_summary("filter/rv", rv),
        **_summary("filter/kept_rv", kept_rv),
        "filter/rv_std_over_mean": _spread(rv),
        "filter/reward_std_mean": float(rv.sqrt().mean()),
        "filter/kept_reward_std_mean": float(kept_rv.sqrt().mean()) if len(kept) else 0.0,
        "filter/reward_std_std_over_mean": _spread(rv.sqrt()),
        "filter/reward_mean": float(r.mean()),
        "filter/kept_reward_mean": float(kept_group_mean.mean()) if len(kept) else 0.0,
        "filter/loss_scale": loss_scale,
        **_summary("filter/soft_weight", adv_weight.double()),
    }
    if scorable:                                   # the selection score's statistics (absent when not computable)
        metrics.update({"filter/zero_score_count": float((scores.abs() <= ZERO_TOL).sum()),   # code's filter_zero_count
                        "filter/score_mean": float(scores.mean()),
                        "filter/kept_score_mean": float(scores[kept].mean()) if len(kept) else 0.0})
    return FilterResult(kept, group_mask, traj_mask, kept_traj, traj_group, adv_weight, loss_scale, scores, metrics)


# ----------------------------------------------------------------------------------------------------------------
# Ablations and the official code's variants: other metrics, softmax top-p, top-k, min-p, quartiles, trajectories
# ----------------------------------------------------------------------------------------------------------------
def group_scores(rewards, metric: str = "reward_variance", *, traj_stat=None) -> torch.Tensor:
    """Per-group selection score phi(B_u), (P, G) -> (P,) float64.

    Reward metrics read `rewards` (per-trajectory returns): `reward_variance` = unbiased variance (the paper's
    RV, default), `reward_std` = unbiased std (what the code ranks by), `reward_mean` (the code's "reward"),
    `reward_sum`. Per-trajectory metrics read `traj_stat`, a (P, G) tensor the caller computes, aggregated the
    way the reference does: `entropy` = group mean of per-trajectory entropy, where a trajectory's entropy is
    the mean token entropy over its loss mask (denominator clamped >= 1); `entropy_variance` / `entropy_std` =
    unbiased variance / std of those (the code's "entropy_variance" is a std); `length` = group mean of
    per-trajectory generated-token counts (sum of the loss mask).
    """
    _choice("metric", metric, METRICS)
    r = _matrix(rewards, "rewards")  # (P, G)
    if metric in REWARD_METRICS:
        x = r
    else:
        if traj_stat is None:
            raise ValueError(f"metric={metric!r} needs traj_stat: a (P, G) tensor of per-trajectory values")
        x = _matrix(traj_stat, "traj_stat")
        if x.shape != r.shape:
            raise ValueError(f"traj_stat shape {tuple(x.shape)} must equal rewards shape {tuple(r.shape)}")
    if metric in DISPERSION_METRICS and x.shape[1] < 2:
        raise ValueError(f"metric={metric!r} needs G >= 2 rollouts per group; got G={x.shape[1]}")
    if metric in ("reward_variance", "entropy_variance"):
        return x.var(dim=1)                            # unbiased: divides by G - 1
    if metric in ("reward_std", "entropy_std"):
        return x.std(dim=1)
    if metric == "reward_sum":
        return x.sum(dim=1)
    return x.mean(dim=1)                               # reward_mean, entropy, length


def _top_p_softmax(s: torch.Tensor, value: float, largest: bool) -> torch.Tensor:
    """Code's nucleus rule: p = softmax(+-s); keep the fewest most probable groups with cum. p >= value (>= 1)."""
    logits = s if largest else -s
    order = torch.sort(logits, descending=True, stable=True).indices
    c = torch.cumsum(torch.softmax(logits[order], 0), 0)            # (n,) nondecreasing, ends at 1
    cut = int(torch.searchsorted(c, torch.tensor([float(value)], dtype=c.dtype))[0])  # first c >= value
    return order[: min(cut + 1, len(s))]


def select_groups(scores, strategy: str = "top_p", value: float = 0.9, *, mode: str = "linear",
                  include_zero: bool = False, eps: float = 0.01, largest: bool = True) -> torch.Tensor:
    """Kept group indices (LongTensor, ascending, possibly empty) for one selection rule.

    - include_zero=False first drops groups with |score| <= 1e-10 (before any rule; if none remain: empty).
    - `none`: keep all P groups (include_zero ignored): the no-filter baseline on the same code path.
    - `top_p`, value rho in (0, 1]: rho >= 1 keeps every remaining candidate (so top_p 1.0 + include_zero
      False = "drop zero-RV groups only"). mode `linear` (paper, App. G): see the module docstring; the walk
      also stops at the first score <= 0, so `largest=False` with zeros present gives empty, and a negative
      total (signed metrics) gives empty. mode `softmax` (code's scripts): nucleus over softmax(scores)
      (softmax(-scores) for smallest), always keeps >= 1.
    - `top_k`, value in (0, 1]: k = int(value * P) with P the full group count, clamped to [1, #candidates].
    - `top_k_abs`, integer value >= 1: k = value, same clamping.
    - `min_p`, value p in (0, 1]: largest keeps score >= p * max - 1e-10; smallest keeps
      score <= min / (p + 1e-10) + 1e-10 (as the code; with a negative max nothing may pass).
    `largest=False` selects the smallest scores (the paper's reverse / "keep smallest" diagnostic).
    """
    check_rule(strategy, value, mode, eps)
    s = torch.as_tensor(scores, dtype=torch.float64)
    if s.dim() != 1 or len(s) < 1:
        raise ValueError(f"scores must have shape (P,) with P >= 1; got {tuple(s.shape)}")
    if not torch.isfinite(s).all():
        raise ValueError("scores contains NaN or inf")
    n_groups = len(s)
    idx = torch.arange(n_groups)                       # original group index of every candidate
    if strategy == "none":
        return idx
    if not include_zero:
        nonzero = s.abs() > ZERO_TOL
        s, idx = s[nonzero], idx[nonzero]
        if len(s) == 0:
            return idx
    if strategy == "top_p":
        if value >= 1:
            pos = torch.arange(len(s))
        elif mode == "linear":
            pos = top_p_linear(s, value, eps, largest)
        else:
            pos = _top_p_softmax(s, value, largest)
    elif strategy in ("top_k", "top_k_abs"):
        k = int(value * n_groups) if strategy == "top_k" else int(value)
        k = max(min(k, len(s)), 1)
        pos = _rank(s, largest)[:k]
    else:                                              # min_p
        if largest:
            pos = (s >= s.max() * value - 1e-10).nonzero().squeeze(1)
        else:
            pos = (s <= s.min() / (value + 1e-10) + 1e-10).nonzero().squeeze(1)
    return torch.sort(idx[pos]).values


def select_quartile(scores, q: int, *, include_zero: bool = True) -> torch.Tensor:
    """Kept group indices (ascending) of RV-rank quartile q (1 = highest scores, 4 = lowest): quartile ablation.

    Candidates (after dropping |score| <= 1e-10 when include_zero=False) are ranked best first (stable);
    rank r (0-based) of n candidates belongs to quartile floor(4 r / n) + 1. With n divisible by 4 each quartile
    holds n/4 groups; otherwise sizes differ by at most one (n=10: 3, 2, 3, 2) and for n < 4 some are empty.
    The paper's ablation (P=8) ranks all groups, zeros included (its Q3/Q4 hold RV 0.0-0.2).
    """
    if isinstance(q, bool) or q not in (1, 2, 3, 4):
        raise ValueError(f"quartile={q!r} is not valid; expected one of (1, 2, 3, 4)")
    s = torch.as_tensor(scores, dtype=torch.float64)
    if s.dim() != 1 or len(s) < 1:
        raise ValueError(f"scores must have shape (P,) with P >= 1; got {tuple(s.shape)}")
    idx = torch.arange(len(s))
    if not include_zero:
        idx = idx[s.abs() > ZERO_TOL]
    order = idx[_rank(s[idx], largest=True)]           # candidate group indices, highest first
    quart = torch.arange(len(order)) * 4 // max(len(order), 1) + 1
    return torch.sort(order[quart == q]).values


def select_trajectories(rewards, k: int) -> torch.Tensor:
    """(P, G) bool mask keeping the top-k and bottom-k rewards inside every group (trajectory-level ablation).

    One stable descending sort per row: the first k are the top, the last k the bottom, so the two sets are
    disjoint (ties: the top takes lower indices, the bottom higher ones). Needs 1 <= k and 2k <= G.
    The paper's table says "top-8 + bottom-8 rewards" with G=16 but reports 64 = 8 x 8 trajectories per update,
    i.e. k=4 (the default of FilterConfig.traj_k); k=8 would keep everything.
    """
    r = _matrix(rewards, "rewards")                    # (P, G)
    n_g = r.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or 2 * k > n_g:
        raise ValueError(f"traj_k={k!r} is not valid for G={n_g}: expected an integer with 1 <= traj_k <= G // 2")
    order = torch.sort(r, dim=1, descending=True, stable=True).indices     # (P, G)
    mask = torch.zeros_like(r, dtype=torch.bool)
    pick = torch.cat([order[:, :k], order[:, n_g - k:]], dim=1)            # (P, 2k)
    return mask.scatter_(1, pick, True)


# ---------------------------------------------------------------------------------------------------------------
# Teaching CLI: which groups does "top-p 0.9" keep? (answers the referee's "which top-p?" in one command)
# ---------------------------------------------------------------------------------------------------------------
def _readings(std: torch.Tensor, value: float, eps: float, largest: bool) -> list:
    """(label, {include_zero: kept indices}) for each reading of the same `value`, on std and variance scores."""
    var = std ** 2
    rows = [("top_p linear on variance  (paper: RV mass)", var, "top_p", "linear"),
            ("top_p linear on std       (code, mode=linear)", std, "top_p", "linear"),
            ("top_p softmax on std      (code's main-table scripts)", std, "top_p", "softmax"),
            ("top_p softmax on variance", var, "top_p", "softmax"),
            ("top_k fraction            (App. B.2 'top 90% of groups')", std, "top_k", "linear"),
            ("min_p on variance         (p x max, or min / p)", var, "min_p", "linear"),
            ("min_p on std", std, "min_p", "linear")]
    return [(label, {iz: select_groups(s, strat, value, mode=mode, include_zero=iz, eps=eps, largest=largest)
                     for iz in (True, False)}) for label, s, strat, mode in rows]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Kept groups under each reading of one filter value. Positional "
                                 "scores are per-group reward stds (the reference's 'RV'); the variance reading "
                                 "squares them. Or pass a reward matrix with --rewards.")
    ap.add_argument("scores", nargs="*", type=float, help="per-group reward std, e.g. 0.25 0.24 0.1 0.05 0 0 0 0")
    ap.add_argument("--rewards", help="P x G rewards: rows separated by ';', entries by ',' (e.g. '1,0,1;0,0,0')")
    ap.add_argument("--value", type=float, default=0.9, help="rho for top_p, fraction for top_k, p for min_p")
    ap.add_argument("--eps", type=float, default=0.01, help="slack of the linear rule")
    ap.add_argument("--smallest", action="store_true", help="keep the smallest scores instead of the largest")
    args = ap.parse_args(argv)
    if args.rewards and args.scores:
        ap.error("give either positional scores or --rewards, not both")
    if args.rewards:
        try:
            rows = [[float(v) for v in row.split(",")] for row in args.rewards.split(";")]
        except ValueError:
            ap.error(f"--rewards: entries must be numbers, rows separated by ';' and entries by ',', got {args.rewards!r}")
        if len({len(r) for r in rows}) != 1 or len(rows[0]) < 2:
            ap.error(f"--rewards: every row (group) needs the same number G >= 2 of rewards, got row lengths "
                     f"{[len(r) for r in rows]}")
        if not all(math.isfinite(v) for r in rows for v in r):
            ap.error("--rewards: rewards must be finite")
        std = group_scores(torch.tensor(rows, dtype=torch.float64), "reward_std")
    elif args.scores:
        std = torch.tensor(args.scores, dtype=torch.float64)
        if (std < 0).any() or not torch.isfinite(std).all():
            ap.error("positional scores are stds and must be finite and >= 0")
    else:
        ap.error("give per-group stds or --rewards")
    try:
        check_value("top_p", args.value)
    except ValueError as e:
        ap.error(str(e))
    n_p = len(std)
    print("group     " + " ".join(f"{i:>7d}" for i in range(n_p)))
    print("std       " + " ".join(f"{v:7.4f}" for v in std.tolist()))
    print("variance  " + " ".join(f"{v:7.4f}" for v in (std ** 2).tolist()))
    print(f"value={args.value}  eps={args.eps}  keep={'smallest' if args.smallest else 'largest'}  P={n_p}\n")
    print(f"{'reading':58s} {'include_zero=True':24s} include_zero=False")
    for label, kept in _readings(std, args.value, args.eps, not args.smallest):
        cells = [f"{{{','.join(map(str, kept[iz].tolist()))}}} {len(kept[iz])}/{n_p}" for iz in (True, False)]
        print(f"{label:58s} {cells[0]:24s} {cells[1]}")
    print("\nEmpty set = the step is skipped. Under the linear rule (tau = value * sum - eps over the candidates) "
          "that happens when\nthere is no candidate, when tau <= 0 (the empty prefix already reaches it: tiny RVs "
          "with eps > 0), or, with\n--smallest, when a zero score is ranked first (the walk stops at the first "
          "score <= 0).")
    var = std ** 2
    for iz in (True, False):
        cand = var if iz else var[var.abs() > ZERO_TOL]
        tau = args.value * float(cand.sum()) - args.eps
        print(f"  linear on variance, include_zero={iz}: tau = {args.value:g} * {float(cand.sum()):.6g} - "
              f"{args.eps:g} = {tau:.6g}" + ("  (<= 0: nothing is kept)" if tau <= 0 else ""))


if __name__ == "__main__":
    main()
