"""The graders of exercises/check.py fail the usual wrong solutions and pass correct ones written differently.

MISTAKES is the catalogue: for every coding exercise, the plausible wrong solutions a class produces (each a
few lines, named after the mistake), and for the experiment exercises the usual wrong answers (the peak copied
for the final, the paper's story instead of the page's, keywords for an explanation). Every entry must be graded
"not correct". CORRECT holds right solutions written another way (numpy, a different loop), which must pass, so
that the grader is not merely strict. exercises/INSTRUCTOR.md lists the same mistakes for the discussion.
"""
import math
import statistics
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exercises"))
import check  # noqa: E402

COMMITTED = any((ROOT / "experiments" / "classroom").glob("classroom-*/metrics.jsonl"))


# ------------------------------------------------------------------------------------------------ exercise 1
def rv_population(R):                 # np.var's default ddof = 0
    return [statistics.pvariance(r) for r in R]


def rv_std(R):                        # the std, not the variance (what the official code ranks by)
    return [statistics.stdev(r) for r in R]


def rv_columns(R):                    # the variance over groups (axis 0) instead of within each group
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(np.var(np.asarray(R, float), axis=0, ddof=1))


def rv_uncentred(R):                  # E[r^2] / (G - 1) without subtracting the mean
    return [sum(v * v for v in r) / (len(r) - 1) for r in R]


def rv_batch_mean(R):                 # centred on the batch mean instead of each group's own mean
    mu = sum(map(sum, R)) / sum(map(len, R))
    return [sum((v - mu) ** 2 for v in r) / (len(r) - 1) for r in R]


# ------------------------------------------------------------------------------------------------ exercise 2
def _ranked(rv, key=None):
    cand = [i for i, v in enumerate(rv) if v > 1e-10]
    return sorted(cand, key=key or (lambda i: (-rv[i], i)))


def tp_check_after_adding(rv, rho=0.9, eps=0.0):      # adds a group, then compares: keeps group 0 when tau <= 0
    cand, kept, mass = _ranked(rv), [], 0.0
    tau = rho * sum(rv[i] for i in cand) - eps
    for i in cand:
        kept.append(i)
        mass += rv[i]
        if mass >= tau:
            break
    return sorted(kept) if mass >= tau else []


def tp_strict(rv, rho=0.9, eps=0.0):                  # `>` instead of `>=`
    cand, kept, mass = _ranked(rv), [], 0.0
    tau = rho * sum(rv[i] for i in cand) - eps
    for i in cand:
        if mass > tau:
            break
        kept.append(i)
        mass += rv[i]
    return sorted(kept) if mass > tau else []


def tp_reversed_ties(rv, rho=0.9, eps=0.0):           # sorted(..., reverse=True) on (rv, index): ties go high first
    cand, kept, mass = _ranked(rv, key=lambda i: (rv[i], i))[::-1], [], 0.0
    tau = rho * sum(rv[i] for i in cand) - eps
    for i in cand:
        if mass >= tau:
            break
        kept.append(i)
        mass += rv[i]
    return sorted(kept) if mass >= tau else []


def tp_never_skips(rv, rho=0.9, eps=0.0):             # "keep at least one group": the skipped step dropped
    cand, kept, mass = _ranked(rv), [], 0.0
    tau = rho * sum(rv[i] for i in cand) - eps
    for i in cand:
        if mass >= tau:
            break
        kept.append(i)
        mass += rv[i]
    return sorted(kept) or cand[:1]


def tp_all_when_tau_nonpositive(rv, rho=0.9, eps=0.0):  # "tau <= 0: every set reaches it, so keep everything"
    cand = _ranked(rv)
    tau = rho * sum(rv[i] for i in cand) - eps
    return sorted(cand) if tau <= 0 else check_reference_2(rv, rho, eps)


