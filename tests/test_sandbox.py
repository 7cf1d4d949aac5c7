"""sandbox.py: ordinary programs run and report their outputs; hostile ones (fork bomb, infinite loop, huge output,
writes outside the scratch dir, os.system, reading the project's files, environment secrets, sockets, signals) fail
their tests or are killed, within a few seconds, and leave no process or file behind. The bubblewrap boundary is
tested with the attacks that got past the process sandbox (issue 22): /proc of the parent, an aliased
_posixsubprocess, exec'd interpreters with sockets, setsid survivors, mknod/mkfifo, a two-faced path, immutable
files, forged reports, signals and renice to the trainer; they run with the audit hook off (the kernel boundary
alone) and on. Without bubblewrap (not Linux, no namespaces) those tests skip, saying why, and the rest run under
isolation='process'."""
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentic import sandbox

PROJECT = Path(__file__).resolve().parents[1]
# CPU-bound programs die at 1 CPU second; the generous wall keeps that true on a busy machine (where 1 CPU second
# can take several wall seconds), so the tests check the limit that fired, not the machine's load
FAST = sandbox.Limits(wall_s=20.0, cpu_s=1)
BWRAP_MISSING = sandbox._probe(sys.executable)          # '' when the boundary works here, else the reason
ISO = "process" if BWRAP_MISSING else "bwrap"           # the ordinary tests run under the best isolation available
needs_bwrap = pytest.mark.skipif(bool(BWRAP_MISSING), reason=f"bubblewrap unavailable: {BWRAP_MISSING}")


def run1(code, inp="", **kw):
    """Run a stdin program on one input: (output, error, Result)."""
    kw.setdefault("isolation", ISO)
    r = sandbox.run(code, [inp], "stdin", limits=kw.pop("limits", FAST), **kw)
    return r.outputs[0], r.errors[0], r


