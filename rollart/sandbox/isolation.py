"""What isolation this machine gives a sandbox, the levels a config may ask for, and the launcher's spec.

In: `SandboxConfig` (its limits and `min_isolation`). Out: `check_isolation(cfg)` → the label of the
mechanisms a sandbox gets here, e.g. `process+rlimits+uid+landlock+netns+pidns+mntns+tmpfs+cgroup`, or
`SandboxUnavailable` naming what is missing and the setting that would accept less; `launcher_spec(...)`
→ the JSON spec `launch.py` runs a program under.

Mechanisms (probed once per process, `probe_isolation`; each probe is a real launch with `probe: true`):
- `process`, `rlimits`: always — own process and session; per-process CPU time, address space, process
  count, file size and open files; the wall timeout kills the whole process group.
- `uid` (rollart runs as root): the program runs as a dedicated unprivileged uid — never as root. If no
  Python is runnable by that uid, nothing runs: `SandboxUnavailable`, at every isolation level.
- `landlock`: reads confined to the interpreter and the system libraries, writes to the sandbox's own
  directories; TCP denied when the network is (ABI ≥ 4).
- `netns`, `pidns`, `mntns`, `tmpfs`: new network (no interface but a downed loopback), PID, IPC and mount
  namespaces, made by the launcher itself (as root, or inside a user namespace where unprivileged ones are
  allowed); a private root holding only the interpreter, the system libraries, a few device nodes, the
  namespace's own /proc and the program's `/workspace` and `/tmp` on a tmpfs of `disk_mb` — so the host's
  /tmp, its Unix sockets and every other path are not there at all, and the files of the program and all
  its children together cannot pass `disk_mb`.
- `cgroup`: memory (`memory_mb` + `disk_mb`: the tmpfs is RAM too), process count (`max_processes`) and
  CPU time (`cpu_time_s`) for the program and all its children together (cgroups.py: v2 or v1).

Isolation levels, weakest first — `min_isolation` says which one a run needs:
- `rlimits`: never root, per-process limits, process-group kill. Files are protected only by permissions.
- `landlock`: + Landlock.
- `namespaces`: + PID/IPC/mount namespaces with the private root and its capped tmpfs, and a network
  namespace when the network is denied. Memory, CPU time and process count are still per process.
- `full` (default): + cgroup limits for the whole program tree.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rollart.config import SandboxConfig, SandboxLimits
from rollart.sandbox import cgroups

log = logging.getLogger("rollart.sandbox")

LAUNCHER = Path(__file__).with_name("launch.py")
LEVELS = ("rlimits", "landlock", "namespaces", "full")  # weakest first
UID_BASE = 200_000  # dedicated uids for sandboxed runs (root only)
SYSTEM_LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")  # the dynamic loader and shared libraries
SYSTEM_FILES = ("/etc/ld.so.cache",)
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
STAGING_PREFIX = "rollart-sbx-"
INODES_PER_MB = 256  # files a tmpfs may hold per MB of its size (inodes cost memory its size does not count)


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot give the isolation the config asks for (or would run as root); nothing ran."""


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox use (see module docstring)."""

    namespaces: bool  # PID, IPC and mount namespaces with a private root work here
    netns: bool  # ... and a network namespace
    userns: bool  # the namespaces are made inside a user namespace (rollart is not root)
    landlock_abi: int  # 0 = unavailable
    root: bool
    cgroups: int  # cgroup version the sandbox uses, 0 = none
    missing: tuple[str, ...] = ()  # why a mechanism is unavailable, for error messages

    def level(self, network: str, disk_cap: bool = True) -> str:
        """The strongest level of LEVELS this machine gives (`disk_cap`: the files sit on a capped tmpfs)."""
        if self.landlock_abi < 1:
            return "rlimits"
        if not (self.namespaces and disk_cap and (self.netns or network == "allow")):
            return "landlock"
        return "full" if self.cgroups else "namespaces"

    def label(self, network: str, uid: bool, disk_cap: bool = True, cgroup: bool | None = None) -> str:
        parts = ["process", "rlimits", "uid" if uid else "user"]
        if self.landlock_abi >= 1:
            parts.append("landlock")
        if network == "deny":
            if self.namespaces and self.netns:
                parts.append("netns")
            elif self.landlock_abi >= 4:
                parts.append("landlock-net")
            else:
                parts.append("network-open")
        if self.namespaces:
            parts += ["pidns", "mntns"] + (["tmpfs"] if disk_cap else [])
        if self.cgroups if cgroup is None else cgroup:
            parts.append("cgroup")
        return "+".join(parts)


@dataclass(frozen=True)
class Interpreter:
    """The Python that sandboxed programs run with, and the files it needs (bound into the private root and
    readable under Landlock)."""

    path: str  # resolved: no symlink or venv indirection the sandbox could not read
    use_uid: bool  # run as a dedicated uid (rollart runs as root)
    read_dirs: tuple[str, ...]
    read_files: tuple[str, ...]


# --- the lifeline: a pipe whose write end only this process holds ----------------------------------------


@functools.lru_cache(maxsize=1)
def lifeline_fd() -> int:
    """The read end of a pipe nobody writes to: every launcher watches it, and when this process dies (even
    by SIGKILL) the kernel closes the write end, the launchers see EOF and kill their sandboxes."""
    read_end, write_end = os.pipe()  # both close-on-exec: no child inherits the write end
    _LIFELINE_KEEP.append(write_end)
    return read_end


_LIFELINE_KEEP: list[int] = []


# --- the launcher's spec ---------------------------------------------------------------------------------


def split_paths(paths: tuple[str, ...] | list[str]) -> tuple[list[str], list[str]]:
    """(directories, files) among the existing `paths`, parents before children, without duplicates."""
    dirs, files = [], []
    for p in sorted(dict.fromkeys(paths)):
        if os.path.isdir(p):
            dirs.append(p)
        elif os.path.exists(p):
            files.append(p)
    return dirs, files


def launcher_spec(
    *, iso: Isolation, network: str, staging: Path, uid: int | None, limits: SandboxLimits,
    read: tuple[str, ...] | list[str], proc: bool = False, exec_write: bool = False,
    bind_work: str | None = None, bind_tmp: str | None = None, cgroup_procs: list[str] | None = None,
    channel_fd: int | None = None, report_fd: int | None = None, wall_s: float | None = None,
    probe: bool = False,
) -> dict:
    """The JSON spec of launch.py for one sandbox. `staging` holds `files/` (the program's files: copied into
    the private root's /workspace, or the working dir itself without namespaces) and `root/` (the private root's
    mount point). `read`: host paths the program may read (bound read-only at the same place). A workspace
    passes `bind_work`/`bind_tmp`, its own host dirs, seen as /workspace and /tmp (or used as they are without
    namespaces)."""
    dirs, files = split_paths(list(read))
    # with a cgroup its pids limit is the one that holds (and says so); RLIMIT_NPROC stays one above it
    nproc = limits.max_processes + (1 if cgroup_procs else 0)
    if uid is None and not iso.root and not iso.userns:
        nproc += _processes_of(os.getuid())  # RLIMIT_NPROC counts every process of this user
    ns = iso.namespaces
    deny = network == "deny"
    spec: dict = {
        "uid": uid,
        "userns": iso.userns and ns,
        "namespaces": {"net": deny and iso.netns} if ns else None,
        "root": None,
        "cwd": "/workspace" if ns else (bind_work or str(staging / "files")),
        "cgroup_procs": cgroup_procs or [],
        "cpu_time_s": limits.cpu_time_s,
        "memory_mb": limits.memory_mb,
        "max_processes": nproc,
        "file_size_mb": limits.file_size_mb,
        "channel_fd": channel_fd,
        "lifeline_fd": lifeline_fd(),
        "report_fd": report_fd,
        "wall_s": wall_s,
        "probe": probe,
        "landlock": None,
    }
    if ns:
        spec["root"] = {
            "mountpoint": str(staging / "root"),
            # a workspace brings its own tmpfs: the root only holds mount points then
            "size_mb": 1 if bind_work else limits.disk_mb,
            "inodes": 1024 if bind_work else max(1024, limits.disk_mb * INODES_PER_MB),
            "binds": dirs + files,
            "devices": list(DEVICES),
            "proc": proc,
            "copy_work_from": None if bind_work else str(staging / "files"),
            "bind_work": bind_work,
            "bind_tmp": bind_tmp,
            "exec": exec_write,
        }
    if iso.landlock_abi >= 1:
        spec["landlock"] = {
            "read": dirs + (["/proc"] if proc and ns else []),
            "read_files": files,
            "write": (["/workspace", "/tmp"] if ns
                      else [bind_work, bind_tmp] if bind_work else [str(staging / "files")]),
            "exec_write": exec_write,
            "devices": list(DEVICES) if ns else ["/dev/null"],
            "deny_network": deny,
        }
    return spec


SPEC_VAR = "ROLLART_SANDBOX_SPEC"  # the launcher reads its spec here (and removes it before the program runs)


def launcher_argv(program: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", str(LAUNCHER)] + program


def launcher_env(spec: dict, env: dict[str, str]) -> dict[str, str]:
    return {**env, SPEC_VAR: json.dumps(spec)}


def _processes_of(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return n


def new_staging() -> Path:
    """A fresh private host dir for one sandbox (`files/`, `root/`), named after this process so a dead
    process's leftovers are recognised (`reap_staging`)."""
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{cgroups.owner_tag()}-"))
    (staging / "files").mkdir()
    (staging / "root").mkdir()
    return staging


