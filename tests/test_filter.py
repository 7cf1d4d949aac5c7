"""Tests for filter.py: worked examples A-E of the official filter rules, the reference's own test cases
(§8), independent re-computations of the linear and softmax rules, the paper's variants (trajectory-level,
quartile, soft reweighting, loss scaling), metrics, the CLI, and bad input. Pure tensors, runs in seconds.
"""
import math
import random

import numpy as np
import pytest
import torch

import filter as F

S_A = [0.25, 0.24, 0.10, 0.05, 0, 0, 0, 0]      # the worked examples' group RVs (stds)
S_D = [5.2, 4.8, 3.0, 0.5, 0.3, 0, 0, 0]        # Sokoban-scale RVs


def kept(scores, strategy="top_p", value=0.9, **kw):
    return F.select_groups(torch.tensor(scores, dtype=torch.float64), strategy, value, **kw).tolist()


def reference_linear(s, value, eps, largest, include_zero):
    """The reference's top_p linear walk, written literally with Python floats and a stable sort."""
    cand = [(i, x) for i, x in enumerate(s) if include_zero or abs(x) > 1e-10]
    if not cand:
        return []
    if value >= 1:
        return sorted(i for i, _ in cand)
    ordered = sorted(cand, key=lambda t: -t[1] if largest else t[1])
    threshold = value * sum(x for _, x in cand) - eps
    total, n = 0.0, 0
    for _, x in ordered:
        if total >= threshold:
            break
        if x <= 0:
            break
        total += x
        n += 1
    return sorted(i for i, _ in ordered[:n]) if total >= threshold else []


# ----------------------------------------------------------------------------- worked examples A-E
@pytest.mark.parametrize("include_zero", [True, False])
@pytest.mark.parametrize("scores, strategy, value, mode, expect_true, expect_false", [
    (S_A, "top_p", 0.9, "linear", [0, 1, 2], [0, 1, 2]),                        # A
    (S_A, "top_p", 0.9, "softmax", list(range(8)), [0, 1, 2, 3]),               # B
    (S_A, "top_k", 0.25, "linear", [0, 1], [0, 1]),                             # C
    (S_A, "top_k_abs", 3, "linear", [0, 1, 2], [0, 1, 2]),                      # C
    (S_A, "min_p", 0.5, "linear", [0, 1], [0, 1]),                              # C
    (S_D, "top_p", 0.9, "linear", [0, 1, 2], [0, 1, 2]),                        # D
    (S_D, "top_p", 0.9, "softmax", [0, 1], [0, 1]),                             # D
    ([0.0] * 8, "top_p", 0.9, "linear", [], []),                                # E
    ([0.0] * 8, "top_p", 0.9, "softmax", list(range(8)), []),                   # E
    ([0.005] + [0.0] * 7, "top_p", 0.9, "linear", [], []),                      # E
])
def test_worked_examples(scores, strategy, value, mode, expect_true, expect_false, include_zero):
    got = kept(scores, strategy, value, mode=mode, include_zero=include_zero, eps=0.01)
    assert got == (expect_true if include_zero else expect_false)


def test_example_b_softmax_probabilities():
    # the spec's hand-computed softmax of S_A: 0.1474, 0.1459, 0.1269, 0.1207, 0.1148 x 4
    p = torch.softmax(torch.tensor(S_A, dtype=torch.float64), 0)
    assert torch.allclose(p, torch.tensor([0.1474, 0.1459, 0.1269, 0.1207] + [0.1148] * 4, dtype=torch.float64),
                          atol=1e-4)


# ----------------------------------------------------------------------------- reference tests (§8)
@pytest.mark.parametrize("scores, mode, value, include_zero, expect", [
    ([1, 1, 1], "softmax", 0.6, True, [0, 1]),
    ([4, 3, 2, 1], "linear", 0.6, True, [0, 1]),           # threshold 5.99
    ([0, 0, 0, 0], "linear", 0.9, True, []),
    ([10, 1, 0, 0], "softmax", 0.9, False, [0]),
    ([4, 2, 0, 0], "softmax", 0.9, False, [0, 1]),
    ([1, 1, 1, 0], "softmax", 0.6, False, [0, 1]),
    ([10, 1, 0, 0], "linear", 0.9, False, [0]),
    ([4, 2, 0, 0], "linear", 0.9, False, [0, 1]),
    ([3, 1, 1, 0], "linear", 0.9, False, [0, 1, 2]),
])
def test_reference_cases(scores, mode, value, include_zero, expect):
    assert kept(scores, "top_p", value, mode=mode, include_zero=include_zero) == expect


