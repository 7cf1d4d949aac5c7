"""The text environments of RAGEN-2 and their registry: Sokoban, FrozenLake (here), Countdown, MetaMathQA, Bandit
(tasks.py), and offline minis of the paper's agentic testbeds: SearchQA, WebShop and
DeepCoder (agentic/: searchqa.py, webshop.py, deepcoder.py; programs run in agentic/sandbox.py).

What it implements (paper section 4 / App. B, and the official code, mll-lab-nu/RAGEN):
  * sokoban    6x6 room (outer ring wall), 1 box, actions Up/Down/Left/Right with push mechanics; rewards -0.1 per
               executed action (bumps included), +1 box onto a target, -1 box off a target, +10 when every box
               is on a target (done, success). Rooms come from sokoban_gen.py (reverse play) and are solvable
               within the action budget. 5 turns x <= 2 actions, 10 actions per episode.
  * frozenlake 4x4 lake, frozen-tile probability 0.9, random distinct start and goal joined by a safe path.
               Reward 1 at the goal; a hole ends the episode (no success). `slip` = probability of sliding to
               one of the two perpendicular directions (never backwards), default 0. 5 x 2 actions, 10 in all.
  * countdown  3-4 numbers and a reachable target; the answer is an arithmetic expression read by a safe
               `ast` walker (never `eval`): 1.0 correct, 0.1 right numbers but wrong value, 0 otherwise.
  * metamathqa a MetaMathQA-format file (answer after "The answer is:") or built-in word problems with exact
               answers; normalised exact match; reward 1/2^attempt. 1 turn, 1 answer by default.
  * bandit     two arms named after an occupational pair: the low-risk arm pays 0.1, the high-risk arm pays
               1.0 with probability 0.25 (else 0). Success = the high-risk arm was chosen.
Observations are text: a "Coordinates:" block and a "Grid Map:" block for the grid games, as in the reference's
`grid_coord` format. `instructions` (the env part of the system message) states the rules, the symbol legend,
the action names, the `<think>...</think><answer>...</answer>` format, the `||` separator and the budgets.

Your own environment (docs/guide.md, "Your own environment"): `make_env("my_module:MyEnv")` or
`make_env("path/to/file.py:MyEnv")` imports the class (a file once per process) and checks it has the protocol
below (`PROTOCOL`); every place that takes an env name (train.py --env, evaluate.py, `python envs.py`, --resume, the
experiment drivers) goes through `make_env`, so a user env needs no edit of this project.

Contract (CONTRIBUTING.md): `make_env(name, **options)`, `ENV_NAMES` (the built-ins); an Env has `name`, `instructions`,
`action_names` (valid action strings, or None for free-form answers), `max_turns`, `max_actions_per_turn`,
`max_actions`, `max_tokens`, `reset(seed) -> str`, `render() -> str`, `step(action) -> (obs, reward, done, info)`.
`step` takes ONE action string (the rollout splits the model's answer on "||" and enforces the budgets).
Actions match case-insensitively. An invalid action returns info["valid"] = False, reward 0, the state
unchanged, done False, and does not count as an executed action; it never raises.

Seeding: every random choice comes from a local numpy Generator seeded by reset(seed), never the global RNGs,
so envs reset with the same seed are identical, including FrozenLake slips and Bandit payouts (common random
numbers: same seed and same actions => same trajectory). Envs are plain objects; `copy.deepcopy` clones them.

Paper vs code: FrozenLake `slip` defaults to 0 (deterministic, the main-table scripts); the paper's text says the
lake is 2% slippery, i.e. `slip=0.02`. The slip-sweep scripts use slip in {0, .02, .05, .1, .2, .5, 1}.
Deliberate differences from the official code (each documented where it happens):
  * Bandit members of a group share the prompt (the reference adds a per-env counter to the seed, so its group
    members see different prompts); each member draws its own payouts (reset(seed, member)).
  * Sokoban rooms are re-generated (derived seed) until solvable within the budget (`check_budget=False`: the
    reference's behaviour). FrozenLake's instructions give the true board size and mention slipping only when
    slip > 0. MetaMathQA also accepts numerically equal answers ("5.0" for "5"; `numeric_match=False` is the
    reference's pure string match). Countdown generates instances locally (`ops="+-"` mimics the reference's
    filter to instances solvable with signs only) and reads the public task set from a local `data_path`.
The agentic minis keep the official action syntax, observation strings and reward rules but generate their data
(a per-seed encyclopedia with BM25 search; a 300-product catalogue; 70 bundled coding problems) instead of the
official services and downloads; their own docstrings and docs/paper-vs-code.md list the differences.
Left out: the official retrieval server, product dump and coding datasets, image observations, dataset downloads.

Run: `python envs.py sokoban --seed 3 --show` prints the instructions and first observation;
`python envs.py frozenlake --seed 1 --play -o slip=0.2` plays an episode in the terminal;
`python envs.py frozenlake --seed 1 --play --agent runs/<name> [--temperature T] [--max-new-tokens N]` watches a policy
(a run, an exported directory or a model name, loaded as evaluate.py does) play it, turn by turn with its reasoning;
`python envs.py path/to/my_env.py:MyEnv --show` shows your own.
"""
from __future__ import annotations

