"""seccomp.py: the filter's syscall numbers equal the kernel headers (where installed); an independent BPF
interpreter below runs program() on both architectures and gets the verdict the docstring promises for each kind
of call; and under bubblewrap a program with raw syscalls (ctypes, audit hook off) is refused exactly those calls,
while the same probe behind an allow-all filter gets them (the control: the probe could have seen a gap)."""
import errno
import json
import platform
import re
import signal
import struct
import sys
from pathlib import Path

import pytest

from agentic import sandbox, seccomp

BWRAP_MISSING = sandbox._probe(sys.executable)
needs_bwrap = pytest.mark.skipif(bool(BWRAP_MISSING), reason=f"bubblewrap unavailable: {BWRAP_MISSING}")
HEADERS = {"x86_64": [Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"), Path("/usr/include/asm/unistd_64.h")],
           "aarch64": [Path("/usr/include/asm-generic/unistd.h")]}
ALLOW, KILL = seccomp.RET_ALLOW, seccomp.RET_KILL_PROCESS
EPERM, ENOSYS = seccomp.RET_ERRNO | errno.EPERM, seccomp.RET_ERRNO | errno.ENOSYS
THREAD_FLAGS = 0x3D0F00          # what glibc's pthread_create passes to clone (VM|FS|FILES|SIGHAND|THREAD|...)


def header_numbers(machine: str) -> dict:
    """{name: number} from the first header of `machine` found here (the `__NR_name number` lines)."""
    for path in HEADERS[machine]:
        if path.exists():
            found = re.findall(r"#define\s+__NR_(\w+)\s+(\d+)\b", path.read_text())
            return {name: int(nr) for name, nr in found}
    pytest.skip(f"no kernel header for {machine} here ({', '.join(map(str, HEADERS[machine]))})")


def run_bpf(prog: bytes, nr: int, arch: int, args=(0,) * 6) -> int:
    """A classic-BPF interpreter for the five instructions a seccomp filter of this kind uses, over a
    struct seccomp_data built here: the verdict the kernel would return."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
    ins = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:                                   # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):                   # JEQ, JGE, JSET with a constant
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:                                 # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected BPF opcode {code:#x} at {pc}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_syscall_numbers_are_the_kernels(machine):
    want = header_numbers(machine)
    table = seccomp.numbers(machine)
    wrong = {name: (nr, want.get(name)) for name, nr in table.items() if name in want and want[name] != nr}
    assert not wrong, f"{machine}: (ours, header) differ: {wrong}"
    # a call missing from the header must be newer than it: numbered above the header's last call
    older = {name: nr for name, nr in table.items() if name not in want and nr <= max(want.values())}
    assert not older, f"{machine}: not in the header although numbered within its range: {older}"
    assert want["clone"] == seccomp.CLONE[machine] and want["clone3"] == seccomp.CLONE3
    missing = [n for n, nrs in seccomp.SYSCALLS.items() if n in want and nrs[list(seccomp.AUDIT_ARCH).index(machine)]
               is None]
    assert not missing, f"{machine} has these calls but the table says it has none: {missing}"


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_refuses_the_denied_calls_and_allows_the_rest(machine):
    prog, arch = seccomp.program(machine), seccomp.AUDIT_ARCH[machine]
    table = seccomp.numbers(machine)
    assert len(table) > 50 and {"unshare", "shmget", "add_key", "memfd_create", "io_uring_setup", "bpf"} <= set(table)
    for name, nr in table.items():
        assert run_bpf(prog, nr, arch) == EPERM, name
    denied = set(table.values()) | {seccomp.CLONE[machine], seccomp.CLONE3}
    for nr in range(0, 470):                               # every other call of this architecture: allowed
        if nr not in denied:
            assert run_bpf(prog, nr, arch) == ALLOW, nr
    clone = seccomp.CLONE[machine]
    assert run_bpf(prog, clone, arch, (THREAD_FLAGS, 0, 0, 0, 0, 0)) == ALLOW          # a thread
    assert run_bpf(prog, clone, arch, (signal.SIGCHLD, 0, 0, 0, 0, 0)) == ALLOW        # fork
    for bit in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert run_bpf(prog, clone, arch, (bit | signal.SIGCHLD, 0, 0, 0, 0, 0)) == EPERM, hex(bit)
    assert run_bpf(prog, clone, arch, ((1 << 32) | signal.SIGCHLD, 0, 0, 0, 0, 0)) == ALLOW   # high word: no NEW*
    assert run_bpf(prog, seccomp.CLONE3, arch) == ENOSYS
    other = next(a for m, a in seccomp.AUDIT_ARCH.items() if m != machine)
    assert run_bpf(prog, 39, other) == KILL and run_bpf(prog, 39, 0x40000003) == KILL         # aarch64 / i386
    if machine == "x86_64":
        assert run_bpf(prog, seccomp.X32_SYSCALL_BIT | 39, arch) == KILL                     # x32 getpid


def test_an_unknown_architecture_is_refused_in_one_line():
    with pytest.raises(ValueError, match="riscv64"):
        seccomp.program("riscv64")


# a program that makes raw system calls through ctypes and prints what each returned
PROBE = """import ctypes, errno, json, os
NR = json.loads(%r)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = lambda b: ctypes.cast(ctypes.create_string_buffer(b), ctypes.c_void_p).value
params = ctypes.create_string_buffer(120)
calls = {
    "unshare": (0x10000000 | 0x20000,),
    "shmget": (0, 1 << 20, 0o1000 | 0o600),
    "semget": (0, 1, 0o1000 | 0o600),
    "msgget": (0, 0o1000 | 0o600),
    "add_key": (buf(b"user"), buf(b"k"), buf(b"v"), 1, -2),
    "memfd_create": (buf(b"x"), 0),
    "io_uring_setup": (1, ctypes.addressof(params)),
    "userfaultfd": (0,),
    "mount": (buf(b"none"), buf(b"/tmp"), buf(b"tmpfs"), 0, 0),
    "inotify_init1": (0,),
    "clone": (0x10000000 | 17, 0, 0, 0, 0),
    "clone3": (0, 0),
    "getpid": (),
}
out = {}
for name, args in calls.items():
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name]), *[ctypes.c_long(a) for a in args])
    if r == 0 and name == "clone":
        os._exit(0)
    out[name] = "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