@pytest.mark.parametrize("scores", [[0, 0, 0], [1, 0, 2], [0.5], [3, -1, 2, 0]])
@pytest.mark.parametrize("mode", ["linear", "softmax"])
def test_value_one_with_include_zero_keeps_all(scores, mode):
    assert kept(scores, "top_p", 1.0, mode=mode, include_zero=True) == list(range(len(scores)))


def test_value_one_without_zeros_drops_only_zero_groups():
    assert kept([0.3, 0, 0.1, 0], "top_p", 1.0, include_zero=False) == [0, 2]


def test_reference_reward_metrics_through_apply_filter():
    r = torch.tensor([[5.0, 5.0], [3.0, 4.0], [2.0, 2.0], [1.0, 2.0]])     # sums 10, 7, 4, 3
    res = F.apply_filter(r, F.FilterConfig(strategy="top_k", value=0.5, metric="reward_sum", include_zero=True))
    assert res.kept_groups.tolist() == [0, 1]
    assert res.metrics["filter/score_mean"] == pytest.approx(6.0)
    assert res.metrics["filter/kept_score_mean"] == pytest.approx(8.5)
    res = F.apply_filter(r, F.FilterConfig(strategy="top_k_abs", value=1, metric="reward_mean", include_zero=True))
    assert res.kept_groups.tolist() == [0]                                 # highest-mean group
    res = F.apply_filter(r, F.FilterConfig(strategy="top_k", value=0.5, metric="reward_std", include_zero=True))
    assert len(res.kept_groups) == 2 and res.kept_groups.tolist() == [1, 3]   # stds 0, .707, 0, .707


# ----------------------------------------------------------------------------- independent re-computations
def test_linear_rule_matches_literal_walk_on_random_vectors():
    rng = random.Random(0)
    for trial in range(400):
        n = rng.randint(1, 12)
        s = [0.0 if rng.random() < 0.3 else rng.uniform(-1 if trial % 4 == 0 else 0, 3) for _ in range(n)]
        value, eps = rng.choice([0.1, 0.5, 0.9, 0.95, 1.0]), rng.choice([0.0, 0.01, 0.3])
        largest, include_zero = rng.random() < 0.7, rng.random() < 0.5
        got = kept(s, "top_p", value, mode="linear", eps=eps, largest=largest, include_zero=include_zero)
        assert got == reference_linear(s, value, eps, largest, include_zero), (s, value, eps, largest)


def test_linear_rule_is_the_papers_k_star_for_nonnegative_scores():
    # paper App. G: k* = min{k : sum of the k largest >= rho * sum - eps}; empty if rho * sum <= eps
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        s = torch.rand(9, generator=g, dtype=torch.float64) * (torch.rand(9, generator=g) < 0.7)
        rho = float(torch.rand(1, generator=g)) * 0.99 + 0.005
        tau = rho * float(s.sum()) - 0.01
        desc = sorted(range(9), key=lambda i: -float(s[i]))
        if tau <= 0:
            expect = []
        else:
            k_star = next(k for k in range(1, 10) if sum(float(s[i]) for i in desc[:k]) >= tau)
            expect = sorted(desc[:k_star])
        assert F.select_groups(s, "top_p", rho, include_zero=True).tolist() == expect


def test_softmax_rule_is_smallest_nucleus_on_random_vectors():
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        s = torch.randn(7, generator=g, dtype=torch.float64) * 2
        rho = float(torch.rand(1, generator=g)) * 0.98 + 0.01
        p = torch.softmax(s, 0).tolist()
        desc = sorted(range(7), key=lambda i: -p[i])
        k = next((k for k in range(1, 8) if sum(p[i] for i in desc[:k]) >= rho), 7)
        assert F.select_groups(s, "top_p", rho, mode="softmax", include_zero=True).tolist() == sorted(desc[:k])