import argparse
import inspect

import numpy as np

import sokoban_gen
from agentic.deepcoder import DeepCoder
from agentic.searchqa import SearchQA
from agentic.webshop import WebShop
from env_base import FORMAT, Env, _int_opt, _prob_opt  # noqa: F401  (re-exported: envs.Env, envs.FORMAT)
from sokoban_gen import MOVES, TARGET, WALL, push
from tasks import Bandit, Countdown, MetaMathQA

ENV_NAMES = ("sokoban", "frozenlake", "countdown", "metamathqa", "bandit", "searchqa", "webshop", "deepcoder")


def _coord_block(shape, labelled):
    """'Board size' line + one 'Label: (r, c), ...' line per non-empty entity list (reference grid_coord)."""
    lines = [f"Board size: {shape[0]} rows x {shape[1]} cols (zero-indexed)."]
    for label, cells in labelled:
        if cells:
            lines.append(f"{label}: " + ", ".join(f"({r}, {c})" for r, c in sorted(cells)))
    return "\n".join(lines)


def _legend(symbols: dict) -> str:
    """Symbol legend line of the system message (the reference appends it when an env has a grid vocabulary)."""
    return "The meaning of each symbol in the state is: " + ", ".join(f"{k}: {v}" for k, v in symbols.items()) + "."


def _coords_sentence(shape) -> str:
    """How to read coordinates. Uses the true board size (the reference's FrozenLake text says (5, 5) on 4x4)."""
    return (f"Coordinates are zero-indexed (row, col), from the top-left corner (0, 0) to the bottom-right corner "
            f"({shape[0] - 1}, {shape[1] - 1}); Up decreases the row, Down increases it, Left decreases the "
            "column, Right increases it.")