def processes_in(directory: str) -> list:
    """Pids whose working directory lies in `directory` (Linux /proc): leftovers of a run."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(directory):
                pids.append(int(pid))
        except OSError:
            pass
    return pids


# ------------------------------------------------------------------------------------------ ordinary programs
def test_function_mode_returns_str_of_each_call_and_isolates_failures():
    code = "def f(a, b):\n    print('debug output is not the result')\n    return a + b\n"
    r = sandbox.run(code, ["(1, 2)", "('x', 'y')", "([1], [2])", "(1,)"], "function", "f", limits=FAST, isolation=ISO)
    assert r.status == "ok"
    assert r.outputs == ["3", "xy", "[1, 2]", None]                   # the bad call fails alone
    assert r.errors[:3] == [None] * 3 and r.errors[3].startswith("TypeError")
    r = sandbox.run("class Solution:\n    def g(self, x):\n        return x * 2\n", ["(21,)"], "function", "g",
                    limits=FAST, isolation=ISO)
    assert r.outputs == ["42"]
    r = sandbox.run("def other(x):\n    return x\n", ["(1,)"], "function", "g", limits=FAST, isolation=ISO)
    assert r.outputs == [None] and "NameError" in r.errors[0]
    # the code runs afresh for every input, not as __main__
    r = sandbox.run("n = 0\ndef f():\n    global n\n    n += 1\n    return n\nif __name__ == '__main__':\n"
                    "    raise SystemExit(3)\n", ["()", "()"], "function", "f", limits=FAST, isolation=ISO)
    assert r.outputs == ["1", "1"]


def test_stdin_mode_serves_every_way_of_reading_input():
    ways = {"input": "print(input()[::-1])", "stdin.read": "import sys\nprint(sys.stdin.read().strip()[::-1])",
            "buffer": "import sys\nprint(sys.stdin.buffer.read().decode().strip()[::-1])",
            "open(0)": "print(open(0).read().strip()[::-1])",
            "exit(0)": "import sys\nprint(input()[::-1])\nsys.exit(0)\nprint('never')",
            "stdout.write": "import sys\nsys.stdout.write(input()[::-1] + '\\n')"}
    for name, code in ways.items():
        r = sandbox.run(code, ["abc\n", "xy\n"], "stdin", limits=FAST, isolation=ISO)
        assert r.outputs == ["cba\n", "yx\n"], name
    out, err, _ = run1("import sys\nprint('partial')\nsys.exit(2)")
    assert out is None and err.startswith("SystemExit")                # a non-zero exit fails the test


def test_syntax_error_fails_every_input_and_stdlib_imports_work():
    r = sandbox.run("def f(:\n", ["(1,)", "(2,)"], "function", "f", limits=FAST, isolation=ISO)
    assert r.status == "ok" and r.outputs == [None, None] and all("SyntaxError" in e for e in r.errors)
    code = ("import math, collections, heapq, itertools, functools, bisect, re, string, fractions, statistics, "
            "calendar, textwrap, random, json\nprint(math.gcd(12, 18), calendar.isleap(2024))")
    assert run1(code)[0] == "6 True\n"


def test_output_is_truncated_per_input():
    limits = sandbox.Limits(wall_s=20.0, output_chars=100)
    out, err, _ = run1("print('x' * 10**6)", limits=limits)
    assert out == "x" * 100 and err is None
    r = sandbox.run("def f():\n    return 'y' * 10**6\n", ["()"], "function", "f", limits=limits, isolation=ISO)
    assert r.outputs == ["y" * 100]


def test_scratch_dir_is_the_cwd_and_is_removed():
    out, err, r = run1("import os\nopen('note.txt', 'w').write('kept?')\nprint(os.getcwd())\n"
                       "print(open('note.txt').read())")
    cwd, text = out.split()
    assert text == "kept?" and cwd.startswith(r.scratch)
    assert not os.path.exists(r.scratch)


def test_no_environment_secrets_are_inherited(monkeypatch):
    monkeypatch.setenv("NANORAGEN_TEST_SECRET", "hunter2")
    out, err, _ = run1("import os\nprint(dict(os.environ))")
    assert "hunter2" not in out and "NANORAGEN_TEST_SECRET" not in out and "PATH" not in out


# ------------------------------------------------------------------------------------------ hostile programs
def test_fork_bomb_fails_and_leaves_no_process():
    out, err, _ = run1("import os\nos.fork()")          # one fork first: the bomb below runs only if it is refused
    assert out is None and "not allowed" in err, err
    out, err, r = run1("import os\nwhile True:\n    os.fork()")
    assert out is None and "not allowed" in err and r.status == "ok" and processes_in(r.scratch) == []


@pytest.mark.parametrize("code", [                         # bounded, in case a layer ever let them through
    "import multiprocessing\nfor _ in range(3):\n    multiprocessing.Process(target=print).start()",
    "import subprocess\nsubprocess.run(['sleep', '60'])",
    "import os\nos.posix_spawn('/bin/sleep', ['sleep', '60'], {})",
    "import pty\npty.fork()",
])
def test_child_processes_are_refused(code):
    out, err, r = run1(code)
    assert out is None and "not allowed" in err, err
    assert processes_in(r.scratch) == []


def test_os_system_and_subprocess_cannot_run_commands(tmp_path):
    marker = tmp_path / "ran"
    for code in (f"import os\nos.system('touch {marker}')", f"import os\nos.execv('/bin/touch', ['touch', '{marker}'])",
                 f"import subprocess\nsubprocess.call(['touch', '{marker}'])"):
        out, err, _ = run1(code)
        assert out is None and "not allowed" in err, err
    assert not marker.exists()


def test_infinite_loop_is_killed_by_the_cpu_limit():
    out, err, r = run1("while True:\n    pass")
    assert out is None and r.status == "killed" and r.detail in ("SIGXCPU", "SIGKILL")


def test_sleeping_program_is_killed_by_the_wall_clock_with_its_group():
    out, err, r = run1("import time\ntime.sleep(60)", limits=sandbox.Limits(wall_s=1.0, cpu_s=5))
    assert out is None and r.status == "timeout" and processes_in(r.scratch) == []


def test_huge_output_and_memory_are_bounded():
    out, err, r = run1("while True:\n    print('x' * 1000)")                  # captured, capped, then CPU limit
    assert out is None and r.status == "killed"
    out, err, r = run1("import os\nwhile True:\n    os.write(1, b'x' * 65536)")  # straight to the stdout file
    assert out is None and r.status != "ok"                                     # RLIMIT_FSIZE: the run fails
    out, err, r = run1("open('big', 'w').write('x' * (8 << 20))")              # > file_mb in the scratch dir
    assert out is None and "File too large" in err
    out, err, r = run1("x = bytearray(8 << 30)")                                # > memory_mb
    assert out is None and "MemoryError" in err


def test_writes_outside_the_scratch_dir_fail(tmp_path):
    targets = [tmp_path / "abs.txt", PROJECT / "sandbox_evil.txt"]
    codes = [f"open({str(targets[0])!r}, 'w').write('x')", f"open({str(targets[1])!r}, 'a').write('x')",
             "open('../../escape.txt', 'w').write('x')", f"import os\nos.mkdir({str(tmp_path / 'd')!r})",
             f"import pathlib\npathlib.Path({str(tmp_path / 'p.txt')!r}).write_text('x')",
             f"import os\nos.rename('.', {str(tmp_path / 'moved')!r})",
             f"import os\nos.symlink({str(PROJECT / 'agentic' / 'sandbox.py')!r}, 'link')",
             f"import shutil\nshutil.copy({str(PROJECT / 'agentic' / 'sandbox.py')!r}, 'copy.py')"]
    for code in codes:
        out, err, r = run1(code)
        assert out is None and "not allowed" in err, (code, err)
    assert sorted(os.listdir(tmp_path)) == [] and not targets[1].exists()
    out, err, _ = run1("for i in range(100):\n    open(f'f{i}', 'w').close()")   # write budget in the scratch dir
    assert out is None and "f16" in err


def test_reading_the_project_files_fails():
    for code in (f"print(open({str(PROJECT / 'agentic' / 'deepcoder_problems.py')!r}).read())",
                 f"print(open({str(Path(__file__).resolve())!r}).read())",
                 f"import os\nprint(os.listdir({str(PROJECT)!r}))",
                 f"import os\nos.chdir({str(PROJECT)!r})\nprint(open('agentic/sandbox.py').read())",
                 "print(open('/etc/passwd').read())"):
        out, err, _ = run1(code)
        assert out is None and "not allowed" in err, (code, err)


def test_sockets_and_signals_are_refused():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        port = server.getsockname()[1]
        out, err, _ = run1(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert out is None and "not allowed" in err
        with pytest.raises(BlockingIOError):                                    # nobody connected
            server.accept()
    out, err, _ = run1("import os\nos.kill(os.getppid(), 0)")                   # signal 0: harmless if it got through
    assert out is None and "not allowed" in err
    for code in ("import ctypes", "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (99, 99))",
                 "import gc\ngc.get_objects()"):
        out, err, _ = run1(code)
        assert out is None and "not allowed" in err


ALIASED = """import importlib.util
origin = importlib.util.find_spec({name!r}).origin        # the extension's real file, in the stdlib
spec = importlib.util.spec_from_file_location('x.{name}', origin)
importlib.util.module_from_spec(spec)
print('loaded')"""


@pytest.mark.parametrize("name", ["_ctypes", "_posixsubprocess", "_testcapi"])
def test_a_denied_module_loaded_under_another_name_is_refused(name):
    """An extension module's init function is named after the last component of the module name, so '_ctypes'
    loaded from its own file as 'x._ctypes' is ctypes' engine under a name the hook once let through; the control
    (a permitted extension, array, loaded the same way) shows the recipe works."""
    out, err, _ = run1(ALIASED.format(name=name))
    assert out is None and f"import x.{name} is not allowed" in err, (out, err)
    out, err, _ = run1(ALIASED.format(name="array"))
    assert err is None and out == "loaded\n", err


FORGERIES = {   # each a first step of native code without ctypes (an attack combined a forged code object's
    # out-of-range LOAD_CONST, which reads any address as an object, with an executable mapping)
    "code.replace": "g = (lambda: 0).__code__.replace(co_consts=())",
    "types.CodeType": "import types\nc = (lambda: 0).__code__\ntypes.CodeType(*[getattr(c, 'co_' + k) for k in ("
                      "'argcount', 'posonlyargcount', 'kwonlyargcount', 'nlocals', 'stacksize', 'flags', 'code', "
                      "'consts', 'names', 'varnames', 'filename', 'name', 'qualname', 'firstlineno', 'linetable', "
                      "'exceptiontable', 'freevars', 'cellvars')])",
    "marshal.loads": "import marshal\nmarshal.loads(marshal.dumps(compile('1', '', 'eval')))",
    "marshal.loads after a .pyc": "import heapq, marshal\nmarshal.loads(marshal.dumps(compile('1', '', 'eval')))",
    "marshal.load": "import io, marshal\nmarshal.load(io.BytesIO(marshal.dumps(compile('1', '', 'eval'))))",
    "mmap": "import mmap\nmmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)",
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_code_objects_and_executable_mappings_are_refused(name):
    out, err, _ = run1(FORGERIES[name] + "\nprint('made')")
    assert out is None and "not allowed" in err, (out, err)


@pytest.mark.parametrize("module", ["_testcapi", "_testinternalcapi", "_xxsubinterpreters", "sqlite3"])
def test_modules_that_get_around_the_hook_are_refused(module):
    """_testcapi.eval_code_ex with a float as a closure cell forged objects over any address (read and write);
    _xxsubinterpreters.run_string ran code in an interpreter without the hook (ctypes, exec mmap, any file);
    sqlite3.connect / ATTACH opened /usr/lib/os-release and /proc/1/cmdline (no checked event)."""
    out, err, _ = run1(f"import {module}\nprint('imported')")
    assert out is None and "is not allowed" in err, (out, err)


# a path through /proc/self/cwd means another file once the cwd moves: the hook resolved it to a decoy in the
# scratch dir, a gc callback run inside the check chdir'd, and the kernel opened the real file (k = 7-15 did)
GC_RACE = """import gc, os
depth = len(os.getcwd().strip('/').split('/'))
root = os.open('.', os.O_RDONLY)
os.makedirs('usr/lib'); open('usr/lib/os-release', 'w').write('DECOY')
os.makedirs('/'.join(['d'] * depth))
P = '/proc/self/cwd/' + '../' * depth + 'usr/lib/os-release'
state = {'k': 0, 'n': 0}
def cb(phase, info):
    if phase == 'start' and state['k']:
        state['n'] += 1
        if state['n'] == state['k']:
            state['k'] = 0
            os.chdir(root)
