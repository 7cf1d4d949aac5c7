"""DeepCoder-mini: single-turn Python code generation, graded on public and hidden tests in a sandbox.

What it implements (RAGEN-2 App. B.1 "DeepCoder", Table 3: single-turn, dense reward; the official code is
mll-lab-nu/RAGEN ragen/env/deepcoder, adapted from rllm's DeepCoder example):
  * One problem per episode, drawn from the seed (`np.random.default_rng(seed)`); the observation is the problem
    text, as the official `{problem}\\n\\nStarter code:\\n{starter_code}`; our problem text lists the public tests
    as examples. 1 turn, 1 answer (official `max_turn` 1, `max_actions_per_turn` 1, `max_steps` 1).
  * The answer is the program: the text inside <answer>...</answer>, as rollout.parse_response hands it over
    (split on "||", first piece, stripped: see "||" below). Reward = passed / total over public + hidden tests
    (the official pass fraction), success = all passed, observation "Correct!" / "Incorrect.", done after the one
    answer. An empty answer is invalid (env_base: no step, no reward), as the official "Invalid action.".
  * Test semantics of the official harness: function problems call `Solution().<func_name>(*args)` when the code
    defines `class Solution`, else the top-level function, and compare `str(result) == str(expected)`; stdin
    problems compare the stripped printed text with the stripped expected text. A timeout or a crash of the whole
    run scores 0 of N (official: one 3 s timeout for all tests together; ours: sandbox.Limits, wall 3 s default).
  * Problems: the 70 bundled ones of deepcoder_problems.py (50 function-style, 20 stdin-style), written for this
    project; the official set (PrimeIntellect + TACO + LiveCodeBench, ~24K problems) is a multi-GB download.

Train / validation split (official: none; it draws train and validation prompts from the same "test" split):
`val_problems` problems, the first of `np.random.default_rng(split_seed).permutation` over the problems sorted by
name, form the validation set, the rest the training set. With split="auto" (default), seeds below
`val_seeds_below` (10000) draw from the validation set and seeds from 10000 on from the training set: train.py
validates on seeds val_seed + i (123...) and trains on train_seed + s*P + i (10000...), so with the default seeds
no validation problem is ever trained on. split="train" / "val" / "all" ignore the seed range.

Deliberate choices, with the official behaviour in brackets:
  * Code fences: with strip_fences=True (default) the body of the first ```python / ```py / ``` block is graded
    (an unclosed fence runs to the end) [official: fences are not stripped, so a fenced answer is a SyntaxError
    and scores 0; strip_fences=False restores that]. Small models fence code out of habit.
  * "||": rollout.parse_response splits every answer on "||" and keeps the first piece; we leave that shared code
    unchanged, as the official does, so code containing "||" is cut there (usually a SyntaxError, 0). Python never
    needs "||" (its operator is `or`); the instructions say not to write it.
  * `sys.exit(0)` / `exit()` ends a stdin program normally [official: kills the whole harness run, 0 of N].
  * Every answer runs inside a bubblewrap boundary (sandbox.py: no checkout, no hidden tests, no /proc of the
    trainer, no network, its own pid namespace, an unprivileged uid), under CPU / memory / file-size / process
    limits, a wall clock and an audit hook [official: a bare `python` child in /tmp with the trainer's
    environment]. Option isolation="bwrap" (default) fails closed: where bubblewrap cannot start, building the env
    raises one line naming isolation="process", the weaker process sandbox, which must be asked for explicitly.
    The isolation used is `env.isolation` and in every step's info.
  * The hidden expected outputs never enter the child process: it returns outputs, the trainer compares, as
    strings only; a malformed, forged or wrongly typed report scores 0 and never raises.
Left out: LiveCodeBench's prompt template (needs the optional rllm package), the `class Solution` starter-header
merging (our starters are plain functions), multi-attempt feedback (official max_steps > 1).
Run: `python envs.py deepcoder --seed 10000 --show`; tests in tests/test_deepcoder.py.
"""
from __future__ import annotations

import math
import re
import subprocess

import numpy as np

from . import sandbox
from .deepcoder_problems import PROBLEMS
from env_base import Env, _int_opt

SPLITS = ("auto", "train", "val", "all")
FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


# ------------------------------------------------------------------------------------------------ grading
def extract_code(answer: str, strip_fences: bool = True) -> str:
    """The program in an answer: the first fenced block's body when strip_fences and there is one, else as is."""
    if strip_fences:
        m = FENCE_RE.search(answer)
        if m:
            return m.group(1)
    return answer


def all_tests(problem: dict) -> list:
    """All tests of a problem, public first: [(sandbox input text, expected)]. Function inputs are the repr of
    the argument tuple (the child reads it with ast.literal_eval)."""
    tests = problem["public"] + problem["hidden"]
    if problem["kind"] == "function":
        return [(repr(tuple(args)), expected) for args, expected in tests]
    return list(tests)


def passes(output, expected, kind: str) -> bool:
    """The official comparison: str(result) == str(expected) (function) or equal stripped stdout (stdin). Strings
    only: anything else the child reported (None when the test raised or the run failed) fails the test."""
    if type(output) is not str:
        return False
    return output == str(expected) if kind == "function" else output.strip() == str(expected).strip()