# ------------------------------------------------------------------------------------------------ Sokoban
class Sokoban(Env):
    """Push every box onto a target (reference CoordSokoban). State: fixed walls/targets, player, box set."""
    name = "sokoban"
    action_names = list(MOVES)                                       # Up, Down, Left, Right
    symbols = {"#": "wall", "_": "empty", "O": "target", "√": "box on target", "X": "box", "P": "player",
               "S": "player on target"}

    def __init__(self, dim=6, num_boxes=1, search_depth=300, check_budget=True,
                 max_turns=5, max_actions_per_turn=2, max_actions=10, max_tokens=120):
        super().__init__(max_turns, max_actions_per_turn, max_actions, max_tokens)
        # dim: an int (square room) or (rows, cols); the outer ring is wall, so the interior is (rows-2)x(cols-2)
        shape = (dim, dim) if not isinstance(dim, (tuple, list)) else tuple(dim)
        if len(shape) != 2:
            raise ValueError(f"dim must be an integer or a (rows, cols) pair, got {dim!r}")
        self.shape = tuple(_int_opt("dim", d, lo=4) for d in shape)
        self.num_boxes = _int_opt("num_boxes", num_boxes)
        interior = (self.shape[0] - 2) * (self.shape[1] - 2)
        if self.num_boxes + 2 > interior:                            # player + boxes + at least one spare cell
            raise ValueError(f"num_boxes={num_boxes} does not fit a {self.shape} room: at most {interior - 2} "
                             f"boxes fit its {interior} interior cells")
        self.search_depth = _int_opt("search_depth", search_depth, lo=2)
        if not isinstance(check_budget, bool):
            raise ValueError(f"check_budget must be True or False, got {check_budget!r}")
        self.check_budget = check_budget
        self.instructions = "\n".join([
            "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.",
            "You are given the coordinates of the targets, boxes and player, and a symbol grid. "
            + _coords_sentence(self.shape),
            "When you are exactly next to a box, you can push it by moving in the same direction. "
            "You cannot push a box through a wall or another box, and you cannot pull a box.",
            _legend(self.symbols),
            self.protocol("Right || Up")])

    def _reset(self, seed):
        """Room by reverse play; re-generated from derived seeds until solvable within max_actions."""
        room = sokoban_gen.generate(seed, self.shape, self.num_boxes, self.search_depth,
                                    self.max_actions, self.check_budget)
        self.fixed, self.player, self.boxes = room.fixed, room.player, room.boxes   # (rows, cols), (r, c), {(r, c)}
        self.solution = room.solution

    def _step(self, action):
        """gym-sokoban rewards: -0.1 per step, +1 / -1 box onto / off a target, +10 when all boxes are placed."""
        before = self.player
        self.player, self.boxes, moved = push(self.fixed, self.player, self.boxes, MOVES[action])
        reward = -0.1                                                # every executed action, bumps included
        if moved is not None:                                        # +1 onto a target, -1 off a target
            src, dst = moved
            reward += float(self.fixed[dst] == TARGET) - float(self.fixed[src] == TARGET)
        if all(self.fixed[b] == TARGET for b in self.boxes):
            reward += 10.0                                           # solved: episode over
            self.done = self.success = True
        return reward, {"effective": self.player != before}

    def render(self) -> str:
        """grid_coord observation: coordinates (walls omitted, empty lists omitted) then the symbol grid."""
        targets = [tuple(t) for t in np.argwhere(self.fixed == TARGET).tolist()]    # all targets, covered or not
        on = [b for b in self.boxes if self.fixed[b] == TARGET]
        player_on = self.fixed[self.player] == TARGET
        coords = _coord_block(self.shape, [
            ("Targets", targets), ("Boxes", [b for b in self.boxes if b not in on]), ("Boxes on target", on),
            ("Player", [] if player_on else [self.player]), ("Player on target", [self.player] if player_on else [])])
        # (rows, cols) symbols: fixed layer first, then boxes, then the player on top
        grid = np.where(self.fixed == WALL, "#", np.where(self.fixed == TARGET, "O", "_")).astype(object)
        for b in self.boxes:
            grid[b] = "√" if self.fixed[b] == TARGET else "X"
        grid[self.player] = "S" if player_on else "P"
        # the reference pads every cell with a space on each side (" # "); we keep that token layout
        rows = "\n".join("".join(f" {s} " for s in row) for row in grid)
        return f"Coordinates:\n{coords}\nGrid Map:\n{rows}"


# --------------------------------------------------------------------------------------------- FrozenLake
FL_MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}   # reference order 1..4
FL_ORDER = list(FL_MOVES)


def lake_path(holes: np.ndarray, start: tuple, goal: tuple):
    """Shortest hole-free action list from start to goal (BFS over cells), or None if the goal is cut off."""
    n_r, n_c = holes.shape
    parent, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for cell in frontier:
            for name, (dr, dc) in FL_MOVES.items():
                r, c = cell[0] + dr, cell[1] + dc
                if 0 <= r < n_r and 0 <= c < n_c and not holes[r, c] and (r, c) not in parent:
                    parent[(r, c)] = (cell, name)
                    nxt.append((r, c))
        frontier = nxt
    if goal not in parent:
        return None
    path, cur = [], goal
    while parent[cur] is not None:
        cur, name = parent[cur]
        path.append(name)
    return path[::-1]


