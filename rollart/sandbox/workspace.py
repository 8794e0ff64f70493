"""Workspace sandboxes: one trajectory's own directory tree and processes, for environments whose tools run
commands (a shell, read and write files, run the tests). Created at reset, destroyed at close; nothing
outlives its trajectory.

API (what environments use; stable):

    ws = open_workspace(limits: WorkspaceConfig, files: Mapping[str, str], *, owner="env") -> Workspace
    ws.root: Path                      # the tree on the host (rollart's own code only; commands see /workspace)
    ws.isolation: str                  # the mechanisms it got, e.g. process+rlimits+uid+landlock+netns+...
    ws.run(command, *, timeout_s=None, stdin="") -> CommandResult   # `bash -c command` in /workspace
    ws.read_file(path, max_bytes) -> str        # text (UTF-8, invalid bytes replaced), "[truncated ...]" past max
    ws.write_file(path, text) -> None           # creates parent dirs; counts against the disk cap
    ws.write_files({path: text, ...}) -> None   # several at once (one round trip in a container)
    ws.snapshot(max_bytes) -> dict[str, str]    # every text file of the tree, for a fresh scoring workspace
    ws.close() -> None                          # kill everything, unmount, delete; idempotent
    reap_leftovers(owner=None) -> int           # at worker start: remove what dead processes' workspaces left

    CommandResult(exit_code, stdout, stderr, timed_out, limit_hit, duration_s, signal)
      exit_code: None when killed by a signal (`signal`); stdout/stderr capped at `max_output_kb` each, with a
      "[truncated]" mark; limit_hit: "memory" | "cpu" | "pids" | "disk" | None.

Paths given to `read_file`/`write_file` are relative to the tree, or absolute under /workspace (as commands see
it). A path that leaves the tree (`..`, another absolute path) or goes through a symlink — even one inside
the tree: the host side never follows links a policy made — is a ValueError; so is anything that is not a
regular file. Hidden files (e.g. hidden tests) never go into a workspace the policy uses: score in a fresh
one, `open_workspace(limits, {**ws.snapshot(n), **hidden})`, after the policy's last command (none of its
processes is alive then: see below).

Isolation: every command runs in a fresh sandbox of process.py/launch.py — own uid (one per workspace),
PID/IPC/mount/network namespaces, a private root (read-only /usr, /bin, /lib*, a few /etc files and device
nodes, its own /proc, the workspace as /workspace and its /tmp), Landlock, and the workspace's cgroup. Limits
(`envs.workspace`): CPU time (`cpu_time_s`) and wall time (`timeout_s`, default `wall_timeout_s`) per
command, for the command and all its children; memory, processes and disk (`disk_mb`: a tmpfs holding the
tree and /tmp, mounted on the host so the tree persists between commands) for the whole workspace.
A command's processes never outlive its `run`: when the command ends, times out or hits a limit, every
process it started (background jobs, daemons, fork bombs) is killed with its PID namespace. There is no
network (not even 127.0.0.1: Ray, the reward service and the gateway are unreachable), other processes'
/proc entries are not visible, and another workspace's tree is not in the view at all.

Lifecycle: `close()` kills a command still running (a cancelled or timed-out trajectory), removes the
cgroup, unmounts the tmpfs and deletes the directory. A workspace that is never closed is closed when it
is garbage-collected or the process exits. A process that dies without closing (an env worker killed with
SIGKILL) leaves its tmpfs, cgroup and directory: its running commands die with it (their launchers watch a
pipe only that process held), and `reap_leftovers` — called by the first `open_workspace` of every
process, and by env workers at start — removes the rest of every workspace whose creator is gone.

Backends: `native` (above) and `podman`/`docker` (container.py: one container per workspace, the same
contract — tests/contracts/test_workspace_contract.py runs both native and podman).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Mapping

from rollart.config import WorkspaceConfig
from rollart.sandbox import cgroups, isolation
from rollart.sandbox.isolation import UID_BASE
from rollart.sandbox.process import Launched, cleanup, encode_text, finish, kill_group, launch, pump, tree_group
from rollart.sandbox.workspace_api import OWNER_NAME, CommandResult, Workspace, WorkspaceClosed, tree_parts

BASE = Path(tempfile.gettempdir()) / "rollart-workspaces"
# what commands may read (bound read-only into each command's private root)
WORKSPACE_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache",
                  "/etc/alternatives", "/etc/localtime")
PATH = "/usr/local/bin:/usr/bin:/bin"
SETTING = "envs.workspace"
_counter = itertools.count()
_uids = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


# --- host-side files: never through a symlink, never out of the tree ------------------------------------


def _open_dir(root: Path, parts: list[str], path: str, create_as: int | None = None) -> int:
    """An fd of the directory `parts` below `root`, walked without following any symlink (O_NOFOLLOW at each
    step); with `create_as` (a uid) missing directories are made, owned by it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if create_as is None:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                if create_as >= 0:
                    os.fchown(nxt, create_as, create_as)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ValueError(f"workspace path {path!r}: {part!r} is a symlink or not a directory "
                                     "(the workspace's files are never reached through links)") from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_file(root: Path, path: str, flags: int, create_as: int | None = None) -> int:
    parts = tree_parts(path)
    dir_fd = _open_dir(root, parts[:-1], path, create_as)
    try:
        fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"workspace path {path!r} is a symlink (never followed)") from None
        if exc.errno == errno.ENXIO:
            raise ValueError(f"workspace path {path!r} is not a regular file") from None
        raise
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"workspace path {path!r} is not a regular file")
    return fd


