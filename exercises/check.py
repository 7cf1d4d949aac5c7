"""Grader of the classroom exercises: `python exercises/check.py --list | N | N --reference`.

Each coding exercise is a stub file in exercises/ (one function or three to write); the grader imports it and
compares it with an INDEPENDENT computation written here (not the solution's loop: the top-p truth is the
definition in exact rationals, GAE is its closed form, the task gradient is a finite difference), on worked
examples, the edge cases a class gets wrong (tau <= 0, ties at the cut, the skipped step, scores of -1000 nats,
duplicate prompts, observation tokens) and random cases, and stops at the first failing case with a message saying
which input, what came back and what was expected. `--reference` runs the same grader on the project's own
implementation (filter.py, algos.py, mi_metrics.py, theory/toy.py), so the grader is itself checked against the
code the project trains with. tests/test_exercises.py: every reference passes, every stub fails;
tests/test_exercise_mistakes.py: the catalogue of usual wrong solutions, each of which must fail.
The experiment exercises (8-10) are graded on numbers (read off the committed classroom runs for 8; rerun from the
same toy command for 9 and 10) and on structured answers (True/False, a quartile, a multiple-choice letter whose
key is derived from those numbers); the written prediction and explanation are required but read in class, not
graded by keyword.

Exit status 0 = correct, 1 = a case failed or the stub is not implemented yet, 2 = usage error.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import random
import sys
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


class Fail(Exception):
    """A failing case: the message says which input, what came back and what was expected."""


def close(got, want, tol=1e-6, what="value"):
    if isinstance(want, (list, tuple)):
        got = list(got) if not isinstance(got, (int, float)) else [got]
        if len(got) != len(want):
            raise Fail(f"{what}: expected {len(want)} entries, got {len(got)}: {got}")
        for i, (g, w) in enumerate(zip(got, want)):
            close(g, w, tol, f"{what}[{i}]")
        return
    g = float(got)
    if not (abs(g - want) <= tol * max(1.0, abs(want))):
        raise Fail(f"{what}: expected {want:.6g}, got {g:.6g}")


def call(what: str, fn, *args, **kw):
    """fn(*args, **kw); a crash becomes a failing case that names the input (what)."""
    try:
        return fn(*args, **kw)
    except NotImplementedError:
        raise
    except Exception as err:
        raise Fail(f"{what}: your code raised {type(err).__name__}: {err}") from err


def rows(x):
    """A nested list of floats from a list / numpy array / torch tensor."""
    return [[float(v) for v in r] for r in (x.tolist() if hasattr(x, "tolist") else x)]


def flat(x):
    return [float(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


# --------------------------------------------------------------------------------------------- graders
def grade_1(m):
    rng = random.Random(1)
    cases = [[[1, 0, 1, 0]], [[0.1, 0.1, 0.1]], [[1, 0], [0, 0], [5, -3]],
             [[rng.uniform(-2, 2) for _ in range(6)] for _ in range(4)]]
    for R in cases:
        want = [sum((v - sum(r) / len(r)) ** 2 for v in r) / (len(r) - 1) for r in R]
        close(flat(call(f"reward_variance({R})", m.reward_variance, R)), want, what=f"reward_variance({R})")


def _top_p(rv, rho, eps):
    """The kept set by the paper's definition, in exact rational arithmetic and without walking a loop:
    group i is kept iff it is a candidate (rv > 1e-10) and the RV mass of the candidates ranked strictly ahead of
    it (larger rv, or equal rv and a lower index) is still below tau = rho * (candidates' RV mass) - eps. That set
    is the prefix k* = min{k : mass of the first k >= tau}; tau <= 0 keeps nothing (the empty prefix reaches it).
    Returns (kept, ambiguous): ambiguous = a prefix mass lies within 1e-9 of tau without equalling it, so that
    float rounding, not the rule, would decide."""
    cand = [i for i, v in enumerate(rv) if v > 1e-10]
    x = {i: Fraction(rv[i]) for i in cand}
    total = sum(x.values(), Fraction(0))
    tau = Fraction(rho) * total - Fraction(eps)
    ahead = {i: sum((x[j] for j in cand if (x[j], -j) > (x[i], -i)), Fraction(0)) for i in cand}
    ambiguous = any(0 < abs(mass - tau) < Fraction(1, 10 ** 9) for mass in [*ahead.values(), total])
    return sorted(i for i in cand if ahead[i] < tau), ambiguous


TOP_P_CASES = [   # (rv, rho, eps, what the case is there for); dyadic numbers where an exact tie is the point
    ([s * s for s in (0.25, 0.24, 0.1, 0.05, 0, 0, 0, 0)], 0.9, 0.01, "the paper's worked example (App. G)"),
    ([0.005, 0.001, 0.0, 0.0], 0.9, 0.01, "tau < 0: the empty prefix already reaches tau, the step is skipped"),
    ([0.5, 0.5], 0.5, 0.5, "tau = 0 exactly: the empty prefix reaches it (>=, not >)"),
    ([0.5, 0.25, 0.25, 0.0], 0.5, 0.0, "the mass before group 1 equals tau exactly: stop there (>=, not >)"),
    ([0.25, 0.25, 0.0, 0.25], 0.5, 0.0, "a tie at the cut: the lower group index goes first"),
    ([0.125, 0.5, 0.125, 0.25], 0.8, 0.0, "a tie behind a larger group: the lower index is taken"),
    ([0.5, 0.25, 0.25], 0.75, 0.25, "eps is subtracted after scaling: tau = rho * sum - eps"),
    ([0.01, 0.004], 0.9, 0.01, "eps decides: without it both groups are kept"),
    ([0.0, 0.0, 0.0], 0.9, 0.0, "no candidate at all: the step is skipped"),
    ([1e-12, 0.5, 0.25], 1.0, 0.0, "rv <= 1e-10 is not a candidate, even at rho = 1"),
    ([0.5, 0.25, 0.0, 0.25], 1.0, 0.0, "rho = 1 keeps every non-zero group, never a zero one"),
    ([0.0, 0.25, 0.0, 0.5, 0.125], 0.5, 0.0, "zero groups before the kept ones: return the ORIGINAL indices"),
    ([0.3, 0.1, 0.1, 0.2], 0.5, 0.0, "ranking by rv, largest first"),
]


def grade_2(m):
    rng = random.Random(2)
    cases = list(TOP_P_CASES)
    for _ in range(200):
        if len(cases) >= len(TOP_P_CASES) + 30:
            break
        rv = [rng.choice([0.0, 0.0, rng.random(), rng.choice([0.25, 0.5])]) for _ in range(rng.randint(1, 9))]
        rho, eps = rng.choice([0.5, 0.8, 0.9, 1.0]), rng.choice([0.0, 0.0, 0.01, 0.1])
        if not _top_p(rv, rho, eps)[1]:                       # skip the cases where float rounding decides
            cases.append((rv, rho, eps, "a random case"))
    for rv, rho, eps, why in cases:
        want, _ = _top_p(rv, rho, eps)
        what = f"top_p_keep(rv={[float(format(v, '.4g')) for v in rv]}, rho={rho}, eps={eps}) [{why}]"
        got = [int(i) for i in call(what, m.top_p_keep, list(rv), rho, eps)]
        if got != want:
            tau = rho * sum(v for v in rv if v > 1e-10) - eps
            raise Fail(f"top_p_keep(rv={[float(format(v, '.4g')) for v in rv]}, rho={rho}, eps={eps}) [{why}; tau = "
                       f"{tau:.6g}]: expected {want}, got {got}"
                       + (" (return the indices sorted)" if sorted(got) == want else ""))


def grade_3(m):
    rng = random.Random(3)
    cases = [[[1, 0, 1, 0]], [[1, 1, 1, 1], [0, 0, 1, 0]], [[rng.uniform(-1, 1) for _ in range(5)] for _ in range(3)]]
    for R in cases:
        for norm in (True, False):
            want = []
            for r in R:
                mu = sum(r) / len(r)
                sd = math.sqrt(sum((v - mu) ** 2 for v in r) / (len(r) - 1))
                want.append([(v - mu) / (sd + 1e-6) if norm else v - mu for v in r])
            got = rows(call(f"group_advantages({R}, normalize_std={norm})", m.group_advantages, R, normalize_std=norm))
            for p, (g, w) in enumerate(zip(got, want)):
                close(g, w, 1e-5, f"group_advantages({R}, normalize_std={norm}) row {p}")


def grade_4(m):
    logp = [-1.0, -1.0, -0.2, -3.0, -0.5, -2.0, -1.0]
    old = [-1.0, -1.3, -1.0, -1.0, -0.5, -0.2, -1.5]
    adv = [1.0, 1.0, 1.0, -1.0, -2.0, 0.5, -1.0]
    for cl, ch, c in ((0.2, 0.28, 3.0), (0.2, 0.2, 3.0), (0.1, 0.5, 1.5)):
        want = []
        for lp, o, a in zip(logp, old, adv):
            ratio = math.exp(lp - o)
            loss = max(-a * ratio, -a * min(max(ratio, 1 - cl), 1 + ch))
            want.append(min(loss, -a * c) if a < 0 else loss)
        close(flat(call(f"clipped_surrogate(clip_low={cl}, clip_high={ch}, clip_c={c})", m.clipped_surrogate, logp, old,
                        adv, cl, ch, c)), want, 1e-6,
              f"clipped_surrogate(clip_low={cl}, clip_high={ch}, clip_c={c})")


def _log_mean_exp(row):
    """log((1/N) sum_j exp(row[j])), shifted by the row max (no float underflow) and summed with math.fsum."""
    top = max(row)
    return top + math.log(math.fsum(math.exp(v - top) for v in row) / len(row))


def grade_5(m):
    rng = random.Random(5)
    L1 = [[-1.0, -3.0, -2.0], [-4.0, -0.5, -4.0], [-2.0, -2.0, -1.0], [-1.0, -1.0, -5.0]]
    # sequence log-probabilities of real reasonings are hundreds of nats below 0: exp() of them is 0.0 in floats
    L_long = [[-1000.0, -1002.0, -1001.5], [-850.0, -849.0, -2000.0], [-3000.0, -3000.0, -2999.0],
              [-745.0, -760.0, -790.0]]
    cases = [(L1, [0, 1, 2, 1], ["a", "b", "c"], "the worked example; row 3 ties columns 0 and 1"),
             (L1, [0, 1, 2, 1], ["a", "a", "c"], "duplicate prompts: columns 0 and 1 are the same prompt"),
             (L_long, [0, 1, 2, 0], ["a", "b", "c"], "very negative scores (long reasonings): stable log-sum-exp"),
             ([[rng.uniform(-30, -1) for _ in range(4)] for _ in range(6)], [0, 1, 2, 3, 0, 2], [1, 2, 2, 3],
              "a random case with duplicate prompts"),
             ([[rng.uniform(-900, -300) for _ in range(5)] for _ in range(7)], [4, 3, 2, 1, 0, 0, 1],
              list(range(5)), "a random case of very negative scores")]
    for L, col, sig, why in cases:
        mi = sum(r[col[i]] - _log_mean_exp(r) for i, r in enumerate(L)) / len(L)
        what = f"mi_estimate(L={L}, true_col={col}) [{why}]"
        close(call(what, m.mi_estimate, L, col), mi, 1e-6, what)
        hits = 0
        for i, r in enumerate(L):
            best = min(j for j, v in enumerate(r) if v == max(r))            # ties: the lowest index
            hits += sig[best] == sig[col[i]]
        what = f"retrieval_accuracy(L={L}, true_col={col}, signatures={sig}) [{why}]"
        close(call(what, m.retrieval_accuracy, L, col, sig), hits / len(L), 1e-9, what)


def grade_6(m):
    cases = [([0, 0, 0, 0, 1.0], [0.2, 0.3, 0, 0.5, 0.4], [1, 1, 0, 1, 1], 1.0, 1.0),
             ([0, 0, 0, 0, 0, 1.0, 0], [0.1, 0.2, 0.9, 0.9, 0.3, 0.6, 0.0], [1, 1, 0, 0, 1, 1, 0], 0.9, 0.8),
             ([0.5, 0, 0, 1.0], [0.0, 0.0, 0.0, 0.0], [1, 0, 1, 1], 1.0, 0.95),
             ([0, 0.3, 0, 0, 1.0, 0], [0.5, 0.7, 0.2, 0.4, 0.1, 0.3], [1, 1, 0, 1, 1, 0], 0.95, 0.9),
             ([0.2, 0.0, 0.0, 0.0], [0.3, 0.1, 0.2, 0.6], [0, 1, 1, 0], 0.9, 0.7)]
    for r, v, mask, g, lam in cases:
        # independent: the closed form over the generated tokens only, A_k = sum_{l >= k} (g lam)^(l - k) delta_l
        gen = [t for t in range(len(r)) if mask[t]]
        vals = [v[t] for t in gen] + [0.0]
        delta = [r[t] + g * vals[k + 1] - vals[k] for k, t in enumerate(gen)]
        want = [0.0] * len(r)
        for k, t in enumerate(gen):
            want[t] = sum((g * lam) ** (l - k) * delta[l] for l in range(k, len(gen)))
        what = f"gae(rewards={r}, values={v}, mask={mask}, gamma={g}, lam={lam})"
        close(flat(call(what, m.gae, r, v, mask, g, lam)), want, 1e-6, what)


def grade_7(m):
    rng = random.Random(7)
    for _ in range(20):
        K = rng.randint(2, 6)
        logits = [rng.gauss(0, 1.5) for _ in range(K)]
        top = max(logits)
        e = [math.exp(x - top) for x in logits]
        pi = [x / sum(e) for x in e]
        r = [rng.choice([0.0, 1.0, rng.uniform(-1, 2)]) for _ in range(K)]
        mean = sum(p * x for p, x in zip(pi, r))
        # independent: central finite differences of E_pi[r] in the logits
        fd = []
        for k in range(K):
            val = []
            for h in (1e-6, -1e-6):
                lg = [x + (h if j == k else 0.0) for j, x in enumerate(logits)]
                t2 = max(lg)
                ee = [math.exp(x - t2) for x in lg]
                val.append(sum(x / sum(ee) * rr for x, rr in zip(ee, r)))
            fd.append((val[0] - val[1]) / 2e-6)
        g = flat(m.task_gradient(pi, r))
        close(g, fd, 1e-5, f"task_gradient(pi={[round(p, 3) for p in pi]}, r={[round(x, 3) for x in r]})")
        rv = sum(p * (x - mean) ** 2 for p, x in zip(pi, r))
        close(m.reward_variance(pi, r), rv, 1e-9, f"reward_variance(pi, r) for pi={[round(p, 3) for p in pi]}")
        es = sum(p * sum(((1.0 if j == z else 0.0) - pj) ** 2 for j, pj in enumerate(pi)) for z, p in enumerate(pi))
        close(m.expected_sq_score(pi), es, 1e-9, f"expected_sq_score(pi={[round(p, 3) for p in pi]})")
        norm = math.sqrt(sum(x * x for x in g))
        if norm > math.sqrt(rv * es) + 1e-9:
            raise Fail(f"the bound ||g|| <= sqrt(RV) sqrt(E||s||^2) fails: {norm:.6g} > {math.sqrt(rv * es):.6g}")


# ------------------------------------------------------------------------------ experiment exercise (8)
RUNS = ROOT / "experiments" / "classroom"
ARMS = ("classroom-filter", "classroom-nofilter", "classroom-nofilter-diluted")
EX8_FIELDS = {"final_" + a.split("-", 1)[1].replace("-", "_"): a for a in ARMS}     # final_filter, ...
MIN_WORDS = 12          # an explanation is a few sentences for the class discussion; its content is not graded

# The multiple-choice questions of the experiment exercises (the stubs print the same texts: see their docstrings)
CHOICES = {
    8: {"a": "Filtering removes the entropy bonus of the zero-RV groups, and the dilution control shows that this "
             "removal alone explains the filter arm's gain.",
        "b": "Once the policy is nearly deterministic per prompt most groups have RV 0, so the filter keeps few "
             "groups (whole steps are skipped) and an all-wrong group never re-enters the update; without the "
             "filter such a group still gets the entropy bonus, but at coefficient 0.001 that force is small, "
             "consistent with the three arms not separating.",
        "c": "The filter arm ends highest because it trains only on the high-SNR groups, as the paper predicts.",
        "d": "Template collapse (MI falls while the entropy stays level) hits the no-filter arm, and the filter "
             "prevents it."},
    9: {"a": "Q4 groups have RV about 0, so their task gradient is about 0 (exercise 7: ||g|| <= sqrt(RV) "
             "sqrt(E||s||^2)); the update is then almost only the entropy gradient, which pushes every prompt's "
             "policy toward uniform, eroding I(X;Z) and success.",
        "b": "Q4 prompts are the hard ones, and hard prompts give large gradients that overshoot.",
        "c": "The Q4 arm updates on fewer prompts per step than the Q1 arm.",
        "d": "The Q4 arm trains without the entropy bonus, so its policy collapses onto one action."},
    "10_selects": {"a": "the prompts with the highest SNR", "b": "the noisiest prompts (RV = Var(mu) + sigma^2 "
                   "grows with the noise)", "c": "a random subset: RV is unrelated to SNR and to the noise"},
    "10_lake": {"a": "filtering should help more on a slippery lake than on a deterministic one",
                "b": "filtering should help less on a slippery lake (it keeps the noisy prompts), as the paper's "
                     "slip sweep finds", "c": "the bound says nothing about a slippery lake"},
}


@functools.lru_cache(maxsize=None)
def ex8_truth() -> dict:
    """From the committed runs: mean final validation success per arm, the filter arm's mean kept fraction and
    mean zero-RV group count, whether any paired difference of final success is resolved (every seed the same
    sign and |mean| > std, the page's rule), and the answer key of the mechanism question."""
    import numpy as np
    import report
    runs = report.load_runs(sorted(str(p) for p in RUNS.glob("classroom-*") if p.is_dir()))
    if not runs:
        raise Fail(f"no committed classroom runs under {RUNS}")
    arms = report.group_arms(runs, ["name"])
    out = {}
    for field, arm in EX8_FIELDS.items():
        out[field] = report.mean_std([report.task_metrics(r["rows"])["final"] for r in arms[arm]])[0]
    for field, key in (("kept_frac_filter", "filter/kept_frac@mean"),
                       ("zero_rv_groups_filter", "filter/zero_rv_count@mean")):
        out[field] = report.mean_std([report.column_value(r["rows"], key) for r in arms["classroom-filter"]])[0]
    pairs = report.paired_differences(runs, ["name"], [(a, b) for i, a in enumerate(ARMS) for b in ARMS[i + 1:]])
    resolved = []
    for row in pairs:
        m, sd, _, n = row["final"]
        d = row["final_diffs"]
        resolved.append(bool(n >= 2 and (np.all(d > 0) or np.all(d < 0)) and abs(m) > sd))
    out["any_difference_resolved"] = any(resolved)
    # the reading on the page: nothing resolves and the filter keeps under half of the groups -> (b)
    out["mechanism"] = "b" if not any(resolved) and out["kept_frac_filter"] < 0.5 else None
    return out


def _written(answers: dict, key: str, words: int = 0):
    text = str(answers.get(key) or "").strip()
    if not text:
        raise Fail(f"write your {key} (a sentence) into ANSWERS[{key!r}]")
    if len(text.split()) < words:
        raise Fail(f"ANSWERS[{key!r}] has {len(text.split())} words: write it out in two or three sentences "
                   f"(at least {words} words) for the class discussion; keywords alone are not an explanation")


def _grade_answers(answers: dict, truth: dict, tol: float, where: str):
    """Numbers within tol, booleans and multiple-choice letters exactly; the first wrong field fails."""
    for key, want in truth.items():
        got = answers.get(key)
        if got is None or got == "":
            raise Fail(f"ANSWERS[{key!r}] is empty: {where}")
        if want is None:
            raise Fail(f"the committed results no longer match the answer key of {key!r}: tell the instructor")
        if isinstance(want, bool):
            if not isinstance(got, bool):
                raise Fail(f"ANSWERS[{key!r}] must be True or False, got {got!r}")
            if got != want:
                raise Fail(f"ANSWERS[{key!r}] = {got}: read the verdicts again")
        elif isinstance(want, str):
            got = str(got).strip().strip("()").lower()
            if got != want.lower():
                raise Fail(f"ANSWERS[{key!r}] = {got!r} is not the answer the numbers support: reread the "
                           f"question and the numbers you copied")
        else:
            if isinstance(got, bool) or not isinstance(got, (int, float)):
                raise Fail(f"ANSWERS[{key!r}] must be a number, got {got!r}")
            close(got, want, tol, f"ANSWERS[{key!r}]")


def grade_8(m):
    answers = m.ANSWERS
    _written(answers, "prediction")
    _grade_answers(answers, dict(ex8_truth()), 0.01, "read it off experiments/RESULTS.md (see the exercise's docstring)")
    _written(answers, "explanation", MIN_WORDS)


# ------------------------------------------------------------------ toy experiment exercises (9, 10)
def _first_number(text) -> float:
    return float(str(text).split("+/-")[0].split("(")[0].split("|")[0].strip())


@functools.lru_cache(maxsize=None)
def toy_truth(n: int) -> dict:
    """The numbers the student reads off `python theory/<script>.py --size small` (same size, same seed), and the
    answer keys of the structured questions, derived from those numbers."""
    import tempfile
    if n == 9:
        from theory import filter_bandit
        num = filter_bandit.main(size="small", fig_dir=tempfile.mkdtemp())["numbers"]
        q = {a: [x.strip() for x in str(num[f"[lam_ent=0.2] {a} only: success | learnable | I | H(Z|X) | kept"])
                 .split("|")] for a in ("Q1", "Q4")}
        out = {"success_Q1": _first_number(q["Q1"][0]), "success_Q4": _first_number(q["Q4"][0]),
               "I_Q1": _first_number(q["Q1"][2]), "I_Q4": _first_number(q["Q4"][2])}
        out["higher_success"] = "Q1" if out["success_Q1"] > out["success_Q4"] else "Q4"
        out["higher_I"] = "Q1" if out["I_Q1"] > out["I_Q4"] else "Q4"
        out["mechanism"] = "a" if out["higher_success"] == out["higher_I"] == "Q1" else None
        return out
    from theory import snr_bound
    num = snr_bound.main(size="small", fig_dir=tempfile.mkdtemp())["numbers"]
    out = {"spearman_homogeneous": _first_number(num["homogeneous sigma: Spearman(RV, SNR)"]),
           "spearman_heterogeneous": _first_number(num["heterogeneous sigma: Spearman(RV, SNR)"])}
    by_noise = _first_number(num["heterogeneous sigma: Spearman(RV, sigma)"])
    selects = "b" if out["spearman_heterogeneous"] < 0 < by_noise else None
    out["rv_selects_heterogeneous"] = selects
    out["slippery_lake"] = "b" if selects == "b" else None
    return out


def grade_toy(n: int, m):
    answers = m.ANSWERS
    _written(answers, "prediction")
    _grade_answers(answers, dict(toy_truth(n)), 0.006, "run the command in the exercise's docstring and copy it")
    _written(answers, "explanation", MIN_WORDS)


# ------------------------------------------------------------ the diagnostic on SmolLM2 (exercise 11)
EX11_FACTS = ("the red key opens the north door", "the box must go two steps left",
              "the lake has a hole at row three", "the answer is the number forty two")
CHOICES[11] = {"a": "diverse: high I(X;Z), high H(Z|X)", "b": "template collapse: I(X;Z) near 0 while H(Z|X) stays up",
               "c": "compressed: high I(X;Z), low H(Z|X)", "d": "low-entropy collapse: I(X;Z) near 0 and H(Z|X) low"}


@functools.lru_cache(maxsize=1)
def _smollm2():
    import policy
    model, tok = policy.load("smollm2-135m")
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Remember: {f}. What do you know?"}],
                                       add_generation_prompt=True, tokenize=False) + "<think>" for f in EX11_FACTS]
    return model, tok, [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]