class FrozenLake(Env):
    """Walk from start to goal without falling into a hole (reference CoordFrozenLake)."""
    name = "frozenlake"
    action_names = FL_ORDER                                        # Left, Down, Right, Up
    symbols = {"P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole",
               "√": "player on goal"}
    MAX_MAP_TRIES = 100_000

    def __init__(self, size=4, p_frozen=0.9, slip=0.0,
                 max_turns=5, max_actions_per_turn=2, max_actions=10, max_tokens=120):
        super().__init__(max_turns, max_actions_per_turn, max_actions, max_tokens)
        self.size = _int_opt("size", size, lo=2)
        self.p_frozen = _prob_opt("p_frozen", p_frozen, lo_open=True)
        # slip: the paper text says 2% (s = 0.98), the main-table scripts use 0 (deterministic); default 0
        self.slip = _prob_opt("slip", slip, lo_open=False)
        slippery = (f"The ice is slippery: with probability {self.slip:g} you slide to one of the two directions "
                    "perpendicular to the one you chose (never backwards)." if self.slip > 0 else
                    "The ice is not slippery: every move goes in the direction you chose.")
        self.instructions = "\n".join([
            "You are solving the FrozenLake puzzle. Walk from the start to the goal without falling into a hole; "
            "falling into a hole ends the game. Moving against the edge of the board leaves you in place.",
            "You are given the coordinates of the start, goal, player and holes, and a symbol grid. "
            + _coords_sentence((self.size, self.size)),
            slippery, _legend(self.symbols), self.protocol("Left || Up")])

    def _reset(self, seed):
        """Random lake: each tile frozen with prob p_frozen, distinct start and goal, redrawn until a safe path."""
        # two independent streams: the map, and the slips (so slips never depend on how many maps were drawn)
        map_seq, slip_seq = np.random.SeedSequence(seed).spawn(2)
        rng, n = np.random.default_rng(map_seq), self.size
        for _ in range(self.MAX_MAP_TRIES):
            holes = rng.random((n, n)) >= self.p_frozen                 # (n, n) True = hole, P = 1 - p_frozen
            start = tuple(int(x) for x in rng.integers(n, size=2))
            goal = tuple(int(x) for x in rng.integers(n, size=2))
            if start == goal:
                continue
            holes[start] = holes[goal] = False
            path = lake_path(holes, start, goal)
            if path is not None:                                      # regenerate until a safe path exists
                break
        else:
            raise ValueError(f"no {n}x{n} lake with a safe path found for p_frozen={self.p_frozen}")
        self.holes, self.start, self.goal, self.player = holes, start, goal, start
        self.solution = path
        self.slip_rng = np.random.default_rng(slip_seq)

    def _step(self, action):
        # one uniform draw per executed action whatever `slip` is, so equal seeds + equal actions => equal outcomes
        u, i = self.slip_rng.random(), FL_ORDER.index(action)
        if u < self.slip / 2:
            executed = FL_ORDER[(i - 1) % 4]                          # perpendicular, one side
        elif u < self.slip:
            executed = FL_ORDER[(i + 1) % 4]                          # perpendicular, other side
        else:
            executed = action
        dr, dc = FL_MOVES[executed]
        before = self.player
        r = min(max(before[0] + dr, 0), self.size - 1)                 # the edge stops the player
        c = min(max(before[1] + dc, 0), self.size - 1)
        self.player = (r, c)
        reward = 0.0
        if self.holes[r, c]:
            self.done = True                                          # fell in: over, no success
        elif self.player == self.goal:
            self.done = self.success = True
            reward = 1.0
        return reward, {"effective": self.player != before, "direction": executed, "slipped": executed != action}

    def render(self) -> str:
        """grid_coord observation: Start, Goal, the player line (plain / on goal / in hole), Holes; then the grid."""
        holes = [tuple(h) for h in np.argwhere(self.holes).tolist()]
        p, in_hole, on_goal = self.player, bool(self.holes[self.player]), self.player == self.goal
        coords = _coord_block(self.holes.shape, [
            ("Start", [self.start]), ("Goal", [self.goal]),
            ("Player", [] if in_hole or on_goal else [p]), ("Player on goal", [p] if on_goal else []),
            ("Player in hole", [p] if in_hole else []), ("Holes", holes)])
        grid = np.where(self.holes, "O", "_").astype(object)           # the start tile shows as empty
        grid[self.goal] = "G"
        grid[p] = "X" if in_hole else "√" if on_goal else "P"
        return f"Coordinates:\n{coords}\nGrid Map:\n" + "\n".join("".join(row) for row in grid)


