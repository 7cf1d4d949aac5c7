"""Tests for envs.py and sokoban_gen.py: the environment rules (as the official code plays them).

Each test checks a rule that training relies on: determinism per seed, push/wall mechanics on hand-built rooms,
reward values of scripted sequences, holes, slip frequencies, safe Countdown grading, solvability of generated
rooms/maps by an independent BFS over copy.deepcopy clones, instructions naming every action, bad input.
Run: .venv/bin/python -m pytest tests/test_envs.py -q
"""
import builtins
import copy
import json
import re
import signal
from contextlib import contextmanager

import numpy as np
import pytest

import envs
import tasks
import sokoban_gen
from envs import ENV_NAMES, make_env


# ------------------------------------------------------------------------------------------------ helpers
@contextmanager
def deadline(seconds=5):
    """Safety net: a grading call that hangs (e.g. evaluates 9**9**9**9) fails the test instead of hanging."""
    def boom(*_):
        raise TimeoutError("call did not return")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def sokoban_room(ascii_map):
    """A Sokoban env whose state is replaced by a hand-built room ('#' wall, '_' floor, 'O' target,
    'X' box, '√' box on target, 'P' player, 'S' player on target)."""
    env = make_env("sokoban")
    env.reset(0)
    rows = [r for r in ascii_map.strip().splitlines()]
    env.fixed = np.array([[sokoban_gen.WALL if ch == "#" else sokoban_gen.TARGET if ch in "O√S"
                           else sokoban_gen.FLOOR for ch in row] for row in rows], dtype=np.int8)
    env.shape = env.fixed.shape
    env.boxes = frozenset((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "X√")
    env.player = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "PS")
    return env


def grid(env):
    """The Grid Map part of an observation, with the reference's cell padding removed."""
    return env.render().split("Grid Map:\n")[1].replace(" ", "")


def bfs_steps(env, budget):
    """Fewest actions to success, searching over copy.deepcopy clones and env.step only; None if > budget."""
    frontier, seen = [env], {env.render()}
    for depth in range(1, budget + 1):
        nxt = []
        for e in frontier:
            for a in e.action_names:
                c = copy.deepcopy(e)
                _, _, done, info = c.step(a)
                if info["success"]:
                    return depth
                if not done and c.render() not in seen:
                    seen.add(c.render())
                    nxt.append(c)
        frontier = nxt
    return None


# ---------------------------------------------------------------------------------------- contract, seeds
@pytest.mark.parametrize("name", ENV_NAMES)
def test_same_seed_same_instance_and_variety_across_seeds(name):
    a, b = make_env(name), make_env(name)
    assert a.reset(7) == b.reset(7) and a.solution == b.solution
    firsts = {make_env(name).reset(s) for s in range(20)}
    assert len(firsts) >= 5, f"{name}: only {len(firsts)} distinct instances in 20 seeds"


@pytest.mark.parametrize("name", ENV_NAMES)
def test_contract_attributes_and_instructions_name_every_action(name):
    env = make_env(name)
    obs = env.reset(1)
    assert env.name == name and obs == env.render()
    for attr in ("max_turns", "max_actions_per_turn", "max_actions", "max_tokens"):
        assert isinstance(getattr(env, attr), int) and getattr(env, attr) >= 1
    text = env.instructions
    assert "<think>" in text and "</think>" in text and "<answer>" in text and "</answer>" in text
    assert "||" in text and f"at most {env.max_actions} " in text and f"{env.max_turns} turn" in text
    if name == "bandit":                       # per-instance arm names: shown in the observation
        assert len(env.action_names) == 2 and all(a in obs for a in env.action_names)
    elif env.action_names is not None:
        assert all(re.search(rf"\b{a}\b", text) for a in env.action_names)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_invalid_action_changes_nothing_and_deepcopy_clones(name):
    env = make_env(name)
    obs = env.reset(3)
    for bad in ("Jump", "", "   ", None, 42):
        if env.action_names is None and isinstance(bad, str) and bad.strip():
            continue                            # free-form envs accept any non-empty text
        out, reward, done, info = env.step(bad)
        assert (out, reward, done, info["valid"], info["actions"]) == (obs, 0.0, False, False, 0)
    action = env.solution[0]
    clone = copy.deepcopy(env)
    assert env.step(action)[:3] == clone.step(action)[:3]