gc.callbacks.append(cb)
seen = set()
for k in range(1, 20):
    os.chdir(root); os.chdir('/'.join(['d'] * depth))
    gc.set_threshold(1)
    state.update(k=k, n=0)
    try:
        with open(P) as f:
            seen.add(f.read()[:5])
    except PermissionError:
        seen.add('refused')
    state['k'] = 0
    gc.set_threshold(700)
print(sorted(seen))"""

# the .pyc rule once kept the path string: opened through /proc/self/cwd/.. it named the stdlib's os.pyc, and after a
# chdir the same string named the program's own forged .pyc, which marshal.loads then accepted (and ran)
PYC_SWAP = """import os, sys, marshal
depth = len(os.getcwd().strip('/').split('/'))
pyc = os.path.join(sys.path[1], '__pycache__', 'os.cpython-%d%d.pyc' % sys.version_info[:2])
P = '/proc/self/cwd/' + '../' * depth + pyc.lstrip('/')
with open(P, 'rb') as f:
    f.read(16)
print('opened')"""


def test_paths_through_proc_or_with_dotdot_are_refused_whatever_runs_during_the_check():
    out, err, _ = run1(GC_RACE)
    assert (out, err) == ("['refused']\n", None), (out, err)
    out, err, _ = run1(PYC_SWAP)
    assert out is None and "is not allowed" in err, (out, err)
    for path in ("/proc/self/root/usr/lib/os-release", "/proc/1/cmdline", "/dev/fd/0", "//proc/self/status"):
        out, err, _ = run1(f"print(open({path!r}).read()[:10])")
        assert out is None and "is not allowed" in err, (path, out, err)


def test_stdlib_modules_still_import_from_their_pyc_files():
    """The control of the marshal rule: an import reads the module's .pyc (marshal.loads of exactly its bytes)."""
    code = ("import os, heapq, fractions, statistics, dataclasses\nprint(os.path.exists(heapq.__cached__), "
            "fractions.Fraction(1, 3) + fractions.Fraction(1, 6), statistics.median([3, 1, 2]))")
    assert run1(code)[:2] == ("True 1/2 2\n", None)