# ------------------------------------------------------------------------------------------------ factory
def env_classes() -> dict:
    """name -> class of the built-in environments (the single-turn tasks live in tasks.py)."""
    return {"sokoban": Sokoban, "frozenlake": FrozenLake, "countdown": Countdown, "metamathqa": MetaMathQA,
            "bandit": Bandit, "searchqa": SearchQA, "webshop": WebShop, "deepcoder": DeepCoder}


# What every environment must have (CONTRIBUTING.md, "envs.py"); env_base.Env provides all of it but `instructions`
# and the env-specific `_reset` / `_step` / `render`.
PROTOCOL = ("name", "instructions", "max_turns", "max_actions_per_turn", "max_actions", "max_tokens", "reset",
            "render", "step")
VALID_HINT = (f"valid names: {', '.join(ENV_NAMES)}, or your own Env class as module:Class (a module on the Python "
              "path or in the current directory) or path/to/file.py:Class")
_USER_MODULES = {}             # resolved file path -> module (a file is executed once per process)


def is_user_env(name) -> bool:
    """An env given as `module:Class` or `path/to/file.py:Class` rather than a built-in name."""
    return isinstance(name, str) and ":" in name


def _import_user_module(spec: str):
    """`pkg.module` (importlib; the current directory is tried too) or `path/to/file.py` (executed once, registered
    in sys.modules under a private name so that pickling its objects works). ValueError (one line) otherwise."""
    import importlib
    import importlib.util
    import os
    import sys
    from pathlib import Path

    path = Path(spec).expanduser()
    if spec.endswith(".py") or os.sep in spec:
        if not path.is_file():
            raise ValueError(f"env file {spec!r} does not exist")
    else:
        try:
            return importlib.import_module(spec)
        except ModuleNotFoundError as err:
            path = Path.cwd() / (spec.replace(".", os.sep) + ".py")   # `python train.py` puts the repo, not the
            if err.name != spec.split(".")[0] or not path.is_file():   # current directory, on sys.path
                raise ValueError(f"cannot import env module {spec!r} ({err}); put it on PYTHONPATH or give "
                                 "path/to/file.py:Class") from None
        except Exception as err:                                      # the user's module itself failed
            raise ValueError(f"importing env module {spec!r} failed: {type(err).__name__}: {err}") from None
    key = str(path.resolve())
    if key not in _USER_MODULES:
        mod_name = "nanoragen_user_env_" + "".join(c if c.isalnum() else "_" for c in path.resolve().stem) + \
            f"_{len(_USER_MODULES)}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, key)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[mod_name]
            raise ValueError(f"loading env file {spec!r} failed: {type(err).__name__}: {err}") from None
        _USER_MODULES[key] = module
    return _USER_MODULES[key]


