"""The container backend of workspaces (`envs.workspace.backend: docker | podman`): one container per
workspace, driven through that CLI, behind the interface of workspace.py.

The container: `--network none` (when the network is denied), `--read-only` root, `/workspace` a tmpfs of
`disk_mb` and `/tmp` one of a quarter of it, `--memory`/`--memory-swap` of `memory_mb` + `disk_mb`,
`--pids-limit`, `--cpus 1`, user nobody (65534), every capability dropped, `no-new-privileges`; its PID 1
is `sleep infinity`. A command is `exec`'d under `timeout -s KILL` (the image needs coreutils' `timeout`,
`bash` and `tar`, as `python:3.11-slim` has); afterwards every process of the user but PID 1 is killed
(`kill -9 -1`), so a command's processes never outlive it. The container's labels name its owner and its
creator process; `reap_leftovers` removes the containers of creators that are gone.

Differences from the native backend, by what a container CLI offers: CPU time is not counted per command
(the wall timeout bounds it, `--cpus` its rate), and `limit_hit` is never set (the CLI does not say
which limit ended a command); `root` is the container's `/workspace`, not a host path.

Where the CLI or its engine is missing, `open_container_workspace` raises `SandboxUnavailable` saying so.
The build machines have neither: this backend's tests there cover only that refusal and the container's
arguments; the workspace tests ran the native backend.
"""

from __future__ import annotations

import io
import itertools
import secrets
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Mapping

from rollart.config import WorkspaceConfig
from rollart.sandbox import cgroups
from rollart.sandbox.isolation import SandboxUnavailable
from rollart.sandbox.process import Launched, encode_text, finish, pump
from rollart.sandbox.workspace_api import OWNER_NAME, CommandResult, WorkspaceClosed, tree_parts

_counter = itertools.count()
USER = "65534:65534"
_RESOLVE = ('p=$(realpath -m -- "$1") && case "$p" in /workspace/*) ;; *) exit 90;; esac && [ "$p" = "$1" ] '
            '|| exit 91; ')  # inside /workspace, and no symlink on the way (the resolved path is the path itself)


