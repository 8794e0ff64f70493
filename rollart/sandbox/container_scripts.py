"""What the container backend runs inside a workspace's container, and how it reads what comes back: the
shell that resolves a path (`RESOLVE`), the supervisor of a command (`SUPERVISOR`) and its trailer (`REPORT`,
`Counters`, `split_trailer`, `limit_hit`), the writer of several files (`WRITER`). In: nothing of the sandbox.
Out: these names, for container.py (the module docstring there says how they are used and why).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

_DISK_FULL_KB = 256  # less free than this on a tmpfs after a command: the disk cap was reached
RESOLVE = ('p=$(realpath -m -- "$1") && case "$p" in /workspace/*) ;; *) exit 90;; esac && [ "$p" = "$1" ] '
            '|| exit 91; ')  # inside /workspace, and no symlink on the way (the resolved path is the path itself)
# The trailer: the container's own cgroup counters (v1 per controller, or v2) and its tmpfs' free space.
_COUNTERS = ('for f in memory/memory.oom_control memory.events pids/pids.events pids.events cpuacct/cpuacct.usage '
             'cpu,cpuacct/cpuacct.usage cpu.stat; do [ -r "/sys/fs/cgroup/$f" ] && { echo "== $f"; '
             'cat "/sys/fs/cgroup/$f"; }; done; echo "== df"; df -Pk /workspace /tmp')
SUPERVISOR = ('ulimit -H -t $(($3 + 1)) 2>/dev/null; ulimit -S -t "$3" 2>/dev/null; timeout -s KILL "$1" bash -c "$2"; rc=$?; kill -9 -1 2>/dev/null; '
              'exec >&2; printf "\\n%s %s\\n" "$4" "$rc"; ' + _COUNTERS)
REPORT = 'kill -9 -1 2>/dev/null; printf "\\n%s 0\\n" "$1"; ' + _COUNTERS  # the same trailer, nothing run
# Several files in one exec: a tar on stdin, each member written below /workspace by the image's python3 with
# every directory opened O_NOFOLLOW (as the native backend writes: never through a link); 91 a link or
# non-directory on the way, 92 not a regular file (a fifo: ENXIO), 94 the disk cap, 127 no python3 in the image.
WRITER = """
import errno, os, stat, sys, tarfile
try:
    tar = tarfile.open(fileobj=sys.stdin.buffer, mode="r|")
    for member in tar:
        parts = member.name.split("/")
        fd = os.open("/workspace", os.O_RDONLY | os.O_DIRECTORY)
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=fd)
        os.close(fd)
        if not stat.S_ISREG(os.fstat(out).st_mode):
            sys.exit(92)
        os.ftruncate(out, 0)
        with os.fdopen(out, "wb") as f:
            f.write(tar.extractfile(member).read())
except OSError as e:
    sys.exit(94 if e.errno == errno.ENOSPC else 91 if e.errno in (errno.ELOOP, errno.ENOTDIR) else
             92 if e.errno == errno.ENXIO else 1)
"""


@dataclass(frozen=True)
class Counters:
    """A container's cgroup counters and free tmpfs space, from a trailer."""

    oom_kills: int = 0
    pids_refused: int = 0
    cpu_s: float = 0.0
    free_kb: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Counters:
        oom = pids = 0
        cpu = 0.0
        free: list[int] = []
        section = ""
        for line in text.splitlines():
            if line.startswith("== "):
                section = line[3:]
                continue
            key, _, value = line.partition(" ")
            try:
                if section in ("memory/memory.oom_control", "memory.events") and key == "oom_kill":
                    oom = int(value)
                elif section in ("pids/pids.events", "pids.events") and key == "max":
                    pids = int(value)
                elif section.endswith("cpuacct.usage") and line.strip().isdigit():
                    cpu = int(line) / 1e9
                elif section == "cpu.stat" and key == "usage_usec":
                    cpu = int(value) / 1e6
                elif section == "df" and line.startswith("/") or section == "df" and line.startswith("tmpfs"):
                    free.append(int(line.split()[3]))
            except (ValueError, IndexError):
                continue
        return cls(oom, pids, cpu, tuple(free))


def split_trailer(stderr: bytes, mark: str) -> tuple[bytes, int | None, Counters | None]:
    """(the command's stderr, its exit status, the counters) — or (stderr, None, None) without a trailer."""
    at = stderr.rfind(("\n" + mark + " ").encode())
    if at < 0:
        return stderr, None, None
    head, _, rest = stderr[at + 1:].decode("utf-8", "replace").partition("\n")
    try:
        status = int(head.split()[1])
    except (IndexError, ValueError):
        return stderr, None, None
    return stderr[:at], status, Counters.parse(rest)


def limit_hit(before: Counters, after: Counters, cpu_limit_s: float, sig: int | None) -> str | None:
    """Which limit a command reached, by the counters' change (the native backend's order)."""
    if after.oom_kills > before.oom_kills:
        return "memory"
    if after.cpu_s - before.cpu_s > cpu_limit_s or sig == signal.SIGXCPU:
        return "cpu"
    if any(kb < _DISK_FULL_KB for kb in after.free_kb):
        return "disk"
    if after.pids_refused > before.pids_refused:
        return "pids"
    return None