def tp_no_tolerance(rv, rho=0.9, eps=0.0):            # candidates rv > 0 instead of rv > 1e-10
    cand = sorted((i for i, v in enumerate(rv) if v > 0), key=lambda i: (-rv[i], i))
    tau, kept, mass = rho * sum(rv[i] for i in cand) - eps, [], 0.0
    for i in cand:
        if mass >= tau:
            break
        kept.append(i)
        mass += rv[i]
    return sorted(kept) if mass >= tau else []


def tp_no_eps(rv, rho=0.9, eps=0.0):                  # the slack forgotten
    return check_reference_2(rv, rho, 0.0)


def tp_eps_inside(rv, rho=0.9, eps=0.0):              # tau = rho * (sum - eps)
    cand, kept, mass = _ranked(rv), [], 0.0
    tau = rho * (sum(rv[i] for i in cand) - eps)
    for i in cand:
        if mass >= tau:
            break
        kept.append(i)
        mass += rv[i]
    return sorted(kept) if mass >= tau else []


def tp_smallest_first(rv, rho=0.9, eps=0.0):          # ranked ascending
    cand, kept, mass = _ranked(rv, key=lambda i: (rv[i], i)), [], 0.0
    tau = rho * sum(rv[i] for i in cand) - eps
    for i in cand:
        if mass >= tau:
            break
        kept.append(i)
        mass += rv[i]
    return sorted(kept) if mass >= tau else []


def tp_positions(rv, rho=0.9, eps=0.0):               # positions in the candidate list, not the group indices
    cand = [i for i, v in enumerate(rv) if v > 1e-10]
    return [cand.index(i) for i in check_reference_2(rv, rho, eps)]


def tp_rank_order(rv, rho=0.9, eps=0.0):              # the kept groups in rank order, not sorted
    return sorted(check_reference_2(rv, rho, eps), key=lambda i: (-rv[i], i))


def tp_keeps_all(rv, rho=0.9, eps=0.0):               # no filter at all
    return list(range(len(rv)))


def check_reference_2(rv, rho=0.9, eps=0.0):          # a correct walk (floats), used by the mistakes above
    cand, kept, mass = _ranked(rv), [], 0.0
    tau = rho * sum(rv[i] for i in cand) - eps
    for i in cand:
        if mass >= tau:
            break
        kept.append(i)
        mass += rv[i]
    return sorted(kept) if mass >= tau else []


def tp_numpy(rv, rho=0.9, eps=0.0):                   # a correct vectorised solution
    rv = np.asarray(rv, float)
    cand = np.flatnonzero(rv > 1e-10)
    order = cand[np.argsort(-rv[cand], kind="stable")]
    before = np.concatenate([[0.0], np.cumsum(rv[order])])
    tau = rho * rv[cand].sum() - eps
    hit = np.flatnonzero(before >= tau)
    return sorted(order[: hit[0]].tolist()) if hit.size else []


# ------------------------------------------------------------------------------------------------ exercise 3
def _adv(R, normalize_std, centre, scale):
    out = []
    for r in R:
        mu, sd = centre(r, R), scale(r, R)
        out.append([(v - mu) / (sd + 1e-6) if normalize_std else v - mu for v in r])
    return out


def adv_population_std(R, normalize_std=True):
    return _adv(R, normalize_std, lambda r, R: sum(r) / len(r), lambda r, R: statistics.pstdev(r))


def adv_no_epsilon(R, normalize_std=True):            # divides by std alone: a saturated group is 0 / 0
    return [[(v - sum(r) / len(r)) / statistics.stdev(r) if normalize_std else v - sum(r) / len(r) for v in r]
            for r in R]


def adv_batch_std(R, normalize_std=True):             # the batch's std instead of the group's
    flat = [v for r in R for v in r]
    return _adv(R, normalize_std, lambda r, R: sum(r) / len(r), lambda r, R: statistics.stdev(flat))


def adv_batch_mean(R, normalize_std=True):            # the batch mean as the baseline
    flat = [v for r in R for v in r]
    return _adv(R, normalize_std, lambda r, R: sum(flat) / len(flat), lambda r, R: statistics.stdev(r))


