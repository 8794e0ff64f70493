"""The container engine's CLI for the container backend (podman or docker): whether it answers, the `run`
arguments of a workspace's container, removing one, and reaping those whose creator is gone. In: the
workspace's limits (`WorkspaceConfig`). Out: `engine_cli`, `container_args`, `ULIMITS`, `remove_container`,
`reap_containers`, `start_error`, `engine_cwd`. Why each argument is there: container.py's docstring.
"""

from __future__ import annotations

import atexit
import functools
import re
import shutil
import subprocess
import tempfile

from rollart.config import WorkspaceConfig
from rollart.sandbox import cgroups
from rollart.sandbox.isolation import SandboxUnavailable

# nofile below every hard limit seen; nproc counts the user's processes of every container (and the pids limit
# bounds each one), so it is large — but at most the runtime's own hard limit (32768 on the build machines)
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=16384:16384")
_RM = {"podman": ["rm", "-f", "-t", "0"], "docker": ["rm", "-f"]}  # podman's `rm -f` waits 10 s for PID 1


def container_args(limits: WorkspaceConfig, name: str, owner: str, creator: str) -> list[str]:
    """The `run` arguments of one workspace's container (after the CLI)."""
    mem = f"{limits.memory_mb + limits.disk_mb}m"
    small = f"{max(1, limits.disk_mb // 4)}m"
    args = ["run", "-d", "--rm", "--pull", "never", "--name", name, "--label", f"rollart.owner={owner}",
            "--label", f"rollart.creator={creator}", "--read-only",
            "--tmpfs", f"/workspace:rw,exec,nosuid,nodev,size={limits.disk_mb}m,mode=1777",
            "--tmpfs", f"/tmp:rw,exec,nosuid,nodev,size={small},mode=1777", "--shm-size", small,
            "--memory", mem, "--memory-swap", mem, "--pids-limit", str(limits.max_processes), "--cpus", "1",
            *ULIMITS, "--init", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--workdir", "/workspace"]
    if limits.backend == "podman":
        args += ["--read-only-tmpfs=false"]  # no writable /run, /var/tmp beside the two sized tmpfs
    if limits.container_runtime:
        args += ["--runtime", limits.container_runtime]
    if limits.network == "deny":
        args += ["--network", "none"]
    return args + [limits.image, "sleep", "infinity"]


@functools.cache
def engine_cwd() -> str:
    """The working directory of every engine call that starts a container or a process in one: a private, empty
    directory of this process. podman's conmon, which stays beside each container and exec session, creates an
    empty file named `oom` in its working directory when a command of the container is OOM-killed — run from
    the caller's directory it would leave that file in a checkout or a run directory."""
    path = tempfile.mkdtemp(prefix="rollart-engine-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.lru_cache(maxsize=None)
def engine_answers(cli: str) -> str:
    """'' when `cli version` works, else why not (asked once per process)."""
    try:
        probe = subprocess.run([cli, "version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{cli} version` failed: {exc}"
    if probe.returncode != 0:
        return f"its engine does not answer ({probe.stderr.decode(errors='replace').strip()[-200:]})"
    return ""


def engine_cli(backend: str) -> str:
    """The path of the backend's CLI, checked to answer; `SandboxUnavailable` saying what is missing."""
    cli = shutil.which(backend)
    if cli is None:
        raise SandboxUnavailable(f"envs.workspace.backend={backend}: there is no `{backend}` command on this machine; "
                                 "install it (Debian: apt-get install podman runc) or set envs.workspace.backend=native")
    why = engine_answers(cli)
    if why:
        raise SandboxUnavailable(f"envs.workspace.backend={backend}: {why}; start it or set "
                                 "envs.workspace.backend=native")
    return cli


def remove_container(cli: str, backend: str, name: str) -> None:
    """Remove a container at once (a running one is killed); best effort: `reap_containers` removes what is
    left once its creator is gone."""
    try:
        subprocess.run([cli, *_RM[backend], name], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        pass


_CREATOR = re.compile(r"^\d+-\d+$")


def reap_containers(backend: str, owner: str | None = None) -> int:
    """Remove the workspace containers (of `owner`, or of every owner) whose creator process is gone; how many.
    0 where the engine is missing or does not answer."""
    cli = shutil.which(backend)
    if cli is None or engine_answers(cli):
        return 0
    label = f"label=rollart.owner={owner}" if owner else "label=rollart.creator"
    try:
        listed = subprocess.run([cli, "ps", "-a", "--filter", label, "--format", '{{.Names}} {{.Labels}}'],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    removed = 0
    for line in listed.stdout.splitlines():
        name, _, labels = line.partition(" ")
        found = re.search(r"rollart\.creator[=:](\d+-\d+)", labels)
        if name and found and _CREATOR.match(found.group(1)) and not cgroups.owner_alive(found.group(1)):
            remove_container(cli, backend, name)
            removed += 1
    return removed


@functools.lru_cache(maxsize=None)
def reap_once(backend: str) -> int:
    """`reap_containers` of every owner, once per process and engine (the first workspace a process opens)."""
    return reap_containers(backend)


def start_error(limits: WorkspaceConfig, stderr: str) -> str:
    """Why a container did not start, and what to do about it."""
    setting = f"envs.workspace.backend={limits.backend}"
    if re.search(r"image not known|No such image|Unable to find image|pull policy", stderr, re.I):
        return (f"{setting}: the image {limits.image!r} (envs.workspace.image) is not in the engine's local store; "
                "build the default one with `make env-image` (python -m rollart.sandbox.image), or name an image "
                "you have")
    if "hybrid" in stderr:
        return (f"{setting}: the container runtime refuses this machine's cgroup layout ({stderr[-200:]}); set "
                "envs.workspace.container_runtime=runc")
    return f"{setting}: the container did not start: {stderr[-400:]}"