out["status"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")]
print(json.dumps(out))
"""


def probe(monkeypatch=None) -> dict:
    machine = platform.machine()
    nrs = dict(seccomp.numbers(machine), clone=seccomp.CLONE[machine], clone3=seccomp.CLONE3,
               getpid={"x86_64": 39, "aarch64": 172}[machine])
    r = sandbox.run(PROBE % json.dumps(nrs), [""], "stdin", audit=False, isolation="bwrap",
                    limits=sandbox.Limits(wall_s=30.0, cpu_s=5))
    assert r.isolation == "bwrap" and r.errors[0] is None, r.errors[0]
    return json.loads(r.outputs[0])


@needs_bwrap
def test_under_bubblewrap_raw_syscalls_are_refused_by_the_kernel():
    got = probe()
    assert got.pop("status") == ["2"]                      # SECCOMP_MODE_FILTER: run() installed it
    assert got.pop("getpid") == "ok" and got.pop("clone3") == "ENOSYS"
    assert got == dict.fromkeys(got, "EPERM") and len(got) == 11, got


@needs_bwrap
def test_the_probe_sees_the_calls_behind_an_allow_all_filter(monkeypatch):
    """The control: with a filter that allows everything, the same probe gets SysV shared memory, a key, a memfd
    and its own user namespace, so the test above could have failed."""
    monkeypatch.setattr(seccomp, "program", lambda machine=None: struct.pack("=HBBI", seccomp.RET_K, 0, 0, ALLOW))
    got = probe()
    assert got["status"] == ["2"] and got["clone3"] != "ENOSYS"
    calls = ("shmget", "add_key", "memfd_create", "unshare", "inotify_init1")
    assert {k: got[k] for k in calls} == dict.fromkeys(calls, "ok"), got


@needs_bwrap
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x32 ABI exists on x86-64 only")
def test_an_x32_system_call_kills_the_program():
    code = """import ctypes
libc = ctypes.CDLL(None)
print('before', flush=True)
libc.syscall(ctypes.c_long(0x40000000 | 39))
print('after')"""
    r = sandbox.run(code, [""], "stdin", audit=False, isolation="bwrap", limits=sandbox.Limits(wall_s=30.0, cpu_s=5))
    assert r.outputs == [None] and r.errors == ["SIGSYS"], (r.outputs, r.errors)
