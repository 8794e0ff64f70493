"""Sandbox launcher: the sandbox's first process. It makes the namespaces and the private root, locks the
program down, then execs it.

Run as `python -I -S launch.py PROGRAM ARGS...` by process.py, with the JSON spec in the environment variable
ROLLART_SANDBOX_SPEC (removed before the program runs; an argument would show in every /proc/PID/cmdline).
Standard library only, and never imported by rollart itself, so nothing of rollart is loaded into the
sandboxed processes.

Three processes, each with one job:
1. the **waiter** (this process, in rollart's PID namespace): with `namespaces`, unshares new PID, IPC and
   network namespaces (and a user namespace when not root), forks, waits for its child and exits with the
   program's status (128 + N for signal N). It kills the sandbox when rollart dies (EOF on the lifeline
   pipe, whose write end only rollart holds) or past the wall-clock backstop `wall_s`, so a sandbox never
   outlives the process that started it, even one killed with SIGKILL.
2. **init** (PID 1 of the new PID namespace; only with `namespaces`): dies with the waiter
   (PR_SET_PDEATHSIG), makes a private mount namespace and the sandbox's root (below), forks the program,
   reaps orphans, reports the program's status and its disk use on `report_fd` (the waiter does without
   namespaces), and exits — the kernel
   then kills every process left in the namespace, fork bombs and daemons included, and the mount
   namespace with its tmpfs goes with the last of them. It stays outside the sandbox's cgroup, so it costs
   the program none of its limits.
3. the **program**: joins the cgroup (`cgroup_procs`: "0" written to each file, opened by init before the
   root was switched), then, each step only narrowing what it may do and all surviving `execv`:
   chdir `cwd`; the peer channel (`channel_fd`) moved to fd 3 and every other fd above 2 closed;
   resource limits (CPU seconds — SIGXCPU, then SIGKILL one second later — address space, processes,
   file size, open files, no core dumps); `no_new_privs`; the dedicated uid/gid (root only: a program
   never runs as root); Landlock; `execv`.

The private root (`root`): a tmpfs of `size_mb` (and `inodes`) mounted on `mountpoint` inside the new mount
namespace holds `/workspace` and `/tmp` (or, for a workspace, `bind_work`/`bind_tmp` — directories of the
workspace's own tmpfs — are bound there), the read-only binds `binds` (the interpreter and the system
libraries, at their own paths), the device nodes `devices` and, with `proc`, the namespace's own /proc;
then `pivot_root` into it and the old root is detached. The host's /tmp, /run, /home, its Unix sockets
and every other path are not there at all. `copy_work_from` is a host directory whose files are copied into
/workspace (so they count against the tmpfs cap).

Landlock (Linux ≥ 5.13, raw syscalls: the standard library has no binding), spec `landlock`: reads and
execution only beneath `read` and `read_files`; reads and writes beneath `write` (execution too with
`exec_write`); the `devices` read/write; everything else denied. TCP bind/connect denied when
`deny_network` (ABI ≥ 4); signals and abstract unix sockets scoped to the sandbox (ABI ≥ 6); a
landlocked process can neither ptrace nor change mounts outside its domain.

A step the kernel refuses is reported on stderr as `rollart-sandbox: ...` and the launch fails (exit 125)
rather than running with less isolation than the parent announced. With `probe`, the program step exits 0
instead of exec'ing (the parent's check that every mechanism works here).
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

# Landlock constants (include/uapi/linux/landlock.h).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
MAKE_ALL = sum(1 << b for b in range(4, 13))  # REMOVE_DIR/FILE, MAKE_CHAR/DIR/REG/SOCK/FIFO/BLOCK/SYM
MAKE_CHAR, MAKE_BLOCK = 1 << 6, 1 << 11
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
CHANNEL_FD = 3
SPEC_VAR = "ROLLART_SANDBOX_SPEC"

# Namespaces and mounts (include/uapi/linux/sched.h, mount.h).
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x00020000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
# statvfs flags a bind remount must keep (the kernel refuses to clear them on a mount it locked)
KEEP_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
              (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel struct is __attribute__((packed))
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def fail(msg):
    sys.stderr.write(f"rollart-sandbox: {msg}\n")
    sys.stderr.flush()
    os._exit(125)


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        fail(f"{what} failed: {os.strerror(err)} (errno {err})")


# --- Landlock --------------------------------------------------------------------------------------------


def apply_landlock(rules):
    abi = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
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
    # writable dirs: read and write, no device nodes; execution only when asked (a workspace's own tools)
    work = (READ_FILE | READ_DIR | WRITE_FILE | MAKE_ALL | extra) & ~(MAKE_CHAR | MAKE_BLOCK | IOCTL_DEV)
    if rules.get("exec_write"):
        work |= EXECUTE
    device = READ_FILE | WRITE_FILE | (TRUNCATE if abi >= 3 else 0)
    allowed = [(p, work) for p in rules.get("write", [])]
    allowed += [(p, device) for p in rules.get("devices", [])]
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


# --- the private root ------------------------------------------------------------------------------------


def mount(source, target, fstype, flags, data=None):
    enc = (lambda s: s.encode() if s is not None else None)
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {source or ''} on {target}")


def bind(source, target, read_only):
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        kept = os.statvfs(source).f_flag
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        flags |= sum(ms for st, ms in KEEP_FLAGS if kept & st)
        mount(None, target, None, flags)


def build_root(root, uid):
    """Mount the sandbox's root on root["mountpoint"] and pivot into it (see the module docstring)."""
    new = root["mountpoint"]
    flags = MS_NOSUID | MS_NODEV | (0 if root.get("exec") else MS_NOEXEC)
    mount("tmpfs", new, "tmpfs", flags, f"size={root['size_mb']}m,nr_inodes={root['inodes']},mode=755")
    bound = []
    for path in root.get("binds", []):
        if any(path == b or path.startswith(b.rstrip("/") + "/") for b in bound):
            continue  # already inside a bound tree
        target = new + path
        if os.path.islink(path):  # e.g. /lib -> usr/lib on a merged-/usr system: the same link inside
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.lexists(target):
                os.symlink(os.readlink(path), target)
            continue
        if os.path.exists(path):
            bind(path, target, read_only=True)
            bound.append(path)
    for dev in root.get("devices", []):
        bind(dev, new + dev, read_only=False)
    if root.get("proc"):
        os.makedirs(new + "/proc", exist_ok=True)
        mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name, host in (("workspace", root.get("bind_work")), ("tmp", root.get("bind_tmp"))):
        inside = f"{new}/{name}"
        os.makedirs(inside, exist_ok=True)
        if host:
            bind(host, inside, read_only=False)
        else:
            os.chmod(inside, 0o700)
            if uid is not None:
                os.chown(inside, uid, uid)
    source = root.get("copy_work_from")
    if source:
        copy_tree(source, new + "/workspace", uid)
    os.chdir(new)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        fail(f"pivot_root: no syscall number known for {os.uname().machine}")
    check(libc.syscall(number, b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "detaching the old root")
    os.chdir("/")


def copy_tree(source, dest, uid):
    for dirpath, dirnames, filenames in os.walk(source):
        rel = os.path.relpath(dirpath, source)
        target_dir = dest if rel == "." else os.path.join(dest, rel)
        for d in dirnames:
            os.mkdir(os.path.join(target_dir, d), 0o700)
            if uid is not None:
                os.chown(os.path.join(target_dir, d), uid, uid)
        for f in filenames:
            target = os.path.join(target_dir, f)
            with open(os.path.join(dirpath, f), "rb") as src, open(target, "wb") as out:
                out.write(src.read())
            if uid is not None:
                os.chown(target, uid, uid)


# --- the three processes ---------------------------------------------------------------------------------


def finish(status, report_fd, disk):
    """Report the program's wait status (and the free space of its /workspace) on `report_fd`, then exit with it
    (128 + N for signal N)."""
    code = os.waitstatus_to_exitcode(status)
    if report_fd is not None:
        report = {"exit": code if code >= 0 else None, "signal": -code if code < 0 else None}
        if disk:
            fs = os.statvfs("/workspace")
            report.update(disk_free=fs.f_bavail * fs.f_frsize, disk_size=fs.f_blocks * fs.f_frsize)
        try:
            os.write(report_fd, (json.dumps(report) + "\n").encode())
        except OSError:
            pass
    os._exit(128 - code if code < 0 else code)


def wait_as_waiter(child, lifeline_fd, wall_s, report_fd):
    """Wait for `child`; kill it if rollart dies (lifeline EOF) or past `wall_s`. Exits with its status, which
    it reports on `report_fd` (given when there is no init to report it)."""
    try:
        pidfd = os.pidfd_open(child)
    except (AttributeError, OSError):
        pidfd = None
    fds = [fd for fd in (pidfd, lifeline_fd) if fd is not None]
    deadline = time.monotonic() + wall_s if wall_s else None
    while True:
        if pidfd is None:
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid:
                finish(status, report_fd, disk=False)
        timeout = 0.05 if pidfd is None else None
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        ready = select.select(fds, [], [], timeout)[0]
        if pidfd is not None and pidfd in ready:
            break
        if (lifeline_fd is not None and lifeline_fd in ready) or (deadline and time.monotonic() >= deadline):
            os.kill(child, signal.SIGKILL)
            break
    finish(os.waitpid(child, 0)[1], report_fd, disk=False)


def run_as_init(spec, program):
    """PID 1: fork the program, reap every orphan, report the program's status and disk use, exit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # init ignores signals it has no handler for
    report_fd, channel_fd = spec.get("report_fd"), spec.get("channel_fd")
    if channel_fd is not None:
        os.close(channel_fd)  # only the program holds the peer channel: its exit is the peer's EOF
    while True:
        pid, status = os.wait()
        if pid == program:
            finish(status, report_fd, disk=True)


def write_id_maps(uid, gid):
    """Map root of a new user namespace to the (unprivileged) user that made it."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def lock_down_and_exec(spec, argv, cgroup_fds):
    for fd in cgroup_fds:  # join the tree's cgroups before anything of the program runs
        try:
            os.write(fd, b"0")
        except OSError as exc:
            fail(f"joining the sandbox's cgroup failed: {exc}")
        os.close(fd)
    os.chdir(spec["cwd"])
    channel_fd = spec.get("channel_fd")
    if channel_fd is not None and channel_fd != CHANNEL_FD:
        os.dup2(channel_fd, CHANNEL_FD)  # dup2 leaves the copy inheritable across execv
    os.closerange(CHANNEL_FD + 1 if channel_fd is not None else CHANNEL_FD, 1 << 20)  # lifeline, report, ...
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
        apply_landlock(spec["landlock"])
    if spec.get("probe"):
        os._exit(0)
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        fail(f"exec {argv[0]} failed: {exc}")


def main():
    spec = json.loads(os.environ.pop(SPEC_VAR))
    argv = sys.argv[1:]
    namespaces = spec.get("namespaces")
    outer_uid, outer_gid = os.getuid(), os.getgid()
    if namespaces is not None:
        flags = CLONE_NEWPID | CLONE_NEWIPC | (CLONE_NEWNET if namespaces.get("net") else 0)
        if spec.get("userns"):
            flags |= CLONE_NEWUSER
        check(libc.unshare(flags), "unshare (new PID/IPC/network namespaces)")
        if spec.get("userns"):
            write_id_maps(outer_uid, outer_gid)
    child = os.fork()
    if child:
        report_fd = spec.get("report_fd")
        if namespaces is not None and report_fd is not None:
            os.close(report_fd)  # init reports; the waiter's copy would hold the pipe open
            report_fd = None
        wait_as_waiter(child, spec.get("lifeline_fd"), spec.get("wall_s"), report_fd)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    cgroup_fds = []
    try:
        cgroup_fds = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in spec.get("cgroup_procs", [])]
    except OSError as exc:
        fail(f"opening the sandbox's cgroup failed: {exc}")
    if namespaces is None:
        lock_down_and_exec(spec, argv, cgroup_fds)
    check(libc.unshare(CLONE_NEWNS), "unshare (new mount namespace)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates to the host
    if spec.get("root"):
        build_root(spec["root"], spec.get("uid"))
    program = os.fork()
    if program == 0:
        lock_down_and_exec(spec, argv, cgroup_fds)
    for fd in cgroup_fds:
        os.close(fd)
    run_as_init(spec, program)


if __name__ == "__main__":
    main()
