"""Run directories: config, metrics, samples, checkpoints and exact resume (boilerplate, no algorithm here).

A run lives in `runs/<name>/`:

    config.json      every resolved flag, plus seed, library versions, git commit, start time
    metrics.jsonl    one JSON object per step (namespaced keys: rollout/, filter/, mi_first_turn/, mi_trajectory/
                     (+ _frozen), train/, grad/, val/, time/, early_stopped/; every key in docs/metrics.md),
                     flushed and fsync'ed after every line, so a killed run loses at most the step in flight
    samples.jsonl    a few full trajectories per step (chat text, actions, rewards) for reading what the agent does
    checkpoints/last model, optimizer(s), RNG states, step, EMA and early-stop state: enough to continue *exactly*
    plots/           written at the end by report.py

Checkpoints are written to a temporary directory and renamed into place; the one they replace moves to
`checkpoints/prev/`, and a resume whose last checkpoint cannot be read falls back to it (with a warning). A run
directory is locked (`.lock`, flock) for the life of the process that writes it, so a second `train.py` on the
same name is refused instead of interleaving its steps; the lock dies with its holder, so a crash never blocks a
later `--resume`. Readers skip a torn last line of a JSONL log (power loss mid-write) with a warning naming the
file; a bad line anywhere else is an error naming file and line. `--resume runs/<name>` reloads `config.json`; flags given on the command line must agree
with it, except those in `RESUMABLE_OVERRIDES` (e.g. `--steps` to extend a run). Disagreement is an error raised
before any model is loaded.

What it leaves out: remote trackers (wandb/tensorboard go through accelerate's trackers in train.py) and
multi-checkpoint retention (the last checkpoint and the one before it are kept).

Run: imported by train.py; `python runlog.py runs/<name>` prints the last logged metrics of a run;
`python runlog.py runs/<name> --samples [--step K] [--n N]` prints the trajectories logged at step K (default: the
last), turn by turn: observation, the <think> reasoning in a marked block, answer, actions, reward (ANSI colour
only on a terminal).
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

# Flags that may differ between the original run and a resumed one (they do not change what the algorithm
# computes up to the resumed step).
RESUMABLE_OVERRIDES = {"steps", "resume", "eval_every", "save_every", "log_samples", "progress", "trackers",
                       "early_stop_empty", "early_stop_rv", "early_stop_val", "stop_nonfinite"}


def git_commit() -> str:
    """The commit of the code that produced the run ('unknown' outside a git checkout), '+dirty' if modified."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha or "unknown") + ("+dirty" if dirty else "")


def cpu_info() -> str:
    """The CPU a number was measured on: its model name, core count and the flags that decide the precision path
    and speed (avx2, avx512f, avx512_bf16, amx_bf16), from /proc/cpuinfo; platform.machine() elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", text, re.M) or [None, ""])[1].split())
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name.group(1).strip() if name else platform.machine()}, {os.cpu_count()} cores, {' '.join(shown) or 'no avx2'}"


def environment_info() -> dict:
    """Versions that matter for reproducing a number, and the CPU."""
    import accelerate
    import transformers
    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__, "numpy": np.__version__, "platform": platform.platform(),
            "cpu": cpu_info(), "git_commit": git_commit(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


class RunLog:
    """Append-only JSONL logs of one run. Only the main process writes (`enabled=False` elsewhere)."""

    def __init__(self, run_dir: str | Path, enabled: bool = True):
        self.dir = Path(run_dir)
        self.enabled = enabled
        self._metrics = self._samples = None
        if enabled:
            (self.dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            self._metrics = open(self.dir / "metrics.jsonl", "a", buffering=1)
            self._samples = open(self.dir / "samples.jsonl", "a", buffering=1)

    def write_config(self, config: dict, run_env: dict | None = None) -> None:
        """config.json: the flags, and where / with what they ran (environment_info + run_env, e.g. precision)."""
        if self.enabled:
            payload = {"flags": config, "env": {**environment_info(), **(run_env or {})}}
            old = self.dir / "config.json"
            if old.exists():   # a resume: keep where and with what code the earlier invocations ran
                before = json.loads(old.read_text())
                payload["earlier_invocations"] = before.get("earlier_invocations", []) + [before["env"]]
            _atomic_write_text(self.dir / "config.json", json.dumps(payload, indent=2, sort_keys=True))

    def log(self, step: int, metrics: dict) -> None:
        """One line per step; flushed and fsync'ed so that `tail -f` and crashes both see every finished step."""
        if self.enabled:
            row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
            self._metrics.write(json.dumps(row, allow_nan=False) + "\n")    # NaN/inf were turned into null
            self._metrics.flush()
            os.fsync(self._metrics.fileno())

    def log_samples(self, step: int, samples: list[dict]) -> None:
        if self.enabled and samples:
            for s in samples:
                self._samples.write(json.dumps({"step": step, **s}) + "\n")
            self._samples.flush()

    def truncate_after(self, step: int) -> None:
        """On resume, drop metric lines of steps after the checkpoint (they will be recomputed identically)."""
        if not self.enabled:
            return
        for name, handle in (("metrics.jsonl", "_metrics"), ("samples.jsonl", "_samples")):
            getattr(self, handle).close()
            path = self.dir / name
            keep = [r for r in read_jsonl(path) if r["step"] <= step]          # also drops a torn last line
            _atomic_write_text(path, "".join(json.dumps({k: _plain(v) for k, v in r.items()}, allow_nan=False)
                                             + "\n" for r in keep))      # old logs may hold bare NaN
            setattr(self, handle, open(path, "a", buffering=1))

    def close(self) -> None:
        for f in (self._metrics, self._samples):
            if f is not None:
                f.close()


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL log. A torn LAST line (a write cut short) is skipped with a warning; a bad line elsewhere
    raises ValueError naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = [(i + 1, ln) for i, ln in enumerate(path.read_text(errors="replace").splitlines()) if ln.strip()]
    rows = []
    for k, (no, ln) in enumerate(lines):
        try:
            rows.append(json.loads(ln))
        except json.JSONDecodeError as err:
            if k == len(lines) - 1:
                warnings.warn(f"{path}: line {no} is torn (incomplete write), skipped", stacklevel=2)
                break
            raise ValueError(f"{path}: line {no} is not valid JSON ({err})") from None
    return rows