@functools.lru_cache(maxsize=None)
def score_reasonings(texts: tuple) -> dict:
    """MI-Seq-Est, its permutation-null z (200 shuffles, seed 0), retrieval accuracy and H(Z|X) est. per token of
    8 reasonings (two per fact, in order) scored by SmolLM2 under the 4 prompts (mi_proxy + mi_metrics)."""
    import numpy as np
    import torch
    import mi_metrics
    import mi_proxy
    if len(texts) != 2 * len(EX11_FACTS) or not all(isinstance(t, str) and t.strip() for t in texts):
        raise Fail(f"a reasoning set needs {2 * len(EX11_FACTS)} non-empty strings (two per fact), got "
                   f"{len(texts)}")
    model, tok, x = _smollm2()
    z = [tok(" " + t.strip(), add_special_tokens=False)["input_ids"] for t in texts]
    col = np.repeat(np.arange(len(EX11_FACTS)), 2)
    with torch.no_grad():
        L_tok, L_seq = mi_proxy.cross_log_probs(model, x, z)
    m = mi_metrics.collapse_metrics(L_tok, L_seq, col)
    null = mi_metrics.permutation_null(L_tok, L_seq, col, None, 200, np.random.default_rng(0))
    z_score = null["mi_seq_estimate_null_z"]
    return {"mi": m["mi_seq_estimate"], "retrieval": m["retrieval_accuracy"], "H": m["conditional_entropy_est"],
            "null_z": 0.0 if math.isnan(z_score) else z_score}