def _cli_or_refuse(limits: WorkspaceConfig) -> str:
    cli = shutil.which(limits.backend)
    if cli is None:
        raise SandboxUnavailable(f"envs.workspace.backend={limits.backend}: there is no `{limits.backend}` "
                                 "command on this machine; install it or set envs.workspace.backend=native")
    try:
        probe = subprocess.run([cli, "version"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"envs.workspace.backend={limits.backend}: `{limits.backend} version` failed: "
                                 f"{exc}") from None
    if probe.returncode != 0:
        raise SandboxUnavailable(f"envs.workspace.backend={limits.backend}: its engine does not answer "
                                 f"({probe.stderr.decode(errors='replace').strip()[-200:]}); start it or set "
                                 "envs.workspace.backend=native")
    return cli


def container_args(limits: WorkspaceConfig, name: str, owner: str, creator: str) -> list[str]:
    """The `run` arguments of one workspace's container (after the CLI)."""
    mem = f"{limits.memory_mb + limits.disk_mb}m"
    args = ["run", "-d", "--rm", "--name", name, "--label", f"rollart.owner={owner}",
            "--label", f"rollart.creator={creator}", "--read-only",
            "--tmpfs", f"/workspace:rw,exec,size={limits.disk_mb}m,mode=1777",
            "--tmpfs", f"/tmp:rw,exec,size={max(1, limits.disk_mb // 4)}m,mode=1777",
            "--memory", mem, "--memory-swap", mem, "--pids-limit", str(limits.max_processes), "--cpus", "1",
            "--user", USER, "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--workdir", "/workspace"]
    if limits.network == "deny":
        args += ["--network", "none"]
    return args + [limits.image, "sleep", "infinity"]


class ContainerWorkspace:
    """A workspace in one container (see the module docstring); implements `workspace_api.Workspace`."""

    def __init__(self, limits: WorkspaceConfig, cli: str, name: str) -> None:
        self.limits, self._cli, self.name = limits, cli, name
        self.root = Path("/workspace")  # inside the container: not a host path
        self.directory = Path(name)
        self.isolation = f"container({limits.backend})"
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _exec(self, args: list[str], stdin: bytes = b"", timeout_s: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([self._cli, "exec", "-i", self.name] + args, input=stdin, capture_output=True,
                              timeout=timeout_s)

    def _check_open(self) -> None:
        if self._closed:
            raise WorkspaceClosed(f"workspace {self.name} is closed")

    def run(self, command: str, *, timeout_s: float | None = None, stdin: str = "") -> CommandResult:
        data = encode_text("the command's stdin", stdin)
        encode_text("the command", command)
        wall = self.limits.wall_timeout_s if timeout_s is None else float(timeout_s)
        with self._lock:
            self._check_open()
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [self._cli, "exec", "-i", "-w", "/workspace", self.name, "timeout", "-s", "KILL", f"{wall:g}",
                 "bash", "-c", command],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            run = Launched(proc, Path(), self.isolation, None, False, None, self.limits.cpu_time_s)
            try:
                timed_out, capped, limit = pump([run], self.limits, data, wall_s=wall + 5)
                res = finish(run, timed_out, capped, limit, t0)
            finally:
                self._exec(["kill", "-9", "-1"], timeout_s=30)  # every process of the user but PID 1
        cap = self.limits.max_output_kb * 1024
        out, err = ((text + "\n[truncated]" if len(run.streams.get(n, b"")) >= cap else text)
                    for n, text in (("stdout", res.stdout), ("stderr", res.stderr)))
        timed_out = res.timed_out or (res.signal == 9 and res.wall_s >= wall)  # `timeout -s KILL` fired
        return CommandResult(res.exit_code, out, err, timed_out, None, res.wall_s, res.signal)

    def read_file(self, path: str, max_bytes: int) -> str:
        self._check_open()
        target = "/workspace/" + "/".join(tree_parts(path))
        res = self._exec(["sh", "-c", _RESOLVE + '[ -f "$1" ] || exit 92; head -c "$2" -- "$1"', "sh", target,
                          str(max(0, max_bytes) + 1)])
        self._raise_for(res, path)
        data = res.stdout
        text = data[:max_bytes].decode("utf-8", "replace")
        return text + ("\n[truncated]" if len(data) > max_bytes else "")

    def write_file(self, path: str, text: str) -> None:
        self._check_open()
        data = encode_text(f"workspace file {path!r}", text)
        if len(data) > self.limits.file_size_mb * 2**20:
            raise ValueError(f"workspace file {path!r}: {len(data)} bytes is over envs.workspace.file_size_mb="
                             f"{self.limits.file_size_mb}")
        target = "/workspace/" + "/".join(tree_parts(path))
        res = self._exec(["sh", "-c", _RESOLVE + 'mkdir -p -- "$(dirname -- "$1")" && { [ ! -e "$1" ] || '
                          '[ -f "$1" ] || exit 92; } && cat > "$1"', "sh", target], stdin=data)
        self._raise_for(res, path)

    @staticmethod
    def _raise_for(res: subprocess.CompletedProcess, path: str) -> None:
        if res.returncode in (90, 91):
            raise ValueError(f"workspace path {path!r} leaves the workspace or goes through a symlink")
        if res.returncode == 92:
            raise ValueError(f"workspace path {path!r} is not a regular file")
        if res.returncode != 0:
            raise OSError(f"workspace path {path!r}: {res.stderr.decode(errors='replace').strip()[-200:]}")

    def snapshot(self, max_bytes: int) -> dict[str, str]:
        self._check_open()
        res = self._exec(["tar", "-c", "-C", "/workspace", "."])
        if res.returncode != 0:
            raise OSError(f"snapshot of {self.name}: {res.stderr.decode(errors='replace').strip()[-200:]}")
        out: dict[str, str] = {}
        total = 0
        with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
            for member in tar:
                if not member.isreg():
                    continue
                data = tar.extractfile(member).read()
                try:
                    out[member.name.removeprefix("./")] = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                total += len(data)
                if total > max_bytes:
                    raise ValueError(f"the workspace's text files are over {max_bytes} bytes")
        return out

    def close(self) -> None:
        self._closed = True
        subprocess.run([self._cli, "rm", "-f", self.name], capture_output=True, timeout=60)

    def __enter__(self) -> "ContainerWorkspace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reap_containers(cli: str, owner: str) -> int:
    """Remove `owner`'s containers whose creator process is gone."""
    listed = subprocess.run([cli, "ps", "-a", "--filter", f"label=rollart.owner={owner}", "--format",
                             '{{.Names}} {{.Label "rollart.creator"}}'], capture_output=True, text=True, timeout=60)
    removed = 0
    for line in listed.stdout.splitlines():
        name, _, creator = line.partition(" ")
        if name and not cgroups.owner_alive(creator.strip()):
            subprocess.run([cli, "rm", "-f", name], capture_output=True, timeout=60)
            removed += 1
    return removed


def open_container_workspace(limits: WorkspaceConfig, files: Mapping[str, str], *, owner: str) -> ContainerWorkspace:
    if not OWNER_NAME.match(owner):
        raise ValueError(f"workspace owner {owner!r}: 1-64 letters, digits, '_', '.' or '-'")
    cli = _cli_or_refuse(limits)
    reap_containers(cli, owner)
    creator = cgroups.owner_tag()
    name = f"rollart-ws-{owner}-{creator}-{next(_counter)}-{secrets.token_hex(3)}"
    started = subprocess.run([cli] + container_args(limits, name, owner, creator), capture_output=True, timeout=300)
    if started.returncode != 0:
        raise SandboxUnavailable(f"envs.workspace.backend={limits.backend}: the container did not start: "
                                 f"{started.stderr.decode(errors='replace').strip()[-300:]}")
    ws = ContainerWorkspace(limits, cli, name)
    try:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path, text in files.items():
                data = encode_text(f"workspace file {path!r}", text)
                info = tarfile.TarInfo("/".join(tree_parts(path)))
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        res = ws._exec(["tar", "-x", "-C", "/workspace"], stdin=buf.getvalue())
        if res.returncode != 0:
            raise OSError(f"copying the files into {name}: {res.stderr.decode(errors='replace').strip()[-200:]}")
    except BaseException:
        ws.close()
        raise
    return ws