def test_default_budgets_match_paper():
    budgets = {n: (e.max_turns, e.max_actions_per_turn, e.max_actions, e.max_tokens)
               for n in ENV_NAMES for e in [make_env(n)]}
    assert budgets == {"sokoban": (5, 2, 10, 120), "frozenlake": (5, 2, 10, 120), "countdown": (1, 1, 1, 100),
                       "metamathqa": (1, 1, 1, 100), "bandit": (1, 1, 1, 100),
                       "searchqa": (5, 1, 10, 300), "webshop": (9, 1, 9, 200), "deepcoder": (1, 1, 1, 300)}


# ------------------------------------------------------------------------------------------------ Sokoban
ROOM = """
#######
#P_X_O#
#__X__#
#_#O__#
#######
"""


def test_sokoban_walls_block_and_still_cost_a_step():
    env = sokoban_room(ROOM)
    before = env.render()
    obs, reward, done, info = env.step("Up")                     # wall above the player
    assert obs == before and reward == pytest.approx(-0.1) and not done
    assert info["valid"] and not info["effective"] and info["actions"] == 1


def test_sokoban_push_mechanics():
    env = sokoban_room(ROOM)
    env.step("right")                                            # lower-case is accepted
    assert env.player == (1, 2)
    _, reward, _, _ = env.step("Right")                          # push the box (1,3) -> (1,4)
    assert env.player == (1, 3) and (1, 4) in env.boxes and (1, 3) not in env.boxes
    assert reward == pytest.approx(-0.1)
    _, reward, done, info = env.step("Right")                    # (1,4) -> (1,5): onto a target, 1 of 2 boxes
    assert reward == pytest.approx(0.9) and not done and not info["success"]
    assert grid(env).splitlines()[1] == "#___P√#"
    state = env.render()
    _, reward, _, info = env.step("Right")                       # box against the wall: nothing moves
    assert env.render() == state and reward == pytest.approx(-0.1) and not info["effective"]
    env.step("Left")
    _, reward, done, info = env.step("Down")                     # (2,3) -> (3,3): last box onto its target
    assert env.player == (2, 3) and env.boxes == frozenset({(1, 5), (3, 3)})
    assert reward == pytest.approx(-0.1 + 1 + 10) and done and info["success"]


def test_sokoban_cannot_pull_and_box_blocks_box():
    env = sokoban_room("""
#######
#_XXP_#
#_O___#
#######
""")
    state = env.render()
    _, reward, _, info = env.step("Left")                        # two boxes in a row: blocked
    assert env.render() == state and not info["effective"] and reward == pytest.approx(-0.1)
    env.step("Right")                                            # walking away never drags a box
    assert env.player == (1, 5) and env.boxes == frozenset({(1, 2), (1, 3)})


def test_sokoban_box_off_target_and_solve_rewards():
    env = sokoban_room("""
######
#P√_O#
######
""")
    _, reward, done, _ = env.step("Right")                       # box leaves its target
    assert reward == pytest.approx(-1.1) and not done
    _, reward, done, info = env.step("Right")                    # box onto the other target: solved
    assert reward == pytest.approx(-0.1 + 1 + 10) and done and info["success"]
    assert "Boxes on target: (1, 4)" in env.render()
    obs, reward, done, info = env.step("Left")                   # after the end: ignored
    assert reward == 0.0 and done and not info["valid"]


def test_sokoban_scripted_solution_return_is_11_minus_steps():
    for seed in range(10):
        env = make_env("sokoban")
        env.reset(seed)
        rewards = [env.step(a)[1] for a in env.solution]
        assert env.done and env.success
        assert sum(rewards) == pytest.approx(11 - 0.1 * len(env.solution))


