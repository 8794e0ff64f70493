"""The container backend of workspaces (`envs.workspace.backend: podman | docker`): one container per
workspace, driven through that engine's CLI, behind the `Workspace` protocol of workspace_api.py.

In: the workspace's limits (`WorkspaceConfig`: `image`, `container_runtime`, the limits), the files to start
with and the owner's name. Out: a `ContainerWorkspace` (`run`, `read_file`, `write_file`, `write_files`,
`snapshot`, `close`). The engine's CLI is container_engine.py (arguments, reaping); what runs inside the
container and how its answers are read, container_scripts.py.

The container (`container_args`): the engine's init (`--init`: it reaps the orphans a command's killed
processes leave, which would otherwise fill the pids limit) over `sleep infinity`, both as root — every command,
read and write runs as user nobody (65534, `exec --user`), who can signal neither; `--read-only` root,
`/workspace` a tmpfs of `disk_mb` and `/tmp` and `/dev/shm` tmpfs of a quarter of it (no other writable path:
podman's automatic /run, /var/tmp tmpfs are off), `--memory`/`--memory-swap` of `memory_mb` + `disk_mb` (tmpfs
pages count as memory), `--pids-limit max_processes`, `--cpus 1`, every capability dropped,
`no-new-privileges`, `--network none` when the network is denied, no mounts of host paths or sockets, and
`--pull never` (the image must be local: `make env-image` builds the default one without a registry). Explicit
`--ulimit`s, because podman's defaults can exceed the hard limits its runtime may set (runc then refuses to
start the container).

A command is one `exec` of a small supervisor (`SUPERVISOR`): RLIMIT_CPU of `cpu_time_s` for every process
(`ulimit -t`), `timeout -s KILL` of the wall limit on `bash -c command`, then `kill -9 -1` — every process of
the workspace's user but PID 1, so nothing a command starts (background jobs, `setsid`, `nohup`, fork bombs)
outlives it; the init and `sleep` are root's — and a trailer on stderr after a per-workspace random mark: the exit status, the container's
cgroup counters (OOM kills, refused forks, CPU time) and the free space of its two tmpfs. Nothing of the
command runs when the trailer is written, so the last mark is the supervisor's. From the counters' change the
result's `limit_hit` is "memory", "cpu" (the tree's CPU time past `cpu_time_s`, or a process killed by
RLIMIT_CPU), "disk" (a tmpfs within 256 KiB of full) or "pids" — as the native backend reports it. When the
command's output passes `max_output_kb` or its wall limit passes (the exec client is then killed), a second
`exec` does the kill and reads the counters. Reads, writes and snapshots are `exec`s too (`realpath` inside
the container: a path that leaves /workspace or goes through a symlink is refused, as natively); `write_files`
writes several in one `exec` (the image's python3 opens every directory O_NOFOLLOW); one operation runs at a
time per workspace, and `close` (`rm -f`) ends one that runs.

Differences from the native backend, by what a container engine offers: the CPU limit ends one process at
`cpu_time_s` (RLIMIT_CPU) and the whole tree only at the wall limit (the tree's CPU time is still reported as
`limit_hit="cpu"`); `root` is the container's `/workspace`, not a host path; each operation costs an `exec`
(about 0.2 s on an idle 2-core machine: this is what the warm pool hides from resets, not from turns).
Opening one is `run -d`, then one `exec` that copies the files to start with in and reads the counters the
first command's are compared with — none for an empty workspace, whose counters are a fresh container's zeros.

Leftovers: a container is labelled `rollart.owner=<owner>` and `rollart.creator=<pid>-<start time>`;
`reap_containers` (run by the first workspace of each process and engine, and by `reap_leftovers`, which env
workers call at start) removes those whose creator is gone — a worker killed with SIGKILL leaves a container
running until then. A workspace never closed is removed when it is garbage-collected or the process exits.

Engines: podman (tested on the build machines: Debian's podman 4.3 with runc, cgroups v1) and docker (the same
arguments; `rm -f` kills at once, podman needs `-t 0`), each only where its CLI answers `version` — else
`SandboxUnavailable` says so. Where podman's default runtime is crun on a hybrid cgroup layout (crun refuses
it), set `envs.workspace.container_runtime=runc`.
"""