def ex11_truth(reasonings: dict) -> dict:
    """Score the student's two sets; check that they are what they claim to be; the numbers and keys to grade."""
    sets = {}
    for name in ("healthy", "templated"):
        texts = reasonings.get(name) or []
        if not texts:
            raise Fail(f"write your {name} reasonings into REASONINGS[{name!r}] (8 strings, two per fact)")
        try:
            sets[name] = score_reasonings(tuple(texts))
        except Fail as err:
            raise Fail(f"REASONINGS[{name!r}]: {err}") from None
    h, t = sets["healthy"], sets["templated"]
    if h["retrieval"] < 0.75 or h["null_z"] <= 2:
        raise Fail(f"your healthy reasonings are not input-dependent enough for the model: retrieval "
                   f"{h['retrieval']:.2f} (need >= 0.75), MI-Seq-Est {h['mi']:.3f} at null z {h['null_z']:.2f} "
                   f"(need > 2): let each reasoning use its own fact")
    if t["mi"] > 0.1 * math.log(len(EX11_FACTS)) or t["retrieval"] > 0.5:
        raise Fail(f"your templated reasonings still carry their prompt: MI-Seq-Est {t['mi']:.3f} (need <= "
                   f"{0.1 * math.log(len(EX11_FACTS)):.3f}), retrieval {t['retrieval']:.2f} (need <= 0.5)")
    # the regime map: I near 0 here by construction; H "stays up" = at least half of the healthy set's (the same
    # half rule as report.COLLAPSE_RULE)
    return {"mi_healthy": h["mi"], "retrieval_healthy": h["retrieval"], "H_healthy": h["H"],
            "mi_templated": t["mi"], "retrieval_templated": t["retrieval"], "H_templated": t["H"],
            "regime_templated": "b" if t["H"] >= 0.5 * h["H"] else "d",
            "entropy_sees_it": bool(t["H"] < h["H"])}