def test_a_climbing_relative_path_with_dir_fd_is_refused():
    """os.open's dir_fd is not in the open audit event: from a cwd 8 levels deep, '../'*8 + 'x' lies in the scratch
    dir for the hook but, relative to a descriptor of the scratch dir, outside it for the kernel."""
    deep = "os.makedirs('a/b/c/d/e/f/g/h')\nfd = os.open('.', os.O_RDONLY)\nos.chdir('a/b/c/d/e/f/g/h')\n"
    out, err, _ = run1("import os\n" + deep + "print(os.read(os.open('../' * 8 + 'usr/lib/os-release', os.O_RDONLY, "
                       "dir_fd=fd), 20))")
    assert out is None and "is not allowed" in err, (out, err)
    out, err, _ = run1("import os\nos.mkdir('d')\nopen('d/x', 'w').write('hi')\nfd = os.open('d', os.O_RDONLY)\n"
                       "print(os.read(os.open('x', os.O_RDONLY, dir_fd=fd), 2))")          # not climbing: allowed
    assert (out, err) == ("b'hi'\n", None)


def test_posix_timers_are_capped_by_rlimit_sigpending():
    """Each timer holds a queued-signal slot, counted per uid on the host (a program once made 96,362 of them,
    +37 MiB of kernel memory, with ctypes and the hook off): RLIMIT_SIGPENDING = SIGPENDING caps them."""
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\ntid = ctypes.c_void_p()\nn = 0\n"
            "while n < 5000 and libc.timer_create(1, None, ctypes.byref(tid)) == 0:\n    n += 1\n"
            "print(n, ctypes.get_errno())")
    out, err, _ = run1(code, audit=False)
    n, errno_ = map(int, out.split())
    assert 0 < n <= sandbox.SIGPENDING and errno_ == 11, (n, errno_)                           # EAGAIN


def kernel_only_settings():
    """Settings that exercise the kernel layers with the audit hook off: the test user itself, or, as root
    (which ignores RLIMIT_NPROC), 'nobody' with an interpreter that user can run; None when neither works."""
    if os.geteuid() != 0:
        return {}
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin:/bin")
    if python is None:
        return None
    try:
        probe = subprocess.run([python, "-c", "pass"], user="nobody", capture_output=True, timeout=30)
    except (KeyError, OSError, subprocess.SubprocessError):
        return None
    return {"user": "nobody", "python": python} if probe.returncode == 0 else None


KERNEL_ONLY = dict(audit=False, isolation="process")    # the process sandbox's kernel layers alone


