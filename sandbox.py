"""A process sandbox for model-written Python: runs a program on test inputs and returns its outputs (DeepCoder-mini).

What it implements: `run(code, inputs, mode, func_name) -> Result`, the execution half of DeepCoder's grader (the
comparison with the expected outputs lives in deepcoder.py, so hidden expected outputs never enter the child).
One evaluation = one fresh child interpreter that runs the program once per input, in order, as the official
harness does (mll-lab-nu/RAGEN ragen/env/deepcoder/utils.py: one `python` child, one 3 s timeout for all tests):
  * mode "function": exec the code in a fresh namespace (`__name__` is not "__main__"), call
    `Solution().<func_name>(*args)` if the code defines `class Solution`, else the top-level `<func_name>(*args)`;
    the output is `str(result)`. An input is the repr of the argument tuple.
  * mode "stdin": exec the code with `__name__ == "__main__"` and the input text on standard input (`input()`,
    `sys.stdin`, `sys.stdin.buffer` and `open(0)` all read it); the output is what it printed.
  Anything the program prints or raises is captured per input; `sys.exit(0)` ends a stdin program normally.

The layers, outermost first (the official harness has none of them: no limits, the trainer's environment, /tmp cwd):
  1. Process: `python -I -S -B -c <harness>` (isolated mode: no PYTHON* variables, no user site, no script dir on
     sys.path; no site-packages; no .pyc writes), `env={}` (no inherited secrets), `close_fds`, its own session
     (`start_new_session`), cwd = a fresh `tempfile.TemporaryDirectory()` that is removed afterwards. stdin is the
     payload file (code, inputs, settings: never the expected outputs), stdout/stderr are files in the scratch dir.
  2. Kernel limits, hard = soft, set by the harness as its first act (not by `preexec_fn`: subprocess documents
     preexec_fn as unsafe in a multi-threaded parent, and a torch trainer has threads): RLIMIT_CPU (then SIGXCPU /
     SIGKILL), RLIMIT_AS (memory), RLIMIT_FSIZE (every file incl. its stdout: SIGXFSZ), RLIMIT_NPROC = 0 (no fork,
     no thread), RLIMIT_NOFILE, RLIMIT_CORE = 0. Captured output is also truncated at `output_chars` per input.
  3. Wall clock: the parent polls; at `wall_s` it SIGKILLs the whole process group (killpg while the leader is
     still unreaped, so the group id cannot have been reused), and it always does so once the child is done.
  4. An audit hook (PEP 578, `sys.addaudithook`) installed before the program runs: `open`, `os.listdir`, ... only
     inside the scratch dir (reads also inside the stdlib, which `import` needs), at most `max_files` opens for
     writing; refused outright: fork/exec/`os.system`/`subprocess`/spawn, `os.kill`, sockets, ctypes, links,
     `resource.setrlimit`, gc introspection (which could reach the hook). A refused call raises PermissionError
     (ImportError for `import subprocess` / `ctypes`) inside the program, so its test fails.
  5. Optional `user="nobody"` when the trainer runs as root: the child runs under that uid (Popen `user=`, no
     preexec_fn), so the kernel also enforces file permissions and RLIMIT_NPROC (root ignores RLIMIT_NPROC).
     Needs an interpreter that user can execute (`python="/usr/bin/python3"` when Python lives under /root).

What it does NOT protect against (it is not a security boundary like a container, a VM or seccomp):
  * The audit hook is an in-process tripwire. A program written to attack the harness can get around it (monkey-
    patch the stdlib helpers the hook calls, e.g. posixpath internals; craft bytecode that corrupts the
    interpreter). Layers 1-3 (and 5) are kernel-enforced and still hold then.
  * Operations the hook never sees: `os.stat` of any path (existence, size, mtime of files), signals through
    `signal.pidfd_send_signal` to processes of the same user (the trainer!), reading already-open descriptors.
  * As root without `user=`, RLIMIT_NPROC is not enforced: only the hook stops a fork bomb (and killpg, unless a
    descendant calls setsid()). No network namespace: only the hook stops sockets. No cgroup: RLIMIT_AS is per
    process. Disk: at most `max_files` x `file_mb` in the scratch dir, removed when the run ends.
Run: imported by deepcoder.py; tests in tests/test_sandbox.py (hostile programs: fork bomb, infinite loop, huge
output, writes outside the scratch dir, os.system, reading the project's files, environment secrets, sockets).
"""
from __future__ import annotations

import inspect
import json
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

