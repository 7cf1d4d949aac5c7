"""A seccomp filter for the sandbox: the system calls a test program never needs are refused by the kernel.

What it implements: `program(machine) -> bytes`, a classic-BPF seccomp program (struct sock_filter[]) that
bubblewrap installs on the sandboxed child just before it executes the interpreter (`bwrap --seccomp FD`, with
no_new_privs). Audit hooks (sandbox.py layer 4) are a tripwire inside the interpreter; this is the kernel's
answer once a program has native code (an attack of 2026-12-02 loaded a written extension module and then used
SysV shared memory beyond RLIMIT_AS, its own user + mount namespace with an unlimited tmpfs, and host keyrings
that persist between evaluations). The rules, checked in this order:
  * a system call of another architecture (i386 `int 0x80` on x86-64) or of the x32 ABI: the process is killed
    (SECCOMP_RET_KILL_PROCESS, SIGSYS), since its numbers mean different calls;
  * DENIED (namespaces and mounts, keyrings, SysV IPC and POSIX message queues, io_uring, bpf, perf, userfaultfd,
    memfd, AIO, inotify, ptrace and cross-process memory, modules, kexec, clocks, swap, reboot, ...): EPERM;
  * clone with any CLONE_NEW* flag: EPERM (clone without them, i.e. fork or a thread, is left to RLIMIT_NPROC = 0);
  * clone3: ENOSYS (its flags sit in user memory, which seccomp cannot read; ENOSYS makes libc fall back to clone,
    the usual answer of container runtimes);
  * everything else: allowed. A deny list, not an allow list: CPython's start-up and the stdlib use a wide, version-
    dependent set of calls, and an allow list that misses one fails correct solutions (a lesson of issue 22).
Written by hand (about 40 lines of BPF assembly below) rather than with libseccomp: its Python binding is not on
PyPI, and pyseccomp (a ctypes wrapper) needs the system's libseccomp.so.2, which a fresh machine may lack; the syscall numbers are those of the kernel's headers (asm/unistd_64.h for
x86-64, asm-generic/unistd.h for aarch64), checked against the headers by tests/test_seccomp.py where present.
Leaves out: argument filtering beyond clone's flags (e.g. ioctl requests, socket families: the network namespace
is empty), other architectures (`program` raises ValueError: the sandbox then refuses to start, no silent
downgrade), and a cgroup (memory still bounded per process by RLIMIT_AS, not in total).
Run: used by sandbox.py (isolation="bwrap"); tests in tests/test_seccomp.py.
"""
import errno
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
NR, ARCH, ARG0_LO = 0, 4, 16                      # byte offsets (little-endian: the low word of args[0] first)
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
#           NEWNS        NEWCGROUP    NEWUTS       NEWIPC       NEWUSER      NEWPID       NEWNET
# (NEWTIME, 0x80, exists for unshare and clone3 only: in clone's flags that byte is the exit signal)

RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06     # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..., BPF_RET|K

# name: (x86_64, aarch64); None where the architecture has no such call
SYSCALLS = {
    # namespaces and mounts: a user namespace of its own gives a program CAP_SYS_ADMIN over fresh mounts
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "open_tree_attr": (467, 467),                 # Linux 6.15: newer than the headers of Debian 12
    # kernel keyrings: keys outlive the sandbox (per uid on the host), a channel between evaluations
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    # SysV IPC and POSIX message queues: kernel memory outside RLIMIT_AS
    "shmget": (29, 194), "semget": (64, 190), "msgget": (68, 186), "mq_open": (240, 180),
    # large kernel attack surfaces no test program needs
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282), "memfd_create": (319, 279),
    "memfd_secret": (447, 447), "io_setup": (206, 0),
    # inotify: watches are counted per uid host-wide (an evaluation once took all 192k of uid 65534's in 0.8 s)
    "inotify_init": (253, None), "inotify_init1": (294, 26), "inotify_add_watch": (254, 27),
    # other processes and their memory
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438), "process_madvise": (440, 440), "process_mrelease": (448, 448),
    # the machine itself
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "reboot": (169, 142), "swapon": (167, 224),
    "swapoff": (168, 225), "acct": (163, 89), "quotactl": (179, 60), "quotactl_fd": (443, 443),
    "syslog": (103, 116), "fanotify_init": (300, 262), "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264), "personality": (135, 92), "sethostname": (170, 161),
    "setdomainname": (171, 162), "settimeofday": (164, 170), "clock_settime": (227, 112), "adjtimex": (159, 171),
    "clock_adjtime": (305, 266), "lookup_dcookie": (212, 18), "vhangup": (153, 58), "nfsservctl": (180, 42),
    "iopl": (172, None), "ioperm": (173, None), "modify_ldt": (154, None), "uselib": (134, None),
    "_sysctl": (156, None),
}
CLONE, CLONE3 = {"x86_64": 56, "aarch64": 220}, 435
DENIED = tuple(SYSCALLS)


def numbers(machine: str) -> dict:
    """{name: number} of DENIED on `machine` (platform.machine() spelling)."""
    if machine not in AUDIT_ARCH:
        raise ValueError(f"seccomp: no syscall table for architecture {machine!r} (known: {sorted(AUDIT_ARCH)})")
    col = list(AUDIT_ARCH).index(machine)
    return {name: nrs[col] for name, nrs in SYSCALLS.items() if nrs[col] is not None}


def program(machine: str | None = None) -> bytes:
    """The filter as the kernel reads it: struct sock_filter {u16 code; u8 jt; u8 jf; u32 k} per instruction."""
    machine = machine or platform.machine()
    nrs = sorted(numbers(machine).values())
    ops = []                                    # (code, jt, jf, k); jt/jf are labels, resolved below

    def op(code, k, jt=0, jf=0):
        ops.append((code, jt, jf, k))
    op(LD_W_ABS, ARCH)
    op(JEQ_K, AUDIT_ARCH[machine], jf="kill")
    op(LD_W_ABS, NR)
    if machine == "x86_64":
        op(JGE_K, X32_SYSCALL_BIT, jt="kill")
    for nr in nrs:
        op(JEQ_K, nr, jt="deny")
    op(JEQ_K, CLONE3, jt="nosys")
    op(JEQ_K, CLONE[machine], jf="allow")
    op(LD_W_ABS, ARG0_LO)                       # clone's flags: the namespace bits are in the low word
    op(JSET_K, CLONE_NEW, jt="deny", jf="allow")
    labels = {"allow": RET_ALLOW, "deny": RET_ERRNO | errno.EPERM, "nosys": RET_ERRNO | errno.ENOSYS,
              "kill": RET_KILL_PROCESS}
    at = {name: len(ops) + i for i, name in enumerate(labels)}
    for k in labels.values():
        op(RET_K, k)
    out = []
    for i, (code, jt, jf, k) in enumerate(ops):
        jt, jf = (at[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise ValueError(f"seccomp: jump out of range at instruction {i}")   # BPF jumps are 8-bit
        out.append(struct.pack("=HBBI", code, jt, jf, k))
    return b"".join(out)