def hand_over(staging: Path, uid: int | None, iso: Isolation) -> None:
    """Without a private root the program works in `staging/files` itself: give it to the sandbox's uid
    (with one, init copies the files into /workspace and chowns the copies)."""
    if uid is None or iso.namespaces:
        return
    files = staging / "files"
    for p in [files, *files.rglob("*")]:
        os.chown(p, uid, uid)
    os.chmod(files, 0o700)
    os.chmod(staging, 0o711)  # passable, not listable


def reap_staging() -> int:
    """Remove the staging dirs of processes that are gone; how many."""
    removed = 0
    for path in Path(tempfile.gettempdir()).glob(f"{STAGING_PREFIX}*"):
        tag = path.name[len(STAGING_PREFIX):]
        if not cgroups.owner_alive(tag) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


# --- probing ---------------------------------------------------------------------------------------------


def _run_launcher(spec: dict, program: list[str], staging: Path) -> str | None:
    """Run the launcher to its end (a probe); None if it exited 0, else what went wrong."""
    try:
        env = launcher_env(spec, {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        res = subprocess.run(launcher_argv(program), capture_output=True, timeout=20, cwd=staging,
                             pass_fds=(lifeline_fd(),), env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if res.returncode == 0:
        return None
    return res.stderr.decode("utf-8", "replace").strip()[-300:] or f"exit code {res.returncode}"


def _landlock_abi() -> int:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return max(0, int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))))
    except (OSError, AttributeError):
        return 0