def test_kernel_limits_hold_without_the_audit_hook():
    settings = kernel_only_settings()
    if settings is None:
        pytest.skip("running as root without a 'nobody'-runnable python3")
    # bounded on purpose: even if RLIMIT_NPROC were not enforced this makes at most 7 short-lived processes
    out, err, r = run1("import os\nfor _ in range(3):\n    os.fork()", **KERNEL_ONLY, **settings)
    assert out is None and "BlockingIOError" in err and processes_in(r.scratch) == []
    out, err, _ = run1("import threading\nthreading.Thread(target=print).start()", **KERNEL_ONLY, **settings)
    assert out is None and "thread" in err
    out, err, r = run1("while True:\n    pass", **KERNEL_ONLY, **settings)
    assert r.status == "killed"
    if settings:                                                                # as 'nobody': file permissions too
        out, err, _ = run1(f"open({str(PROJECT / 'sandbox_evil.txt')!r}, 'w')", **KERNEL_ONLY, **settings)
        assert out is None and "Permission denied" in err and not (PROJECT / "sandbox_evil.txt").exists()
        out, err, _ = run1(f"import os\nos.kill({os.getpid()}, 0)", **KERNEL_ONLY, **settings)   # signal 0: harmless
        assert out is None and "Operation not permitted" in err


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="mode"):
        sandbox.run("", [""], "repl")
    with pytest.raises(ValueError, match="func_name"):
        sandbox.run("", ["()"], "function", "not a name")
    with pytest.raises(ValueError, match="MAX_INPUT_BYTES"):
        sandbox.run("", ["x" * (sandbox.MAX_INPUT_BYTES + 1)], "stdin")
    for bad in (dict(wall_s=0), dict(cpu_s=0), dict(memory_mb=1.5), dict(output_chars=True)):
        with pytest.raises(ValueError):
            sandbox.Limits(**bad)
    if os.geteuid() != 0:
        with pytest.raises(ValueError, match="root"):
            sandbox.run("", [""], "stdin", user="nobody")


# ------------------------------------------------------------------------ the bubblewrap boundary (issue 22)
BOTH = pytest.mark.parametrize("audit", [False, True], ids=["kernel-only", "with-hook"])


def bwrap1(code, audit=True, inp="", limits=FAST):
    """Run a stdin program under bubblewrap: (output, error, Result); the scratch dir and processes are gone."""
    r = sandbox.run(code, [inp], "stdin", limits=limits, audit=audit, isolation="bwrap")
    assert r.isolation == "bwrap" and r.cleaned and not os.path.exists(r.scratch) and processes_in(r.scratch) == []
    return r.outputs[0], r.errors[0], r


@needs_bwrap
@BOTH
def test_checkout_and_parent_are_invisible_through_proc(audit, monkeypatch):
    monkeypatch.setenv("NANORAGEN_TEST_SECRET", "hunter2")
    code = f"""import os
found = []
for pid in os.listdir('/proc'):
    for name in ('cwd/agentic/deepcoder_problems.py', 'root{PROJECT}/agentic/deepcoder_problems.py', 'environ', 'cmdline'):
        try:
            found.append(open(f'/proc/{{pid}}/{{name}}', 'rb').read()[:4000])
        except Exception:
            pass
for path in ({str(PROJECT / 'agentic' / 'deepcoder_problems.py')!r}, '/proc/{os.getpid()}/environ', '/proc/{os.getppid()}/cwd'):
    try:
        found.append(open(path, 'rb').read())
    except Exception as e:
        found.append(repr(e).encode())
print(repr(found), os.getppid(), sorted(os.listdir('/proc'), key=str.isdigit)[-4:])"""
    out, err, _ = bwrap1(code, audit)
    assert out is not None or "not allowed" in err, err
    text = out or err
    assert "PROBLEMS" not in text and "hunter2" not in text and "reference" not in text


@needs_bwrap
@BOTH
def test_no_process_can_be_started_or_survive(audit, tmp_path):
    marker = tmp_path / "pwned"
    code = f"""import _imp, os, types
try:
    ps = _imp.create_builtin(types.SimpleNamespace(name='_posixsubprocess'))   # aliased: no import event
    r, w = os.pipe()
    ps.fork_exec([b'/bin/sh', b'-c', b'id > {marker}'], [b'/bin/sh', b'/usr/bin/sh'], True, (w,), None, None,
                 -1, -1, -1, -1, -1, -1, r, w, True, True, -1, None, None, None, -1, None, False)
    print('spawned')
except Exception as e:
    print('refused', type(e).__name__)
try:
    if os.fork() == 0:
        os.setsid()
        import time
        time.sleep(60)
    print('forked')
except Exception as e:
    print('refused', type(e).__name__)"""
    out, err, r = bwrap1(code, audit)
    assert out is None or ("spawned" not in out and "forked" not in out), out
    assert not marker.exists()


