"""experiments/agnostic.py: the best fixed action sequence of a map set, against brute force over every sequence."""
import itertools
import sys
from pathlib import Path

import pytest

import envs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import agnostic  # noqa: E402


def replay(seq, seeds, options):
    """Successes of one fixed sequence, each map played from reset on a fresh env."""
    wins = 0
    for s in seeds:
        e = envs.make_env("frozenlake", **options)
        e.reset(s)
        for a in seq:
            e.step(a)
        wins += e.success
    return wins


@pytest.mark.parametrize("options", [{"max_turns": 2}, {"max_turns": 2, "slip": 0.3}, {"max_turns": 2, "size": 3}])
def test_best_fixed_sequence_equals_brute_force(options):
    seeds, h = list(range(40, 52)), 4
    seq, wins, n = agnostic.best_fixed_sequence("frozenlake", seeds, options)
    assert n == len(seeds) and len(seq) <= h == agnostic.horizon_of(envs.make_env("frozenlake", **options))
    scores = {s: replay(s, seeds, options) for s in itertools.product(envs.FrozenLake.action_names, repeat=h)}
    assert wins == max(scores.values()) == replay(seq, seeds, options)
    assert 0 < wins < n                              # the set is neither trivial nor solvable without the map
    first_best = next(s for s, w in scores.items() if w == wins)      # ties: first in action-name order
    assert list(first_best[:len(seq)]) == seq


def test_a_map_set_one_sequence_solves_is_solved_and_bad_input_is_refused():
    seq, wins, n = agnostic.best_fixed_sequence("frozenlake", [7], {"max_turns": 3})
    assert wins == n == 1 and replay(seq, [7], {"max_turns": 3}) == 1
    with pytest.raises(ValueError, match="no instances"):
        agnostic.best_fixed_sequence("frozenlake", [])
    with pytest.raises(ValueError, match="no discrete action names"):
        agnostic.best_fixed_sequence("countdown", [0])
    assert agnostic.parse_seeds("3:6") == [3, 4, 5] and agnostic.parse_seeds("1,9") == [1, 9]