def env_class(name: str) -> type:
    """The class behind an env name: a built-in name (case-insensitive) or `module:Class` / `path/file.py:Class`.
    ValueError (one line, listing the valid names) when it cannot be found."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"unknown env name {name!r}; {VALID_HINT}")
    if not is_user_env(name):
        cls = env_classes().get(name.lower())
        if cls is None:
            raise ValueError(f"unknown env name {name!r}; {VALID_HINT}")
        return cls
    module_spec, _, attr = name.rpartition(":")
    if not module_spec or not attr.isidentifier():
        raise ValueError(f"env {name!r}: expected module:Class or path/to/file.py:Class")
    cls = getattr(_import_user_module(module_spec), attr, None)
    if not isinstance(cls, type):
        raise ValueError(f"env {name!r}: {module_spec} has no class {attr!r}")
    return cls


def make_env(name: str, **options) -> Env:
    """Build an environment by name (built-in or `module:Class`); unknown names or options raise ValueError listing
    the valid ones, a user class that misses part of the protocol raises ValueError naming what is missing."""
    cls = env_class(name)
    valid = [p for p, v in inspect.signature(cls.__init__).parameters.items()
             if p != "self" and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
    takes_any = any(v.kind == v.VAR_KEYWORD for v in inspect.signature(cls.__init__).parameters.values())
    unknown = sorted(set(options) - set(valid))
    if unknown and not takes_any:
        raise ValueError(f"unknown option(s) {unknown} for env {getattr(cls, 'name', name)!r}; valid options: {valid}")
    if not is_user_env(name):
        return cls(**options)
    try:
        env = cls(**options)
    except (TypeError, ValueError) as err:                          # the user's own option checks
        raise ValueError(f"env {name!r} with options {options}: {type(err).__name__}: {err}") from None
    missing = [a for a in PROTOCOL if not hasattr(env, a)]
    if missing:
        raise ValueError(f"env {name!r} misses {missing} of the Env protocol (subclass env_base.Env; docs/guide.md, "
                         "\"Your own environment\")")
    return env


# ---------------------------------------------------------------------------------------------------- CLI
def _parse_value(text: str):
    """'3' -> 3, '0.2' -> 0.2, 'true' -> True, anything else stays a string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def agent_episode(source: str, env: str, options: dict, seed: int, *, temperature: float | None = None,
                  max_new_tokens: int | None = None, checkpoint: str = "last", device: str | None = None,
                  generate_fn=None) -> dict:
    """One episode of a policy (a run directory, an exported directory or a model name) on `env` at instance `seed`,
    by the training code path: evaluate.resolve_source / load_source (the loader of evaluate.py), then rollout.rollout
    with group size 1 at the run's validation temperature (0.5 for a model name) unless `temperature` is given.
    Returns the samples.jsonl record of the episode (train.sample_records) plus per-turn `rewards`, `valid`,
    `penalties`, and `end_reason`, `setup` (source, step, env, temperature, max_new_tokens) for runlog.format_episode.
    config.UsageError (one line, naming the flag) before the model loads when a flag is refused. CLI-side helper:
    its imports are deferred so that envs.py itself stays below rollout.py in the import order."""
    import dataclasses
    import json

    import torch

    import evaluate
    import rollout
    import sampling
    import train

    flags = ["--env", env] + (["--env-options", json.dumps(options)] if options else [])
    if temperature is not None:
        flags += ["--val-temperature", repr(float(temperature))]
    if max_new_tokens is not None:
        flags += ["--max-new-tokens", str(int(max_new_tokens))]
    args, kind = evaluate.resolve_source(source, flags, checkpoint=checkpoint)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tok, step = evaluate.load_source(source, args, kind, device, checkpoint)
    rcfg = train.rollout_config(args)
    rcfg = dataclasses.replace(rcfg, temperature=args.val_temperature, top_p=rcfg.val_top_p)   # as validation samples
    torch.manual_seed(seed)
    with torch.no_grad():
        [traj] = rollout.rollout(model, tok, rcfg, [seed], 1, generate_fn=generate_fn or sampling.generate)
    return {**train.sample_records([traj], 1)[0], "rewards": [t.reward for t in traj.turns],
            "valid": [list(t.valid) for t in traj.turns], "penalties": [t.penalty for t in traj.turns],
            "end_reason": traj.end_reason,
            "setup": {"source": source, "kind": kind, "step": step, "env": args.env, "temperature": args.val_temperature,
                      "max_new_tokens": args.max_new_tokens}}


