"""Cost of one DeepCoder evaluation in the sandbox, with and without the bubblewrap boundary (issue 22).

What it measures: wall seconds of `sandbox.run` for a 6-input evaluation (a function problem and a stdin problem,
the reference solutions of deepcoder_problems.py), median and 90th percentile over --runs runs per setting:
isolation="process" (a fresh `python -I -S` child under rlimits + audit hook) and isolation="bwrap" (the same child
inside bubblewrap's namespaces; for a root trainer with the inode-capped scratch mount, also "bwrap-tmpfs": the same
without it, bwrap's own --tmpfs, to price the extra unshare + mount; and "bwrap-allowall": the seccomp filter
replaced by a one-instruction allow-all one, to price the ~70 rules every system call runs through). Leaves out: the model, the trainer's load (run it on an idle machine), batching.
Run: `python bench/sandbox.py --runs 30`; it prints a markdown table (docs/sandbox.md keeps the measured numbers).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agentic import deepcoder                                         # noqa: E402
from agentic import sandbox                                           # noqa: E402
from agentic import seccomp                                           # noqa: E402
from agentic.deepcoder_problems import PROBLEMS                       # noqa: E402


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_runs(problem: dict, setting: str, runs: int) -> list:
    isolation = setting.split("-")[0]
    tools, program = sandbox.scratch_mount_tools, seccomp.program
    if setting == "bwrap-tmpfs":                                       # the scratch dir as bwrap's own --tmpfs
        sandbox.scratch_mount_tools = lambda: None
    if setting == "bwrap-allowall":                                    # BPF_RET ALLOW: a filter with no rules
        seccomp.program = lambda machine=None: struct.pack("=HBBI", seccomp.RET_K, 0, 0, seccomp.RET_ALLOW)
    try:
        return _time_runs(problem, isolation, runs)
    finally:
        sandbox.scratch_mount_tools, seccomp.program = tools, program


def _time_runs(problem: dict, isolation: str, runs: int) -> list:
    tests = deepcoder.all_tests(problem)[:6]
    inputs = [inp for inp, _ in tests]
    times = []
    for _ in range(runs + 1):                                          # the first one warms caches: dropped
        start = time.perf_counter()
        r = sandbox.run(problem["reference"], inputs, problem["kind"], problem.get("func_name"),
                        limits=sandbox.Limits(wall_s=30.0, cpu_s=10), isolation=isolation)
        times.append(time.perf_counter() - start)
        if r.status != "ok":
            raise SystemExit(f"{isolation}: the reference of {problem['name']} did not run: {r.detail}")
    return times[1:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="timed runs per setting (default 30)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    isolations = ["process"] + ([] if sandbox._probe(sys.executable) else
                                ["bwrap", "bwrap-allowall"] + (["bwrap-tmpfs"] if sandbox.scratch_mount_tools() else []))
    problems = [next(p for p in PROBLEMS if p["kind"] == kind and len(deepcoder.all_tests(p)) >= 6)
                for kind in ("function", "stdin")]
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores), Python {platform.python_version()}, "
          f"{'root' if os.geteuid() == 0 else 'non-root'} trainer, {args.runs} runs each, 6 inputs per evaluation\n")
    print("| problem | isolation | median ms | p90 ms | extra vs process (median) |")
    print("|---|---|---|---|---|")
    for p in problems:
        base = None
        for iso in isolations:
            t = sorted(time_runs(p, iso, args.runs))
            med, p90 = statistics.median(t) * 1e3, t[min(len(t) - 1, int(0.9 * len(t)))] * 1e3
            base = med if base is None else base
            print(f"| {p['name']} ({p['kind']}) | {iso} | {med:.1f} | {p90:.1f} | {med - base:+.1f} ms |")
    if "bwrap" not in isolations:
        print(f"\nbwrap not measured: {sandbox._probe(sys.executable)}")


if __name__ == "__main__":
    main()
