"""deepcoder.py (+ deepcoder_problems.py): every reference passes every test in the sandbox, wrong programs fail,
the pass-fraction reward on hand-built answers, fences, '||', the train/validation split, determinism, hostile
answers (reward hacking by reading the problems, forged reports: 0, never raising), fail-closed isolation, options,
and a train.py smoke run. Runs under bubblewrap where it works, else under isolation='process' (stated skips)."""
import json
import sys
from pathlib import Path

import pytest

from agentic import deepcoder
import envs
import rollout
import runlog
from agentic import sandbox
import train
from agentic.deepcoder_problems import PROBLEMS

PROJECT = Path(__file__).resolve().parents[1]
BY_NAME = {p["name"]: p for p in PROBLEMS}
BWRAP_MISSING = sandbox._probe(sys.executable)          # '' when the boundary works here, else the reason
ISO = "process" if BWRAP_MISSING else "bwrap"
needs_bwrap = pytest.mark.skipif(bool(BWRAP_MISSING), reason=f"bubblewrap unavailable: {BWRAP_MISSING}")


def answer(env, code):
    """Step a freshly reset env with one answer: (reward, info)."""
    _, reward, done, info = env.step(code)
    return reward, info


def env_on(problem_name, **options):
    """A DeepCoder env reset on the first seed that draws `problem_name` (split='all'). A 10 s timeout by default
    (official 3 s), so that correct programs pass on a busy machine too."""
    env = envs.make_env("deepcoder", split="all", **{"timeout": 10.0, "isolation": ISO, **options})
    for seed in range(10_000):
        env.reset(seed)
        if env.problem["name"] == problem_name:
            return env
    raise AssertionError(problem_name)


# --------------------------------------------------------------------------------------------- problem set
def test_problem_set_has_60_plus_varied_well_formed_problems():
    kinds = [p["kind"] for p in PROBLEMS]
    assert len(PROBLEMS) >= 60 and kinds.count("function") >= 30 and kinds.count("stdin") >= 15
    assert len(BY_NAME) == len(PROBLEMS)                                        # unique names
    for p in PROBLEMS:
        assert p["statement"] and len(p["public"]) >= 2 and len(p["hidden"]) >= 3, p["name"]
        assert "||" not in p["reference"]
        if p["kind"] == "function":
            assert p["signature"] == f"def {p['func_name']}(" + p["signature"].split("(", 1)[1]
            assert f"def {p['func_name']}(" in p["reference"]


def test_every_reference_passes_every_test_in_the_sandbox():
    failures = []
    for p in PROBLEMS:
        passed, total, result = deepcoder.grade(p["reference"], p, sandbox.Limits(wall_s=20.0, cpu_s=10),
                                                isolation=ISO)
        if passed != total:
            failures.append((p["name"], passed, total, result.status, result.errors))
    assert failures == []


def test_tests_reject_constant_and_memorising_programs():
    """Checked on the data: a program that prints one fixed answer fails some test of every problem (the expected
    values differ), and a program that memorised the public examples fails every hidden test (their inputs differ)."""
    for p in PROBLEMS:
        tests = deepcoder.all_tests(p)
        assert len({str(e).strip() for _, e in tests}) > 1, p["name"]
        public_inputs = {inp for inp, _ in tests[:len(p["public"])]}
        assert all(inp not in public_inputs for inp, _ in tests[len(p["public"]):]), p["name"]


# near misses, with their pass counts worked out by hand from the tests in deepcoder_problems.py
NEAR_MISSES = [
    ("is_even", "def is_even(n):\n    return n % 2 == 1", 0),
    ("factorial", "def factorial(n):\n    r = 1\n    for i in range(1, n):\n        r *= i\n    return r", 2),
    ("reverse_words", "def reverse_words(s):\n    return ' '.join(s.split(' ')[::-1])", 5),
    ("missing_number", "def missing_number(nums):\n    return len(nums)", 1),
    ("max_in_list", "def max_in_list(nums):\n    return nums[-1]", 2),
    ("sum_list", "print(sum(int(x) for x in open(0).read().split()))", 1),
    ("fizzbuzz", "n = int(input())\nfor i in range(1, n + 1):\n    print('Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0"
                 " else 'FizzBuzz' if i % 15 == 0 else i)", 5),
    ("average", "nums = [int(x) for x in input().split()]\nprint(sum(nums) // len(nums))", 0),
]


