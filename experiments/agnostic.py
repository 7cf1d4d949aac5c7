"""The input-agnostic baseline of a map set: the best success any fixed action sequence reaches on it.

A policy whose reasoning ignores its input (template collapse, paper §3) can at best play one action sequence on
every instance. On the Bandit that ceiling is 50 % (always the first-listed arm); on FrozenLake it is the success
of the best fixed move sequence over the validation maps, so a success above it needs the map. This module finds
that sequence exactly: a depth-first search over the prefix tree of sequences of length `horizon` (the episode's
action budget: min(turns x actions per turn, max actions)), each node holding a copy of every instance's env, with
branch-and-bound (a prefix whose successes plus its still-running instances cannot beat the best so far is cut).
It steps the real env classes (envs.make_env), so the rules (edges, holes, slips drawn per seed) are the
rollout's. A longer sequence never succeeds less than its prefix (an episode that ended stays ended), so only full
length sequences are searched.

Leaves out: sequences that adapt to the observation (that would be a policy, not a template); envs whose action
space is not a small list of names (Countdown, MetaMathQA: their input-agnostic answer is a constant string).

Run: python experiments/agnostic.py --env frozenlake --seeds 5000:5064 [--env-options '{"slip": 0.2}']
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))       # envs lives at the repository root
import envs  # noqa: E402


def horizon_of(env) -> int:
    """The most actions one episode of `env` can execute: min(turns x actions per turn, the episode's budget)."""
    return min(env.max_turns * env.max_actions_per_turn, env.max_actions)


def best_fixed_sequence(env_name: str, seeds, options: dict | None = None, horizon: int | None = None):
    """(best sequence, its number of successes, number of instances) over the instances `seeds` of env_name.

    Ties go to the sequence first in the order of env.action_names (depth-first, lexicographic)."""
    options = options or {}
    roots = []
    for s in seeds:
        e = envs.make_env(env_name, **options)
        e.reset(int(s))
        roots.append(e)
    if not roots:
        raise ValueError("seeds: no instances given")
    actions = roots[0].action_names
    if not actions:
        raise ValueError(f"{env_name}: no discrete action names, no fixed move sequence to search")
    horizon = horizon_of(roots[0]) if horizon is None else horizon
    best = {"seq": [], "wins": sum(e.success for e in roots)}

    def search(prefix, running, wins):              # running: envs not yet done; wins: successes so far
        if wins > best["wins"]:
            best["seq"], best["wins"] = list(prefix), wins
        if len(prefix) == horizon or not running or wins + len(running) <= best["wins"]:
            return                                   # bound: even winning every running instance does not beat it
        for a in actions:
            nxt, w = [], wins
            for e in running:
                c = copy.deepcopy(e)
                c.step(a)
                if c.done:
                    w += c.success
                else:
                    nxt.append(c)
            search(prefix + [a], nxt, w)

    search([], [e for e in roots if not e.done], best["wins"])
    return best["seq"], best["wins"], len(roots)


def parse_seeds(text: str) -> list[int]:
    """'1,2,3', or what evaluate.py's --seeds takes: 'START:END' (END excluded) or 'START' (64 seeds)."""
    if "," in text:
        return [int(x) for x in text.split(",") if x]
    import evaluate
    return evaluate.parse_seeds(text, None)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="frozenlake")
    ap.add_argument("--env-options", default="{}", help="JSON, as train.py's --env-options")
    ap.add_argument("--seeds", default="5000:5064", help="instances: START:END (END excluded), START (64 seeds) or "
                    "a,b,c")
    ap.add_argument("--horizon", type=int, default=None, help="sequence length (default: the episode's budget)")
    a = ap.parse_args(argv)
    try:
        options = json.loads(a.env_options)
        seeds = parse_seeds(a.seeds)
    except ValueError as e:
        ap.error(f"--env-options / --seeds: {e}")
    seq, wins, n = best_fixed_sequence(a.env, seeds, options, a.horizon)
    print(json.dumps({"env": a.env, "env_options": options, "seeds": a.seeds, "sequence": seq, "successes": wins,
                      "instances": n, "success": wins / n}))


if __name__ == "__main__":
    main()