def adv_ignores_flag(R, normalize_std=True):          # Dr.GRPO normalised anyway
    return _adv(R, True, lambda r, R: sum(r) / len(r), lambda r, R: statistics.stdev(r))


def adv_numpy(R, normalize_std=True):                 # correct
    R = np.asarray(R, float)
    A = R - R.mean(axis=1, keepdims=True)
    return A / (R.std(axis=1, ddof=1, keepdims=True) + 1e-6) if normalize_std else A


# ------------------------------------------------------------------------------------------------ exercise 4
def _surrogate(lp, old, adv, cl, ch, c, pess=max, dual="neg", ratio=lambda x, o: math.exp(x - o)):
    out = []
    for x, o, a in zip(lp, old, adv):
        rt = ratio(x, o)
        loss = pess(-a * rt, -a * min(max(rt, 1 - cl), 1 + ch))
        if dual == "neg" and a < 0 or dual == "all":
            loss = min(loss, -a * c)
        elif dual == "max" and a < 0:
            loss = max(loss, -a * c)
        out.append(loss)
    return out


def sur_no_dual(lp, old, adv, cl=0.2, ch=0.28, c=3.0):
    return _surrogate(lp, old, adv, cl, ch, c, dual="none")


def sur_dual_everywhere(lp, old, adv, cl=0.2, ch=0.28, c=3.0):
    return _surrogate(lp, old, adv, cl, ch, c, dual="all")


def sur_dual_max(lp, old, adv, cl=0.2, ch=0.28, c=3.0):
    return _surrogate(lp, old, adv, cl, ch, c, dual="max")


def sur_optimistic(lp, old, adv, cl=0.2, ch=0.28, c=3.0):    # min(L1, L2) instead of the pessimistic max
    return _surrogate(lp, old, adv, cl, ch, c, pess=min)


def sur_symmetric(lp, old, adv, cl=0.2, ch=0.28, c=3.0):     # clip-higher ignored: 1 +- clip_low
    return _surrogate(lp, old, adv, cl, cl, c)


def sur_inverted_ratio(lp, old, adv, cl=0.2, ch=0.28, c=3.0):
    return _surrogate(lp, old, adv, cl, ch, c, ratio=lambda x, o: math.exp(o - x))


def sur_unclipped(lp, old, adv, cl=0.2, ch=0.28, c=3.0):      # plain policy gradient
    return [-a * math.exp(x - o) for x, o, a in zip(lp, old, adv)]


def sur_torch(lp, old, adv, cl=0.2, ch=0.28, c=3.0):          # correct
    import torch
    lp, old, a = (torch.tensor(v, dtype=torch.float64) for v in (lp, old, adv))
    rt = torch.exp(lp - old)
    loss = torch.maximum(-a * rt, -a * rt.clamp(1 - cl, 1 + ch))
    return torch.where(a < 0, torch.minimum(loss, -a * c), loss).tolist()


# ------------------------------------------------------------------------------------------------ exercise 5
def _rowwise(L, col, f):
    return sum(r[col[i]] - f(r) for i, r in enumerate(L)) / len(L)


def mi_naive_lse(L, col):                 # log(mean(exp)) without the max shift: exp(-1000) == 0.0
    return _rowwise(L, col, lambda r: math.log(sum(math.exp(v) for v in r) / len(r)))


def mi_naive_numpy(L, col):               # the same in numpy: log(0) = -inf, a warning, and MI = inf
    with np.errstate(divide="ignore"):
        return _rowwise(L, col, lambda r: float(np.log(np.mean(np.exp(np.asarray(r))))))


def mi_log_sum(L, col):                   # log-SUM-exp: forgets the 1/N, off by log N
    return _rowwise(L, col, lambda r: max(r) + math.log(sum(math.exp(v - max(r)) for v in r)))


def mi_mean_score(L, col):                # the mean log-score instead of the log of the mean probability
    return _rowwise(L, col, lambda r: sum(r) / len(r))


