"""The environment protocol every RAGEN-2 environment shares (envs.py: grid games + registry; tasks.py: single-turn).

What it implements: `Env`, the base class (budgets, case-insensitive action matching, step bookkeeping, the shared
part of the instructions: actions, the `<think>...</think><answer>...</answer>` format, the `||` separator and the
budgets), and the option checks every environment uses. It sits below envs.py and tasks.py so that the imports run
one way (envs -> tasks -> env_base), with no cycle.

Contract (CONTRIBUTING.md): a subclass sets `name`, `action_names`, `self.instructions`, and implements
`_reset(seed)`, `_step(action) -> (reward, info_extra)` and `render()`. Left out: anything env-specific.
Run: imported only (`python envs.py NAME --show` shows an environment).
"""
from __future__ import annotations

import numpy as np

FORMAT = "<think> [your reasoning] </think> <answer> [your answer] </answer>"


# ----------------------------------------------------------------------------------------------- validation
def _int_opt(flag, value, lo=1):
    """An integer option >= lo (bools rejected), else ValueError naming the option."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{flag} must be an integer >= {lo}, got {value!r}")
    return int(value)


def _prob_opt(flag, value, lo_open):
    """A probability option in [0, 1], or in (0, 1] when lo_open."""
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    if not ok or not (0.0 < value <= 1.0 if lo_open else 0.0 <= value <= 1.0):
        raise ValueError(f"{flag} must be a number in {'(0, 1]' if lo_open else '[0, 1]'}, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------------------- base
class Env:
    """Shared protocol: budgets, action matching, the step bookkeeping and the instruction text.

    A subclass sets `name`, `action_names`, `self.instructions`, and implements `_reset(seed)` (build the
    instance), `_step(action) -> (reward, info_extra)` (one VALID action; sets self.done / self.success) and
    `render()`.
    """
    name = "env"
    action_names = None        # list of valid action strings, or None when any non-empty answer is accepted
    noun = "action"            # what one step is called in the instructions ("action" / "answer")

    def __init__(self, max_turns, max_actions_per_turn, max_actions, max_tokens):
        self.max_turns = _int_opt("max_turns", max_turns)
        self.max_actions_per_turn = _int_opt("max_actions_per_turn", max_actions_per_turn)
        self.max_actions = _int_opt("max_actions", max_actions)
        self.max_tokens = _int_opt("max_tokens", max_tokens)        # length hint in words (rollout prompt)
        self.seed, self.done, self.success, self.num_actions = None, False, False, 0
        self.solution = None   # a list of actions that solves the instance from reset, when known (demos, tests)

    def protocol(self, example: str) -> str:
        """The part of the instructions every env shares: actions, answer format, separator, budgets."""
        k, n, t = self.max_actions_per_turn, self.max_actions, self.max_turns
        lines = []
        if self.action_names:
            lines.append(f"Valid actions: {', '.join(self.action_names)} (case-insensitive); "
                         "an invalid action is ignored.")
        lines.append(f"Answer format: {FORMAT}.")
        if k > 1:
            lines.append(f"You may give up to {k} {self.noun}s per turn, separated by ' || ', "
                         f"e.g. <answer>{example}</answer>.")
        else:
            lines.append(f"Give exactly one {self.noun} per turn (do not join several with ' || '), "
                         f"e.g. <answer>{example}</answer>.")
        lines.append(f"The episode allows at most {n} {self.noun}{'s' if n > 1 else ''} "
                     f"over at most {t} turn{'s' if t > 1 else ''}.")
        return "\n".join(lines)

    def reset(self, seed, member: int = 0) -> str:
        """Start a new episode; the same seed always gives the same instance and the same observation text.

        member: the env's index inside its rollout group. Instances and transitions depend on the seed only
        (common random numbers across the group); the one exception is Bandit's payout draw, which also uses
        `member` so that group members share the prompt but not the coin flip (see tasks.Bandit)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if isinstance(member, bool) or not isinstance(member, (int, np.integer)) or member < 0:
            raise ValueError(f"member must be a non-negative integer, got {member!r}")
        self.seed, self.member, self.done, self.success, self.num_actions = int(seed), int(member), False, False, 0
        self._reset(self.seed)
        return self.render()

    def step(self, action: str):
        """Execute one action string. Returns (obs, reward, done, info); info has valid, success, effective,
        actions (= number of executed actions so far). Invalid input never raises and changes nothing."""
        if self.seed is None:                              # a programming error, not bad model output
            raise RuntimeError(f"{self.name}: call reset(seed) before step()")
        key = action.strip() if isinstance(action, str) else ""
        if self.action_names is not None:                  # discrete actions: case-insensitive lookup
            key = {a.lower(): a for a in self.action_names}.get(key.lower(), "")
        if self.done or not key:                           # invalid (or the episode is already over)
            return self.render(), 0.0, self.done, self._info(valid=False, effective=False)
        reward, extra = self._step(key)                   # valid: the env executes it (it counts as a step)
        self.num_actions += 1
        return self.render(), float(reward), self.done, self._info(valid=True, **extra)

    def _info(self, **kw):
        """info dict of a step: success so far, executed-action count, plus valid/effective and extras."""
        return {"success": self.success, "actions": self.num_actions, **kw}