@pytest.mark.parametrize("name,code,expected_passed", NEAR_MISSES)
def test_near_miss_programs_earn_exactly_their_pass_fraction(name, code, expected_passed):
    env = env_on(name)
    reward, info = answer(env, code)
    total = len(BY_NAME[name]["public"]) + len(BY_NAME[name]["hidden"])
    assert (info["passed"], info["total"]) == (expected_passed, total)
    assert reward == pytest.approx(expected_passed / total) and not info["success"] and env.done
    assert env.render() == "Incorrect."


def test_hidden_expected_outputs_never_reach_the_child(monkeypatch):
    calls = []

    def fake_run(code, inputs, mode, func_name=None, **kw):
        calls.append((code, list(inputs), mode, func_name, kw))
        return sandbox.Result("ok", ["x"] * len(inputs), [None] * len(inputs), "", 0, 0.0, "")
    monkeypatch.setattr(sandbox, "run", fake_run)
    p = BY_NAME["collatz_steps"]
    deepcoder.grade("code", p, isolation=ISO)
    (code, inputs, mode, func_name, kw), = calls
    assert inputs == [repr(tuple(args)) for args, _ in p["public"] + p["hidden"]] and mode == "function"
    assert set(kw) == {"limits", "user", "python", "isolation"}                  # nothing else is passed


# -------------------------------------------------------------------------------------------- env behaviour
def test_reset_is_deterministic_and_independent_of_call_order():
    a, b = envs.make_env("deepcoder", isolation=ISO), envs.make_env("deepcoder", isolation=ISO)
    seeds = [123, 124, 10000, 10001, 10002, 555]
    first = [a.reset(s) for s in seeds]
    second = [b.reset(s) for s in reversed(seeds)][::-1]
    assert first == second and a.reset(10001) == first[3]
    assert len({a.reset(s) for s in range(10000, 10040)}) > 10                 # seeds spread over problems
    for s in (123, 10000):                                                    # the text is the rendered problem
        a.reset(s)
        assert a.render() == deepcoder.render_problem(a.problem) and a.solution == [a.problem["reference"]]


def test_observation_shows_public_examples_never_hidden_tests():
    env = env_on("two_sum")
    obs = env.render()
    assert "two_sum([2, 7, 11, 15], 9) == [0, 1]" in obs and "def two_sum(nums, target):" in obs
    assert "[-1, 8, 3, 10]" not in obs                                         # a hidden test's input
    env = env_on("fizzbuzz")
    assert "Example 2\nInput:\n1\nOutput:\n1" in env.render() and "FizzBuzz\n" not in env.render()


def test_split_is_disjoint_seeded_and_follows_the_seed_range():
    env = envs.make_env("deepcoder", isolation=ISO)
    train_names, val_names = {p["name"] for p in env.train}, {p["name"] for p in env.val}
    assert len(val_names) == 14 and not train_names & val_names and train_names | val_names == set(BY_NAME)
    # train.py's default seeds: validation 123 + i, training 10000 + s * P + i
    for seed in range(123, 123 + 64):
        env.reset(seed)
        assert env.problem["name"] in val_names
    drawn = set()
    for seed in range(10000, 10000 + 300):
        env.reset(seed)
        drawn.add(env.problem["name"])
    assert drawn <= train_names and len(drawn) > len(train_names) // 2
    other = envs.make_env("deepcoder", isolation=ISO, split_seed=1)
    assert {p["name"] for p in other.val} != val_names                          # the split depends on split_seed
    assert {p["name"] for p in envs.make_env("deepcoder", isolation=ISO).val} == val_names     # and only on it
    forced = envs.make_env("deepcoder", isolation=ISO, split="train", val_problems=5)
    forced.reset(123)
    assert forced.problem["name"] not in {p["name"] for p in forced.val} and len(forced.val) == 5
    assert envs.make_env("deepcoder", isolation=ISO, split="val").pool(99999) == env.val