def mi_max(L, col):                       # the best column instead of the mixture
    return _rowwise(L, col, max)


def mi_diagonal(L, col):                  # L[i][i] instead of L[i][true_col[i]]
    return sum(r[i] - (max(r) + math.log(sum(math.exp(v - max(r)) for v in r) / len(r)))
               for i, r in enumerate(L)) / len(L)


def mi_correct(L, col):
    return _rowwise(L, col, lambda r: max(r) + math.log(sum(math.exp(v - max(r)) for v in r) / len(r)))


def mi_torch(L, col):                     # correct
    import torch
    L = torch.tensor(L, dtype=torch.float64)
    return float((L[torch.arange(len(L)), col] - torch.logsumexp(L, 1) + math.log(L.shape[1])).mean())


def ra_correct(L, col, sig):
    return sum(sig[int(np.argmax(r))] == sig[col[i]] for i, r in enumerate(L)) / len(L)


def ra_ignores_signatures(L, col, sig):   # compares column indices: a duplicate prompt counts as a miss
    return sum(int(np.argmax(r)) == col[i] for i, r in enumerate(L)) / len(L)


def ra_ties_last(L, col, sig):            # ties broken towards the highest index
    return sum(sig[max(j for j, v in enumerate(r) if v == max(r))] == sig[col[i]] for i, r in enumerate(L)) / len(L)


def ra_argmin(L, col, sig):               # the lowest score (a log-prob read as a loss)
    return sum(sig[int(np.argmin(r))] == sig[col[i]] for i, r in enumerate(L)) / len(L)


def ra_columns(L, col, sig):              # argmax down each column instead of along each row
    best = np.asarray(L).argmax(axis=0)
    return sum(sig[col[int(best[j])]] == sig[j] for j in range(len(sig))) / len(sig)


# ------------------------------------------------------------------------------------------------ exercise 6
def _gae(r, v, mask, g, lam, on_obs="carry", mask_values=True, recursion=None):
    out, vn, an = [0.0] * len(r), 0.0, 0.0
    for t in reversed(range(len(r))):
        vt = v[t] * mask[t] if mask_values else v[t]
        if mask[t]:
            an = recursion(r[t], vn, vt, an) if recursion else r[t] + g * vn - vt + g * lam * an
            vn, out[t] = vt, an
        elif on_obs == "reset":
            vn, an = 0.0, 0.0
        elif on_obs == "value":
            vn = vt
        elif on_obs == "all":
            an = r[t] + g * vn - vt + g * lam * an
            vn = vt
    return out


def gae_over_all_tokens(r, v, mask, gamma=1.0, lam=1.0):     # observations take part in the recursion
    out, vn, an = [0.0] * len(r), 0.0, 0.0
    for t in reversed(range(len(r))):
        an = r[t] + gamma * vn - v[t] + gamma * lam * an
        vn, out[t] = v[t], an * mask[t]
    return out


def gae_reset_at_observation(r, v, mask, gamma=1.0, lam=1.0):   # every turn treated as its own episode
    return _gae(r, v, mask, gamma, lam, on_obs="reset")


def gae_observation_value(r, v, mask, gamma=1.0, lam=1.0):      # V_next <- the observation's (unmasked) value
    return _gae(r, v, mask, gamma, lam, on_obs="value", mask_values=False)


def gae_no_gamma_in_trace(r, v, mask, gamma=1.0, lam=1.0):      # A = delta + lam * A_next
    return _gae(r, v, mask, gamma, lam, recursion=lambda rt, vn, vt, an: rt + gamma * vn - vt + lam * an)


def gae_forward(r, v, mask, gamma=1.0, lam=1.0):                # the loop run forwards
    out, vn, an = [0.0] * len(r), 0.0, 0.0
    for t in range(len(r)):
        if mask[t]:
            an = r[t] + gamma * vn - v[t] + gamma * lam * an
            vn, out[t] = v[t], an
    return out