MODES = ("function", "stdin")
MAX_INPUT_BYTES = 16_384            # stdin text goes through a pipe, filled before the program runs
REPORT_MARK = "\n@@nanoragen-sandbox-report@@"


@dataclass
class Limits:
    """Resource limits of one evaluation (the official harness: a 3 s wall timeout, nothing else)."""
    wall_s: float = 3.0             # wall clock for all inputs together (official: 3 s)
    cpu_s: int = 3                  # RLIMIT_CPU seconds (SIGXCPU; SIGKILL one second later)
    memory_mb: int = 512            # RLIMIT_AS
    file_mb: int = 1                # RLIMIT_FSIZE: largest file the child may write (its stdout included)
    max_files: int = 16             # opens-for-writing + mkdirs allowed in the scratch dir (audit hook)
    nofile: int = 32                # RLIMIT_NOFILE
    output_chars: int = 8192        # captured output kept per input

    def __post_init__(self):
        if not (isinstance(self.wall_s, (int, float)) and not isinstance(self.wall_s, bool) and self.wall_s > 0):
            raise ValueError(f"wall_s must be a number > 0, got {self.wall_s!r}")
        for name in ("cpu_s", "memory_mb", "file_mb", "max_files", "nofile", "output_chars"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


@dataclass
class Result:
    """What one evaluation produced. outputs[i] is None when input i raised (or when the run failed as a whole)."""
    status: str                     # "ok" (the harness reported) | "timeout" | "killed" (a signal) | "no_report"
    outputs: list                   # per input: str(result) / printed text (truncated), or None
    errors: list                    # per input: "ExceptionType: message", or None
    detail: str                     # e.g. "SIGXCPU" for a killed run, the start of stderr for "no_report"
    returncode: int | None
    wall_s: float
    scratch: str                    # the scratch directory (removed by the time you read this)


# ------------------------------------------------------------------------------------------ the child side
# These two functions are never called in the trainer: their source text is the program the child runs.
def _make_guard(scratch, read_roots, max_files):
    """The child's audit hook: file access confined to `scratch` (reads also to `read_roots`), processes,
    signals, sockets and ctypes refused. Only closure values and captured functions are used (no globals)."""
    import os
    realpath, fsdecode, isdir, sep = os.path.realpath, os.fsdecode, os.path.isdir, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    denied = frozenset({"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "os.link", "os.symlink",
                        "os.setxattr", "os.removexattr", "resource.setrlimit", "resource.prlimit",
                        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.remote_exec"})
    denied_prefixes = ("socket.", "ctypes.", "_winapi.", "winreg.", "msvcrt.")
    denied_imports = frozenset({"_posixsubprocess", "_ctypes"})       # subprocess, multiprocessing, ctypes
    # event -> (indices of path arguments, indices of dir_fd arguments, modifies the file system)
    path_events = {"os.chdir": ((0,), (), True), "os.chmod": ((0,), (2,), True), "os.chown": ((0,), (3,), True),
                   "os.listdir": ((0,), (), False), "os.scandir": ((0,), (), False), "os.mkdir": ((0,), (2,), True),
                   "os.remove": ((0,), (1,), True), "os.rmdir": ((0,), (1,), True),
                   "os.rename": ((0, 1), (2, 3), True), "os.truncate": ((0,), (), True),
                   "os.utime": ((0,), (3,), True)}
    writes_left = [max_files]

    def where(path):
        """'scratch', 'read' (stdlib) or None (outside) for a path; an int is an already-open descriptor."""
        if isinstance(path, int):
            return "scratch"
        try:
            p = realpath(fsdecode(path))
        except Exception:
            return None
        if p == scratch or p.startswith(scratch + sep):
            return "scratch"
        return "read" if any(p == r or p.startswith(r + sep) for r in read_roots) else None

    def guard(event, args):
        if event in denied or event.startswith(denied_prefixes):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in denied_imports:
            raise ImportError(f"sandbox: import {args[0]} is not allowed")
        if event == "open":
            path, _, flags = args[:3]
            write, place = not isinstance(flags, int) or bool(flags & write_flags), where(path)
            # reads in the stdlib: files only (a directory descriptor there could serve as dir_fd for os.open)
            ok = place == "scratch" or (place == "read" and not write and not isdir(fsdecode(path)))
            if ok and write and not isinstance(path, int):
                writes_left[0] -= 1
                ok = writes_left[0] >= 0
            if not ok:
                raise PermissionError(f"sandbox: open({path!r}) {'for writing ' if write else ''}is not allowed")
        elif event in path_events:
            paths, dir_fds, modifies = path_events[event]
            places = [where("." if args[i] is None else args[i]) for i in paths]
            ok = all(args[i] is None for i in dir_fds if i < len(args)) and all(
                p == "scratch" or (p == "read" and not modifies) for p in places)
            if ok and event == "os.mkdir":
                writes_left[0] -= 1
                ok = writes_left[0] >= 0
            if not ok:
                raise PermissionError(f"sandbox: {event}{tuple(args[i] for i in paths)!r} is not allowed")
    return guard


def _harness():
    """The child: read the payload from stdin, set the limits, install the guard, run every input, report."""
    import ast, io, json, os, resource, sys
    payload = json.loads(sys.stdin.buffer.read())
    for name, soft, hard in payload["rlimits"]:                     # hard = soft: the program cannot raise them
        res = getattr(resource, name)
        cur_hard = resource.getrlimit(res)[1]
        if cur_hard != resource.RLIM_INFINITY:
            hard, soft = min(hard, cur_hard), min(soft, cur_hard)
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError):                              # refused by this OS (RLIMIT_AS on macOS)
            pass
    if payload["audit"]:
        read_roots = tuple(os.path.realpath(p) for p in sys.path if p)  # with -I -S: the stdlib only
        sys.addaudithook(_make_guard(os.path.realpath(os.getcwd()), read_roots, payload["max_files"]))
    cap = payload["output_chars"]

    class Capped(io.BytesIO):
        """A byte sink that keeps the first 4*cap bytes and silently drops the rest."""
        def write(self, b):
            room = 4 * cap - self.tell()
            if room > 0:
                super().write(bytes(b[:room]))
            return len(b)

    def stream():
        return io.TextIOWrapper(Capped(), encoding="utf-8", errors="replace", write_through=True)

    real = sys.stdin, sys.stdout, sys.stderr
    code, error = None, None
    try:
        code = compile(payload["code"], "<solution>", "exec")
    except BaseException as e:                                     # SyntaxError, ValueError (NUL byte), ...
        error = f"{type(e).__name__}: {e}"[:300]
    outputs, errors = [], []
    for text in payload["inputs"]:
        out, err = None, error
        if code is not None:
            r, w = os.pipe()                                       # this input becomes file descriptor 0
            os.write(w, (text if payload["mode"] == "stdin" else "").encode())
            os.close(w)
            if r != 0:                                             # (0 is free when the program closed it)
                os.dup2(r, 0)
                os.close(r)
            sink = stream()                                        # kept: the program may rebind sys.stdout
            sys.stdin, sys.stdout, sys.stderr = open(0, "r", encoding="utf-8", closefd=False), sink, stream()
            try:
                if payload["mode"] == "stdin":
                    try:
                        exec(code, {"__name__": "__main__"})
                    except SystemExit as e:                        # sys.exit() / exit(0): a normal end
                        if e.code not in (None, 0):
                            raise
                    sink.flush()
                    out = sink.buffer.getvalue().decode("utf-8", "replace")[:cap]
                else:
                    scope = {"__name__": "__solution__"}
                    exec(code, scope)
                    fn = payload["func_name"]
                    target = getattr(scope["Solution"](), fn) if "Solution" in scope else scope.get(fn)
                    if not callable(target):
                        raise NameError(f"function {fn!r} is not defined")
                    out = str(target(*ast.literal_eval(text)))[:cap]
            except BaseException as e:                             # the program's exception fails this input
                try:
                    err = f"{type(e).__name__}: {e}"[:300]
                except BaseException:
                    err = type(e).__name__
            finally:
                sys.stdin, sys.stdout, sys.stderr = real
        outputs.append(out)
        errors.append(err)
    report = json.dumps({"outputs": outputs, "errors": errors})
    os.write(1, (REPORT_MARK + report + "\n").encode())
    os._exit(0)                                                    # skip atexit handlers the program registered


HARNESS = "\n".join([f"REPORT_MARK = {REPORT_MARK!r}", inspect.getsource(_make_guard),
                     inspect.getsource(_harness), "_harness()"])


# ----------------------------------------------------------------------------------------- the parent side
def _wait(proc, wall_s: float) -> bool:
    """Wait up to wall_s, then SIGKILL the child's whole process group; True when the wall clock ran out."""
    deadline, pause, timed_out = time.monotonic() + wall_s, 0.001, False
    try:
        if hasattr(os, "waitid"):                                  # WNOWAIT: exited but not reaped (a zombie)
            while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                time.sleep(pause)
                pause = min(2 * pause, 0.02)
        else:                                                      # (no waitid, e.g. macOS)
            try:
                proc.wait(timeout=wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:                                                       # also on KeyboardInterrupt in the trainer
        try:
            os.killpg(proc.pid, signal.SIGKILL)                    # the group id is the child's pid (new session)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    return timed_out


def _read_head(path: str, n: int) -> str:
    with open(path, "rb") as f:
        return f.read(n).decode("utf-8", "replace")


def run(code: str, inputs: list, mode: str, func_name: str | None = None, limits: Limits | None = None,
        audit: bool = True, user: str | None = None, python: str | None = None) -> Result:
    """Run `code` on every input in one sandboxed child (see the module docstring); never raises for bad code.

    inputs: stdin texts (mode "stdin") or argument-tuple reprs such as "([1, 2], 3)" (mode "function").
    audit: install the audit hook (layer 4; tests switch it off to check the kernel layers alone).
    user: run the child as this user (needs root); python: the interpreter (default: this one).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if mode == "function" and not (isinstance(func_name, str) and func_name.isidentifier()):
        raise ValueError(f"func_name must be a Python identifier in mode 'function', got {func_name!r}")
    if not isinstance(code, str) or not isinstance(inputs, (list, tuple)) or \
            not all(isinstance(x, str) for x in inputs):
        raise ValueError("code must be a str and inputs a list of str")
    if any(len(x.encode()) > MAX_INPUT_BYTES for x in inputs):
        raise ValueError(f"an input is longer than MAX_INPUT_BYTES={MAX_INPUT_BYTES} bytes")
    limits = Limits() if limits is None else limits
    python = python or sys.executable
    if not python:
        raise ValueError("python: no interpreter path (sys.executable is empty); pass python=")
    ids = {}
    if user is not None:
        if os.geteuid() != 0:
            raise ValueError(f"user={user!r} needs a root trainer (it drops root to that user)")
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"user={user!r} is not a user of this machine") from None
        ids = dict(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
    mib = 1 << 20
    payload = {"code": code, "inputs": list(inputs), "mode": mode, "func_name": func_name, "audit": bool(audit),
               "output_chars": limits.output_chars, "max_files": limits.max_files,
               "rlimits": [("RLIMIT_CPU", limits.cpu_s, limits.cpu_s + 1),
                           ("RLIMIT_AS", limits.memory_mb * mib, limits.memory_mb * mib),
                           ("RLIMIT_FSIZE", limits.file_mb * mib, limits.file_mb * mib),
                           ("RLIMIT_NPROC", 0, 0), ("RLIMIT_NOFILE", limits.nofile, limits.nofile),
                           ("RLIMIT_CORE", 0, 0)]}
    with tempfile.TemporaryDirectory(prefix="nanoragen-sandbox-", ignore_cleanup_errors=True) as tmp:
        work, paths = os.path.join(tmp, "work"), {k: os.path.join(tmp, k) for k in ("payload", "out", "err")}
        os.mkdir(work)
        if ids:                                                    # the dropped user may enter work/ only
            os.chmod(tmp, 0o711)
            os.chown(work, ids["user"], ids["group"])
        with open(paths["payload"], "w", encoding="utf-8") as f:
            json.dump(payload, f)
        start = time.monotonic()
        with open(paths["payload"], "rb") as fin, open(paths["out"], "wb") as fout, open(paths["err"], "wb") as ferr:
            proc = subprocess.Popen([python, "-I", "-S", "-B", "-c", HARNESS], stdin=fin, stdout=fout, stderr=ferr,
                                    cwd=work, env={}, close_fds=True, start_new_session=True, **ids)
            timed_out = _wait(proc, limits.wall_s)
        wall = time.monotonic() - start
        out = _read_head(paths["out"], limits.file_mb * mib + 1)
        err = _read_head(paths["err"], 2000)
    n, rc = len(inputs), proc.returncode
    report = None
    if not timed_out and REPORT_MARK in out:
        try:
            report = json.loads(out.rsplit(REPORT_MARK, 1)[1])
            if not (isinstance(report, dict) and len(report.get("outputs", ())) == n == len(report.get("errors", ()))):
                report = None
        except ValueError:
            report = None
    if report is not None:
        return Result("ok", report["outputs"], report["errors"], "", rc, wall, tmp)
    if timed_out:
        status, detail = "timeout", f"wall clock > {limits.wall_s:g} s"
    elif rc is not None and rc < 0:
        status, detail = "killed", signal.Signals(-rc).name if -rc in signal.valid_signals() else str(rc)
    else:
        status, detail = "no_report", err.strip()[-500:]
    return Result(status, [None] * n, [detail] * n, detail, rc, wall, tmp)
