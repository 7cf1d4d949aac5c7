"""verdicts.py on hand-built metric rows: each part of the collapse rule passes on one run and fails on another,
the baseline is the format-learnt step, the sign-flip test's p on worked examples, the Wilson interval and the
t quantiles against independent values, and the minimum detectable difference printed for 'not resolved'."""
import math

import numpy as np
import pytest

import verdicts as v


def run(acc, ent, fmt, chance=0.25, n=32):
    """Metric rows of one run: MI logged on every step given, format on every step."""
    return [{"step": -1, "val/success": 0.0}] + [
        {"step": s, v.ACC: a, v.CHANCE: chance, v.NROWS: n, v.ENT_UNFILTERED: e, v.FMT: f}
        for s, (a, e, f) in enumerate(zip(acc, ent, fmt))]


COLLAPSING = run(acc=[0.25, 0.9, 0.8, 0.25], ent=[3.0, 1.0, 0.9, 0.8], fmt=[0.1, 0.9, 1.0, 1.0])


def test_collapse_rule_passes_on_a_collapsing_run():
    p = v.collapse_parts(COLLAPSING)
    assert p["baseline_step"] == 1 and p["end_step"] == 3              # step 0: format not yet learnt
    assert p["input_dependent"] and p["mi_at_chance"] and p["entropy_kept"] and p["format_ok"] and p["collapsed"]
    assert p["entropy"] == (1.0, 0.8)
    # against step 0 (the old baseline) the entropy would have "fallen" to 0.8 / 3.0 < 1/2: the baseline matters
    assert 0.8 < 0.5 * 3.0


@pytest.mark.parametrize("change,part", [
    (dict(acc=[0.25, 0.4, 0.3, 0.25]), "input_dependent"),            # never clearly above chance at the baseline
    (dict(acc=[0.25, 0.9, 0.9, 0.75]), "mi_at_chance"),               # still retrievable at the end
    (dict(ent=[3.0, 1.0, 0.6, 0.4]), "entropy_kept"),                 # Ĥ(Z|X) fell below half of its baseline
    (dict(fmt=[0.1, 0.9, 1.0, 0.5]), "format_ok"),                    # the format was lost again
])
def test_each_part_of_the_rule_can_fail(change, part):
    args = dict(acc=[0.25, 0.9, 0.8, 0.25], ent=[3.0, 1.0, 0.9, 0.8], fmt=[0.1, 0.9, 1.0, 1.0], **{})
    args.update(change)
    p = v.collapse_parts(run(**args))
    assert not p[part] and not p["collapsed"]
    assert all(p[k] for k in ("input_dependent", "mi_at_chance", "entropy_kept", "format_ok") if k != part)


def test_no_verdict_without_a_learnt_format_or_the_mi_keys():
    assert v.collapse_parts(run(acc=[0.9, 0.25], ent=[1, 1], fmt=[0.5, 0.7])) is None       # format never learnt
    assert v.collapse_parts([{"step": 0, v.FMT: 1.0}]) is None                               # no MI logged
    # MI every 2 steps, format learnt on an odd step: the baseline is the next MI step
    rows = run(acc=[0.3, 0.9, 0.9, 0.9, 0.25], ent=[2, 1, 1, 1, 1], fmt=[0.1, 0.85, 1, 1, 1])
    rows = [r if r["step"] % 2 == 0 or r["step"] < 0 else {k: r[k] for k in ("step", v.FMT)} for r in rows]
    assert v.baseline_step(rows) == 2


def test_wilson_interval_bounds_solve_its_defining_equation():
    lo, hi = v.wilson(8, 32)                                 # 0.25 of 32: contains chance 0.25
    z, p, n = v.Z95, 0.25, 32
    for b in (lo, hi):                                       # (p - b)^2 = z^2 b (1 - b) / n at both ends
        assert (p - b) ** 2 == pytest.approx(z * z * b * (1 - b) / n, rel=1e-9)
    assert lo == pytest.approx(0.1325, abs=1e-4) and hi == pytest.approx(0.4211, abs=1e-4)
    assert v.wilson(32, 32)[1] == 1.0 and v.wilson(0, 32)[0] == 0.0
    assert v.retrieval_state(COLLAPSING, 1)["above_chance"] and not v.retrieval_state(COLLAPSING, 3)["above_chance"]


def test_sign_flip_p_on_worked_examples():
    # 6 seeds, all positive and distinct: only the all-plus and all-minus patterns reach |mean| 3.5 -> 2/64
    assert v.sign_flip_p([1, 2, 3, 4, 5, 6]) == pytest.approx(2 / 64)
    # +-0.3 differences: every pattern's |mean| is 0.1 or 0.3 >= the observed 0.1 -> p = 1
    assert v.sign_flip_p([0.3, 0.3, -0.3]) == pytest.approx(1.0)
    # 3 seeds [1, 2, 4] (mean 7/3): patterns with |mean| >= 7/3 are +++ and --- only -> 2/8
    assert v.sign_flip_p([1, 2, 4]) == pytest.approx(0.25)
    # [1, 2, 10]: flipping 1 or 2 or both keeps |sum| >= 13? sums 13, 11, 9, 7 (and negatives) -> only +/-13: 2/8
    assert v.sign_flip_p([1, 2, 10]) == pytest.approx(0.25)
    assert v.min_sign_flip_p(3) == 0.25 and v.min_sign_flip_p(6) == pytest.approx(1 / 32)
    assert math.isnan(v.sign_flip_p([]))
    big = v.sign_flip_p(np.full(20, 0.5))                     # random patterns beyond 16 seeds
    assert big == pytest.approx(1 / 10_001, rel=0.5)


def test_t_quantiles_and_minimum_detectable_difference():
    # published values of Student's t
    for p, df, t in [(0.975, 1, 12.7062), (0.975, 2, 4.30265), (0.975, 5, 2.57058), (0.8, 2, 1.06066),
                     (0.975, 30, 2.04227), (0.5, 4, 0.0)]:
        assert v.t_quantile(p, df) == pytest.approx(t, abs=2e-4)
    mdd = v.min_detectable(0.2, 3)
    assert mdd == pytest.approx((4.30265 + 1.06066) * 0.2 / math.sqrt(3), rel=1e-4)
    assert math.isnan(v.min_detectable(0.2, 1)) and math.isnan(v.min_detectable(math.nan, 3))
    with pytest.raises(ValueError, match="df"):
        v.t_quantile(0.975, 0)


def test_paired_verdict_resolves_or_prints_the_detectable_difference():
    called = v.paired_verdict([0.1, 0.2, 0.15, 0.12, 0.3, 0.22], "final validation success")
    assert "p = 0.031" in called and called.endswith(": higher.")
    unresolved = v.paired_verdict([0.2, 0.1, 0.3], "final validation success")
    assert "p = 0.250: not resolved" in unresolved and "Minimum detectable difference at 3 seeds: ±0.310" in unresolved
    for d, why in (([0.016, 0.016], "2 seeds with equal differences (spread 0)"), ([0.1], "1 seed with no spread")):
        line = v.paired_verdict(d, "x")                       # no spread: no "±0.000" or "±nan" power claim
        assert f"No minimum detectable difference can be estimated: {why}" in line and "±0.000" not in line
        assert "nan" not in line.split("sign-flip")[1]
    assert "no difference can be called below 6 seeds" in unresolved
    noisy = v.paired_verdict([0.1, -0.2, 0.3, 0.05, -0.1, 0.2], "x")
    assert "not resolved" in noisy and "smallest p at 6 seeds is 0.031." in noisy
    assert v.paired_verdict([], "x") == "x: no seed in both arms."