def gae_whitened(r, v, mask, gamma=1.0, lam=1.0):               # whitening applied although the stub says not
    a = _gae(r, v, mask, gamma, lam)
    gen = [x for x, m in zip(a, mask) if m]
    mu, sd = sum(gen) / len(gen), statistics.pstdev(gen) + 1e-8
    return [(x - mu) / sd if m else 0.0 for x, m in zip(a, mask)]


def gae_correct(r, v, mask, gamma=1.0, lam=1.0):
    return _gae(r, v, mask, gamma, lam)


# ------------------------------------------------------------------------------------------------ exercise 7
def tg_correct(pi, r):
    mean = sum(p * x for p, x in zip(pi, r))
    return [p * (x - mean) for p, x in zip(pi, r)]


def tg_no_baseline(pi, r):                # pi * r: forgets the mean
    return [p * x for p, x in zip(pi, r)]


def tg_unweighted(pi, r):                 # r - mean(r), not weighted by pi
    mean = sum(r) / len(r)
    return [x - mean for x in r]


def rv7_correct(pi, r):
    mean = sum(p * x for p, x in zip(pi, r))
    return sum(p * (x - mean) ** 2 for p, x in zip(pi, r))


def rv7_uniform(pi, r):                   # the variance of the list r, ignoring pi
    return statistics.pvariance(r)


def rv7_uncentred(pi, r):                 # E_pi[r^2]
    return sum(p * x * x for p, x in zip(pi, r))


def rv7_std(pi, r):
    return math.sqrt(rv7_correct(pi, r))


def es_correct(pi):
    return 1.0 - sum(p * p for p in pi)


def es_one_minus_max(pi):
    return 1.0 - max(pi)


def es_sum_squares(pi):                   # ||pi||^2 instead of 1 - ||pi||^2
    return sum(p * p for p in pi)


def es_one_term(pi):                      # ||e_z - pi||^2 for z = argmax only
    z = max(range(len(pi)), key=lambda k: pi[k])
    return sum(((1.0 if j == z else 0.0) - p) ** 2 for j, p in enumerate(pi))


def _ns7(tg=tg_correct, rv=rv7_correct, es=es_correct):
    return SimpleNamespace(task_gradient=tg, reward_variance=rv, expected_sq_score=es)