def grade_11(m):
    answers = m.ANSWERS
    _written(answers, "prediction")
    _grade_answers(answers, ex11_truth(m.REASONINGS), 0.02,
                   "run `python exercises/ex11_collapse_diagnostic.py` and copy what it prints")
    _written(answers, "explanation", MIN_WORDS)


EX11_REFERENCE = {"healthy": [f"I know that {f}." for f in EX11_FACTS for _ in range(2)],
                  "templated": ["Let me think step by step about this."] * 8}


# --------------------------------------------------------------------------------------------- registry
EXERCISES = {
    1: ("ex1_reward_variance.py", "reward variance of each group", "§3.3", "code"),
    2: ("ex2_top_p.py", "the linear top-p rule with its slack", "§3.3, App. G", "code"),
    3: ("ex3_advantages.py", "GRPO and Dr.GRPO advantages", "§2.1, §4.1", "code"),
    4: ("ex4_surrogate.py", "clipped surrogate with clip-higher and dual clip", "§2.1, App. B", "code"),
    5: ("ex5_mi_estimate.py", "MI-Est and retrieval accuracy from a score matrix", "§2.3, App. F", "code"),
    6: ("ex6_gae.py", "GAE over a multi-turn mask", "§2.1, App. B", "code"),
    7: ("ex7_task_gradient.py", "the task gradient and its sqrt(RV) bound", "§3, Thm H.2", "code"),
    8: ("ex8_filter_vs_nofilter.py", "filter vs no filter vs dilution on SmolLM2: predict, read, explain",
        "§4, review", "experiment"),
    9: ("ex9_rv_quartiles.py", "RV-quartile ablation on the toy bandit: predict, run, explain", "§3.3, Table 6",
        "experiment"),
    10: ("ex10_noise_and_rv.py", "when does RV rank prompts by SNR? homogeneous vs heterogeneous noise",
         "§3, Thm H.3, slip sweep", "experiment"),
    11: ("ex11_collapse_diagnostic.py", "the collapse diagnostic on SmolLM2: healthy vs templated reasonings",
         "§2.3, Fig. 1", "experiment"),
}
GRADERS = {1: grade_1, 2: grade_2, 3: grade_3, 4: grade_4, 5: grade_5, 6: grade_6, 7: grade_7, 8: grade_8,
           9: lambda m: grade_toy(9, m), 10: lambda m: grade_toy(10, m), 11: grade_11}