def test_sokoban_observation_format():
    env = make_env("sokoban")
    obs = env.reset(4)
    coords, grid_map = obs.split("\nGrid Map:\n")
    lines = coords.splitlines()
    assert lines[0] == "Coordinates:" and lines[1] == "Board size: 6 rows x 6 cols (zero-indexed)."
    assert {l.split(":")[0] for l in lines[2:]} <= {"Targets", "Boxes", "Boxes on target", "Player",
                                                    "Player on target"}
    rows = [r.replace(" ", "") for r in grid_map.splitlines()]
    assert len(rows) == 6 and all(len(r) == 6 for r in rows)
    assert rows[0] == rows[-1] == "######" and all(r[0] == r[-1] == "#" for r in rows)
    r, c = env.player
    assert rows[r][c] in "PS" and f"({r}, {c})" in coords


def test_sokoban_200_rooms_solvable_within_budget_by_bfs_over_clones():
    for seed in range(200):
        env = make_env("sokoban")
        env.reset(seed)
        assert not env.boxes <= {tuple(t) for t in np.argwhere(env.fixed == sokoban_gen.TARGET).tolist()}
        steps = bfs_steps(env, env.max_actions)
        assert steps is not None, f"seed {seed}: not solvable in {env.max_actions}"
        assert steps == len(env.solution)                      # the generator's BFS agrees


def test_sokoban_budget_check_rejects_long_rooms():
    # seeds whose first attempt was rejected: without the check they need more than the 10-action budget
    rejected = [s for s in range(300) if sokoban_gen.generate(s).attempt > 0]
    assert rejected
    for s in rejected:
        long = sokoban_gen.generate(s, check_budget=False)
        assert len(long.solution) > 10 and long.attempt == 0


def test_sokoban_options():
    env = make_env("sokoban", dim=7, num_boxes=2, max_actions=20, max_turns=10)
    env.reset(0)
    assert env.fixed.shape == (7, 7) and len(env.boxes) == 2
    assert bfs_steps(env, 20) == len(env.solution) <= 20


# --------------------------------------------------------------------------------------------- FrozenLake
def lake(rows, player=None):
    env = make_env("frozenlake")
    env.reset(0)
    env.holes = np.array([[ch == "O" for ch in r] for r in rows])
    env.start = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "S")
    env.goal = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "G")
    env.player, env.size = player or env.start, len(rows)
    return env


def test_frozenlake_hole_ends_episode_without_success():
    env = lake(["S_O", "___", "__G"])
    _, reward, done, info = env.step("Right")
    assert (reward, done, info["success"]) == (0.0, False, False)
    obs, reward, done, info = env.step("Right")                  # into the hole at (0, 2)
    assert reward == 0.0 and done and not info["success"]
    assert "Player in hole: (0, 2)" in obs and grid(env).splitlines()[0] == "__X"
    assert env.step("Down")[3]["valid"] is False                 # nothing happens after the end


def test_frozenlake_goal_reward_and_edges():
    env = lake(["S__", "_O_", "__G"])
    _, reward, _, info = env.step("Up")                          # against the edge: stays, still executed
    assert env.player == (0, 0) and reward == 0.0 and info["valid"] and not info["effective"]
    rewards = [env.step(a)[1] for a in ["Right", "Right", "Down", "Down"]]
    assert rewards == [0.0, 0.0, 0.0, 1.0] and env.done and env.success
    assert "Player on goal: (2, 2)" in env.render() and grid(env).splitlines()[2] == "__√"


def test_frozenlake_200_maps_have_safe_path_by_bfs_over_clones():
    for seed in range(200):
        env = make_env("frozenlake")
        env.reset(seed)
        assert env.start != env.goal and not env.holes[env.start] and not env.holes[env.goal]
        steps = bfs_steps(env, 4 * 4)
        assert steps is not None and steps == len(env.solution)


def test_frozenlake_slip_frequencies_never_backwards():
    slip, counts, n = 0.3, {"same": 0, "perp": 0, "back": 0}, 0
    opposite = {"Left": "Right", "Right": "Left", "Up": "Down", "Down": "Up"}
    seed = 0
    while n < 4000:
        env = make_env("frozenlake", size=6, p_frozen=1.0, slip=slip)
        env.reset(seed)
        seed += 1
        for k in range(40):
            action = env.action_names[k % 4]
            before = env.player
            _, _, done, info = env.step(action)
            d = info["direction"]
            dr, dc = envs.FL_MOVES[d]                            # the player moved the executed way
            assert env.player == (min(max(before[0] + dr, 0), 5), min(max(before[1] + dc, 0), 5))
            counts["same" if d == action else "back" if d == opposite[action] else "perp"] += 1
            n += 1
            if done:
                break
    assert counts["back"] == 0
    assert abs(counts["same"] / n - (1 - slip)) < 0.03 and abs(counts["perp"] / n - slip) < 0.03


