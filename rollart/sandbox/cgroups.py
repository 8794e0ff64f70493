"""Control groups for sandboxes: memory, process count and CPU time of a program and all its children together.

In: the limits of one sandboxed run (or one workspace). Out: a `TreeGroup` the sandbox's processes join
before the program runs (`procs_files`), read while it runs (`cpu_s`, `oom_kills`), and removed after it
(`remove`: every process in it killed, then the group's directories deleted).

Which cgroups a machine has is probed once per process (`support()`):
- cgroup v2 (`/sys/fs/cgroup` is a cgroup2 mount): groups go in `rollart-sandbox/` beside or below this
  process's own cgroup — the nearest one (own, parent, ...) whose children may have the `memory` and
  `pids` controllers (v2 lets a cgroup that holds processes hand controllers to children only at the root,
  so usually the parent). `cpu.stat` counts CPU time in every v2 group; OOM kills the whole group
  (`memory.oom.group`).
- cgroup v1 (separate `memory`, `pids` and `cpuacct` hierarchies, as on this project's build machines):
  one directory per hierarchy, right below this process's own cgroup in each (no directory of rollart's
  stays there between runs). v1 has no group OOM kill: the
  sandbox polls `oom_kill` and ends the whole run itself.
- neither (no writable cgroups, e.g. an unprivileged user without delegation): `support().reason` says why,
  and the sandbox's isolation level stays below `full`.
Memory is limited without swap (v1 `memsw`, v2 `memory.swap.max = 0`) so a tree cannot page out of its limit.

Nothing leaks: a group's name holds its creator's pid and start time (`rollart-<pid>-<start>-<n>`); `reap()`
kills and removes the groups of creators that are gone (called once per process, before its first sandbox).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_DIR = "rollart-sandbox"
V1_CONTROLLERS = ("memory", "pids", "cpuacct")
_counter = itertools.count()


@dataclass(frozen=True)
class CgroupSupport:
    """Where this process may make sandbox groups; `version` 0 with a `reason` when nowhere."""

    version: int  # 2, 1 or 0
    bases: dict[str, Path] = field(default_factory=dict)  # v1: controller → its rollart-sandbox dir; v2: {"": dir}
    reason: str = ""


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), or None when it is gone: with the pid, it names one
    process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_tag(pid: int | None = None) -> str:
    """`<pid>-<start time>` of this process (or `pid`): what leftovers are recognised by."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{start_time(pid)}"


def owner_alive(tag: str) -> bool:
    """Is the process that `owner_tag` named still running? Malformed tags count as alive (never reaped)."""
    try:
        pid, started = (int(x) for x in tag.split("-")[:2])
    except ValueError:
        return True
    return start_time(pid) == started


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its v2 path."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            paths[c] = path
    return paths


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fs type, super options) of every cgroup mount."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, post = line.split(" - ", 1)
        fields, (fstype, _source, opts) = pre.split(), post.split()[:3]
        if fstype in ("cgroup", "cgroup2"):
            out.append((fields[3], fields[4], fstype, set(opts.split(","))))
    return out


def _under(mount_root: str, path: str) -> str:
    """A cgroup path as seen inside a mount whose root is `mount_root` (a container's mount starts below /)."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root):] or "/"
    return path.lstrip("/")


def _try_group(make: Callable[[str], "TreeGroup"]) -> str:
    """Make, limit and remove a probe group; '' if that worked, else why not."""
    try:
        group = make(f"rollart-probe-{owner_tag()}-{next(_counter)}")
    except OSError as exc:
        return str(exc)
    group.remove()
    return ""


def _probe_v2(mount_point: str, mount_root: str, own: str) -> CgroupSupport:
    top = Path(mount_point)
    here = top / _under(mount_root, own)
    needed = {"memory", "pids"}
    tried = []
    while True:
        base = here / GROUP_DIR
        try:
            enabled = set((here / "cgroup.subtree_control").read_text().split())
            if not needed <= enabled:
                (here / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(needed - enabled)))
            base.mkdir(exist_ok=True)
            have = set((base / "cgroup.subtree_control").read_text().split())
            if not needed <= have:
                (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(needed - have)))
            support = CgroupSupport(2, {"": base})
            why = _try_group(lambda name: TreeGroup.create(support, name, 64 << 20, 4))
            if not why:
                return support
            tried.append(f"{base}: {why}")
        except OSError as exc:
            tried.append(f"{here}: {exc.strerror or exc}")
        if here == top:
            break
        here = here.parent
    return CgroupSupport(0, reason="cgroup v2: no cgroup where children get the memory and pids controllers ("
                         + "; ".join(tried) + "); run rollart in a delegated cgroup (e.g. `systemd-run --scope "
                         "-p Delegate=yes`) or as root")


def _probe_v1(mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str]) -> CgroupSupport:
    bases: dict[str, Path] = {}
    for controller in V1_CONTROLLERS:
        found = [(root, point) for root, point, fstype, opts in mounts if fstype == "cgroup" and controller in opts]
        if not found:
            return CgroupSupport(0, reason=f"cgroup v1: the {controller} controller is not mounted")
        root, point = found[0]
        bases[controller] = Path(point) / _under(root, own.get(controller, "/"))
    support = CgroupSupport(1, bases)
    why = _try_group(lambda name: TreeGroup.create(support, name, 64 << 20, 4))
    return support if not why else CgroupSupport(0, reason=f"cgroup v1: a probe group failed: {why}")


@functools.lru_cache(maxsize=1)
def support() -> CgroupSupport:
    """Which cgroups this process can give sandboxes (probed once; see the module docstring)."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as exc:
        return CgroupSupport(0, reason=f"cannot read this process's cgroups: {exc}")
    v2 = [(root, point) for root, point, fstype, _ in mounts if fstype == "cgroup2" and Path(point) == CGROUP_ROOT]
    if v2:
        return _probe_v2(v2[0][1], v2[0][0], own.get("", "/"))
    if not any(fstype == "cgroup" for _, _, fstype, _ in mounts):
        return CgroupSupport(0, reason="no cgroup filesystem is mounted at /sys/fs/cgroup")
    if os.geteuid() != 0:
        return CgroupSupport(0, reason="cgroup v1 needs root (v1 has no delegation to other users)")
    return _probe_v1(mounts, own)


