"""Sandbox launcher: runs INSIDE the sandbox's fresh process, locks it down, then execs the untrusted program.

Run as `python -I sandbox_launch.py '<json spec>' PROGRAM ARGS...` (by `sandbox.py`, usually under
`unshare --net --pid --fork --kill-child`). Standard library only, and never imported by rollart itself, so
nothing of rollart is loaded into the sandboxed process.

In a new PID namespace the launcher first forks: it stays PID 1 (reaping orphans) and the child goes on.
Order (each step only narrows what the process may do, and all of it survives `execv`):
1. chdir into the working directory;
2. resource limits (`resource.setrlimit`): CPU seconds (SIGXCPU, then SIGKILL one second later), address
   space (memory), processes (RLIMIT_NPROC: counted per user, so it only bites on an unprivileged uid — when
   launched as root we switch to the dedicated uid in the spec; otherwise the limit is the user's current
   process count plus the allowance), file size, open files, no core dumps;
3. drop to the dedicated uid/gid (root only) — the working dir was chowned to it;
4. Landlock (Linux ≥ 5.13, via raw syscalls: Python has no binding in the standard library): writes of any
   kind allowed only beneath the working dir (reading stays allowed), TCP bind/connect denied when network
   is denied (ABI ≥ 4), signals and abstract unix sockets scoped to the sandbox (ABI ≥ 6);
5. `execv` the program.
A step that the kernel refuses is reported on stderr as `rollart-sandbox: ...` and the launch fails
(exit 125) rather than running with less isolation than the parent announced.
"""

import ctypes
import json
import os
import resource
import sys

# Landlock constants (include/uapi/linux/landlock.h).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
FS_WRITE_ABI1 = (
    (1 << 1)  # WRITE_FILE
    | (1 << 4)  # REMOVE_DIR
    | (1 << 5)  # REMOVE_FILE
    | (1 << 6)  # MAKE_CHAR
    | (1 << 7)  # MAKE_DIR
    | (1 << 8)  # MAKE_REG
    | (1 << 9)  # MAKE_SOCK
    | (1 << 10)  # MAKE_FIFO
    | (1 << 11)  # MAKE_BLOCK
    | (1 << 12)  # MAKE_SYM
)
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel struct is __attribute__((packed))
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def fail(msg: str) -> None:
    sys.stderr.write(f"rollart-sandbox: {msg}\n")
    sys.stderr.flush()
    os._exit(125)


def landlock_abi(libc) -> int:
    return libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))


def apply_landlock(workdir: str, deny_network: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    abi = landlock_abi(libc)
    if abi < 1:
        fail(f"landlock unavailable (errno {ctypes.get_errno()})")
    fs = FS_WRITE_ABI1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if deny_network and abi >= 4 else 0
    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0
    attr = RulesetAttr(fs, net, scoped)
    size = ctypes.sizeof(RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    rfd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rfd < 0:
        fail(f"landlock_create_ruleset failed (errno {ctypes.get_errno()})")
    for path, access in ((workdir, fs), ("/dev/null", 1 << 1)):
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneathAttr(access, pfd)
        if libc.syscall(SYS_ADD_RULE, rfd, RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            fail(f"landlock_add_rule({path}) failed (errno {ctypes.get_errno()})")
        os.close(pfd)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail("prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.syscall(SYS_RESTRICT_SELF, rfd, ctypes.c_uint32(0)) != 0:
        fail(f"landlock_restrict_self failed (errno {ctypes.get_errno()})")
    os.close(rfd)


def processes_of(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def run_as_init() -> None:
    """As PID 1 of a new PID namespace: run the program as a child, reap every orphan, exit with the
    program's status (128 + signal if killed). The program must not be PID 1 itself: the kernel does not
    deliver the CPU limit's SIGXCPU to a namespace's init, and when init exits the kernel kills every
    process left in the namespace — which is how nothing a fork bomb made outlives the sandbox."""
    child = os.fork()
    if child == 0:
        return
    while True:
        pid, status = os.wait()
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def main() -> None:
    spec = json.loads(sys.argv[1])
    argv = sys.argv[2:]
    if os.getpid() == 1:
        run_as_init()
    os.chdir(spec["workdir"])
    uid = spec.get("uid")
    nproc = spec["max_processes"]
    if uid is None and os.getuid() != 0:
        # RLIMIT_NPROC counts every process of this user; leave room for the ones already running
        nproc += processes_of(os.getuid())
    cpu = max(1, int(round(spec["cpu_time_s"])))
    mem = spec["memory_mb"] * 2**20
    limits = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, mem, mem),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_FSIZE, spec["file_size_mb"] * 2**20, spec["file_size_mb"] * 2**20),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    for which, soft, hard in limits:
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as exc:
            fail(f"setrlimit({which}) failed: {exc}")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if spec.get("landlock"):
        apply_landlock(spec["workdir"], spec.get("deny_network", True))
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        fail(f"exec {argv[0]} failed: {exc}")


if __name__ == "__main__":
    main()
