"""The single-turn text tasks of RAGEN-2: Countdown, MetaMathQA and Bandit (environments with free-form answers).

What it implements (paper section 4 / App. B, and the official code, mll-lab-nu/RAGEN):
  * countdown  3-4 numbers and a reachable target; the answer is an arithmetic expression read by a safe
               `ast` walker (never `eval`): 1.0 correct, 0.1 right numbers but wrong value, 0 otherwise.
  * metamathqa a MetaMathQA-format file (answer after "The answer is:") or built-in word problems with exact
               answers; normalised exact match; reward 1/2^attempt. 1 turn, 1 answer by default.
  * bandit     two arms named after an occupational pair: the low-risk arm pays 0.1, the high-risk arm pays
               1.0 with probability 0.25 (else 0). Success = the high-risk arm was chosen. Option
               `payout="deterministic"` (not in the paper; the classroom protocol, experiments/classroom.md): the high-risk arm pays 1, the
               low-risk arm 0, so the env reward's variance is p(1-p) of the success rate p (x G/(G-1), unbiased); the return
               adds the -0.1 format penalty, so RV is task signal only once the format is learnt (--rv-from success), and the
               input-agnostic template "always the first-listed arm" succeeds 50 % of the time (fair arm order).
They share the Env protocol of envs.py (reset/step/render, budgets, instructions) and are built through
`envs.make_env` (their base class is env_base.Env); envs.py's docstring lists the deliberate differences from the official code.

Left out: downloading the public Countdown / MetaMathQA sets (pass a local `data_path` instead).

Run: `python envs.py countdown --seed 0 --show`; tests in tests/test_envs.py.
"""
from __future__ import annotations

import ast
import itertools
import json
import operator
import re
from fractions import Fraction
from pathlib import Path

import numpy as np

from env_base import Env, _int_opt