# ------------------------------------------------------------------------------------------------ catalogue
NS = SimpleNamespace
MISTAKES = {
    1: {"population variance (divides by G)": NS(reward_variance=rv_population),
        "the std instead of the variance": NS(reward_variance=rv_std),
        "variance over groups (axis 0)": NS(reward_variance=rv_columns),
        "not centred": NS(reward_variance=rv_uncentred),
        "centred on the batch mean": NS(reward_variance=rv_batch_mean)},
    2: {"mass checked after adding a group": NS(top_p_keep=tp_check_after_adding),
        "> instead of >=": NS(top_p_keep=tp_strict),
        "ties: higher index first": NS(top_p_keep=tp_reversed_ties),
        "never skips the step (keeps at least one)": NS(top_p_keep=tp_never_skips),
        "tau <= 0 read as keep everything": NS(top_p_keep=tp_all_when_tau_nonpositive),
        "candidates rv > 0 (no 1e-10 tolerance)": NS(top_p_keep=tp_no_tolerance),
        "eps forgotten": NS(top_p_keep=tp_no_eps),
        "tau = rho * (sum - eps)": NS(top_p_keep=tp_eps_inside),
        "smallest RV first": NS(top_p_keep=tp_smallest_first),
        "positions among candidates, not group indices": NS(top_p_keep=tp_positions),
        "kept groups in rank order, unsorted": NS(top_p_keep=tp_rank_order),
        "keeps every group": NS(top_p_keep=tp_keeps_all)},
    3: {"population std": NS(group_advantages=adv_population_std),
        "no 1e-6 (a saturated group divides 0 by 0)": NS(group_advantages=adv_no_epsilon),
        "the batch std": NS(group_advantages=adv_batch_std),
        "the batch mean as baseline": NS(group_advantages=adv_batch_mean),
        "Dr.GRPO normalised anyway": NS(group_advantages=adv_ignores_flag)},
    4: {"no dual clip": NS(clipped_surrogate=sur_no_dual),
        "dual clip also where A > 0": NS(clipped_surrogate=sur_dual_everywhere),
        "dual clip with max": NS(clipped_surrogate=sur_dual_max),
        "min(L1, L2) instead of max": NS(clipped_surrogate=sur_optimistic),
        "clip-higher ignored (symmetric clip)": NS(clipped_surrogate=sur_symmetric),
        "ratio exp(old - new)": NS(clipped_surrogate=sur_inverted_ratio),
        "no clipping at all": NS(clipped_surrogate=sur_unclipped)},
    5: {"naive log-sum-exp (math)": NS(mi_estimate=mi_naive_lse, retrieval_accuracy=ra_correct),
        "naive log-sum-exp (numpy)": NS(mi_estimate=mi_naive_numpy, retrieval_accuracy=ra_correct),
        "log-sum-exp without 1/N": NS(mi_estimate=mi_log_sum, retrieval_accuracy=ra_correct),
        "mean log-score as the marginal": NS(mi_estimate=mi_mean_score, retrieval_accuracy=ra_correct),
        "max score as the marginal": NS(mi_estimate=mi_max, retrieval_accuracy=ra_correct),
        "the diagonal instead of true_col": NS(mi_estimate=mi_diagonal, retrieval_accuracy=ra_correct),
        "signatures ignored": NS(mi_estimate=mi_correct, retrieval_accuracy=ra_ignores_signatures),
        "ties to the highest index": NS(mi_estimate=mi_correct, retrieval_accuracy=ra_ties_last),
        "argmin instead of argmax": NS(mi_estimate=mi_correct, retrieval_accuracy=ra_argmin),
        "argmax down the columns": NS(mi_estimate=mi_correct, retrieval_accuracy=ra_columns)},
    6: {"observation tokens in the recursion": NS(gae=gae_over_all_tokens),
        "reset at every observation": NS(gae=gae_reset_at_observation),
        "V_next from the observation's value": NS(gae=gae_observation_value),
        "gamma missing from the trace": NS(gae=gae_no_gamma_in_trace),
        "forward loop": NS(gae=gae_forward),
        "whitened": NS(gae=gae_whitened)},
    7: {"task gradient without the baseline": _ns7(tg=tg_no_baseline),
        "task gradient not weighted by pi": _ns7(tg=tg_unweighted),
        "RV ignoring pi": _ns7(rv=rv7_uniform),
        "RV not centred": _ns7(rv=rv7_uncentred),
        "std instead of RV": _ns7(rv=rv7_std),
        "E||s||^2 = 1 - max(pi)": _ns7(es=es_one_minus_max),
        "E||s||^2 = ||pi||^2": _ns7(es=es_sum_squares),
        "E||s||^2 of the argmax outcome only": _ns7(es=es_one_term)},
}
CORRECT = {
    1: NS(reward_variance=lambda R: list(np.var(np.asarray(R, float), axis=1, ddof=1))),
    2: NS(top_p_keep=tp_numpy),
    3: NS(group_advantages=adv_numpy),
    4: NS(clipped_surrogate=sur_torch),
    5: NS(mi_estimate=mi_torch, retrieval_accuracy=ra_correct),
    6: NS(gae=gae_correct),
    7: _ns7(),
}
CASES = [(n, name, ns) for n, wrong in MISTAKES.items() for name, ns in wrong.items()]


def test_every_coding_exercise_has_a_catalogue():
    coding = {n for n, spec in check.EXERCISES.items() if spec[3] == "code"}
    assert set(MISTAKES) == set(CORRECT) == coding
    assert all(len(MISTAKES[n]) >= 5 for n in coding)