@pytest.mark.parametrize("metric, fn", [
    ("reward_variance", lambda x: x.var(axis=1, ddof=1)), ("reward_std", lambda x: x.std(axis=1, ddof=1)),
    ("reward_mean", lambda x: x.mean(axis=1)), ("reward_sum", lambda x: x.sum(axis=1))])
def test_group_scores_reward_metrics(metric, fn):
    r = np.random.default_rng(3).normal(size=(5, 6))
    assert np.allclose(F.group_scores(torch.tensor(r), metric).numpy(), fn(r))


@pytest.mark.parametrize("metric, fn", [
    ("entropy", lambda x: x.mean(axis=1)), ("length", lambda x: x.mean(axis=1)),
    ("entropy_variance", lambda x: x.var(axis=1, ddof=1)), ("entropy_std", lambda x: x.std(axis=1, ddof=1))])
def test_group_scores_per_trajectory_metrics_read_traj_stat(metric, fn):
    rng = np.random.default_rng(4)
    r, stat = rng.normal(size=(4, 3)), rng.uniform(0, 5, size=(4, 3))
    assert np.allclose(F.group_scores(torch.tensor(r), metric, traj_stat=torch.tensor(stat)).numpy(), fn(stat))


def test_binary_reward_std_table():
    # spec §1.2: unbiased std of k successes out of G=16
    table = {0: 0.0, 1: 0.25, 2: 0.3416, 3: 0.4031, 4: 0.4472, 5: 0.4787, 6: 0.5, 7: 0.5123, 8: 0.5164, 15: 0.25}
    r = torch.tensor([[1.0] * k + [0.0] * (16 - k) for k in table])
    assert torch.allclose(F.group_scores(r, "reward_std"), torch.tensor(list(table.values()), dtype=torch.float64),
                          atol=1e-4)


# ----------------------------------------------------------------------------- edge cases
def test_single_group_batches():
    assert kept([0.4], "top_p", 0.9) == [0]
    assert kept([0.4], "top_p", 0.9, mode="softmax") == [0]
    assert kept([0.4], "top_k", 0.25) == [0]                      # int(0.25 * 1) = 0 -> clamped to 1
    assert kept([0.0], "top_p", 0.9) == []
    res = F.apply_filter(torch.tensor([[1.0, 0.0, 1.0]]))
    assert res.kept_traj.tolist() == [0, 1, 2] and res.metrics["filter/kept_frac"] == 1.0


def test_all_zero_batch_is_empty_with_metrics():
    res = F.apply_filter(torch.ones(4, 5))
    assert res.empty and res.kept_groups.numel() == 0 and res.adv_weight.numel() == 0
    m = res.metrics
    assert m["filter/empty"] == 1.0 and m["filter/zero_rv_count"] == 4.0 and m["filter/kept_rv_mean"] == 0.0
    assert m["filter/rv_std_over_mean"] == 0.0


def test_signed_scores():
    assert kept([-1.0, -2.0, 0.5], "top_p", 0.9, include_zero=True) == []          # negative total -> empty
    assert kept([3.0, -1.0, 2.0], "top_p", 0.9) == [0, 2]                          # tau 3.59: 3 then 2
    assert kept([3.0, -1.0, 2.0], "top_p", 0.9, largest=False) == []               # first element <= 0 stops
    assert kept([3.0, -1.0, 2.0], "top_k_abs", 1) == [0]
    assert kept([3.0, -1.0, 2.0], "top_k_abs", 1, largest=False) == [1]
    assert kept([-1.0, -2.0], "min_p", 0.5) == []                                  # the code's quirk, kept
    r = torch.tensor([[-1.0, -1.0], [-3.0, -2.0], [0.0, 1.0]])
    res = F.apply_filter(r, F.FilterConfig(strategy="top_k_abs", value=2, metric="reward_mean"))
    assert res.kept_groups.tolist() == [0, 2]


def test_ties_break_by_lower_index():
    assert kept([0.3, 0.3, 0.3, 0.1], "top_k_abs", 2) == [0, 1]
    assert kept([0.5, 0.1, 0.1, 0.1], "top_k_abs", 2, largest=False) == [1, 2]
    assert kept([0.0, 0.0, 0.0, 0.0], "top_k", 0.5, include_zero=True) == [0, 1]
    assert kept([2.0, 2.0, 2.0, 2.0], "top_p", 0.4) == [0, 1]                      # tau 3.19
    assert kept([2.0, 2.0, 2.0, 2.0], "top_p", 0.3, mode="softmax") == [0, 1]