def _probe_namespaces(root: bool, abi: int, net: bool) -> str | None:
    base = Isolation(True, net, not root, abi, root, 0)
    staging = new_staging()
    try:
        uid = UID_BASE if root else None
        spec = launcher_spec(iso=base, network="deny" if net else "allow", staging=staging, uid=uid,
                             limits=SandboxConfig(), read=SYSTEM_LIB_DIRS + SYSTEM_FILES, proc=True,
                             probe=True)
        return _run_launcher(spec, ["/bin/true"], staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@functools.lru_cache(maxsize=1)
def probe_isolation() -> Isolation:
    """Which mechanisms work here (cached: probing costs a few process starts). Also removes what sandboxes
    of dead processes left behind (cgroups, staging dirs): this runs once per process, before its first
    sandbox."""
    root = os.geteuid() == 0
    missing: list[str] = []
    abi = _landlock_abi()
    if abi < 1:
        missing.append("Landlock is unavailable (Linux ≥ 5.13 with the landlock LSM enabled)")
    cg = cgroups.support()
    if not cg.version:
        missing.append(cg.reason)
    else:
        cgroups.reap()
    reap_staging()
    namespaces = netns = False
    for net in (True, False):
        why = _probe_namespaces(root, abi, net)
        if why is None:
            namespaces, netns = True, net
            break
        missing.append(f"namespaces{' with a network namespace' if net else ''} failed: {why}")
    return Isolation(namespaces, netns, namespaces and not root, abi, root, cg.version, tuple(missing))


def _interpreter(python: str, use_uid: bool) -> Interpreter:
    real = os.path.realpath(python)
    prefix = os.path.dirname(os.path.dirname(real))
    dirs = [d for d in (os.path.join(prefix, "lib"), *SYSTEM_LIB_DIRS) if os.path.isdir(d)]
    files = [f for f in (real, *SYSTEM_FILES) if os.path.isfile(f)]
    return Interpreter(real, use_uid, tuple(dict.fromkeys(dirs)), tuple(files))


@functools.lru_cache(maxsize=8)
def _find_interpreter(configured: str, iso: Isolation) -> Interpreter | str:
    """The sandbox's Python under `iso` (see `sandbox_python`), or why there is none."""
    candidates = [configured] if configured else [sys.executable, shutil.which("python3", path="/usr/bin:/bin")]
    tried = []
    for python in filter(None, candidates):
        interp = _interpreter(python, iso.root)
        res = _try_interpreter(interp, iso)
        if res is None:
            return interp
        tried.append(f"{python} ({interp.path}): {res}")
    who = f"uid {UID_BASE} (rollart runs as root and never runs a program as root)" if iso.root else "this user"
    return (f"no Python interpreter runs in the sandbox as {who}; tried: {'; '.join(tried) or 'none'}. Set "
            "reward.sandbox.python to an interpreter that user can read (outside /root, e.g. /usr/bin/python3 "
            "from the python3-minimal package)")


def _try_interpreter(interp: Interpreter, iso: Isolation) -> str | None:
    """Start `interp` under this machine's strongest isolation and import a few stdlib modules; None if it
    worked, else what went wrong."""
    staging = new_staging()
    try:
        uid = UID_BASE if interp.use_uid else None
        hand_over(staging, uid, iso)
        spec = launcher_spec(iso=iso, network="deny", staging=staging, uid=uid, limits=SandboxConfig(),
                             read=interp.read_dirs + interp.read_files)
        return _run_launcher(spec, [interp.path, "-I", "-S", "-c", "import json, math, re, collections, itertools"],
                             staging)
    except OSError as exc:
        return str(exc)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def sandbox_python(configured: str) -> Interpreter:
    """The interpreter of sandboxed programs: `configured`, else this one, else /usr/bin/python3 — the first
    that really starts under the sandbox (as the dedicated uid when rollart runs as root). Raises
    `SandboxUnavailable` when none does."""
    found = _find_interpreter(configured, probe_isolation())
    if isinstance(found, str):
        raise SandboxUnavailable(found)
    return found


def check_level(limits: SandboxLimits, *, uid: bool, disk_cap: bool = True, setting: str = "reward.sandbox") -> str:
    """The isolation label `limits` gets here, or `SandboxUnavailable` saying what is missing and which setting
    would accept less (`setting`: where `limits` sits in the run config). Probes once per process."""
    iso = probe_isolation()
    have = iso.level(limits.network, disk_cap)
    if LEVELS.index(have) < LEVELS.index(limits.min_isolation):
        missing = "; ".join(iso.missing) or ("the files are not on a capped tmpfs (that needs root)"
                                             if not disk_cap else "unknown")
        raise SandboxUnavailable(
            f"the sandbox needs isolation level '{limits.min_isolation}' ({setting}.min_isolation) but "
            f"this machine gives only '{have}': {missing}. Fix the machine, or set "
            f"{setting}.min_isolation={have} to accept running untrusted code with less isolation "
            f"(levels, weakest first: {', '.join(LEVELS)})"
        )
    if have != "full":
        _warn_once(have, setting)
    return iso.label(limits.network, uid, disk_cap)


def check_isolation(cfg: SandboxConfig) -> str:
    """The isolation label a code sandbox with `cfg` (reward.sandbox) gets here, its interpreter included;
    `SandboxUnavailable` as `check_level` says."""
    interp = sandbox_python(cfg.python)
    return check_level(cfg, uid=interp.use_uid)


@functools.lru_cache(maxsize=8)
def _warn_once(level: str, setting: str) -> None:
    log.warning("the sandbox runs at isolation level '%s' (below 'full', accepted by %s.min_isolation)",
                level, setting)