@pytest.mark.parametrize("n, name, ns", CASES, ids=[f"ex{n}: {name}" for n, name, _ in CASES])
def test_grader_fails_the_mistake(n, name, ns):
    ok, msg = check.grade_module(n, ns)
    assert not ok, f"exercise {n} grades the mistake '{name}' as correct"
    assert msg.startswith(("first failing case", "your code raised")), msg


@pytest.mark.parametrize("n", sorted(CORRECT))
def test_grader_passes_a_correct_solution_written_differently(n):
    assert check.grade_module(n, CORRECT[n]) == (True, "correct")


def test_top_p_messages_name_the_edge_case():
    ok, msg = check.grade_module(2, NS(top_p_keep=tp_check_after_adding))
    assert "tau < 0" in msg and "expected []" in msg and "got [0]" in msg
    ok, msg = check.grade_module(2, NS(top_p_keep=tp_strict))
    assert ">=, not >" in msg
    ok, msg = check.grade_module(2, NS(top_p_keep=tp_rank_order))
    assert "sorted" in msg
    ok, msg = check.grade_module(5, NS(mi_estimate=mi_naive_lse, retrieval_accuracy=ra_correct))
    assert "very negative" in msg


def test_top_p_truth_is_the_definition_not_a_walk():
    """The grader's _top_p on cases solved by hand (paper App. G and the edge cases)."""
    want = {0: [0, 1], 1: [], 2: [], 3: [0], 4: [0, 1], 5: [0, 1, 3], 6: [0], 7: [0], 8: [], 9: [1, 2],
            10: [0, 1, 3], 11: [3], 12: [0, 3]}
    assert {i: check._top_p(rv, rho, eps)[0] for i, (rv, rho, eps, _) in enumerate(check.TOP_P_CASES)} == want
    assert not any(check._top_p(rv, rho, eps)[1] for rv, rho, eps, _ in check.TOP_P_CASES)


def test_filter_cli_and_grader_agree_on_tau_below_zero():
    """The issue's example: `filter.py 0.0707 0.0316 0 0 --value 0.9` (stds) keeps {} under the paper rule."""
    import torch
    import filter as F
    rv = torch.tensor([0.0707, 0.0316, 0, 0], dtype=torch.float64) ** 2
    assert F.top_p_by_rv(rv, 0.9, 0.01).tolist() == [] == check._top_p(rv.tolist(), 0.9, 0.01)[0]


# ------------------------------------------------------------------------------------- experiment exercises
def _ns_answers(n, **change):
    good = dict(check.reference(n).ANSWERS)
    good.update(change)
    return NS(ANSWERS=good)


def _experiment_mistakes():
    out = []
    if COMMITTED:
        t = check.ex8_truth()
        import report
        runs = report.load_runs(sorted(str(p) for p in check.RUNS.glob("classroom-*") if p.is_dir()))
        arms = report.group_arms(runs, ["name"])
        peak = report.mean_std([report.task_metrics(r["rows"])["peak"] for r in arms["classroom-filter"]])[0]
        auc = report.mean_std([report.task_metrics(r["rows"])["auc"] for r in arms["classroom-filter"]])[0]
        out += [(8, "the peak copied as final", {"final_filter": peak}),
                (8, "the AUC copied as final", {"final_filter": auc}),
                (8, "a percentage", {"final_nofilter": 100 * t["final_nofilter"]}),
                (8, "the no-filter arm's kept fraction (1.0)", {"kept_frac_filter": 1.0}),
                (8, "the zero-RV count as a fraction of 4", {"zero_rv_groups_filter": t["zero_rv_groups_filter"] / 4}),
                (8, "a difference called resolved", {"any_difference_resolved": True}),
                (8, "'yes' for a boolean", {"any_difference_resolved": "no"}),
                (8, "the dilution reading (a)", {"mechanism": "a"}),
                (8, "the paper's story (c)", {"mechanism": "c"}),
                (8, "template collapse (d)", {"mechanism": "d"}),
                (8, "keywords for an explanation", {"explanation": "zero rv"}),
                (8, "no prediction", {"prediction": ""})]
    out += [(9, "quartiles swapped", {"higher_success": "Q4"}),
            (9, "I(X;Z) higher for Q4", {"higher_I": "Q4"}),
            (9, "the H(Z|X) column copied for I", {"I_Q4": 1.937}),
            (9, "the 'overshoot' story (b)", {"mechanism": "b"}),
            (9, "fewer prompts (c)", {"mechanism": "c"}),
            (9, "keywords for an explanation", {"explanation": "signal variance rv"}),
            (10, "the sign flipped", {"spearman_heterogeneous": 0.362}),
            (10, "the p-value copied", {"spearman_homogeneous": 0.0005}),
            (10, "RV still picks high SNR (a)", {"rv_selects_heterogeneous": "a"}),
            (10, "filtering helps more on a slippery lake (a)", {"slippery_lake": "a"}),
            (10, "keywords for an explanation", {"explanation": "noise sigma snr"})]
    return out