def grade(code: str, problem: dict, limits=None, user=None, python=None, isolation="bwrap"):
    """(passed, total, sandbox.Result) of a program on every test of a problem, in one sandboxed run. The parent
    never trusts the child: a run that could not be read, or whose report does not fit, scores 0 and never raises
    (sandbox.parse_report already rejects malformed reports; this catches what is left, e.g. a full disk)."""
    tests = all_tests(problem)
    try:
        result = sandbox.run(code, [inp for inp, _ in tests], problem["kind"], problem.get("func_name"),
                             limits=limits, user=user, python=python, isolation=isolation)
        outputs = list(result.outputs)
        passed = sum(passes(out, expected, problem["kind"]) for out, (_, expected) in zip(outputs, tests)) \
            if len(outputs) == len(tests) else 0
    except (OSError, subprocess.SubprocessError, TypeError, AttributeError, RecursionError, MemoryError) as e:
        detail = f"{type(e).__name__}: {e}"[:300]
        result = sandbox.Result("error", [None] * len(tests), [detail] * len(tests), detail, None, 0.0, "",
                                isolation)
        passed = 0
    return passed, len(tests), result


def render_problem(problem: dict) -> str:
    """The observation: statement, the public tests as examples, and the starter code (function problems)."""
    lines = [problem["statement"], ""]
    if problem["kind"] == "function":
        lines.append("Examples:")
        for args, expected in problem["public"]:
            lines.append(f"{problem['func_name']}({', '.join(map(repr, args))}) == {expected!r}")
        lines += ["", "Starter code:", problem["signature"]]
    else:
        lines.append("Read the input from standard input and print the answer to standard output.")
        for i, (inp, expected) in enumerate(problem["public"], 1):
            lines += ["", f"Example {i}", "Input:", inp.rstrip("\n"), "Output:", expected]
    return "\n".join(lines)


def split_problems(problems, val_problems: int, split_seed: int):
    """(train, val): val = the first val_problems of a seeded permutation of the problems sorted by name."""
    ordered = sorted(problems, key=lambda p: p["name"])
    perm = np.random.default_rng(split_seed).permutation(len(ordered))
    val = [ordered[i] for i in sorted(perm[:val_problems])]
    train = [ordered[i] for i in sorted(perm[val_problems:])]
    return train, val


# ---------------------------------------------------------------------------------------------------- env
class DeepCoder(Env):
    """Write a Python program that passes a problem's tests (reference DeepCoderEnv). Single turn, one answer."""
    name = "deepcoder"
    noun = "answer"

    def __init__(self, split="auto", val_problems=14, split_seed=0, val_seeds_below=10000, strip_fences=True,
                 timeout=3.0, memory_mb=512, user=None, python=None, isolation="bwrap", max_tokens=300):
        """timeout: wall seconds for all tests of one answer (official 3; CPU limit = ceil(timeout));
        user / python: run programs as this user with this interpreter (a root trainer; see sandbox.py);
        isolation: "bwrap" (default; refused in one line where bubblewrap cannot start) or "process" (the weaker
        process sandbox, accepted explicitly)."""
        super().__init__(1, 1, 1, max_tokens)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        self.split = split
        self.val_problems = _int_opt("val_problems", val_problems)
        if self.val_problems >= len(PROBLEMS):
            raise ValueError(f"val_problems must be < the {len(PROBLEMS)} bundled problems, got {val_problems!r}")
        self.split_seed = _int_opt("split_seed", split_seed, lo=0)
        self.val_seeds_below = _int_opt("val_seeds_below", val_seeds_below, lo=0)
        if not isinstance(strip_fences, bool):
            raise ValueError(f"strip_fences must be True or False, got {strip_fences!r}")
        self.strip_fences = strip_fences
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 60:
            raise ValueError(f"timeout must be a number of seconds in (0, 60], got {timeout!r}")
        self.limits = sandbox.Limits(wall_s=float(timeout), cpu_s=math.ceil(timeout),
                                     memory_mb=_int_opt("memory_mb", memory_mb, lo=64))
        for flag, value in (("user", user), ("python", python)):
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"{flag} must be a non-empty string or None, got {value!r}")
        self.user, self.python = user, python
        sandbox.check_isolation(isolation, python)          # fail closed, before any compute
        self.isolation = isolation
        self.train, self.val = split_problems(PROBLEMS, self.val_problems, self.split_seed)
        fences = ("A single ```python fenced block is also accepted." if strip_fences else
                  "Do not use ``` code fences: the answer is run exactly as written.")
        self.instructions = "\n".join([
            "You are solving a coding task. Provide a complete Python 3 solution only, inside the answer tags.",
            "For a function problem (it shows starter code 'def name(...):'), define that function; it is called "
            "with each test's arguments and str() of its return value must equal the expected value. For an "
            "input/output problem, write a program that reads standard input and prints the answer.",
            "Your code runs on the examples and on hidden tests; the reward is the fraction of tests passed "
            f"(1 = all). Standard library only; about {timeout:g} seconds for all tests together.",
            f"Write only code in the answer, no explanation. {fences} Never write '||' in your code.",
            self.protocol("def add(a, b): return a + b")])

    def pool(self, seed: int) -> list:
        """The problems this seed draws from (see the module docstring)."""
        if self.split == "all":
            return self.train + self.val
        if self.split == "auto":
            return self.val if seed < self.val_seeds_below else self.train
        return self.val if self.split == "val" else self.train

    def _reset(self, seed):
        pool = self.pool(seed)
        self.problem = pool[int(np.random.default_rng(seed).integers(len(pool)))]
        self.solution = [self.problem["reference"]]
        self.obs = render_problem(self.problem)

    def _step(self, answer):
        """Grade the one answer on every test; the episode ends whatever the result (single turn)."""
        passed, total, result = grade(extract_code(answer, self.strip_fences), self.problem, self.limits,
                                      self.user, self.python, self.isolation)
        self.done, self.success = True, passed == total
        self.obs = "Correct!" if self.success else "Incorrect."
        return passed / total, {"effective": True, "passed": passed, "total": total, "status": result.status,
                                "isolation": self.isolation, "cleaned": result.cleaned}

    def render(self) -> str:
        return self.obs