class TreeGroup:
    """One sandbox's group: `memory_bytes` and `max_pids` for every process in it together, CPU time counted."""

    def __init__(self, support: CgroupSupport, name: str) -> None:
        """The group `name` (made or not): use `create` for a new one."""
        self.version = support.version
        self._by = {controller: base / name for controller, base in support.bases.items()}
        self.dirs = list(self._by.values())

    @classmethod
    def create(cls, support: CgroupSupport, name: str, memory_bytes: int, max_pids: int) -> "TreeGroup":
        """Make the group's directories and set its limits; OSError (nothing left behind) if the kernel refuses."""
        group = cls(support, name)
        made: list[Path] = []
        try:
            for d in group.dirs:
                d.mkdir()
                made.append(d)
            mem, pids = group._dir("memory"), group._dir("pids")
            if group.version == 2:
                group._write(mem / "memory.max", memory_bytes)
                group._write(mem / "memory.swap.max", 0, optional=True)
                group._write(mem / "memory.oom.group", 1, optional=True)
            else:
                group._write(mem / "memory.limit_in_bytes", memory_bytes)
                group._write(mem / "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
            group._write(pids / "pids.max", max_pids)
        except OSError:
            for d in reversed(made):
                _rmdir(d)
            raise
        return group

    @staticmethod
    def _write(path: Path, value: int, optional: bool = False) -> None:
        try:
            path.write_text(str(value))
        except OSError:
            if not (optional and not path.exists()):
                raise

    def _dir(self, controller: str) -> Path:
        return self.dirs[0] if self.version == 2 else self._by[controller]

    @property
    def procs_files(self) -> list[str]:
        """The `cgroup.procs` files a process writes "0" to, to join (all of them, before the program runs)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def cpu_s(self) -> float:
        """CPU seconds used by every process that was ever in the group."""
        try:
            if self.version == 2:
                for line in (self.dirs[0] / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
                return 0.0
            return int((self._dir("cpuacct") / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return 0.0

    def _keyed(self, path: Path, key: str) -> int:
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def oom_kills(self) -> int:
        """Processes the kernel killed because the group passed its memory limit."""
        if self.version == 2:
            return self._keyed(self.dirs[0] / "memory.events", "oom_kill")
        return self._keyed(self._dir("memory") / "memory.oom_control", "oom_kill")

    def pids_refused(self) -> int:
        """Forks (and threads) refused because the group was at `max_pids`."""
        return self._keyed(self._dir("pids") / "pids.events", "max")

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(found)

    def kill(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the group until it is empty (v2: `cgroup.kill`); False if some outlived
        `timeout_s` (a process stuck in the kernel)."""
        if self.version == 2:
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
            except OSError:
                pass
        return all([_empty(d, timeout_s) for d in self.dirs])

    def remove(self) -> None:
        """Kill what is left in the group and delete its directories; idempotent."""
        self.kill()
        for d in self.dirs:
            _rmdir(d)


def _rmdir(d: Path) -> None:
    for _ in range(100):  # a v1 group is busy for a moment after its last process exits
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def new_group(memory_bytes: int, max_pids: int) -> TreeGroup:
    """A fresh group for one sandbox, named after this process (see `reap`). Raises OSError if the kernel
    refuses it."""
    return TreeGroup.create(support(), f"rollart-{owner_tag()}-{next(_counter)}", memory_bytes, max_pids)


_GROUP_NAME = re.compile(r"^rollart-(?:probe-)?(\d+-\d+)-\d+$")
_REAP_DEPTH = 8  # how deep below a hierarchy's root sandbox groups are looked for


def _group_dirs() -> list[Path]:
    """Every sandbox group directory in every cgroup hierarchy this process can see: the group of a dead
    process may sit below another cgroup than this process's own (another service, another session)."""
    found: list[Path] = []
    try:
        points = [Path(point) for _, point, _, _ in _mounts()]
    except OSError:
        return found
    for top in points:
        for dirpath, dirnames, _ in os.walk(top):
            depth = len(Path(dirpath).relative_to(top).parts)
            keep = []
            for d in dirnames:
                if _GROUP_NAME.match(d):
                    found.append(Path(dirpath) / d)
                elif depth < _REAP_DEPTH:
                    keep.append(d)
            dirnames[:] = keep
    return found


def reap() -> int:
    """Kill and remove every sandbox group whose creating process is gone (in every hierarchy); how many
    directories were removed."""
    removed = 0
    for d in _group_dirs():
        if owner_alive(_GROUP_NAME.match(d.name).group(1)):
            continue
        _empty(d)
        _rmdir(d)
        removed += not d.exists()
    return removed


def _empty(d: Path, timeout_s: float = 5.0) -> bool:
    """SIGKILL every process in one group directory until it is empty; False if some outlived `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return True
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)