@needs_bwrap
def test_exec_d_interpreter_has_no_network():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        port = server.getsockname()[1]
        inner = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
        for code in (f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {inner!r}])",
                     f"import _imp, types\n_imp.create_builtin(types.SimpleNamespace(name='_socket'))\n{inner}",
                     inner):
            out, err, r = bwrap1(code, audit=False)            # the hook off: the network namespace alone
            assert out is None or "connected" not in out, (code, out)
        with pytest.raises(BlockingIOError):                    # nobody connected
            server.accept()


@needs_bwrap
@BOTH
def test_trainer_cannot_be_signalled_reniced_or_written(audit):
    """Every attempt is harmless if it got through (signal 0, the trainer's own nice value): success shows as 'ok'."""
    me, nice = os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)
    code = f"""import os, signal
tries = []
for act in (lambda: signal.pidfd_send_signal(os.pidfd_open({me}), 0), lambda: os.kill({me}, 0),
            lambda: os.setpriority(os.PRIO_PROCESS, {me}, {nice}), lambda: open('/proc/{me}/mem', 'rb'),
            lambda: open('/proc/{me}/environ', 'rb')):
    try:
        act()
        tries.append('ok')
    except Exception as e:
        tries.append(type(e).__name__)
print(tries)"""
    out, err, _ = bwrap1(code, audit)
    assert out is None or "'ok'" not in out, out
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice


