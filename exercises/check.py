"""Grader of the classroom exercises: `python exercises/check.py --list | N | N --reference`.

Each coding exercise is a stub file in exercises/ (one function or three to write); the grader imports it and
compares it with an INDEPENDENT computation written here in plain Python (loops, math), case by case, and stops at
the first failing case with a message saying what was expected. `--reference` runs the same grader on the
project's own implementation (filter.py, algos.py, mi_metrics.py, theory/toy.py), so the grader is itself checked
against the code the project trains with (tests/test_exercises.py: every reference passes, every stub fails).
The experiment exercises (8-10) grade a written prediction and explanation and the numbers a student read off the
committed classroom runs (8) or off a toy run (9, 10; the grader reruns the same command to check them).

Exit status 0 = correct, 1 = a case failed or the stub is not implemented yet, 2 = usage error.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import sys
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
        close(flat(m.reward_variance(R)), want, what=f"reward_variance({R})")


def _top_p(rv, rho, eps):
    cand = sorted((i for i, v in enumerate(rv) if v > 1e-10), key=lambda i: (-rv[i], i))
    tau, mass, kept = rho * sum(rv) - eps, 0.0, []
    for i in cand:
        if mass >= tau:
            break
        kept.append(i)
        mass += rv[i]
    return sorted(kept) if mass >= tau else []


def grade_2(m):
    stds = [0.25, 0.24, 0.1, 0.05, 0, 0, 0, 0]
    cases = [([s * s for s in stds], 0.9, 0.0), ([0.25, 0.25, 0.0, 0.25], 0.9, 0.0), ([0.0, 0.0], 0.9, 0.0),
             ([0.01, 0.004], 0.9, 0.01), ([0.3, 0.1, 0.1, 0.2], 0.5, 0.0), ([0.2, 0.2, 0.1], 1.0, 0.0)]
    rng = random.Random(2)
    cases += [([rng.choice([0.0, 0.0, rng.random()]) for _ in range(8)], rng.choice([0.5, 0.8, 0.9]), 0.0)
              for _ in range(20)]
    for rv, rho, eps in cases:
        want, got = _top_p(rv, rho, eps), m.top_p_keep(list(rv), rho, eps)
        if sorted(int(i) for i in got) != want:
            raise Fail(f"top_p_keep(rv={[round(v, 4) for v in rv]}, rho={rho}, eps={eps}): expected {want}, "
                       f"got {sorted(int(i) for i in got)}")


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
            got = rows(m.group_advantages(R, normalize_std=norm))
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
        close(flat(m.clipped_surrogate(logp, old, adv, cl, ch, c)), want, 1e-6,
              f"clipped_surrogate(clip_low={cl}, clip_high={ch}, clip_c={c})")


def grade_5(m):
    rng = random.Random(5)
    L1 = [[-1.0, -3.0, -2.0], [-4.0, -0.5, -4.0], [-2.0, -2.0, -1.0], [-1.0, -1.0, -5.0]]
    cases = [(L1, [0, 1, 2, 1], ["a", "b", "c"]), (L1, [0, 1, 2, 1], ["a", "a", "c"]),
             ([[rng.uniform(-30, -1) for _ in range(4)] for _ in range(6)], [0, 1, 2, 3, 0, 2], [1, 2, 2, 3])]
    for L, col, sig in cases:
        mi = 0.0
        for i, r in enumerate(L):
            top = max(r)
            mi += r[col[i]] - (top + math.log(sum(math.exp(v - top) for v in r) / len(r)))
        close(m.mi_estimate(L, col), mi / len(L), 1e-6, f"mi_estimate(L={L}, true_col={col})")
        hits = 0
        for i, r in enumerate(L):
            best = max(range(len(r)), key=lambda j: (r[j], -j))              # ties: the lowest index
            hits += sig[best] == sig[col[i]]
        close(m.retrieval_accuracy(L, col, sig), hits / len(L), 1e-9,
              f"retrieval_accuracy(L={L}, true_col={col}, signatures={sig})")


def grade_6(m):
    cases = [([0, 0, 0, 0, 1.0], [0.2, 0.3, 0, 0.5, 0.4], [1, 1, 0, 1, 1], 1.0, 1.0),
             ([0, 0, 0, 0, 0, 1.0, 0], [0.1, 0.2, 0.9, 0.9, 0.3, 0.6, 0.0], [1, 1, 0, 0, 1, 1, 0], 0.9, 0.8),
             ([0.5, 0, 0, 1.0], [0.0, 0.0, 0.0, 0.0], [1, 0, 1, 1], 1.0, 0.95)]
    for r, v, mask, g, lam in cases:
        want, v_next, a_next = [0.0] * len(r), 0.0, 0.0
        for t in reversed(range(len(r))):
            vt = v[t] * mask[t]
            if mask[t]:
                a_next = r[t] + g * v_next - vt + g * lam * a_next
                v_next, want[t] = vt, a_next
        close(flat(m.gae(r, v, mask, g, lam)), want, 1e-6, f"gae(rewards={r}, values={v}, mask={mask}, "
                                                            f"gamma={g}, lam={lam})")


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


def ex8_truth() -> dict:
    """Mean final validation success per arm over the committed seeds, and the filter arm's mean kept fraction."""
    import report
    runs = report.load_runs(sorted(str(p) for p in RUNS.glob("classroom-*") if p.is_dir()))
    if not runs:
        raise Fail(f"no committed classroom runs under {RUNS}")
    arms = report.group_arms(runs, ["name"])
    out = {}
    for field, arm in EX8_FIELDS.items():
        out[field] = report.mean_std([report.task_metrics(r["rows"])["final"] for r in arms[arm]])[0]
    out["kept_frac_filter"] = report.mean_std([report.column_value(r["rows"], "filter/kept_frac@mean")
                                               for r in arms["classroom-filter"]])[0]
    return out


