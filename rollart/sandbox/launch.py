"""Sandbox launcher: runs INSIDE the sandbox's fresh process, locks it down, then execs the untrusted program.

Run as `python -I launch.py '<json spec>' PROGRAM ARGS...` (by `process.py`, usually under
`unshare --net --mount --pid --fork --kill-child --mount-proc`). Standard library only, and never imported
by rollart itself, so nothing of rollart is loaded into the sandboxed process.

In a new PID namespace the launcher first forks: it stays PID 1 (reaping orphans) and the child goes on.
Order (each step only narrows what the process may do, and all of it survives `execv`):
1. chdir into the working directory; the peer channel (spec `channel_fd`, if any) is moved to fd 3;
2. resource limits (`resource.setrlimit`): CPU seconds (SIGXCPU, then SIGKILL one second later), address
   space (memory), processes (RLIMIT_NPROC, counted per user: the parent adds the user's running processes
   when it is not root), file size, open files, no core dumps;
3. `no_new_privs` (no setuid binary can gain privileges), then drop to the dedicated uid/gid (root only;
   the working dir was chowned to it) — a program never runs as root;
4. Landlock (Linux ≥ 5.13, raw syscalls: the standard library has no binding), spec `landlock`:
   reads and execution only beneath `read` (the interpreter's files and the system libraries) and
   `read_files`; reads and writes (no execution) only beneath the working dir; `/dev/null` read/write;
   everything else — the project tree, other users' files, `/proc`, `/tmp` — denied. TCP bind/connect
   denied when the network is denied (ABI ≥ 4); signals and abstract unix sockets scoped to the sandbox
   (ABI ≥ 6); a landlocked process can neither ptrace nor change mounts outside its domain;
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
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
MAKE_ALL = sum(1 << b for b in range(4, 13))  # REMOVE_DIR/FILE, MAKE_CHAR/DIR/REG/SOCK/FIFO/BLOCK/SYM
MAKE_CHAR, MAKE_BLOCK = 1 << 6, 1 << 11
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
CHANNEL_FD = 3


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


def apply_landlock(rules: dict, workdir: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    abi = landlock_abi(libc)
    if abi < 1:
        fail(f"landlock unavailable (errno {ctypes.get_errno()})")
    extra = (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0) | (IOCTL_DEV if abi >= 5 else 0)
    handled = EXECUTE | WRITE_FILE | READ_FILE | READ_DIR | MAKE_ALL | extra
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if rules.get("deny_network") and abi >= 4 else 0
    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0
    attr = RulesetAttr(handled, net, scoped)
    size = ctypes.sizeof(RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    rfd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rfd < 0:
        fail(f"landlock_create_ruleset failed (errno {ctypes.get_errno()})")
    file_read = EXECUTE | READ_FILE
    # the working dir: read and write, never execute a file written there, no device nodes
    work = (READ_FILE | READ_DIR | WRITE_FILE | MAKE_ALL | extra) & ~(MAKE_CHAR | MAKE_BLOCK | IOCTL_DEV)
    allowed = [(workdir, work), ("/dev/null", READ_FILE | WRITE_FILE | (TRUNCATE if abi >= 3 else 0))]
    allowed += [(p, file_read | READ_DIR) for p in rules.get("read", [])]
    allowed += [(p, file_read) for p in rules.get("read_files", [])]
    for path, access in allowed:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            fail(f"landlock rule for {path}: {exc}")
        rule = PathBeneathAttr(access, pfd)
        if libc.syscall(SYS_ADD_RULE, rfd, RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            fail(f"landlock_add_rule({path}) failed (errno {ctypes.get_errno()})")
        os.close(pfd)
    if libc.syscall(SYS_RESTRICT_SELF, rfd, ctypes.c_uint32(0)) != 0:
        fail(f"landlock_restrict_self failed (errno {ctypes.get_errno()})")
    os.close(rfd)


def run_as_init(channel_fd) -> None:
    """As PID 1 of a new PID namespace: run the program as a child, reap every orphan, exit with the
    program's status (128 + signal if killed). The program must not be PID 1 itself: the kernel does not
    deliver the CPU limit's SIGXCPU to a namespace's init, and when init exits the kernel kills every
    process left in the namespace — which is how nothing a fork bomb made outlives the sandbox."""
    child = os.fork()
    if child == 0:
        return
    if channel_fd is not None:
        os.close(channel_fd)  # only the program holds the peer channel: its exit is the peer's EOF
    while True:
        pid, status = os.wait()
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def main() -> None:
    spec = json.loads(sys.argv[1])
    argv = sys.argv[2:]
    channel_fd = spec.get("channel_fd")
    if os.getpid() == 1:
        run_as_init(channel_fd)
    os.chdir(spec["workdir"])
    if channel_fd is not None and channel_fd != CHANNEL_FD:
        os.dup2(channel_fd, CHANNEL_FD)  # dup2 leaves the copy inheritable across execv
        os.close(channel_fd)
    cpu = max(1, int(round(spec["cpu_time_s"])))
    mem = spec["memory_mb"] * 2**20
    nproc = spec["max_processes"]
    fsize = spec["file_size_mb"] * 2**20
    limits = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, mem, mem),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_FSIZE, fsize, fsize),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    for which, soft, hard in limits:
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as exc:
            fail(f"setrlimit({which}) failed: {exc}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail("prctl(PR_SET_NO_NEW_PRIVS) failed")
    uid = spec.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if os.geteuid() == 0 and not spec.get("userns"):
        fail("refusing to run the program as root")
    if spec.get("landlock"):
        apply_landlock(spec["landlock"], spec["workdir"])
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        fail(f"exec {argv[0]} failed: {exc}")


if __name__ == "__main__":
    main()