def read_metrics(run_dir: str | Path) -> list[dict]:
    """All logged steps of a run, in order."""
    return read_jsonl(Path(run_dir) / "metrics.jsonl")


class RunLock:
    """An exclusive lock on a run directory for the life of this process (fcntl.flock on <run>/.lock): a second
    writer is refused; the kernel releases the lock when the holder exits or dies."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / ".lock"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a+")
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._f.seek(0)
            holder = self._f.read().strip() or "another process"
            self._f.close()
            raise ValueError(f"{run_dir} is in use by {holder}: one train.py per run directory "
                             "(wait for it to end, or choose another --name)") from None
        self._f.seek(0)
        self._f.truncate()
        self._f.write(f"pid {os.getpid()} on {platform.node()}\n")
        self._f.flush()

    def release(self) -> None:
        if not self._f.closed:
            fcntl.flock(self._f, fcntl.LOCK_UN)
            self._f.close()


def checkpoint_expected(run_dir: str | Path, save_every: int) -> bool:
    """Whether a checkpoint must exist: the run finished, or a step after the first periodic save was logged."""
    if (Path(run_dir) / "finished.json").exists():
        return True
    steps = [r["step"] for r in read_metrics(run_dir)]
    return bool(save_every) and any(s >= save_every for s in steps)


def load_config(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise ValueError(f"{run_dir}: no config.json there (not a nanoRAGEN run directory)")
    return json.loads(path.read_text())["flags"]


def check_resume_config(saved: dict, explicit: dict) -> None:
    """Flags given explicitly on a resume must equal the saved ones (except RESUMABLE_OVERRIDES)."""
    diffs = [f"--{k.replace('_', '-')}: run has {saved.get(k)!r}, command line has {v!r}"
             for k, v in explicit.items() if k not in RESUMABLE_OVERRIDES and k in saved and saved[k] != v]
    unknown = [k for k in explicit if k not in saved and k not in RESUMABLE_OVERRIDES]
    if diffs or unknown:
        lines = diffs + [f"--{k.replace('_', '-')}: not a flag of the saved run" for k in unknown]
        hint = ("\nTo evaluate the checkpoint on other seeds / temperatures without training: python evaluate.py "
                "RUN --seeds START:END --temperature T." if any(k.startswith("val_") for k in explicit
                                                               if k not in RESUMABLE_OVERRIDES) else "")
        raise ValueError("--resume: the command line disagrees with the run's config.json:\n  " + "\n  ".join(lines)
                         + "\nStart a new run (--name) to change these, or drop them from the command line." + hint)


# ----------------------------------------------------------------------------------------------- RNG + checkpoints
def rng_state() -> dict:
    """Every global RNG a step touches (sampling in generate uses torch's)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: str | Path, state: dict, rank: int = 0) -> Path:
    """Write `state` (tensors, optimizer states, plain Python) as checkpoints/last/rank{r}.pt, atomically; the file
    it replaces becomes checkpoints/prev/rank{r}.pt (the fallback of load_checkpoint).

    Each process writes its own file (RNG states differ per process).
    """
    ckpts = Path(run_dir) / "checkpoints"
    final, prev, tmp = ckpts / "last", ckpts / "prev", ckpts / f".tmp-{rank}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / f"rank{rank}.pt")
    final.mkdir(parents=True, exist_ok=True)
    prev.mkdir(parents=True, exist_ok=True)
    if (final / f"rank{rank}.pt").exists():
        os.replace(final / f"rank{rank}.pt", prev / f"rank{rank}.pt")
    os.replace(tmp / f"rank{rank}.pt", final / f"rank{rank}.pt")  # atomic on POSIX
    shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_checkpoint(run_dir: str | Path, rank: int = 0) -> dict | None:
    """The last checkpoint; if it is missing or unreadable, the previous one (with a warning); None if there is
    neither. Two unreadable files raise ValueError naming them."""
    ckpts = Path(run_dir) / "checkpoints"
    last = ckpts / "last" / f"rank{rank}.pt"
    paths = [p for p in (last, ckpts / "prev" / f"rank{rank}.pt") if p.exists()]
    errors = []
    for path in paths:
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:                      # truncated / corrupt file: try the previous checkpoint
            errors.append(f"{path}: {type(err).__name__}: {err}")
            continue
        if path != last:
            warnings.warn(f"{last} could not be read ({errors[0] if errors else 'missing'}); falling back to the "
                          f"previous checkpoint {path} (step {state.get('step')})", stacklevel=2)
        return state
    if errors:
        raise ValueError("no readable checkpoint: " + "; ".join(errors))
    return None


# ------------------------------------------------------------------------------------------------------ helpers
def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _plain(v):
    """JSON-friendly scalar: tensors and numpy numbers become Python floats/ints; NaN and inf become null (bare
    NaN is not JSON)."""
    if isinstance(v, torch.Tensor):
        v = v.item() if v.numel() == 1 else v.tolist()
    elif isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


# ------------------------------------------------------------------------------------------- reading episodes
_TAG = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_REWARD = re.compile(r"\AReward:\n(\S+)\n")
_ANSI = {"label": "\033[1m", "think": "\033[2;36m", "answer": "\033[1;32m", "bad": "\033[1;31m", "head": "\033[1;35m",
         "end": "\033[0m"}


def episode_turns(record: dict) -> list[dict]:
    """The turns of one logged episode (a samples.jsonl row, train.sample_records; or the same record of a fresh
    rollout with per-turn `rewards` / `valid` / `penalties` and its `end_reason` added).

    Each turn: observation (the "State:" block of the user message rollout.turn_block wrote), reasoning (between
    <think> and </think>; None when the reply has no think block), answer (between <answer> and </answer>; None when
    there is none, a format error), actions (what reached env.step), valid (per action, or None if not recorded),
    reward (the turn's env reward: recorded, else read from the next user message's "Reward:" line, else None: the
    last turn of a samples.jsonl row), penalty (or None) and done (the episode ended after this turn)."""
    msgs = record.get("messages", [])
    users = [m["content"] for m in msgs if m.get("role") == "user"]
    replies = [m["content"] for m in msgs if m.get("role") == "assistant"]
    acts = record.get("actions") or [[] for _ in replies]
    rewards, valid, pens = record.get("rewards"), record.get("valid"), record.get("penalties")
    turns = []
    for k, reply in enumerate(replies):
        user = users[k] if k < len(users) else ""
        obs = user.split("State:\n", 1)[1] if "State:\n" in user else user
        obs = obs.rsplit("\nYou have ", 1)[0]
        if rewards is not None:
            reward = float(rewards[k])
        else:
            nxt = _REWARD.match(users[k + 1]) if k + 1 < len(users) else None
            reward = float(nxt.group(1)) if nxt else None
        think, answer = _TAG.search(reply), _ANSWER.search(reply)
        turns.append({"turn": k + 1, "observation": obs, "reasoning": think.group(1).strip() if think else None,
                      "answer": answer.group(1).strip() if answer else None, "reply": reply,
                      "actions": list(acts[k]) if k < len(acts) else [],
                      "valid": list(valid[k]) if valid is not None else None, "reward": reward,
                      "penalty": float(pens[k]) if pens is not None else None, "done": k == len(replies) - 1})
    return turns


def format_episode(record: dict, *, title: str = "", color: bool = False) -> str:
    """One episode as readable text, turn by turn: observation, the reasoning in a marked block ("  | " lines),
    answer, actions, reward, done; then the episode's return and success. ANSI colour only when `color` (a TTY)."""
    c = (lambda kind, text: f"{_ANSI[kind]}{text}{_ANSI['end']}") if color else (lambda kind, text: text)
    indent = lambda text, mark="  ": "\n".join(mark + ln for ln in (text.splitlines() or [""]))  # noqa: E731
    out = [c("head", f"=== {title} ===")] if title else []
    for t in episode_turns(record):
        out.append(c("head", f"--- turn {t['turn']} ---"))
        out.append(c("label", "observation:") + "\n" + indent(t["observation"]))
        if t["reasoning"] is not None:
            out.append(c("label", "reasoning:") + "\n" + c("think", indent(t["reasoning"], "  | ")))
        if t["answer"] is None:                      # format error; the raw reply when no reasoning was shown
            out.append(c("label", "answer:") + " " + c("bad", "(no <answer>...</answer>: format error)")
                       + ("" if t["reasoning"] is not None else "\n" + c("think", indent(t["reply"], "  | "))))
        else:
            out.append(c("label", "answer:") + " " + c("answer", t["answer"]))
        acts = [a if t["valid"] is None else f"{a} ({'valid' if ok else 'invalid'})"
                for a, ok in zip(t["actions"], t["valid"] or [None] * len(t["actions"]))]
        out.append(c("label", "actions:") + " " + (" || ".join(acts) if acts else "(none executed)"))
        reward = "(not logged)" if t["reward"] is None else f"{t['reward']:+g}"
        if t["penalty"]:
            reward += f", format penalty {t['penalty']:+g}"
        out.append(c("label", "reward:") + f" {reward}   " + c("label", "done:") + f" {'yes' if t['done'] else 'no'}")
    end = f", ended by {record['end_reason']}" if record.get("end_reason") else ""
    ret = record.get("return")
    out.append(c("head", f"episode: return {ret:+.4g}, success {bool(record.get('success'))}{end}" if ret is not None
                 else f"episode: success {bool(record.get('success'))}{end}"))
    return "\n".join(out)


def read_samples(run_dir: str | Path, step: int | None = None) -> tuple[int, list[dict]]:
    """(step, rows) of samples.jsonl at `step` (default: the last logged step). ValueError (one line, naming --step
    and the logged steps) when that step has no samples."""
    rows = read_jsonl(Path(run_dir) / "samples.jsonl")
    steps = sorted({r["step"] for r in rows})
    if not steps:
        raise ValueError(f"{run_dir}: no samples logged (samples.jsonl is missing or empty; train.py --log-samples)")
    step = steps[-1] if step is None else step
    if step not in steps:
        shown = ", ".join(map(str, steps)) if len(steps) <= 12 else f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"
        raise ValueError(f"--step {step}: no samples logged at that step in {run_dir}; logged steps: {shown}")
    return step, [r for r in rows if r["step"] == step]


def main(argv=None) -> None:
    """CLI: print the last logged row of a run, one key per line (`python runlog.py runs/<name>`), or its logged
    trajectories (`--samples [--step K] [--n N]`)."""
    import argparse
    ap = argparse.ArgumentParser(description="Print the last logged metrics row of a run directory, one key a line; "
                                 "with --samples, the trajectories logged at a step, turn by turn.")
    ap.add_argument("run", help="a run directory, e.g. runs/demo (holds config.json and metrics.jsonl)")
    ap.add_argument("--samples", action="store_true", help="print the trajectories of samples.jsonl at --step")
    ap.add_argument("--step", type=int, help="with --samples: which logged step (default: the last one)")
    ap.add_argument("--n", type=int, help="with --samples: at most N trajectories (default: all logged at the step)")
    args = ap.parse_args(argv)
    if not Path(args.run).is_dir():
        ap.error(f"{args.run}: no such run directory")
    if not args.samples:
        if args.step is not None or args.n is not None:
            ap.error("--step / --n: only with --samples")
        rows = read_metrics(args.run)
        if not rows:
            ap.error(f"no metrics in {args.run}")
        for k, v in sorted(rows[-1].items()):
            print(f"{k:48s} {v}")
        return
    if args.n is not None and args.n < 1:
        ap.error(f"--n: must be >= 1, got {args.n}")
    try:
        step, rows = read_samples(args.run, args.step)
    except ValueError as err:                        # one line, exit 2 (as evaluate.py's refusals)
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    rows = rows[:args.n] if args.n else rows
    color = sys.stdout.isatty()
    for i, r in enumerate(rows):
        title = (f"{args.run} step {step}: sample {i + 1}/{len(rows)}, group {r.get('group')}, seed {r.get('seed')}")
        print(format_episode(r, title=title, color=color) + ("\n" if i + 1 < len(rows) else ""))


if __name__ == "__main__":
    main()