@needs_bwrap
@BOTH
def test_mknod_mkfifo_and_a_two_faced_path_reach_nothing_outside(audit, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hidden expected outputs")
    code = f"""import _io, os, posix
results = []
for act in (lambda: posix.mkfifo({str(tmp_path / 'fifo')!r}), lambda: posix.mknod('null2', 0o20666, os.makedev(1, 3)),
            lambda: posix.mkfifo('/tmp/fifo')):
    try:
        act()
        results.append('made')
    except Exception as e:
        results.append(type(e).__name__)
class TwoFaced:
    calls = 0
    def __fspath__(self):
        TwoFaced.calls += 1
        return 'harmless.txt' if TwoFaced.calls == 1 else {str(secret)!r}
try:
    results.append(_io.FileIO(TwoFaced()).read().decode())
except Exception as e:
    results.append(type(e).__name__)
print(results)"""
    out, err, _ = bwrap1(code, audit)
    assert "hidden expected outputs" not in (out or err)
    assert sorted(os.listdir(tmp_path)) == ["secret.txt"]
    if out is not None:
        assert out.split(",")[1].strip() != "'made'", out       # no device node


@needs_bwrap
def test_immutable_files_cannot_be_made_and_cleanup_never_raises(tmp_path):
    code = """import fcntl, os
fd = os.open('stuck', os.O_CREAT | os.O_WRONLY)
try:
    fcntl.ioctl(fd, 0x40086602, (0x10).to_bytes(8, 'little'))   # FS_IOC_SETFLAGS, FS_IMMUTABLE_FL
    print('immutable')
except OSError as e:
    print('refused', e.errno)"""
    out, err, r = bwrap1(code, audit=False)                       # bwrap1 checks that the scratch dir is gone
    assert out is not None and out.startswith("refused")
    # the trainer side: a tree that cannot be removed is reported, not raised
    stuck = tmp_path / "tree" / "stuck"
    stuck.parent.mkdir()
    stuck.write_text("x")
    fd = os.open(stuck, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, 0x40086602, (0x10).to_bytes(8, "little"))
    except OSError:
        os.close(fd)
        pytest.skip("cannot set the immutable flag here (not root or a file system without it)")
    try:
        assert sandbox._remove_tree(str(stuck.parent)) is False and stuck.exists()
    finally:
        fcntl.ioctl(fd, 0x40086602, (0).to_bytes(8, "little"))
        os.close(fd)
    assert sandbox._remove_tree(str(stuck.parent)) is True and not stuck.parent.exists()


# A program that switches the audit hook off from the traceback of a refused call (found by an attack on the
# sandbox: the hook's closure, its private builtins and its event table are all reachable from that frame).
DISABLE_HOOK = """
try:
    open('/x')
except PermissionError as e:
    tb = e.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    f = tb.tb_frame
    w = f.f_locals['where']
    w.__closure__[w.__code__.co_freevars.index('scratch')].cell_contents = ''
    f.f_builtins['bool'] = lambda x: False
    f.f_locals['path_events'].clear()
"""


@needs_bwrap
def test_with_the_hook_switched_off_the_kernel_caps_what_lands_and_nothing_reaches_the_host():
    """The audit hook is a tripwire: the program above disables it. What bounds it then is the kernel: the scratch
    dir and /tmp are tmpfs mounts of at most max_files x file_mb (16 MiB) inside the sandbox, so 40 files of 1 MiB
    do not fit, the host disk sees none of it, and a tree 1,000 directories deep (within the 1,024 inodes a root
    trainer's scratch tmpfs has, the test below) goes with the mount namespace."""
    code = DISABLE_HOOK + """import os
counts = []
for where in ('.', '/tmp'):
    n = 0
    for i in range(40):
        try:
            with open(os.path.join(where, 'f%d' % i), 'wb') as fh:
                fh.write(b'x' * ((1 << 20) - 4096))
            n += 1
        except OSError:
            break
    counts.append(n)
for i in range(1000):
    os.mkdir('d')
    os.chdir('d')
print(counts[0], counts[1], len(os.getcwd()))"""
    out, err, r = bwrap1(code, audit=True)                        # bwrap1: scratch gone, no process left
    assert err is None, err
    here, tmp, depth = map(int, out.split())
    assert 8 <= here <= 16                                        # the cap held (not 40), and writing worked at all
    assert tmp <= 16 and (tmp == 0) == (os.geteuid() == 0)        # /tmp: capped too; a root trainer's is read-only
    assert depth > 1000 * 2


INODE_FLOOD = DISABLE_HOOK + """import errno, os
n = 0
try:
    while n < 300000:
        os.mkdir('d%d' % n)
        n += 1
except OSError as e:
    print(n, errno.errorcode[e.errno])
else:
    print(n, 'none')"""


@needs_bwrap
@pytest.mark.skipif(sandbox.scratch_mount_tools() is None, reason="the inode cap needs a root trainer with unshare(1)"
                    " and mount(8); without it the scratch tmpfs has the kernel's default inode limit (documented)")
def test_with_the_hook_switched_off_the_scratch_inode_count_is_capped_and_the_mount_stays_private():
    """tmpfs --size caps bytes, not inodes: 292k empty directories once cost the host +364 MiB of kernel memory in
    2.3 s. A root trainer's scratch tmpfs is mounted with nr_inodes = max_inodes, so the flood stops with ENOSPC
    at max_inodes - 1 (the root directory is one), the sandbox still reports, and the host's mount table never
    shows the mount (it lives in a private mount namespace)."""
    before = open("/proc/self/mountinfo").read()
    for cap in (1024, 100):
        limits = sandbox.Limits(wall_s=20.0, cpu_s=10, max_inodes=cap)
        out, err, r = bwrap1(INODE_FLOOD, audit=True, limits=limits)
        assert err is None and out.split() == [str(cap - 1), "ENOSPC"], (out, err, r.detail)
        assert r.scratch not in open("/proc/self/mountinfo").read()
    assert "nanoragen-scratch" not in before + open("/proc/self/mountinfo").read()
    ok = sandbox.run("import os\nos.mkdir('a')\nopen('a/b', 'w').write('x')\nprint(sorted(os.listdir('.')))",
                     [""], "stdin", limits=FAST, isolation="bwrap")
    assert ok.outputs == ["['a']\n"], ok.errors                   # an ordinary program still writes its files


def test_the_write_budget_is_per_input():
    """A correct program that writes 3 files per test passes all 6 tests (the hook's max_files = 16 counted once
    for the whole evaluation used to fail tests 6 and on), and one input still cannot write more than 16."""
    code = "import sys\nfor k in range(3):\n    open('data%d.txt' % k, 'w').write(sys.stdin.read() or 'x')\nprint('ok')"
    r = sandbox.run(code, [str(i) for i in range(6)], "stdin", limits=FAST, isolation=ISO)
    assert r.outputs == ["ok\n"] * 6, r.errors
    greedy = "for k in range(20):\n    open('g%d' % k, 'w').write('x')\nprint('all')"
    out, err, _ = run1(greedy)
    assert out is None and "is not allowed" in err


def test_cleanup_removes_trees_too_deep_for_rmtree(tmp_path):
    """Process mode keeps the host scratch dir: a tree thousands of levels deep (RecursionError in Python 3.11's
    rmtree, paths beyond PATH_MAX) with an unreadable directory inside is still removed, and reported as such."""
    top = tmp_path / "scratch"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(3000):                                          # 3000 x "/dd" = 9000 chars > PATH_MAX (4096)
        os.mkdir("dd", dir_fd=fd)
        nxt = os.open("dd", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.mkdir("locked", dir_fd=fd)
    os.chmod("locked", 0o000, dir_fd=fd)
    os.close(fd)
    assert sandbox._remove_tree(str(top)) is True and not top.exists()


FORGED = [sandbox.REPORT_MARK + "[" * 200_000,                                      # RecursionError once
          sandbox.REPORT_MARK + json.dumps({"outputs": [["42"]], "errors": [None]}),    # AttributeError once
          sandbox.REPORT_MARK + json.dumps({"outputs": [42], "errors": [None]}),
          sandbox.REPORT_MARK + json.dumps({"outputs": ["42", "43"], "errors": [None, None]}),
          sandbox.REPORT_MARK + json.dumps({"outputs": ["42"], "errors": [None], "extra": 1}),
          sandbox.REPORT_MARK + json.dumps(["42"]), sandbox.REPORT_MARK + "\udcff",
          sandbox.REPORT_MARK + " " * (sandbox.MAX_REPORT_CHARS + 1) + '{"outputs": ["42"], "errors": [null]}']


@pytest.mark.parametrize("forged", range(len(FORGED)))
def test_forged_reports_are_rejected_without_raising(forged):
    assert sandbox.parse_report("noise" + FORGED[forged] + "\n", 1) is None
    code = f"import os\nos.write(1, {FORGED[forged].encode('utf-8', 'surrogatepass')!r})\nos._exit(0)"
    limits = sandbox.Limits(wall_s=20.0, cpu_s=1, file_mb=8)
    out, err, r = run1(code, limits=limits)
    assert out is None and r.status == "no_report"
    assert sandbox.parse_report(sandbox.REPORT_MARK + '{"outputs": ["42"], "errors": [null]}\n', 1) == (["42"], [None])


def test_audit_hook_allows_dir_fd_free_calls_in_the_scratch_dir():
    code = ("import os\nos.mkdir('d')\nopen('d/f', 'w').close()\nos.chmod('d/f', 0o600)\nos.rename('d/f', 'd/g')\n"
            "os.remove('d/g')\nos.rmdir('d')\nprint('fine')")
    assert run1(code)[0] == "fine\n"


def test_fail_closed_when_bubblewrap_is_missing(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    sandbox._probe.cache_clear()
    try:
        with pytest.raises(ValueError, match="isolation='process'") as e:
            sandbox.check_isolation("bwrap")
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match="isolation='process'"):
            sandbox.run("print(1)", [""], "stdin")
        assert sandbox.run("print(1)", [""], "stdin", isolation="process").outputs == ["1\n"]
    finally:
        sandbox._probe.cache_clear()
    with pytest.raises(ValueError, match="isolation"):
        sandbox.check_isolation("container")


@needs_bwrap
def test_stdlib_modules_with_shared_libraries_load_as_the_dropped_user():
    """/usr used to be created 0700 inside the sandbox, so uid 65534 could load no libz / libffi: `import base64`
    (binascii -> zlib) failed and a correct solution scored 0."""
    code = "import base64, zlib, json\nprint(base64.b64encode(zlib.compress(b'ab')).decode()[:4], json.dumps([1]))"
    out, err, _ = bwrap1(code)
    assert err is None and out.split() == ["eJxL", "[1]"], err


def test_max_inodes_must_fit_the_kernels_counter():
    """nr_inodes is parsed modulo 2**64 (2**64 = no limit at all): refused before anything runs."""
    for bad in (1 << 32, 1 << 64, 0, True, 2.5):
        with pytest.raises(ValueError, match="max_inodes"):
            sandbox.Limits(max_inodes=bad)
    assert sandbox.Limits(max_inodes=(1 << 32) - 1).max_inodes == (1 << 32) - 1


WRITTEN_EXTENSION = """import importlib.util, array, os
name = os.path.basename(array.__file__)
open(name, 'wb').write(open(array.__file__, 'rb').read())
try:
    importlib.util.module_from_spec(importlib.util.spec_from_file_location('array', os.path.abspath(name)))
    print('loaded')
except ImportError as e:
    print('refused', 'failed to map segment' in str(e))"""


@needs_bwrap
@pytest.mark.skipif(sandbox.scratch_mount_tools() is None, reason="the noexec scratch mount needs a root trainer")
def test_native_code_written_to_the_scratch_dir_cannot_be_loaded():
    """A program that writes a compiled extension module and imports it gets raw syscalls past the audit hook
    (an attack found it: SysV shm beyond RLIMIT_AS, its own namespaces and mounts, host keyrings). The root
    trainer's scratch tmpfs is mounted noexec, so the loader cannot map it (here: a copy of the stdlib's own
    `array` extension, which loads fine from its real path)."""
    out, err, _ = bwrap1(WRITTEN_EXTENSION, limits=sandbox.Limits(wall_s=20.0, cpu_s=5, file_mb=4))
    assert err is None and out == "refused True\n", (out, err)
    via_memfd = """import importlib.machinery, importlib.util, array, os
fd = os.memfd_create('x')
os.write(fd, open(array.__file__, 'rb').read())
loader = importlib.machinery.ExtensionFileLoader('array', '/proc/self/fd/%d' % fd)
importlib.util.module_from_spec(importlib.util.spec_from_loader('array', loader))
print('loaded')"""
    out, err, _ = bwrap1(via_memfd, limits=sandbox.Limits(wall_s=20.0, cpu_s=5, file_mb=4))
    assert out is None and "memfd_create" in err                   # the hook's tripwire: os.memfd_create is gone