from __future__ import annotations

import io
import itertools
import secrets
import signal
import subprocess
import tarfile
import threading
import time
import weakref
from pathlib import Path
from typing import Mapping

from rollart.config import WorkspaceConfig
from rollart.sandbox import cgroups
from rollart.sandbox.container_engine import (
    container_args, engine_cli, engine_cwd, reap_once, remove_container, start_error,
)
from rollart.sandbox.container_scripts import (
    REPORT, RESOLVE, SUPERVISOR, WRITER, Counters, limit_hit, split_trailer,
)
from rollart.sandbox.isolation import SandboxUnavailable
from rollart.sandbox.process import Launched, encode_text, finish, pump
from rollart.sandbox.workspace_api import OWNER_NAME, CommandResult, WorkspaceClosed, tree_parts

USER = "65534:65534"
_counter = itertools.count()


class ContainerWorkspace:
    """A workspace in one container (see the module docstring); the `Workspace` protocol."""

    def __init__(self, limits: WorkspaceConfig, cli: str, name: str) -> None:
        self.limits, self._cli, self.name = limits, cli, name
        self.root = Path("/workspace")  # inside the container: not a host path
        self.isolation = f"container({limits.backend})"
        self._mark = f"@@rollart-{secrets.token_hex(8)}@@"
        self._counters = Counters()
        self._lock = threading.Lock()
        self._closed = False
        self._finalizer = weakref.finalize(self, remove_container, cli, limits.backend, name)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise WorkspaceClosed(f"workspace {self.name} is closed")

    def _exec(self, args: list[str], stdin: bytes = b"", timeout_s: float = 60) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self._cli, "exec", "-i", "--user", USER, self.name, *args], input=stdin, capture_output=True,
                                  timeout=timeout_s, cwd=engine_cwd())
        except subprocess.TimeoutExpired:
            raise OSError(f"workspace {self.name}: `{self._cli} exec` did not answer in {timeout_s:g}s") from None

    def _report(self) -> Counters | None:
        """Kill every process of the user and read the counters (after a command whose trailer was lost)."""
        res = self._exec(["sh", "-c", REPORT, "sh", self._mark], timeout_s=60)
        _, status, counters = split_trailer(res.stdout + res.stderr, self._mark)
        return counters if status is not None else None

    def run(self, command: str, *, timeout_s: float | None = None, stdin: str = "") -> CommandResult:
        """`bash -c command` in /workspace (see the module docstring); blocking."""
        data = encode_text("the command's stdin", stdin)
        encode_text("the command", command)
        wall = self.limits.wall_timeout_s if timeout_s is None else float(timeout_s)
        if not wall > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        cpu = max(1, int(self.limits.cpu_time_s + 0.999))
        with self._lock:
            self._check_open()
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [self._cli, "exec", "-i", "--user", USER, "-w", "/workspace", self.name, "sh", "-c", SUPERVISOR, "sh", f"{wall:g}",
                 command, str(cpu), self._mark],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                cwd=engine_cwd())
            run = Launched(proc, Path(), self.isolation, None, False, None, self.limits.cpu_time_s)
            timed_out, capped, _ = pump([run], self.limits, data, wall_s=wall + 5)
            stderr, status, after = split_trailer(bytes(run.streams.get("stderr", b"")), self._mark)
            run.streams["stderr"] = bytearray(stderr)
            res = finish(run, timed_out, capped, None, t0)
            if after is None and not self._closed:
                after = self._report()
        if self._closed:
            raise WorkspaceClosed(f"workspace {self.name} was closed while a command ran")
        code, sig = res.exit_code, res.signal
        if status is not None:
            code, sig = (None, status - 128) if 128 < status < 160 else (status, None)
        limit = limit_hit(self._counters, after, self.limits.cpu_time_s, sig) if after is not None else None
        self._counters = after or self._counters
        timed_out = res.timed_out or (sig == signal.SIGKILL and res.wall_s >= wall)  # `timeout -s KILL` fired
        cap = self.limits.max_output_kb * 1024
        out, err = ((text + "\n[truncated]" if len(run.streams.get(n, b"")) >= cap else text)
                    for n, text in (("stdout", res.stdout), ("stderr", res.stderr)))
        return CommandResult(code if sig is None else None, out, err, timed_out, limit, res.wall_s, sig)

    def read_file(self, path: str, max_bytes: int) -> str:
        """As the native backend's: the text of a regular file of the tree, capped; ValueError for a path that
        leaves the tree, goes through a symlink or is not a regular file; FileNotFoundError when it is missing."""
        target = "/workspace/" + "/".join(tree_parts(path))
        with self._lock:
            self._check_open()
            res = self._exec(["sh", "-c", RESOLVE + '[ -e "$1" ] || exit 93; [ -f "$1" ] || exit 92; '
                              'wc -c < "$1" >&2; head -c "$2" -- "$1"', "sh", target, str(max(0, max_bytes) + 1)])
        self._raise_for(res, path)
        data = res.stdout
        text = data[:max_bytes].decode("utf-8", "replace")
        if len(data) > max_bytes:
            size = res.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
            text += f"\n[truncated: {size[0].strip()} bytes in all]"
        return text

    def write_file(self, path: str, text: str) -> None:
        """As the native backend's: creates parent directories; OSError(ENOSPC) past the disk cap."""
        data = encode_text(f"workspace file {path!r}", text)
        if len(data) > self.limits.file_size_mb * 2**20:
            raise ValueError(f"workspace file {path!r}: {len(data)} bytes is over envs.workspace.file_size_mb="
                             f"{self.limits.file_size_mb}")
        target = "/workspace/" + "/".join(tree_parts(path))
        with self._lock:
            self._check_open()
            res = self._exec(["sh", "-c", RESOLVE + 'mkdir -p -- "$(dirname -- "$1")" || exit 94; '
                              '{ [ ! -e "$1" ] || [ -f "$1" ]; } || exit 92; cat > "$1" || exit 94', "sh", target],
                             stdin=data)
        if res.returncode == 94 and b"No space left" in res.stderr:
            import errno

            raise OSError(errno.ENOSPC, f"workspace file {path!r}: the workspace is full (envs.workspace.disk_mb="
                          f"{self.limits.disk_mb})")
        self._raise_for(res, path)

    def write_files(self, files: Mapping[str, str]) -> None:
        """Several files in one `exec` (`WRITER`); the same refusals as `write_file` (for the first file refused,
        those before it written). Without python3 in the image, one `write_file` each."""
        payload = _tar(files, self.limits.file_size_mb)
        if not files:
            return
        with self._lock:
            self._check_open()
            res = self._exec(["python3", "-I", "-c", WRITER], stdin=payload, timeout_s=120)
        if res.returncode == 127:
            for path, text in files.items():
                self.write_file(path, text)
            return
        what = f"one of {sorted(files)[:3]}{' …' if len(files) > 3 else ''}"
        if res.returncode == 94:
            import errno

            raise OSError(errno.ENOSPC, f"workspace files {what}: the workspace is full (envs.workspace.disk_mb="
                          f"{self.limits.disk_mb})")
        self._raise_for(res, what)

    @staticmethod
    def _raise_for(res: subprocess.CompletedProcess, path: str) -> None:
        if res.returncode in (90, 91):
            raise ValueError(f"workspace path {path!r} leaves the workspace or goes through a symlink")
        if res.returncode == 92:
            raise ValueError(f"workspace path {path!r} is not a regular file")
        if res.returncode == 93:
            raise FileNotFoundError(f"workspace path {path!r} does not exist")
        if res.returncode != 0:
            raise OSError(f"workspace path {path!r}: {res.stderr.decode(errors='replace').strip()[-200:]}")

    def snapshot(self, max_bytes: int) -> dict[str, str]:
        """Every regular UTF-8 text file of the tree (symlinks and other kinds left out); ValueError past
        `max_bytes`."""
        with self._lock:
            self._check_open()
            res = self._exec(["tar", "-c", "-C", "/workspace", "."], timeout_s=120)
        if res.returncode != 0:
            raise OSError(f"snapshot of {self.name}: {res.stderr.decode(errors='replace').strip()[-200:]}")
        out: dict[str, str] = {}
        total = 0
        with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
            for member in tar:
                if not member.isreg():
                    continue
                extracted = tar.extractfile(member)
                data = extracted.read() if extracted is not None else b""
                try:
                    out[member.name.removeprefix("./")] = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                total += len(data)
                if total > max_bytes:
                    raise ValueError(f"the workspace's text files are over {max_bytes} bytes")
        return out

    def close(self) -> None:
        """Remove the container (a command still running dies with it); idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> ContainerWorkspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def _tar(files: Mapping[str, str], file_size_mb: int) -> bytes:
    """`files` as a tar (paths checked to stay in the tree, texts to be valid and under `file_size_mb`)."""
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as tar:
        for path, text in files.items():
            data = encode_text(f"workspace file {path!r}", text)
            if len(data) > file_size_mb * 2**20:
                raise ValueError(f"workspace file {path!r}: {len(data)} bytes is over envs.workspace.file_size_mb="
                                 f"{file_size_mb}")
            info = tarfile.TarInfo("/".join(tree_parts(path)))
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, 65534, 65534
            tar.addfile(info, io.BytesIO(data))
    return payload.getvalue()


def open_container_workspace(limits: WorkspaceConfig, files: Mapping[str, str], *, owner: str) -> ContainerWorkspace:
    """A fresh container workspace holding `files` (see the module docstring). `SandboxUnavailable` when the
    engine, the image or the runtime is missing; ValueError for a bad owner, file name or text."""
    if not OWNER_NAME.match(owner):
        raise ValueError(f"workspace owner {owner!r}: 1-64 letters, digits, '_', '.' or '-'")
    cli = engine_cli(limits.backend)
    payload = _tar(files, limits.file_size_mb)
    reap_once(limits.backend)
    creator = cgroups.owner_tag()
    name = f"rollart-ws-{owner}-{creator}-{next(_counter)}-{secrets.token_hex(3)}"
    try:
        started = subprocess.run([cli, *container_args(limits, name, owner, creator)], capture_output=True,
                                 timeout=300, cwd=engine_cwd())
    except subprocess.TimeoutExpired:
        remove_container(cli, limits.backend, name)
        raise SandboxUnavailable(f"envs.workspace.backend={limits.backend}: the container did not start in 300s") from None
    if started.returncode != 0:
        remove_container(cli, limits.backend, name)
        raise SandboxUnavailable(start_error(limits, started.stderr.decode(errors="replace").strip()))
    ws = ContainerWorkspace(limits, cli, name)
    if not files:  # nothing to copy: a fresh container's counters are the zero ones (no OOM kill, no refused fork,
        return ws  # its init's CPU time well under a second) — an `exec` here would cost ~0.1 s for nothing
    try:
        script = 'tar -x -C /workspace || exit 1; shift; ' + REPORT
        res = ws._exec(["sh", "-c", script, "sh", "x", ws._mark], stdin=payload)
        _, status, counters = split_trailer(res.stdout + res.stderr, ws._mark)
        if res.returncode != 0 or status is None or counters is None:
            raise OSError(f"copying the files into {name}: {res.stderr.decode(errors='replace').strip()[-300:]}")
        ws._counters = counters
    except BaseException:
        ws.close()
        raise
    return ws