def grade_8(m):
    answers = m.ANSWERS
    for key in ("prediction", "explanation"):
        if not str(answers.get(key, "")).strip():
            raise Fail(f"write your {key} (a sentence) into ANSWERS[{key!r}]")
    truth = ex8_truth()
    for key, want in truth.items():
        if answers.get(key) is None:
            raise Fail(f"ANSWERS[{key!r}] is empty: read it off the page (see the exercise's docstring)")
        close(answers[key], want, 0.01, f"ANSWERS[{key!r}]")
    words = str(answers["explanation"]).lower()
    if not any(w in words for w in ("zero-rv", "zero rv", "kept", "rv = 0", "rv 0", "saturat", "entropy")):
        raise Fail("the explanation should name the diagnostic that explains the difference (zero-RV groups, kept "
                   "fraction, entropy, saturation ...)")


# ------------------------------------------------------------------ toy experiment exercises (9, 10)
def _first_number(text) -> float:
    return float(str(text).split("+/-")[0].split("(")[0].split("|")[0].strip())


def toy_truth(n: int) -> dict:
    """The numbers the student reads off `python theory/<script>.py --size small` (same size, same seed)."""
    import tempfile
    if n == 9:
        from theory import filter_bandit
        num = filter_bandit.main(size="small", fig_dir=tempfile.mkdtemp())["numbers"]
        q = {a: [x.strip() for x in str(num[f"[lam_ent=0.2] {a} only: success | learnable | I | H(Z|X) | kept"])
                 .split("|")] for a in ("Q1", "Q4")}
        return {"success_Q1": _first_number(q["Q1"][0]), "success_Q4": _first_number(q["Q4"][0]),
                "I_Q1": _first_number(q["Q1"][2]), "I_Q4": _first_number(q["Q4"][2])}
    from theory import snr_bound
    num = snr_bound.main(size="small", fig_dir=tempfile.mkdtemp())["numbers"]
    return {"spearman_homogeneous": _first_number(num["homogeneous sigma: Spearman(RV, SNR)"]),
            "spearman_heterogeneous": _first_number(num["heterogeneous sigma: Spearman(RV, SNR)"])}


def grade_toy(n: int, m, words: tuple):
    answers = m.ANSWERS
    for key in ("prediction", "explanation"):
        if not str(answers.get(key, "")).strip():
            raise Fail(f"write your {key} (a sentence) into ANSWERS[{key!r}]")
    for key, want in toy_truth(n).items():
        if answers.get(key) is None:
            raise Fail(f"ANSWERS[{key!r}] is empty: run the command in the exercise's docstring and copy it")
        close(answers[key], want, 0.006, f"ANSWERS[{key!r}]")
    if not any(w in str(answers["explanation"]).lower() for w in words):
        raise Fail(f"the explanation should use the idea the exercise is about (one of: {', '.join(words)})")


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
}
GRADERS = {1: grade_1, 2: grade_2, 3: grade_3, 4: grade_4, 5: grade_5, 6: grade_6, 7: grade_7, 8: grade_8,
           9: lambda m: grade_toy(9, m, ("signal", "gradient", "variance", "rv", "learn")),
           10: lambda m: grade_toy(10, m, ("noise", "sigma", "snr"))}


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
    if n == 8:
        return SimpleNamespace(ANSWERS={"prediction": "(reference)", "explanation": "the zero-RV groups",
                                        **ex8_truth()})
    if n in (9, 10):
        return SimpleNamespace(ANSWERS={"prediction": "(reference)", "explanation": "signal-to-noise: RV", **toy_truth(n)})
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
        GRADERS[n](reference(n) if use_reference else load_student(n))
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