# --- host mounts -----------------------------------------------------------------------------------------


def _mount_tmpfs(target: Path, size_mb: int) -> None:
    opts = f"size={size_mb}m,nr_inodes={max(1024, size_mb * isolation.INODES_PER_MB)},mode=700".encode()
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting the workspace's tmpfs on {target}: {os.strerror(err)}")


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix) or point == str(path):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def _unmount_all(path: Path) -> None:
    for point in _mounts_under(path):
        _libc.umount2(point.encode(), MNT_DETACH)


def _destroy(directory: Path, group: cgroups.TreeGroup | None) -> None:
    """Kill what is left in the workspace's cgroup, unmount its tmpfs and delete its directory."""
    if group is not None:
        group.remove()
    _unmount_all(directory)
    shutil.rmtree(directory, ignore_errors=True)


# --- the workspace ---------------------------------------------------------------------------------------


class NativeWorkspace:
    """One trajectory's own directory tree and process sandbox (the `native` backend); nothing outlives close(). Built by
    `open_workspace`. One command runs at a time (`run` holds a lock; `close` does not wait for it)."""

    def __init__(self, limits: WorkspaceConfig, directory: Path, disk_cap: bool, uid: int | None,
                 group: cgroups.TreeGroup | None, label: str) -> None:
        self.limits = limits
        self.directory = directory
        self.root = directory / "disk" / "work"
        self.isolation = label
        self._tmp = directory / "disk" / "tmp"
        self._disk_cap = disk_cap
        self._uid = uid
        self._group = group
        self._lock = threading.Lock()
        self._current: Launched | None = None
        self._closed = False
        self._finalizer = weakref.finalize(self, _destroy, directory, group)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise WorkspaceClosed(f"workspace {self.directory.name} is closed")

    def run(self, command: str, *, timeout_s: float | None = None, stdin: str = "") -> CommandResult:
        """Run `bash -c command` in /workspace; blocking (call it from a worker thread). Every process the command
        started is killed when it ends. `timeout_s` (default `wall_timeout_s`) bounds its wall time."""
        data = encode_text("the command's stdin", stdin)
        encode_text("the command", command)
        wall = self.limits.wall_timeout_s if timeout_s is None else float(timeout_s)
        if not wall > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        with self._lock:
            self._check_open()
            iso = isolation.probe_isolation()
            t0 = time.monotonic()
            run = launch(
                ["/bin/bash", "-c", command], self.limits, iso=iso, interp=None, stdin=subprocess.PIPE,
                staging=self.directory, uid=self._uid, group=self._group, owns_group=False,
                env={"PATH": PATH}, read=WORKSPACE_READ, wall_s=wall, proc=True, exec_write=True,
                bind_work=str(self.root), bind_tmp=str(self._tmp), disk_cap=self._disk_cap,
            )
            self._current = run
            try:
                if self._closed:  # closed while it started: do not let it run
                    kill_group(run.proc)
                timed_out, capped, limit = pump([run], self.limits, data, wall_s=wall)
                res = finish(run, timed_out, capped, limit, t0)
            finally:
                self._current = None
                cleanup(run, remove_staging=False)
        cap = self.limits.max_output_kb * 1024
        out, err = ((text + "\n[truncated]" if len(run.streams.get(name, b"")) >= cap else text)
                    for name, text in (("stdout", res.stdout), ("stderr", res.stderr)))
        return CommandResult(res.exit_code, out, err, res.timed_out, res.limit_hit, res.wall_s, res.signal)

    def read_file(self, path: str, max_bytes: int) -> str:
        """The text of a regular file of the tree (UTF-8; invalid bytes replaced), at most `max_bytes` of it
        and then a "[truncated: N bytes in all]" line. ValueError for a path that leaves the tree, goes
        through a symlink or is not a regular file; FileNotFoundError when it does not exist."""
        self._check_open()
        fd = _open_file(self.root, path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            data = os.read(fd, max(0, max_bytes) + 1) if max_bytes > 0 else b""
        finally:
            os.close(fd)
        text = data[:max_bytes].decode("utf-8", "replace")
        return text + (f"\n[truncated: {size} bytes in all]" if len(data) > max_bytes else "")

    def write_file(self, path: str, text: str) -> None:
        """Write `text` (UTF-8) to a file of the tree, making its parent directories. ValueError as
        `read_file`, or for text that is not valid or a file over `file_size_mb`; OSError(ENOSPC) when the
        workspace's disk cap (`disk_mb`) is reached."""
        self._check_open()
        data = encode_text(f"workspace file {path!r}", text)
        if len(data) > self.limits.file_size_mb * 2**20:
            raise ValueError(f"workspace file {path!r}: {len(data)} bytes is over {SETTING}.file_size_mb="
                             f"{self.limits.file_size_mb}")
        owner = -1 if self._uid is None else self._uid
        fd = _open_file(self.root, path, os.O_WRONLY | os.O_CREAT, create_as=owner)
        try:
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self._uid is not None:
                os.fchown(fd, self._uid, self._uid)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise OSError(errno.ENOSPC, f"workspace file {path!r}: the workspace is full ({SETTING}.disk_mb="
                              f"{self.limits.disk_mb})") from None
            raise
        finally:
            os.close(fd)

    def write_files(self, files: Mapping[str, str]) -> None:
        """`write_file` of each (path → text), in order; the first refusal raises (those before it are written)."""
        for path, text in files.items():
            self.write_file(path, text)

    def snapshot(self, max_bytes: int) -> dict[str, str]:
        """Every regular file of the tree that is valid UTF-8 text, by relative path (symlinks, other kinds
        of file and binary files left out) — for a fresh workspace that scores the policy's work. ValueError
        when they add up to more than `max_bytes`."""
        self._check_open()
        out: dict[str, str] = {}
        total = 0
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for name in filenames:
                rel = os.path.relpath(os.path.join(dirpath, name), self.root)
                try:
                    fd = _open_file(self.root, rel, os.O_RDONLY)
                except (ValueError, OSError):
                    continue
                try:
                    data = os.read(fd, max_bytes - total + 1)
                finally:
                    os.close(fd)
                total += len(data)
                if total > max_bytes:
                    raise ValueError(f"the workspace's text files are over {max_bytes} bytes")
                try:
                    out[rel] = data.decode("utf-8")
                except UnicodeDecodeError:
                    total -= len(data)
        return out

    def close(self) -> None:
        """Kill a command still running and everything it started, remove the cgroup, unmount the tmpfs and
        delete the tree. Idempotent; safe from any thread while `run` is blocked in another."""
        self._closed = True
        current = self._current
        if current is not None and current.proc.returncode is None:
            kill_group(current.proc)  # `run` sees its pipes close and returns
        with self._lock:
            self._finalizer()

    def __enter__(self) -> NativeWorkspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ws_uid(iso: isolation.Isolation) -> int | None:
    if not iso.root:
        return None
    return UID_BASE + 100_000 + (os.getpid() * 991 + next(_uids)) % 100_000  # apart from the code sandbox's


def open_workspace(limits: WorkspaceConfig, files: Mapping[str, str], *, owner: str = "env") -> Workspace:
    """A fresh workspace holding `files` (relative path → text). `owner` names the creator's kind (e.g. the
    env worker's name) for `reap_leftovers`. Raises `SandboxUnavailable` when `limits.min_isolation` cannot
    be had here, ValueError for a bad file name or text. Blocking (tens of ms); call it from a worker
    thread."""
    if limits.backend != "native":
        from rollart.sandbox.container import open_container_workspace

        return open_container_workspace(limits, files, owner=owner)
    if not OWNER_NAME.match(owner):
        raise ValueError(f"workspace owner {owner!r}: 1-64 letters, digits, '_', '.' or '-'")
    _reap_once()
    iso = isolation.probe_isolation()
    disk_cap = iso.root and iso.namespaces  # the tree's tmpfs is mounted on the host: root only
    label = isolation.check_level(limits, uid=iso.root, disk_cap=disk_cap, setting=SETTING)
    directory = BASE / owner / f"{cgroups.owner_tag()}-{next(_counter)}-{secrets.token_hex(4)}"
    for _ in range(3):  # a reaper may remove an empty owner dir between its mkdir and ours
        BASE.mkdir(mode=0o700, exist_ok=True)
        directory.parent.mkdir(mode=0o700, exist_ok=True)
        try:
            directory.mkdir(mode=0o700)
            break
        except FileNotFoundError:
            continue
    else:
        directory.mkdir(mode=0o700)
    group = None
    try:
        (directory / "root").mkdir()
        disk = directory / "disk"
        disk.mkdir(mode=0o700)
        if disk_cap:
            _mount_tmpfs(disk, limits.disk_mb)
        uid = _ws_uid(iso)
        for sub in ("work", "tmp"):
            (disk / sub).mkdir(mode=0o700)
            if uid is not None:
                os.chown(disk / sub, uid, uid)
        if uid is not None:
            os.chmod(directory, 0o711)  # without namespaces the uid passes through to disk/
            os.chmod(disk, 0o711)
        group = tree_group(limits, iso, SETTING)
        ws = NativeWorkspace(limits, directory, disk_cap, uid, group, label if group else label.replace("+cgroup", ""))
    except BaseException:
        _destroy(directory, group)
        raise
    try:
        ws.write_files(files)
    except BaseException:
        ws.close()
        raise
    return ws


def reap_leftovers(owner: str | None = None) -> int:
    """Remove every workspace (of `owner`, or of all owners) whose creating process is gone: its commands'
    processes and cgroup, its tmpfs, its directory — and the containers of the container backend, where podman
    or docker answers. Returns how many. Safe while other processes' workspaces are in use (theirs are left
    alone)."""
    from rollart.sandbox.container_engine import reap_containers

    removed = sum(reap_containers(engine, owner) for engine in ("podman", "docker"))
    if not BASE.is_dir():
        return removed
    parents = [BASE / owner] if owner else [p for p in BASE.iterdir() if p.is_dir() and not p.is_symlink()]
    for parent in parents:
        if not parent.is_dir():
            continue
        for directory in parent.iterdir():
            tag = "-".join(directory.name.split("-")[:2])
            if directory.is_symlink() or cgroups.owner_alive(tag):
                continue
            _destroy(directory, None)
            removed += 1
        try:
            parent.rmdir()  # an owner with no workspace left leaves no directory either
        except OSError:
            pass
    cgroups.reap()  # their cgroups: named after the same dead creators
    return removed


@functools.lru_cache(maxsize=1)
def _reap_once() -> int:
    return reap_leftovers()