def main(argv=None):
    ap = argparse.ArgumentParser(description="Show or play one episode of a nanoRAGEN text environment, yourself or "
                                 "watching an agent (--play --agent).")
    ap.add_argument("name", help=f"a built-in env ({', '.join(ENV_NAMES)}) or your own: module:Class, "
                    "path/to/file.py:Class")
    ap.add_argument("--seed", type=int, default=0, help="instance seed (same seed, same instance); with --agent also "
                    "the sampling seed")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--show", action="store_true", help="print instructions and first observation (default)")
    mode.add_argument("--play", action="store_true", help="play an episode: type actions separated by ' || ' (or "
                      "watch --agent play it)")
    ap.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                    help="environment option, e.g. -o slip=0.2 -o size=5 (repeatable)")
    ap.add_argument("--agent", metavar="SOURCE", help="with --play: the policy that plays, turn by turn with its "
                    "reasoning: runs/<name> | an exported directory | smollm2-135m | tiny | a Hugging Face id")
    ap.add_argument("--temperature", type=float, help="with --agent: sampling temperature > 0 (default: the run's "
                    "--val-temperature, else 0.5)")
    ap.add_argument("--max-new-tokens", type=int, help="with --agent: token cap per turn (default: the run's, else "
                    "train.py's default)")
    ap.add_argument("--checkpoint", choices=["last", "prev"], help="with --agent runs/<name>: which checkpoint [last]")
    args = ap.parse_args(argv)
    options = {}
    for item in args.option:
        key, sep, val = item.partition("=")
        if not sep:
            ap.error(f"--option expects KEY=VALUE, got {item!r}")
        options[key] = _parse_value(val)
    if args.agent is not None and not args.play:
        ap.error("--agent: only with --play (watch the agent play an episode)")
    for flag in ("temperature", "max_new_tokens", "checkpoint"):
        if getattr(args, flag) is not None and args.agent is None:
            ap.error(f"--{flag.replace('_', '-')}: only with --play --agent SOURCE")
    if args.temperature is not None and not args.temperature > 0:
        ap.error(f"--temperature: must be > 0, got {args.temperature}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        ap.error(f"--max-new-tokens: must be >= 1, got {args.max_new_tokens}")
    try:
        env = make_env(args.name, **options)
    except ValueError as err:
        ap.error(str(err))
    if args.agent is not None:
        import sys

        import runlog
        try:
            rec = agent_episode(args.agent, args.name, options, args.seed, temperature=args.temperature,
                                max_new_tokens=args.max_new_tokens, checkpoint=args.checkpoint or "last")
        except ValueError as err:                   # config.UsageError included: one line, exit 2
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2)
        s = rec["setup"]
        print(f"=== instructions (the system message) ===\n{rec['messages'][0]['content']}\n")
        step = "" if s["step"] is None else f" (step {s['step']})"
        title = (f"{s['source']}{step} plays {s['env']} seed {args.seed} at temperature {s['temperature']:g}, "
                 f"<= {s['max_new_tokens']} new tokens a turn")
        print(runlog.format_episode(rec, title=title, color=sys.stdout.isatty()))
        return
    obs = env.reset(args.seed)
    print(f"=== instructions ===\n{env.instructions}\n")
    if not args.play:
        print(f"=== first observation (seed {args.seed}) ===\n{obs}\n")
        if getattr(env, "solution", None) is not None:
            print(f"=== a solution ===\n{' || '.join(env.solution)}")
        return
    total, used, done = 0.0, 0, False
    for turn in range(1, env.max_turns + 1):
        print(f"--- Turn {turn}: ---\n{obs}\n({env.max_actions - used} actions left)")
        try:
            answer = input("> ")
        except EOFError:
            break
        actions = [a.strip() for a in answer.split("||") if a.strip()][:env.max_actions_per_turn]
        for action in actions:
            if used >= env.max_actions:
                break
            obs, reward, done, info = env.step(action)
            used += info["valid"]
            total += reward
            print(f"{action!r}: reward {reward:+g}" + ("" if info["valid"] else " (invalid, ignored)"))
            if done:
                break
        if done or used >= env.max_actions:
            break
    print(f"\n{obs}\n\nepisode over: return {total:+g}, success {getattr(env, 'success', False)}")


if __name__ == "__main__":
    main()