EXP = _experiment_mistakes()


@pytest.mark.parametrize("n, name, change", EXP, ids=[f"ex{n}: {name}" for n, name, _ in EXP])
def test_experiment_grader_fails_the_usual_wrong_answer(n, name, change):
    ok, msg = check.grade_module(n, _ns_answers(n, **change))
    assert not ok and msg.startswith("first failing case"), (name, msg)


def test_experiment_choices_are_the_ones_the_stubs_print():
    """The multiple-choice texts graded in check.py appear word for word in the stubs' docstrings."""
    norm = lambda s: " ".join(s.split())                                     # noqa: E731
    where = {8: 8, 9: 9, "10_selects": 10, "10_lake": 10, 11: 11}
    for key, options in check.CHOICES.items():
        doc = norm(check.load_student(where[key]).__doc__)
        for letter, text in options.items():
            assert f"({letter}) {norm(text)}" in doc, (key, letter)


@pytest.mark.slow
def test_ex11_grader_fails_sets_that_are_not_what_they_claim_and_wrong_placements():
    """Exercise 11 on SmolLM2: a template handed in as 'healthy', restated facts handed in as 'templated', the
    wrong regime, 'entropy sees it', and numbers of the other set all fail; a varied-wording template passes."""
    ref = check.reference(11)
    restated, template = check.EX11_REFERENCE["healthy"], check.EX11_REFERENCE["templated"]
    varied = ["Let me think step by step.", "Okay, I will reason carefully now.", "Hmm, let us see.",
              "First I consider the question.", "I should think about it.", "Let me work this out.",
              "Thinking about the problem.", "Alright, step by step."]
    def grade(reasonings=None, **change):
        return check.grade_module(11, NS(REASONINGS=reasonings or check.EX11_REFERENCE,
                                         ANSWERS={**ref.ANSWERS, **change}))
    ok, msg = grade({"healthy": template, "templated": template})
    assert not ok and "not input-dependent enough" in msg
    ok, msg = grade({"healthy": restated, "templated": restated})
    assert not ok and "still carry their prompt" in msg
    ok, msg = grade({"healthy": restated, "templated": restated[:6]})
    assert not ok and "8 non-empty strings" in msg
    for change in ({"regime_templated": "a"}, {"regime_templated": "d"}, {"entropy_sees_it": True},
                   {"mi_healthy": ref.ANSWERS["mi_templated"]}, {"H_templated": ref.ANSWERS["H_healthy"]},
                   {"explanation": "template collapse"}):
        assert not grade(**change)[0], change
    truth = check.ex11_truth({"healthy": restated, "templated": varied})
    assert check.grade_module(11, NS(REASONINGS={"healthy": restated, "templated": varied},
                                     ANSWERS={**ref.ANSWERS, **truth})) == (True, "correct")
    assert truth["regime_templated"] == "b" and truth["entropy_sees_it"] is False