REFERENCE_EXPLANATION = ("(reference) The reference answers are the graded fields themselves; the explanation "
                         "is read in class, so this placeholder only has the length the grader asks for.")


def reference(n: int):
    """The project's own implementation behind the exercise's function names."""
    import numpy as np
    import torch
    if n == 1:
        import filter as f
        return SimpleNamespace(reward_variance=lambda R: f.reward_variance(torch.tensor(R, dtype=torch.float64)))
    if n == 2:
        import filter as f
        return SimpleNamespace(top_p_keep=lambda rv, rho=0.9, eps=0.0: f.top_p_by_rv(
            torch.tensor(rv, dtype=torch.float64), rho, eps).tolist())
    if n == 3:
        import algos
        return SimpleNamespace(group_advantages=lambda R, normalize_std=True: algos.grpo_advantages(
            torch.tensor(R, dtype=torch.float64), normalize_std=normalize_std))
    if n == 4:
        import algos
        t = lambda x: torch.tensor([x], dtype=torch.float64)                       # noqa: E731  (1, T)
        return SimpleNamespace(clipped_surrogate=lambda lp, old, a, cl=0.2, ch=0.28, c=3.0: algos.clipped_surrogate(
            t(lp), t(old), t(a), cl, ch, c)[0])
    if n == 5:
        import mi_metrics
        def metrics(L, col, sig=None):
            L = np.asarray(L, dtype=np.float64)
            return mi_metrics.collapse_metrics(L, L, col, sig, lengths=[1] * len(L))   # |z| = 1: L_tok = L_seq
        return SimpleNamespace(mi_estimate=lambda L, col: metrics(L, col)["mi_seq_estimate"],
                               retrieval_accuracy=lambda L, col, sig: metrics(L, col, sig)["retrieval_accuracy"])
    if n == 6:
        import algos
        def gae(r, v, mask, gamma=1.0, lam=1.0):
            t = [torch.tensor([x], dtype=torch.float64) for x in (r, v, mask)]
            return (algos.gae_advantages(*t, gamma, lam, whiten_adv=False)[0] * t[2])[0]
        return SimpleNamespace(gae=gae)
    if n == 7:
        from theory import toy
        return SimpleNamespace(task_gradient=lambda pi, r: toy.task_gradient(pi, r),
                               reward_variance=lambda pi, r: float(toy.reward_variance(pi, r)),
                               expected_sq_score=lambda pi: float(toy.expected_sq_score(pi)))
    if n in (8, 9, 10):
        return SimpleNamespace(ANSWERS={"prediction": "(reference)", "explanation": REFERENCE_EXPLANATION,
                                        **(ex8_truth() if n == 8 else toy_truth(n))})
    if n == 11:
        return SimpleNamespace(REASONINGS=EX11_REFERENCE, ANSWERS={
            "prediction": "(reference)", "explanation": REFERENCE_EXPLANATION, **ex11_truth(EX11_REFERENCE)})
    raise KeyError(n)