# ---------------------------------------------------------------------------------------------- data files
def load_records(path, fields, flag="data_path"):
    """Rows of a local JSON (a list of objects), JSONL or parquet file, each with every key in `fields`."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{flag}={str(path)!r} is not a file")
    suffix = p.suffix.lower()
    if suffix not in (".json", ".jsonl", ".parquet"):
        raise ValueError(f"{flag} must end in .json, .jsonl or .parquet, got {str(path)!r}")
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq                              # optional dependency
        except ImportError:
            raise ValueError(f"{flag}={str(path)!r}: reading .parquet needs pyarrow (pip install pyarrow); "
                             "or convert the file to .jsonl") from None
        rows = pq.read_table(p).to_pylist()
    else:
        try:                                                          # .json: one list; .jsonl: one row a line
            text = p.read_text()
            rows = json.loads(text) if suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
        except ValueError as err:                                     # bad JSON or bad text encoding
            raise ValueError(f"{flag}={str(path)!r} is not valid {suffix[1:].upper()}: {err}") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and set(fields) <= set(r)
                                                         for r in rows):
        raise ValueError(f"{flag}={str(path)!r} must hold a non-empty list of records with fields {list(fields)}")
    return rows


# ---------------------------------------------------------------------------------------------- Countdown
MAX_EXPR_CHARS = 200                            # longer answers score 0 without being parsed
EXPR_CHARS = re.compile(r"[0-9+\-*/()\s]*")     # digits, the four operators, parentheses, spaces: nothing else
BIN_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def parse_expression(text: str):
    """Safely read an arithmetic answer: (numbers, value) or None when it is not a plain expression.

    Two gates, no `eval`: a character whitelist, then an AST whitelist (integer literals, + - * /, unary +/-,
    parentheses). `**`, names, calls, attributes, floats, `//` are rejected before anything is computed, so
    '9**9**9**9' or "__import__('os')" cost microseconds. value is an exact Fraction, or None on division by 0.
    """
    if not isinstance(text, str) or len(text) > MAX_EXPR_CHARS or not EXPR_CHARS.fullmatch(text):
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    numbers = []
    for node in ast.walk(tree):                                     # gate 2: every node must be whitelisted
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                return None                                         # floats, strings, ...
            numbers.append(node.value)
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.UAdd, ast.USub, *BIN_OPS)):
            return None                                             # names, calls, **, //, ...

    def value(node):                                                # exact rational arithmetic
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        return BIN_OPS[type(node.op)](value(node.left), value(node.right))

    try:
        return numbers, value(tree.body)
    except ZeroDivisionError:
        return numbers, None


def countdown_row(r: dict, path, i: int) -> tuple[list[int], int]:
    """(nums, target) of data row i: a non-empty list of integers and an integer (ints given as floats/strings
    are accepted when exact), else ValueError naming the file and the row."""
    def integer(v):
        if isinstance(v, bool):
            raise ValueError
        if isinstance(v, float) and not v.is_integer():
            raise ValueError
        return int(v)
    try:
        if not isinstance(r["nums"], (list, tuple)) or not r["nums"]:
            raise ValueError
        return [integer(n) for n in r["nums"]], integer(r["target"])
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"data_path={str(path)!r}, row {i}: need nums = a non-empty list of integers and target = "
                         f"an integer, got nums={r['nums']!r}, target={r['target']!r}") from None


def countdown_reward(answer: str, nums, target) -> float:
    """1.0 if the expression uses exactly the multiset `nums` and equals target (tolerance 1e-5); 0.1 if the
    numbers are right but the value is wrong (or divides by zero); 0.0 if malformed or the numbers differ."""
    parsed = parse_expression(answer)
    if parsed is None or sorted(parsed[0]) != sorted(int(n) for n in nums):
        return 0.0
    return 1.0 if parsed[1] is not None and abs(parsed[1] - target) < 1e-5 else 0.1


def countdown_instance(rng: np.random.Generator, ops="+-*/", lo=1, hi=100, max_tries=100_000):
    """3-4 numbers in [lo, hi] and a target in [lo, hi] reached by combining all of them with `ops`.

    Built forwards: repeatedly combine two random items with a random operator, keeping every intermediate a
    positive integer (subtraction larger-minus-smaller, exact division only); retry until the target is in range.
    Returns (nums, target, expression) with the expression as a certificate of reachability.
    """
    for _ in range(max_tries):
        nums = [int(x) for x in rng.integers(lo, hi + 1, size=int(rng.integers(3, 5)))]
        items = [(n, str(n)) for n in nums]                          # (value, expression text)
        while len(items) > 1:
            i, j = (int(x) for x in rng.choice(len(items), size=2, replace=False))
            (a, ea), (b, eb) = items[i], items[j]
            op = ops[int(rng.integers(len(ops)))]
            if op in "-/" and a < b:                                  # larger first for - and /
                (a, ea), (b, eb) = (b, eb), (a, ea)
            if (op == "-" and a == b) or (op == "/" and a % b):
                break                                                 # zero or a fraction: start again
            v = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
            items = [x for k, x in enumerate(items) if k not in (i, j)] + [(v, f"({ea} {op} {eb})")]
        if len(items) == 1 and lo <= items[0][0] <= hi:
            return nums, items[0][0], items[0][1][1:-1]               # drop the outer parentheses
    raise ValueError(f"ops={ops!r}: no reachable Countdown instance found in {max_tries} tries")


def signed_sum(nums, target):
    """An expression '+-n1 +- n2 ...' (each number once, in order) equal to target, or None (2^k sign patterns)."""
    for signs in itertools.product((1, -1), repeat=len(nums)):
        if sum(s * n for s, n in zip(signs, nums)) == target:
            text = " ".join(f"{'+' if s > 0 else '-'} {n}" for s, n in zip(signs, nums))
            return text[2:] if signs[0] > 0 else "-" + text[2:]
    return None


class Countdown(Env):
    """Reach the target with the given numbers (reference `_4_countdown`). Single turn, one answer."""
    name = "countdown"
    noun = "answer"

    def __init__(self, data_path=None, ops="+-*/", max_tokens=100):
        """ops: the operators instances are built from. Generated instances use only these; with a data file,
        "+-*/" keeps every row and "+-" keeps the rows solvable as a signed sum (the reference's filter)."""
        super().__init__(1, 1, 1, max_tokens)
        if not isinstance(ops, str) or not ops or set(ops) - set("+-*/") or len(set(ops)) != len(ops):
            raise ValueError(f"ops must be a non-empty subset of '+-*/' without repeats, got {ops!r}")
        self.ops = ops
        self.data = None
        if data_path is not None:                     # e.g. a JSONL export of Countdown-Tasks-3to4 (nums, target)
            if set(ops) not in ({"+", "-"}, set("+-*/")):
                raise ValueError(f"with data_path, ops must be '+-*/' (all rows) or '+-' (rows solvable with "
                                 f"signs only), got {ops!r}")
            rows = [countdown_row(r, data_path, i) for i, r in enumerate(load_records(data_path, ("nums", "target")))]
            # (nums, target, solution or None): the signed-sum solution doubles as the certificate
            self.data = [(n, t, signed_sum(n, t)) for n, t in rows]
            if len(ops) == 2:
                self.data = [row for row in self.data if row[2] is not None]
                if not self.data:
                    raise ValueError(f"data_path={data_path!r}: no row is solvable with ops='+-'")
        self.instructions = "\n".join([
            "You are solving the Countdown puzzle. Use every number in the list exactly once, with + - * / and "
            "parentheses, to write an arithmetic expression that equals the target.",
            "Answer with the expression only, without '=' or the target. For target 4 and numbers [3, 5, 2]: "
            "<think> 2 + 5 = 7, 7 - 3 = 4. </think> <answer>2 + 5 - 3</answer>",
            self.protocol("(7 - 3) * 2")])

    def _reset(self, seed):
        if self.data is not None:                     # reference rule: instance = seed mod len(data)
            self.nums, self.target, expr = self.data[seed % len(self.data)]
            self.solution = None if expr is None else [expr]
        else:
            self.nums, self.target, expr = countdown_instance(np.random.default_rng(seed), self.ops)
            self.solution = [expr]
        self.obs = f"Target: {self.target}, nums: {self.nums}"

    def _step(self, answer):
        """Grade the one answer; the episode ends whatever the result (single turn, single action)."""
        reward = countdown_reward(answer, self.nums, self.target)
        self.done, self.success = True, reward == 1.0
        self.obs = {1.0: "Correct!", 0.1: "Right numbers, wrong value."}.get(reward, "Invalid expression.")
        return reward, {"effective": True}

    def render(self) -> str:
        return self.obs


# --------------------------------------------------------------------------------------------- MetaMathQA
NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farah", "Hugo", "Ines", "Jonas", "Mei", "Omar", "Lena"]
# built-in word problems: each template maps integers from the rng to (question, exact integer answer)
PROBLEMS = [
    lambda n, a, b, c: (f"{n} has {a} apples and buys {b} bags with {c} apples in each bag. "
                        f"How many apples does {n} have now?", a + b * c),
    lambda n, a, b, c: (f"{n} reads {a} pages every day for {b} days and then {c} more pages. "
                        f"How many pages did {n} read in total?", a * b + c),
    lambda n, a, b, c: (f"{n} had {a * b + c + b} stickers and gave {a} stickers to each of {b} friends. "
                        f"How many stickers does {n} have left?", c + b),
    lambda n, a, b, c: (f"A tank holds {a * c + b} liters. {n} pours out {b} liters and splits the rest equally "
                        f"into {c} bottles. How many liters are in each bottle?", a),
    lambda n, a, b, c: (f"Pencils cost {b} dollars each. {n} buys {c} pencils and pays with {b * c + a} dollars. "
                        f"How much change does {n} get?", a),
    lambda n, a, b, c: (f"A rectangle is {a + c} meters long and {b} meters wide. What is its perimeter in "
                        "meters?", 2 * (a + c + b)),
]


def word_problem(rng: np.random.Generator):
    """(question, answer string) of a built-in arithmetic word problem (offline stand-in for MetaMathQA)."""
    name = NAMES[int(rng.integers(len(NAMES)))]
    a, b, c = (int(x) for x in rng.integers(2, 20, size=3))
    question, answer = PROBLEMS[int(rng.integers(len(PROBLEMS)))](name, a, b, c)
    return question, str(answer)


MAX_NUMBER_CHARS, MAX_EXPONENT = 64, 100     # a longer number or |exponent| > 100 is never a match


def _number(text: str):
    """'5', '5.0', '-3', '1/2', '1,000', '$12', '1e3' -> Fraction; None when the text is not a plain number or is
    out of range. Bounded first: Fraction('1e999999999') would build a billion-digit integer (hours), so a text
    over MAX_NUMBER_CHARS characters or with an exponent beyond +/-MAX_EXPONENT is not read at all."""
    text = text.lstrip("$")
    if len(text) > MAX_NUMBER_CHARS:
        return None
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")                                 # thousands separators only
    exp = re.search(r"[eE]([+-]?\d+)$", text)
    if exp and abs(int(exp.group(1))) > MAX_EXPONENT:
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(answer: str, label: str, numeric: bool = True) -> bool:
    """Reference rule: equal after removing whitespace and lower-casing. With numeric=True (ours) two answers
    that both read as plain numbers also match when equal as numbers ("5.0" == "5", "1,000" == "1000")."""
    a, b = re.sub(r"\s+", "", answer.lower()), re.sub(r"\s+", "", label.lower())
    if a == b:
        return True
    if numeric:
        x, y = _number(a), _number(b)
        return x is not None and y is not None and x == y
    return False


class MetaMathQA(Env):
    """Answer a math question (reference `_5_metamathqa`); correct on attempt k (0-based) earns 1/2^k."""
    name = "metamathqa"
    noun = "answer"

    def __init__(self, data_path=None, numeric_match=True,
                 max_turns=1, max_actions_per_turn=1, max_actions=1, max_tokens=100):
        super().__init__(max_turns, max_actions_per_turn, max_actions, max_tokens)
        if not isinstance(numeric_match, bool):
            raise ValueError(f"numeric_match must be True or False, got {numeric_match!r}")
        self.numeric_match = numeric_match
        self.data = None
        if data_path is not None:                    # MetaMathQA rows: query, response ending "The answer is: X"
            rows = load_records(data_path, ("query", "response"))
            labelled = [(str(r["query"]), re.search(r"The answer is:\s*(.*)$", str(r["response"]), re.DOTALL))
                        for r in rows]
            self.data = [(q, m.group(1).strip()) for q, m in labelled if m and m.group(1).strip()]
            if not self.data:
                raise ValueError(f"data_path={data_path!r}: no response contains 'The answer is: <answer>'")
        self.instructions = "\n".join([
            "You are solving math problems. Reason step by step, then give only the final answer "
            "(a number or a short expression) in the answer tags.",
            self.protocol("42")])

    def _reset(self, seed):
        rng = np.random.default_rng(seed)
        if self.data is not None:                    # reference: a random row under the seed
            self.question, self.label = self.data[int(rng.integers(len(self.data)))]
        else:
            self.question, self.label = word_problem(rng)
        self.solution, self.obs = [self.label], self.question

    def _step(self, answer):
        """Grade one answer; a wrong one leaves the episode open while graded answers remain (max_actions)."""
        correct = answers_match(answer, self.label, self.numeric_match)
        reward = 0.5 ** self.num_actions if correct else 0.0          # num_actions = earlier graded answers
        self.success = correct
        self.done = correct or self.num_actions + 1 >= self.max_actions
        self.obs = "Correct!" if correct else ("Incorrect." if self.done else "Incorrect. Please think again.")
        return reward, {"effective": True}

    def render(self) -> str:
        return self.obs


# ------------------------------------------------------------------------------------------------- Bandit
# (low-risk, high-risk) occupational name pairs, the reference's train / test lists
ARM_PAIRS = {
    "train": [("Teacher", "Trader"), ("Nurse", "StartupFounder"), ("Librarian", "Investor"),
              ("Accountant", "StockBroker"), ("Engineer", "RealEstateAgent"), ("Pharmacist", "Musician"),
              ("Clerk", "Freelancer"), ("Technician", "Youtuber"), ("Planner", "Artist"), ("Postman", "Pilot"),
              ("Banker", "VentureCapitalist"), ("Gardener", "Cryptominer")],
    "test": [("Receptionist", "Explorer"), ("Archivist", "Filmmaker"), ("Bookkeeper", "Consultant"),
             ("SocialWorker", "Photographer"), ("Mechanic", "GameDesigner"), ("Secretary", "Entrepreneur"),
             ("Cashier", "DataScientist"), ("CivilServant", "StartupAccelerator")],
}
LOW_PAY, HIGH_PAY, HIGH_PROB = 0.1, 1.0, 0.25
PAYOUTS = ("bernoulli", "deterministic")   # the paper's risky payout | reward 1 for the high-risk arm, 0 for the other


class Bandit(Env):
    """Pick one of two named arms (reference `_1_bandit`). `action_names` = this instance's two arm names.

    The payout of the high-risk arm is drawn from a stream seeded by (seed, payout_offset, member): the G members
    of a group (same seed, member 0..G-1) share the prompt but flip their own coins, so a group that always picks
    the high-risk arm still has reward variance, as in the reference. The reference gets there by giving each env
    its own seed, which also gives group members *different* prompts (and breaks the first-turn MI family).
    """
    name = "bandit"
    action_names = []                                              # set by reset: the two arms of the instance

    def __init__(self, split="train", payout_offset=0, max_tokens=100, payout="bernoulli"):
        super().__init__(1, 1, 1, max_tokens)
        if split not in ARM_PAIRS:
            raise ValueError(f"split must be one of {list(ARM_PAIRS)}, got {split!r}")
        if payout not in PAYOUTS:
            raise ValueError(f"payout must be one of {list(PAYOUTS)}, got {payout!r}")
        self.split, self.payout = split, payout
        self.payout_offset = _int_opt("payout_offset", payout_offset, lo=0)
        self.instructions = "\n".join([
            "You are playing a bandit game. Goal: maximize your reward by choosing which of two arms to pull.",
            "Each arm has its own reward distribution, related to its name. Analyze the symbolic meaning of each "
            "arm's name to guess which arm gives higher rewards on average.",
            "Valid actions: the two arm names given in the observation (case-insensitive).",
            self.protocol("ArmName")])

    def _reset(self, seed):
        """Pick a name pair and a random arm order from the seed; the payout stream is seeded separately."""
        rng = np.random.default_rng(seed)
        self.low, self.high = ARM_PAIRS[self.split][int(rng.integers(len(ARM_PAIRS[self.split])))]
        self.action_names = [self.low, self.high] if rng.random() < 0.5 else [self.high, self.low]
        self.payout_rng = np.random.default_rng([seed, self.payout_offset, self.member])   # per group member
        self.solution = [self.high]
        a, b = self.action_names
        self.obs = (f"There are 2 arms, named {a} and {b}. Which arm do you think is more likely to give higher "
                    f"rewards on average? Choose between {a} and {b}: answer <answer>{a}</answer> or "
                    f"<answer>{b}</answer>.")

    def _step(self, arm):
        if self.payout == "deterministic":                          # reward = success (the format penalty aside)
            reward = 1.0 if arm == self.high else 0.0
        elif arm == self.low:
            reward = LOW_PAY
        else:                                                       # high risk: 1.0 w.p. 0.25, else 0
            reward = HIGH_PAY if self.payout_rng.random() < HIGH_PROB else 0.0
        self.done, self.success = True, arm == self.high
        self.obs = f"{arm}: {reward} points"
        return reward, {"effective": True}

    def render(self) -> str:
        return self.obs