def test_frozenlake_common_random_numbers_and_deterministic_default():
    actions = ["Right", "Down", "Left", "Up"] * 3
    runs = []
    for seed in (5, 5):
        env = make_env("frozenlake", slip=0.5, p_frozen=1.0)
        env.reset(seed)
        runs.append([env.step(a)[3]["direction"] for a in actions if not env.done])
    assert runs[0] == runs[1] and any(r != a for r, a in zip(runs[0], actions))
    env = make_env("frozenlake")
    for seed in range(30):
        env.reset(seed)
        assert all(not env.step(a)[3]["slipped"] for a in actions if not env.done)


# ---------------------------------------------------------------------------------------------- Countdown
@pytest.mark.parametrize("answer, reward", [
    ("2 + 5 - 3", 1.0), ("(5 - 3) * 2", 1.0), (" 5-3*2 ", 0.1), ("(2 + 5) * 3", 0.1),
    ("2 + 5", 0.0), ("2 + 5 - 3 - 3", 0.0), ("2 + 5 - 3 = 4", 0.0), ("2 + 5 - 4", 0.0), ("", 0.0),
    ("2.0 + 5 - 3", 0.0), ("5 // 2 + 3", 0.0), ("2 ** 5 - 3", 0.0), ("-(3 - 5) + 2", 1.0),
    ("-2 + 5 + 3", 0.1), ("2 * 5 - 3 * 2", 0.0), ("5 - (3 - 2)", 1.0),
])
def test_countdown_grading_worked_examples(answer, reward):
    assert tasks.countdown_reward(answer, [3, 5, 2], 4) == reward


def test_countdown_exact_arithmetic_and_division_by_zero():
    assert tasks.countdown_reward("5 * (5 - 1 / 5)", [1, 5, 5, 5], 24) == 1.0   # fractional intermediate
    assert tasks.countdown_reward("1 / (5 - 5)", [5, 5, 1], 3) == 0.1           # right numbers, no value
    assert tasks.countdown_reward("-3 + 10", [3, 10], 7) == 1.0                   # unary minus allowed


@pytest.mark.parametrize("hostile, nums", [
    ("__import__('os').system('echo pwned')", [1]), ("9**9**9**9", [9, 9, 9, 9]), ("9 ** 9 ** 9 ** 9", [9] * 4),
    ("1" * 100_000, [1]), ("(" * 150 + "1" + ")" * 150, [1]), ("(" * 99 + "1" + ")" * 99, [2]),
    ("-" * 190 + "1", [2]),
    ("open('/etc/passwd').read()", []), ("lambda: 1", [1]), ("[1, 2]", [1, 2]), ("0x10", [16]), ("1_0", [10]),
    ("1e9", [1]), ("True + 1", [1]), ("().__class__", []), ("1 if 1 else 2", [1, 1, 2]),
])
def test_countdown_hostile_strings_score_zero_without_eval(hostile, nums, monkeypatch):
    def no_eval(*_):
        raise AssertionError("eval/exec must never be called")
    monkeypatch.setattr(builtins, "eval", no_eval)
    monkeypatch.setattr(builtins, "exec", no_eval)
    with deadline(5):
        assert tasks.countdown_reward(hostile, nums, 1) == 0.0


def test_countdown_generator_reachable_targets():
    for ops in ("+-*/", "+-"):
        rng = np.random.default_rng(0)
        for _ in range(200):
            nums, target, expr = tasks.countdown_instance(rng, ops)
            assert 3 <= len(nums) <= 4 and all(1 <= n <= 100 for n in nums) and 1 <= target <= 100
            assert tasks.countdown_reward(expr, nums, target) == 1.0
            assert set(re.sub(r"[\d\s()]", "", expr)) <= set(ops)


