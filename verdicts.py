"""Verdict rules that can decide (issue 23, item 3): template collapse per run, and between-arm tests over seeds.

The paper's template collapse (§2.3, Fig. 1): I(X;Z) falls while H(Z|X) stays up and the format stays valid. The
rules here fix the three ways the earlier rule (report.py, first vs last logged value) could not decide:

* the baseline is the **first step at which the format is learnt** (`rollout/format_ok_rate` >= FORMAT_LEARNT =
  0.8, the first step that logged the MI proxy at or after it), not step 0: before the format is learnt Z is mostly
  unclosed text, so "entropy kept half of its step-0 value" compared a different kind of text;
* MI is judged by **retrieval accuracy against chance with a 95 % Wilson interval** over the M scored reasonings:
  a scale in [0, 1] that does not grow with scorer sharpness (MI-Est minus its permutation null does: the null mean
  of a sharp scorer is far below zero). "Input-dependent" = the interval's lower end above chance; "at chance" = the
  lower end at or below it. (Rows of one group share a prompt, so the interval is, if anything, too narrow.)
* the entropy is **Ĥ(Z|X) of the unfiltered batch** (`mi_first_turn/conditional_entropy_est`, scored on every
  trajectory before the filter), not `train/entropy`, which is measured on the kept tokens only and so differs
  between a filter arm and a no-filter arm by construction.
Between arms: a paired **sign-flip permutation test** over seeds (exact over all 2^n sign patterns up to n = 16,
10,000 random patterns beyond), two-sided, p < 0.05 to call a difference; every "not resolved" states the minimum
detectable difference at its seed count (paired t, alpha 0.05 two-sided, power 0.8, with the observed std) and the
smallest p the exact test can reach (2 / 2^n: at 3 seeds 0.25, so no difference can be called below 6 seeds).

Left out: multiple-comparison corrections across pairs and metrics, per-prompt clustering of the retrieval
interval. Used by report.py (`verdict_lines`); tests: `.venv/bin/python -m pytest tests/test_verdicts.py -q`.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

FORMAT_LEARNT = 0.8            # rollout/format_ok_rate at which the format counts as learnt (and kept at the end)
ALPHA, POWER = 0.05, 0.8
Z95 = 1.959963984540054
MI_PREFIX = "mi_first_turn"
FMT, ENT_UNFILTERED = "rollout/format_ok_rate", f"{MI_PREFIX}/conditional_entropy_est"
ACC, CHANCE, NROWS = (f"{MI_PREFIX}/retrieval_accuracy", f"{MI_PREFIX}/retrieval_chance_level",
                      f"{MI_PREFIX}/n_rows")
RULE = (f"baseline = the first MI step at or after the format is learnt (format ok >= {FORMAT_LEARNT:g}); "
        "input-dependent there = retrieval accuracy's 95 % Wilson lower bound above chance; template collapse = "
        "at the last MI step retrieval is at chance (lower bound <= chance) while Ĥ(Z|X) of the unfiltered batch "
        f"kept at least half of its baseline value and format ok >= {FORMAT_LEARNT:g}")


def _series(rows: list[dict], key: str) -> dict:
    """step -> value of one metric over the training steps (>= 0) that logged it (finite numbers only)."""
    return {int(r["step"]): float(r[key]) for r in rows if r.get("step", -1) >= 0 and isinstance(r.get(key),
            (int, float)) and math.isfinite(r[key])}


def wilson(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (successes of n trials)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def baseline_step(rows: list[dict]) -> int | None:
    """The first step that logged the MI proxy at or after the first step with format ok >= FORMAT_LEARNT."""
    fmt, acc = _series(rows, FMT), _series(rows, ACC)
    learnt = [s for s in sorted(fmt) if fmt[s] >= FORMAT_LEARNT]
    later = [s for s in sorted(acc) if learnt and s >= learnt[0]]
    return later[0] if later else None


def retrieval_state(rows: list[dict], step: int) -> dict:
    """Retrieval accuracy, its Wilson interval over n_rows, chance, and above_chance (lower bound > chance)."""
    acc, chance, n = (_series(rows, k)[step] for k in (ACC, CHANCE, NROWS))
    lo, hi = wilson(acc * n, n)
    return {"acc": acc, "lo": lo, "hi": hi, "chance": chance, "n": n, "above_chance": lo > chance}


def collapse_parts(rows: list[dict]) -> dict | None:
    """RULE on one run: baseline step, input_dependent at baseline, mi_at_chance, entropy_kept and format_ok at
    the last MI step, and collapsed = all four. None when the format is never learnt at an MI step or a key is
    missing (nothing to judge)."""
    b = baseline_step(rows)
    if b is None:
        return None
    acc, ent, fmt = _series(rows, ACC), _series(rows, ENT_UNFILTERED), _series(rows, FMT)
    end = max(acc)
    if b not in ent or end not in ent or not fmt or any(end not in _series(rows, k) for k in (CHANCE, NROWS)):
        return None
    start, last = retrieval_state(rows, b), retrieval_state(rows, end)
    parts = {"input_dependent": start["above_chance"], "mi_at_chance": not last["above_chance"],
             "entropy_kept": ent[end] >= 0.5 * ent[b], "format_ok": fmt[max(fmt)] >= FORMAT_LEARNT}
    return {**parts, "collapsed": all(parts.values()), "baseline_step": b, "end_step": end,
            "entropy": (ent[b], ent[end]), "retrieval": (start, last)}


# ----------------------------------------------------------------------------------------------------------
# Between arms: paired sign-flip test over seeds, minimum detectable difference
# ----------------------------------------------------------------------------------------------------------
def sign_flip_p(d, n_random: int = 10_000, seed: int = 0) -> float:
    """Two-sided p of the paired sign-flip permutation test of mean(d) = 0: the fraction of sign patterns whose
    |mean| is at least the observed |mean| (exact over all 2^n patterns for n <= 16, the observed one included;
    else (1 + hits) / (1 + n_random) over random patterns). NaN without differences."""
    d = np.asarray(d, float)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return math.nan
    obs = abs(d.mean()) - 1e-12
    if d.size <= 16:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))            # (2^n, n)
        return float((np.abs(signs @ d / d.size) >= obs).mean())
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(n_random, d.size))
    return float((1 + (np.abs(signs @ d / d.size) >= obs).sum()) / (1 + n_random))


def min_sign_flip_p(n: int) -> float:
    """The smallest two-sided p the exact sign-flip test can give with n seeds: 2 / 2^n."""
    return min(1.0, 2.0 / 2 ** n)


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t (df >= 1) by bisection on its CDF, the CDF by Simpson's rule on the density (our
    own: numpy has no t distribution and scipy is not a dependency). Accurate to ~1e-6 for p in [0.5, 0.9999]."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"need 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t):                      # 0.5 + integral_0^t of the density; substitution u = atan(x) tames the tail
        u = np.linspace(0.0, math.atan(t), 4001)
        f = c * (1 + np.tan(u) ** 2 / df) ** (-(df + 1) / 2) / np.cos(u) ** 2
        h = u[1] - u[0]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def min_detectable(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable mean paired difference: (t_{1-alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n). NaN for
    n < 2 or a NaN std."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return (t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def paired_verdict(d, what: str) -> str:
    """One verdict line for paired differences d (one per seed) of one metric."""
    d = np.asarray(d, float)
    d = d[np.isfinite(d)]
    n = int(d.size)
    if n == 0:
        return f"{what}: no seed in both arms."
    m, sd = float(d.mean()), float(d.std(ddof=1)) if n > 1 else math.nan
    p = sign_flip_p(d)
    head = (f"{what}: {m:+.3f} ± {sd:.3f} over {n} seeds ({int((d > 0).sum())}/{n} positive), "
            f"sign-flip p = {p:.3f}")
    if p < ALPHA:
        return f"{head}: {'higher' if m > 0 else 'lower'}."
    mdd = min_detectable(sd, n)
    power_part = (f"Minimum detectable difference at {n} seeds: ±{mdd:.3f} (paired t, α = {ALPHA:g}, power "
                  f"{POWER:g})" if mdd > 0 else      # (NaN > 0 is False) one seed, or equal differences: no spread
                  f"No minimum detectable difference can be estimated: {n} seed{'s' if n > 1 else ''} with "
                  f"{'equal differences (spread 0)' if n > 1 else 'no spread'}")
    return (f"{head}: not resolved. {power_part}; the exact test's smallest p at {n} seeds is {min_sign_flip_p(n):.3f}"
            + (f", so no difference can be called below {_seeds_needed()} seeds." if min_sign_flip_p(n) >= ALPHA
               else "."))


def _seeds_needed(alpha: float = ALPHA) -> int:
    return next(n for n in range(1, 64) if min_sign_flip_p(n) < alpha)