def test_smallest():
    assert kept(S_A, "top_p", 0.9, include_zero=True, largest=False) == []         # zeros first -> empty
    assert kept(S_A, "top_p", 0.9, include_zero=False, largest=False) == [0, 1, 2, 3]
    assert kept(S_A, "top_p", 0.5, include_zero=False, largest=False) == [1, 2, 3]  # .05+.1+.24 >= .31
    assert kept(S_A, "top_k", 0.25, include_zero=True, largest=False) == [4, 5]
    assert kept(S_A, "min_p", 0.5, include_zero=False, largest=False) == [2, 3]    # <= 0.05 / 0.5
    assert kept(S_D, "top_p", 0.5, mode="softmax", include_zero=False, largest=False) == [4]     # p = .525
    assert kept(S_D, "top_p", 0.9, mode="softmax", include_zero=False, largest=False) == [3, 4]  # .525+.430


def test_none_keeps_everything_and_logs_the_same_keys():
    r = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    base = F.apply_filter(r, F.FilterConfig(strategy="none"))
    filt = F.apply_filter(r, F.FilterConfig())
    assert base.kept_groups.tolist() == [0, 1, 2] and base.traj_mask.all()
    assert filt.kept_groups.tolist() == [1]
    assert base.metrics.keys() == filt.metrics.keys()
    assert all(k.startswith("filter/") and type(v) is float for k, v in base.metrics.items())