def test_reward_rules_on_hand_built_answers():
    env = env_on("add_numbers")
    reward, info = answer(env, BY_NAME["add_numbers"]["reference"])
    assert (reward, info["success"], info["valid"], env.done) == (1.0, True, True, True)
    assert env.render() == "Correct!" and info["passed"] == info["total"] == 6
    _, reward, done, info = env.step("def add_numbers(a, b): return a + b")     # the episode is over: ignored
    assert (reward, info["valid"]) == (0.0, False)
    env = env_on("add_numbers")
    _, reward, done, info = env.step("   ")                                    # empty answer: invalid, no step
    assert (reward, done, info["valid"]) == (0.0, False, False)
    reward, info = answer(env, "def add_numbers(a, b): return 5")              # right only where a + b == 5
    assert reward == pytest.approx(1 / 6) and info["passed"] == 1
    env = env_on("add_numbers")
    reward, info = answer(env, "def add_numbers(a, b):\n    return a +")       # SyntaxError: 0 of 6
    assert (reward, info["passed"], env.done, env.success) == (0.0, 0, True, False)
    env = env_on("add_numbers")                                                # class Solution is accepted too
    reward, _ = answer(env, "class Solution:\n    def add_numbers(self, a, b):\n        return a + b")
    assert reward == 1.0


def test_code_fences_are_stripped_or_score_zero_like_the_official_code():
    ref = BY_NAME["shout"]["reference"]
    fenced = f"Here is my code:\n```python\n{ref}\n```\nIt prints the line in upper case."
    assert deepcoder.extract_code(fenced) == ref + "\n"
    assert deepcoder.extract_code(f"```py\n{ref}") == ref                      # unclosed fence: to the end
    assert deepcoder.extract_code(f"```\n{ref}\n```") == ref + "\n"
    assert deepcoder.extract_code("```cpp\nint main() {}\n```") == "```cpp\nint main() {}\n```"
    assert deepcoder.extract_code(fenced, strip_fences=False) == fenced
    assert answer(env_on("shout"), fenced)[0] == 1.0
    assert answer(env_on("shout", strip_fences=False), fenced)[0] == 0.0        # official: a SyntaxError


def test_double_bar_cuts_the_answer_as_rollout_parses_it():
    code = BY_NAME["contains"]["reference"]
    ok, actions = rollout.parse_response(f"plan</think><answer>\n{code}\n</answer>", True, 1)
    assert ok and actions == [code]                                            # whole program, stripped
    bad = code.replace("pattern in text", "pattern in text || False")
    ok, actions = rollout.parse_response(f"plan</think><answer>{bad}</answer>", True, 1)
    assert actions == [bad.split("||")[0].strip()]                              # official: cut at the first ||
    assert answer(env_on("contains"), actions[0])[0] == 0.0


def test_hostile_answers_score_zero_and_return():
    env_options = dict(timeout=1.0)
    for code in ("while True:\n    pass",
                 "import os\nos.system('echo hacked')",
                 "import os\nwhile True:\n    os.fork()",
                 f"print(open({str(PROJECT / 'agentic' / 'deepcoder_problems.py')!r}).read())",
                 "print('x' * 10**8)"):
        env = env_on("shout", **env_options)
        reward, info = answer(env, code)
        assert (reward, env.done, env.success) == (0.0, True, False), code


# reward hacking by lookup: find deepcoder_problems.py (the checkout, through /proc of the parent or a guessed
# path), load it, and answer every call from the hidden tests. Against a readable checkout this scores 1.0.
LOOKUP = f"""import os
def _problems():
    paths = [{str(PROJECT / 'agentic' / 'deepcoder_problems.py')!r}]
    for pid in os.listdir('/proc'):
        paths += [f'/proc/{{pid}}/cwd/agentic/deepcoder_problems.py', f'/proc/{{pid}}/root{PROJECT}/agentic/deepcoder_problems.py']
    for path in paths:
        try:
            scope = {{}}
            exec(open(path).read(), scope)
            return scope['PROBLEMS']
        except Exception:
            pass
    return []
def add_numbers(*args):
    for p in _problems():
        for a, expected in p['public'] + p['hidden']:
            if p['name'] == 'add_numbers' and tuple(a) == args:
                return expected
    return 'not found'
"""


@needs_bwrap
def test_reward_hacking_by_reading_the_problems_scores_zero():
    for audit in (True, False):                      # the audit hook off too: the boundary alone holds
        r = sandbox.run(LOOKUP, ["(2, 3)"], "function", "add_numbers", audit=audit)
        assert r.isolation == "bwrap" and r.outputs in (["not found"], [None]), r
    reward, info = answer(env_on("add_numbers"), LOOKUP)
    assert (reward, info["passed"], info["isolation"]) == (0.0, 0, "bwrap")
    assert answer(env_on("add_numbers"), BY_NAME["add_numbers"]["reference"])[0] == 1.0   # the honest way works