def load_student(n: int):
    path = HERE / EXERCISES[n][0]
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def grade(n: int, use_reference: bool = False) -> tuple[bool, str]:
    """(passed, message) for exercise n."""
    try:
        module = reference(n) if use_reference else load_student(n)
    except NotImplementedError as err:
        return False, f"not implemented yet: {err}"
    except Exception as err:                        # a stub that does not even import
        return False, f"exercises/{EXERCISES[n][0]} raised {type(err).__name__} on import: {err}"
    return grade_module(n, module)


def grade_module(n: int, module) -> tuple[bool, str]:
    """(passed, message) for any object carrying exercise n's functions or ANSWERS (the tests pass wrong ones)."""
    try:
        GRADERS[n](module)
    except NotImplementedError as err:
        return False, f"not implemented yet: {err}"
    except Fail as err:
        return False, f"first failing case: {err}"
    except Exception as err:                        # a crash in the student's code is a failed case too
        return False, f"your code raised {type(err).__name__}: {err}"
    return True, "correct"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("exercise", nargs="?", type=int, help="exercise number")
    ap.add_argument("--list", action="store_true", help="list the exercises")
    ap.add_argument("--reference", action="store_true", help="grade the project's own implementation instead")
    args = ap.parse_args(argv)
    if args.list or args.exercise is None:
        for n, (file, title, sec, kind) in EXERCISES.items():
            print(f"{n}  {title}  [{sec}; {kind}; exercises/{file}]")
        return 0
    if args.exercise not in EXERCISES:
        print(f"error: no exercise {args.exercise}; exercises are {sorted(EXERCISES)} (--list)", file=sys.stderr)
        return 2
    ok, msg = grade(args.exercise, args.reference)
    who = "reference implementation" if args.reference else f"exercises/{EXERCISES[args.exercise][0]}"
    print(f"exercise {args.exercise} ({who}): {msg}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