# ----------------------------------------------------------------------------- apply_filter and variants
def test_apply_filter_expands_groups_in_batch_order_and_metrics():
    ks = [8, 4, 2, 1, 0, 0, 16, 0]                    # successes out of G=16 per group
    r = torch.tensor([[1.0] * k + [0.0] * (16 - k) for k in ks])
    cfg = F.FilterConfig(metric="reward_std", include_zero=True)
    res = F.apply_filter(r, cfg)
    std = r.double().std(1).tolist()
    assert res.kept_groups.tolist() == reference_linear(std, 0.9, 0.01, True, True)
    assert torch.equal(res.traj_mask, res.group_mask.repeat_interleave(16))
    assert torch.equal(res.kept_traj, res.traj_mask.nonzero().squeeze(1))
    assert torch.equal(res.traj_group, res.kept_traj // 16)
    rv = r.numpy().astype(np.float64).var(axis=1, ddof=1)
    m = res.metrics
    assert m["filter/kept_trajs"] == 16 * len(res.kept_groups)
    assert m["filter/kept_frac"] == len(res.kept_groups) / 8
    assert m["filter/zero_rv_count"] == 4.0
    assert m["filter/rv_mean"] == pytest.approx(rv.mean()) and m["filter/rv_max"] == pytest.approx(rv.max())
    assert m["filter/kept_rv_mean"] == pytest.approx(rv[res.kept_groups.numpy()].mean())
    assert m["filter/rv_std_over_mean"] == pytest.approx(rv.std() / rv.mean())
    assert m["filter/reward_std_mean"] == pytest.approx(np.mean(std))


def test_trajectory_level_keeps_top_and_bottom_k_in_every_prompt():
    r = torch.tensor([[0.0, 5.0, 1.0, 4.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    mask = F.select_trajectories(r, 2)
    assert mask[0].nonzero().squeeze(1).tolist() == [0, 1, 2, 3]           # top 5, 4; bottom 0, 1
    assert mask[1].nonzero().squeeze(1).tolist() == [0, 1, 4, 5]           # ties: top low, bottom high
    res = F.apply_filter(r, F.FilterConfig(strategy="none", level="trajectory", traj_k=2))
    assert res.kept_traj.tolist() == [0, 1, 2, 3, 6, 7, 10, 11]
    assert res.traj_group.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert res.metrics["filter/kept_rv_max"] == pytest.approx(np.var([0, 5, 1, 4], ddof=1))
    assert res.metrics["filter/kept_frac"] == 1.0 and res.metrics["filter/kept_traj_frac"] == 8 / 12
    g = torch.Generator().manual_seed(5)                                   # disjoint top/bottom, with ties
    rr = torch.randint(0, 3, (20, 10), generator=g).double()
    assert (F.select_trajectories(rr, 4).sum(1) == 8).all()


@pytest.mark.parametrize("n, sizes", [(8, [2, 2, 2, 2]), (10, [3, 2, 3, 2]), (3, [1, 1, 1, 0])])
def test_quartiles_partition_ranked_groups(n, sizes):
    s = torch.arange(n, 0, -1, dtype=torch.float64)                        # group 0 has the highest score
    parts = [F.select_quartile(s, q).tolist() for q in (1, 2, 3, 4)]
    assert [len(p) for p in parts] == sizes
    assert sorted(sum(parts, [])) == list(range(n))
    assert parts[0] == list(range(sizes[0]))                               # Q1 = highest
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0], [0.0, 0.0], [0.0, 2.0], [0.0, 0.5]])
    res = F.apply_filter(r, F.FilterConfig(strategy="none", quartile=1, include_zero=False))
    assert res.kept_groups.tolist() == [2]                                 # 4 non-zero groups -> 1 per quartile


def test_soft_reweight_and_loss_scaling():
    r = torch.tensor([[0.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    cfg = F.FilterConfig(strategy="top_k", value=0.5, soft_reweight=True, loss_scaling="sqrt")
    res = F.apply_filter(r, cfg)
    rv = r.double().var(1)
    assert res.kept_groups.tolist() == [0, 1]
    expect = (rv / (rv[[0, 1]].max() + 1e-6))[res.traj_group].float()
    assert torch.allclose(res.adv_weight, expect) and res.adv_weight[3:].max() == pytest.approx(0.25, abs=1e-5)
    assert res.loss_scale == pytest.approx(math.sqrt(6 / 12))
    res = F.apply_filter(r, F.FilterConfig(strategy="top_k", value=0.5, metric="reward_std",
                                           soft_reweight=True, loss_scaling="linear"))
    assert res.adv_weight[3:].max() == pytest.approx(0.5, abs=1e-5)        # std ratio = sqrt of var ratio
    assert res.loss_scale == pytest.approx(0.5)
    plain = F.apply_filter(r, F.FilterConfig(strategy="top_k", value=0.5))
    assert torch.equal(plain.adv_weight, torch.ones(6)) and plain.loss_scale == 1.0


def test_entropy_metric_through_apply_filter():
    r = torch.zeros(3, 2)
    ent = torch.tensor([[1.0, 1.0], [3.0, 2.0], [0.5, 0.5]])
    res = F.apply_filter(r, F.FilterConfig(strategy="top_k_abs", value=1, metric="entropy"), traj_stats=ent)
    assert res.kept_groups.tolist() == [1]


def test_cli_prints_every_reading(capsys):
    F.main(["0.25", "0.24", "0.1", "0.05", "0", "0", "0", "0", "--value", "0.9"])
    lines = {line[:58].strip(): line[58:].split() for line in capsys.readouterr().out.splitlines()}
    assert lines["top_p linear on std       (code, mode=linear)"] == ["{0,1,2}", "3/8", "{0,1,2}", "3/8"]
    assert lines["top_p linear on variance  (paper: RV mass)"] == ["{0,1}", "2/8", "{0,1}", "2/8"]
    assert lines["top_p softmax on std      (code's main-table scripts)"] == [
        "{0,1,2,3,4,5,6,7}", "8/8", "{0,1,2,3}", "4/8"]
    F.main(["--rewards", "1,0,1,0;0,0,0,0"])
    assert "0.5774" in capsys.readouterr().out


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, match", [
    (lambda: F.select_groups([1.0], "top_q", 0.5), "strategy"),
    (lambda: F.select_groups([1.0], "top_p", 0.0), "value"),
    (lambda: F.select_groups([1.0], "top_p", 1.5), "value"),
    (lambda: F.select_groups([1.0], "top_k", 0.0), "value"),
    (lambda: F.select_groups([1.0], "top_k_abs", 2.5), "value"),
    (lambda: F.select_groups([1.0], "min_p", 1.1), "value"),
    (lambda: F.select_groups([1.0], "top_p", 0.5, mode="nucleus"), "mode"),
    (lambda: F.select_groups([1.0], "top_p", 0.5, eps=-1.0), "eps"),
    (lambda: F.select_groups([[1.0]], "top_p", 0.5), "scores"),
    (lambda: F.select_groups([float("nan")], "top_p", 0.5), "scores"),
    (lambda: F.group_scores(torch.ones(3, 1), "reward_variance"), "G >= 2"),
    (lambda: F.group_scores(torch.ones(3, 1), "reward_std"), "G >= 2"),
    (lambda: F.group_scores(torch.ones(3, 1), "entropy_variance", traj_stat=torch.ones(3, 1)), "G >= 2"),
    (lambda: F.group_scores(torch.ones(6), "reward_mean"), "rewards"),
    (lambda: F.group_scores(torch.ones(2, 3, 4), "reward_mean"), "rewards"),
    (lambda: F.group_scores(torch.ones(2, 3), "entropy"), "traj_stat"),
    (lambda: F.group_scores(torch.ones(2, 3), "entropy", traj_stat=torch.ones(3, 2)), "traj_stat"),
    (lambda: F.group_scores(torch.ones(2, 3), "loss"), "metric"),
    (lambda: F.select_quartile([1.0, 2.0], 5), "quartile"),
    (lambda: F.select_trajectories(torch.ones(2, 6), 4), "traj_k"),
    (lambda: F.FilterConfig(level="token"), "level"),
    (lambda: F.FilterConfig(loss_scaling="log"), "loss_scaling"),
    (lambda: F.FilterConfig(quartile=5, strategy="none"), "quartile"),
    (lambda: F.FilterConfig(quartile=1), "strategy='none'"),
    (lambda: F.FilterConfig(include_zero="yes"), "include_zero"),
    (lambda: F.FilterConfig(traj_k=0), "traj_k"),
    (lambda: F.FilterConfig(value=2.0), "value"),
    (lambda: F.apply_filter(torch.ones(2, 6), F.FilterConfig(strategy="none", level="trajectory", traj_k=4)),
     "traj_k"),
    (lambda: F.apply_filter(torch.ones(2, 1), F.FilterConfig(metric="reward_mean", soft_reweight=True)),
     "soft_reweight"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_paper_rule_equals_the_general_selector_and_the_worked_example():
    """F.top_p_by_rv (the paper's rule, written out) == select_groups(top_p, linear, include_zero=False)."""
    rv = torch.tensor([0.25, 0.24, 0.1, 0.05, 0, 0, 0, 0], dtype=torch.float64) ** 2
    assert F.top_p_by_rv(rv, 0.9, 0.01).tolist() == [0, 1]      # tau = 0.1093: 0.0625 < tau <= 0.1201
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        R = (torch.rand(8, 4, generator=gen) < torch.rand(8, 1, generator=gen)).double()   # (P, G) 0/1 rewards
        rv = F.reward_variance(R)
        assert torch.allclose(rv, torch.tensor([float(np.var(row, ddof=1)) for row in R.tolist()], dtype=torch.float64))
        for rho in (0.3, 0.7, 0.9, 1.0):
            want = F.select_groups(rv, "top_p", rho, mode="linear", include_zero=False, eps=0.01)
            assert F.top_p_by_rv(rv, rho, 0.01).tolist() == want.tolist()
    with pytest.raises(ValueError, match="value"):
        F.top_p_by_rv(rv, 1.5)


def test_no_filter_still_logs_the_real_score_statistics():
    R = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)       # RV 0.5, 0, 0
    m = F.apply_filter(R, F.FilterConfig(strategy="none")).metrics
    assert m["filter/zero_score_count"] == 2.0 and m["filter/score_mean"] == pytest.approx(0.5 / 3)
    single = F.apply_filter(torch.tensor([[1.0], [0.0]]), F.FilterConfig(strategy="none")).metrics   # G = 1
    assert "filter/zero_score_count" not in single and single["filter/kept_groups"] == 2.0


def test_cli_footer_explains_an_empty_set_from_tau_below_zero(capsys):
    """`filter.py 0.0707 0.0316 0 0 --value 0.9`: tau < 0, so the paper rule keeps {} because the empty prefix
    already reaches tau (not because tau is unreachable); the footer prints tau."""
    F.main(["0.0707", "0.0316", "0", "0", "--value", "0.9"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("top_p linear on variance"))
    assert row.split()[-2:] == ["{}", "0/4"]
    assert "unreachable" not in out and "tau <= 0" in out and "(<= 0: nothing is kept)" in out