def test_countdown_env_episode_and_data_file(tmp_path):
    env = make_env("countdown")
    obs = env.reset(3)
    assert obs == f"Target: {env.target}, nums: {env.nums}"
    _, reward, done, info = env.step(env.solution[0])
    assert (reward, done, info["success"]) == (1.0, True, True)
    env.reset(3)
    _, reward, done, info = env.step(" + ".join(map(str, env.nums)) + " + 0")
    assert (reward, done, info["success"]) == (0.0, True, False)
    path = tmp_path / "cd.jsonl"
    rows = [{"nums": [3, 5, 2], "target": 4}, {"nums": [10, 2, 7, 1], "target": 13}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = make_env("countdown", data_path=str(path))
    assert env.reset(5) == "Target: 13, nums: [10, 2, 7, 1]"        # instance = seed mod len(data)
    assert env.step("10 + 2 * 7 - 1")[1] == 0.1 and env.reset(4) == "Target: 4, nums: [3, 5, 2]"
    env = make_env("countdown", data_path=str(path), ops="+-")  # reference filter: signed sums only
    assert {env.reset(s) for s in range(4)} == {"Target: 4, nums: [3, 5, 2]"}
    assert tasks.countdown_reward(env.solution[0], [3, 5, 2], 4) == 1.0
    with pytest.raises(ValueError, match="ops"):
        make_env("countdown", data_path=str(path), ops="+-*")


# --------------------------------------------------------------------------------------------- MetaMathQA
FORMULAS = {                                      # independent reading of each built-in template
    "apples": lambda a, b, c: a + b * c, "pages": lambda a, b, c: a * b + c,
    "stickers": lambda t, a, b: t - a * b, "tank": lambda t, b, c: (t - b) // c,
    "Pencils": lambda p, c, paid: paid - p * c, "rectangle": lambda l, w: 2 * (l + w),
}


def test_metamathqa_builtin_problems_have_exact_answers():
    seen = set()
    for seed in range(120):
        env = make_env("metamathqa")
        q = env.reset(seed)
        key = next(k for k in FORMULAS if k in q)
        seen.add(key)
        assert str(FORMULAS[key](*map(int, re.findall(r"\d+", q)))) == env.label
    assert seen == set(FORMULAS)


def test_metamathqa_matching_and_halving_rewards():
    assert tasks.answers_match(" 2 1 ", "21", numeric=False) and tasks.answers_match("ABC", "abc", False)
    assert tasks.answers_match("21.0", "21") and not tasks.answers_match("21.0", "21", numeric=False)
    assert tasks.answers_match("1,000", "1000") and tasks.answers_match("1/2", "0.5")
    assert not tasks.answers_match("1,2", "12") and not tasks.answers_match("22", "21")
    env = make_env("metamathqa", max_turns=3, max_actions=3)
    env.reset(0)
    steps = [env.step(a) for a in ("-1", "junk", env.label)]
    assert [s[1] for s in steps] == [0.0, 0.0, 0.25] and [s[2] for s in steps] == [False, False, True]
    assert steps[2][3]["success"]
    env.reset(0)
    steps = [env.step("-1") for _ in range(3)]
    assert [s[2] for s in steps] == [False, False, True] and not steps[2][3]["success"]
    assert [s[0] for s in steps] == ["Incorrect. Please think again."] * 2 + ["Incorrect."]   # no retry offered at the end
    env = make_env("metamathqa")
    env.reset(1)
    assert env.step(env.label)[1:3] == (1.0, True)
    env.reset(1)
    assert env.step("-1")[0] == "Incorrect."                        # single turn: the episode is over


def test_metamathqa_hostile_numbers_are_bounded():
    """Numbers a policy can sample in a few tokens must not stall training (Fraction('1e999999999') would build a
    billion-digit integer): out-of-range exponents and overlong numbers never match, in microseconds."""
    import time
    t0 = time.perf_counter()
    for hostile in ("1e999999999", "1e20000000", "-1E+99999999", "9" * 5000, "1e999999999/3"):
        assert not tasks.answers_match(hostile, "12") and not tasks.answers_match("12", hostile)
        assert not tasks.answers_match(hostile, hostile + "0")
    assert time.perf_counter() - t0 < 1.0                            # was 33 s for one 1e20000000
    assert tasks.answers_match("1e3", "1000") and tasks.answers_match("2.5E-1", "1/4")
    assert tasks.answers_match("1e100", "1" + "0" * 100) is False    # 101 characters: beyond the length bound


def test_metamathqa_data_file(tmp_path):
    rows = [{"query": "What is 3*6?", "response": "3*6 = 18.\nThe answer is: 18"},
            {"query": "No label here", "response": "I do not know"}]
    path = tmp_path / "mm.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = make_env("metamathqa", data_path=str(path))
    assert env.reset(0) == "What is 3*6?" and env.step(" 18 ")[1] == 1.0
    path.write_text(json.dumps([rows[1]]))
    path = path.rename(tmp_path / "mm.json")
    with pytest.raises(ValueError, match="The answer is"):
        make_env("metamathqa", data_path=str(path))
    path.write_text("[{not json")
    with pytest.raises(ValueError, match="data_path"):
        make_env("metamathqa", data_path=str(path))


# ------------------------------------------------------------------------------------------------- Bandit
def test_bandit_arms_payouts_and_success():
    pairs = set(tasks.ARM_PAIRS["train"])
    orders, high_pay = set(), []
    for seed in range(2000):
        env = make_env("bandit")
        env.reset(seed)
        assert (env.low, env.high) in pairs and set(env.action_names) == {env.low, env.high}
        orders.add(env.action_names[0] == env.low)
        arm = env.high if seed % 2 else env.low.upper()            # case-insensitive
        _, reward, done, info = env.step(arm)
        assert done and info["valid"] and info["success"] == bool(seed % 2)
        if seed % 2:
            assert reward in (0.0, 1.0)
            high_pay.append(reward)
        else:
            assert reward == 0.1
    assert orders == {True, False}
    assert abs(np.mean(high_pay) - 0.25) < 0.04                     # 1000 draws, sd ~0.014


def test_bandit_shared_prompt_and_payout_per_seed():
    def payouts(offset):
        out = []
        for seed in range(200):
            env = make_env("bandit", split="test", payout_offset=offset)
            env.reset(seed)
            assert (env.low, env.high) in tasks.ARM_PAIRS["test"]
            out.append(env.step(env.high)[1])
        return out
    assert payouts(0) == payouts(0) and payouts(0) != payouts(1)


def test_bandit_members_share_the_prompt_but_not_the_coin():
    flips = []
    for seed in range(100):
        members = [make_env("bandit") for _ in range(8)]
        obs = {env.reset(seed, member=k) for k, env in enumerate(members)}
        assert len(obs) == 1                                          # one prompt per group
        flips.append([env.step(env.high)[1] for env in members])
        again = make_env("bandit")
        again.reset(seed, member=3)
        assert again.step(again.high)[1] == flips[-1][3]              # deterministic per (seed, member)
    flips = np.array(flips)
    assert 0.2 < flips.mean() < 0.3
    assert (flips.std(axis=1) > 0).mean() > 0.7       # P(8 equal coins) = 0.75^8 + 0.25^8 ~ 0.10
    for env in ("sokoban", "frozenlake"):                             # everything else: common random numbers
        assert make_env(env).reset(5, member=0) == make_env(env).reset(5, member=4)


def test_bandit_deterministic_payout_is_success_and_template_gets_half():
    """payout=deterministic: reward 1 exactly when the high-risk arm is chosen, 0 otherwise, the same for every
    group member; 'always the first-listed arm' (an input-agnostic template) succeeds on about half the seeds."""
    first_arm_wins = []
    for seed in range(2000):
        members = [make_env("bandit", payout="deterministic") for _ in range(4)]
        for k, env in enumerate(members):
            env.reset(seed, member=k)
        assert [m.step(m.high)[1] for m in members[:2]] == [1.0, 1.0]
        assert [m.step(m.low)[1] for m in members[2:]] == [0.0, 0.0]
        env = make_env("bandit", payout="deterministic")
        env.reset(seed)
        _, reward, _, info = env.step(env.action_names[0])
        assert reward == float(info["success"])
        first_arm_wins.append(reward)
    assert abs(np.mean(first_arm_wins) - 0.5) < 0.04                # 2000 fair coins, sd ~0.011


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("name, options, match", [
    ("sokoban", {"num_boxes": 15}, "num_boxes"), ("sokoban", {"dim": 3}, "dim"),
    ("sokoban", {"dim": (6, 6, 6)}, "dim"), ("sokoban", {"max_actions": 0}, "max_actions"),
    ("sokoban", {"check_budget": "yes"}, "check_budget"), ("sokoban", {"slip": 0.1}, "valid options"),
    ("frozenlake", {"size": 1}, "size"), ("frozenlake", {"p_frozen": 0.0}, "p_frozen"),
    ("frozenlake", {"p_frozen": 1.5}, "p_frozen"), ("frozenlake", {"slip": -0.1}, "slip"),
    ("frozenlake", {"slip": 2}, "slip"), ("frozenlake", {"max_turns": 2.5}, "max_turns"),
    ("countdown", {"ops": "+^"}, "ops"), ("countdown", {"ops": ""}, "ops"),
    ("countdown", {"max_turns": 3}, "valid options"), ("countdown", {"data_path": "/nonexistent.jsonl"}, "data_path"),
    ("metamathqa", {"numeric_match": 1}, "numeric_match"), ("metamathqa", {"data_path": __file__}, "data_path"),
    ("bandit", {"split": "val"}, "split"), ("bandit", {"payout_offset": -1}, "payout_offset"),
    ("bandit", {"payout": "fixed"}, "payout"),
])
def test_impossible_options_raise_value_error_naming_them(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_env(name, **options)


def test_unknown_env_and_bad_seed():
    with pytest.raises(ValueError, match="sokoban, frozenlake, countdown, metamathqa, bandit"):
        make_env("minecraft")
    env = make_env("SOKOBAN")
    for seed in (-1, 1.5, "3", None, True):
        with pytest.raises(ValueError, match="seed"):
            env.reset(seed)


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path):
    try:
        import pyarrow  # noqa: F401
        pytest.skip("pyarrow installed: parquet files are read")
    except ImportError:
        pass
    path = tmp_path / "cd.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="pyarrow"):
        make_env("countdown", data_path=str(path))


@pytest.mark.parametrize("row", [{"nums": [], "target": 3}, {"nums": ["a", 2], "target": 3},
                                 {"nums": [1, 2], "target": "x"}, {"nums": 5, "target": 3},
                                 {"nums": [1.5, 2], "target": 3}, {"nums": [1, True], "target": 3}])
def test_countdown_data_rows_with_wrong_types_name_file_and_row(tmp_path, row):
    path = tmp_path / "cd.jsonl"
    path.write_text(json.dumps({"nums": [1, 2], "target": 3}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"cd.jsonl', row 1: need nums"):
        make_env("countdown", data_path=str(path))


def test_filter_cli_refuses_malformed_rewards(capsys):
    import filter as rvfilter
    for bad in ("1,0;1", "a,b", "1;0", "1,nan;0,1"):
        with pytest.raises(SystemExit) as exc:
            rvfilter.main(["--rewards", bad])
        assert exc.value.code == 2 and "--rewards" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- CLI
def test_cli_show_and_play(capsys, monkeypatch):
    envs.main(["frozenlake", "--seed", "2", "--show"])
    out = capsys.readouterr().out
    assert "Valid actions: Left, Down, Right, Up" in out and "Grid Map:" in out
    env = make_env("sokoban")
    env.reset(3)
    plan = [" || ".join(env.solution[i:i + 2]) for i in range(0, len(env.solution), 2)]
    lines = iter(["Jump"] + plan)                                # an invalid first turn, then the plan
    monkeypatch.setattr(builtins, "input", lambda *_: next(lines))
    envs.main(["sokoban", "--seed", "3", "--play"])
    assert "success True" in capsys.readouterr().out


# --------------------------------------------------------------------------------- your own environment (issue 25)
# The example of docs/guide.md ("Your own environment"), written outside the repository by the tests.
USER_ENV = '''
import numpy as np
from env_base import Env


class Guess(Env):
    """Guess a number in 0..hi; each wrong guess is told whether it was too low or too high."""
    name = "guess"
    noun = "answer"

    def __init__(self, hi=9, max_turns=4, max_actions_per_turn=1, max_actions=4, max_tokens=60):
        super().__init__(max_turns, max_actions_per_turn, max_actions, max_tokens)
        if not isinstance(hi, int) or hi < 1:
            raise ValueError(f"hi must be an integer >= 1, got {hi!r}")
        self.hi = hi
        self.instructions = f"Guess my number between 0 and {hi}.\\n" + self.protocol("4")

    def _reset(self, seed):
        self.target, self.hint = int(np.random.default_rng(seed).integers(self.hi + 1)), "Make a guess."

    def _step(self, action):
        if not action.strip().isdigit():
            self.hint = f"{action!r} is not a number."
            return 0.0, {}
        guess = int(action)
        self.done = self.success = guess == self.target
        self.hint = "Right!" if self.success else f"{guess} is too {'low' if guess < self.target else 'high'}."
        return float(self.success), {}

    def render(self):
        return self.hint
'''


def write_user_env(directory, name="my_guess.py"):
    path = directory / name
    path.write_text(USER_ENV)
    return path


def test_an_env_defined_outside_the_repository_loads_by_file_and_by_module(tmp_path, monkeypatch):
    path = write_user_env(tmp_path)
    env = make_env(f"{path}:Guess", hi=3)
    assert env.reset(7) == "Make a guess." and env.name == "guess"
    target = env.target
    wrong = (target + 1) % 4
    obs, r, done, info = env.step(str(wrong))
    assert (r, done, info["valid"], info["success"]) == (0.0, False, True, False) and "too" in obs
    obs, r, done, info = env.step(str(target))
    assert (obs, r, done, info["success"]) == ("Right!", 1.0, True, True)
    assert make_env(f"{path}:Guess", hi=3).reset(7) == make_env(f"{path}:Guess", hi=3).reset(7)
    assert copy.deepcopy(env).target == target
    assert envs.env_class(f"{path}:Guess") is envs.env_class(f"{path}:Guess")      # the file runs once
    monkeypatch.syspath_prepend(str(tmp_path))                                      # a module on the path
    assert make_env("my_guess:Guess").reset(7) == "Make a guess."
    monkeypatch.chdir(tmp_path)                                                     # relative file path
    assert make_env("my_guess.py:Guess", hi=3).reset(7) == "Make a guess."


def test_a_bad_user_env_is_one_clear_error(tmp_path):
    path = write_user_env(tmp_path)
    (tmp_path / "broken.py").write_text("import nonexistent_package_xyz\n")
    (tmp_path / "partial.py").write_text("class Half:\n    name = 'half'\n    def __init__(self):\n        pass\n")
    for spec, match in [(f"{path}:Gues", "has no class 'Gues'"), (f"{tmp_path}/nope.py:Guess", "does not exist"),
                        (f"{tmp_path}/broken.py:X", "ModuleNotFoundError"), ("no_such_module_xyz:X", "PYTHONPATH"),
                        (f"{tmp_path}/partial.py:Half", "misses"), (f"{path}:", "module:Class")]:
        with pytest.raises(ValueError, match=match) as e:
            make_env(spec)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['size'\]"):
        make_env(f"{path}:Guess", size=3)
    with pytest.raises(ValueError, match="hi must be"):                              # the env's own check
        make_env(f"{path}:Guess", hi=0)


def test_envs_cli_shows_a_user_env(tmp_path, capsys):
    path = write_user_env(tmp_path)
    envs.main([f"{path}:Guess", "--seed", "3", "-o", "hi=5"])
    out = capsys.readouterr().out
    assert "Guess my number between 0 and 5." in out and "Make a guess." in out
    with pytest.raises(SystemExit):
        envs.main(["chess"])
    assert "module:Class" in capsys.readouterr().err