@pytest.mark.parametrize("report", ["[" * 200_000, json.dumps({"outputs": [["5"]] * 6, "errors": [None] * 6}),
                                    json.dumps({"outputs": [5] * 6, "errors": [None] * 6}),
                                    json.dumps({"outputs": ["5"] * 7, "errors": [None] * 7}), "{" * 100 + '"'])
def test_forged_reports_score_zero_and_never_raise(report):
    code = f"import os\nos.write(1, {(sandbox.REPORT_MARK + report).encode()!r})\nos._exit(0)"
    env = env_on("add_numbers")
    reward, info = answer(env, code)
    assert (reward, info["passed"], env.done) == (0.0, 0, True) and info["status"] == "no_report"


def test_grade_scores_zero_when_the_run_cannot_be_read(monkeypatch):
    def broken(*a, **kw):
        raise OSError("No space left on device")
    monkeypatch.setattr(sandbox, "run", broken)
    passed, total, result = deepcoder.grade("print(1)", BY_NAME["shout"], isolation=ISO)
    assert (passed, result.status) == (0, "error") and total > 0 and "No space" in result.detail
    for outputs in ([["x"]] * total, [7] * total, ["x"]):           # wrongly typed or sized: 0, no exception
        monkeypatch.setattr(sandbox, "run", lambda *a, o=outputs, **kw: sandbox.Result("ok", o, [None] * len(o), "",
                                                                                       0, 0.0, ""))
        assert deepcoder.grade("x", BY_NAME["shout"], isolation=ISO)[0] == 0


def test_fail_closed_without_bubblewrap(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    sandbox._probe.cache_clear()
    try:
        with pytest.raises(ValueError, match="isolation='process'") as e:
            envs.make_env("deepcoder")
        assert "\n" not in str(e.value)
        with pytest.raises(train.config.UsageError, match="--env-options: isolation='bwrap'"):
            train.config.resolve(["--preset", "smoke", "--env", "deepcoder"])
        env = envs.make_env("deepcoder", isolation="process")          # the weaker sandbox, asked for explicitly
        assert env.isolation == "process"
    finally:
        sandbox._probe.cache_clear()


def test_options_are_validated():
    for bad in (dict(split="test"), dict(val_problems=0), dict(val_problems=len(PROBLEMS)), dict(split_seed=-1),
                dict(strip_fences="yes"), dict(timeout=0), dict(timeout=True), dict(memory_mb=16),
                dict(user=""), dict(python=3), dict(max_tokens=0), dict(isolation="docker")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            envs.make_env("deepcoder", **{"isolation": ISO, **bad})
    with pytest.raises(ValueError, match="valid options"):
        envs.make_env("deepcoder", isolation=ISO, max_turns=2)                 # single turn, not an option
    env = envs.make_env("deepcoder", isolation=ISO, timeout=2.5)
    assert (env.limits.wall_s, env.limits.cpu_s, env.max_turns, env.max_actions) == (2.5, 3, 1, 1)


def test_scripted_policy_solves_sampled_instances():
    env = envs.make_env("deepcoder", timeout=10.0, isolation=ISO)
    for seed in (123, 124, 10000, 10001, 10002):
        env.reset(seed)
        _, reward, done, info = env.step(env.solution[0])
        assert (reward, info["success"]) == (1.0, True), (seed, env.problem["name"])


def test_train_smoke_run_on_deepcoder(tmp_path):
    d = train.main(["--preset", "smoke", "--env", "deepcoder", "--out-dir", str(tmp_path), "--name", "x",
                    "--no-progress", "--steps", "1", "--mi-every", "0", "--val-envs", "1",
                    "--env-options", json.dumps({"timeout": 1.0, "isolation": ISO})])
    rows = runlog.read_metrics(d)
    assert [r["step"] for r in rows] == [-1, 0] and "deepcoder" in envs.ENV_NAMES
    assert rows[-1]["rollout/num_trajectories"] == 4 and "val/success" in rows[-1]
    assert json.loads((d / "config.json").read_text())["env"]["env_isolation"] == ISO   # the log says which
