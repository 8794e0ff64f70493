"""The limits of the sandboxes: the code reward's (`reward.sandbox`) and each trajectory's workspace
(`envs.workspace`), both read by the sandbox layer (rollart/sandbox/).

In: `Section` and the trust markers (`base`), the bounds (`bounds`). Out: `SandboxLimits`, what every sandbox
may use; `SandboxConfig` and `WorkspaceConfig`, the two sandboxes' limits with their own defaults and settings.

Guarantee: every limit is bounded and positive; the isolation a sandbox may fall back to has a floor
(`min_isolation`), below which its programs refuse to run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollart.config.base import TRUST_CODE, TRUST_GUARD, Section
from rollart.config.bounds import DAY_S, MAX_MB, MAX_THREADS


class SandboxLimits(Section):
    """What a sandbox may use (rollart/sandbox/). With cgroups (isolation level `full`) memory, CPU time and
    processes hold for the program and all its children together; per process otherwise."""

    cpu_time_s: float = Field(
        2.0, gt=0, le=DAY_S, description="CPU-time limit of a sandboxed run (the whole process tree)"
    )
    memory_mb: int = Field(
        256, ge=64, le=MAX_MB, description="memory of the whole process tree, and address space of each process "
        "(Python itself needs ~40 MB); the tree may also hold `disk_mb` of files"
    )
    wall_timeout_s: float = Field(
        5.0, gt=0, le=DAY_S, description="wall-clock limit of a sandboxed run (then it is killed)"
    )
    max_processes: int = Field(16, ge=1, le=65_536, description="processes and threads the program may have at once")
    file_size_mb: int = Field(16, ge=1, le=MAX_MB, description="largest file the program may write")
    disk_mb: int = Field(
        64, ge=1, le=MAX_MB, description="all files of the program and its children together (a tmpfs of this size "
        "holds its working dir and /tmp; a write past it fails)"
    )
    network: Literal["deny", "allow"] = Field(
        "deny", description="whether the program may use the network", json_schema_extra=TRUST_GUARD
    )
    max_output_kb: int = Field(
        1024, ge=1, le=1 << 20, description="bytes (KiB) each of stdout/stderr may carry; past it the sandbox is "
        "killed and the result says so"
    )
    min_isolation: Literal["full", "namespaces", "landlock", "rlimits"] = Field(
        "full", description="the weakest isolation sandboxed programs may run with; below it they refuse to run. "
        "full: namespaces + cgroup limits on memory, CPU time and processes of the whole process tree; "
        "namespaces: own uid (never root), rlimits, Landlock, PID/mount/network namespaces and a private root "
        "(no host /tmp or Unix sockets) whose files sit on a tmpfs of disk_mb; landlock: no namespaces (limits "
        "per process, no disk cap); rlimits: resource limits only (files protected by permissions alone)",
        json_schema_extra=TRUST_GUARD,
    )


class SandboxConfig(SandboxLimits):
    """Limits of the sandbox the `code` reward runs a program and its tests in (rollart/sandbox/process.py)."""

    max_concurrent: int = Field(2, ge=1, le=MAX_THREADS, description="sandboxes run at once per process")
    python: str = Field(
        "", description="interpreter of sandboxed programs; empty = this one if the sandbox user may run it, "
        "else python3 from /usr/bin",
        json_schema_extra=TRUST_CODE,
    )


class WorkspaceConfig(SandboxLimits):
    """One trajectory's workspace sandbox (rollart/sandbox/workspace.py): its own directory tree and processes,
    for environments whose tools run commands. Limits hold per command (CPU, wall) or for the whole workspace
    (memory, processes, disk)."""

    cpu_time_s: float = Field(30.0, gt=0, le=DAY_S, description="CPU time of one command and all its children")
    memory_mb: int = Field(
        1024, ge=64, le=MAX_MB, description="memory of the workspace's processes together (and address space of "
        "each); its files may hold `disk_mb` more"
    )
    wall_timeout_s: float = Field(60.0, gt=0, le=DAY_S, description="wall-clock limit of one command unless the caller "
                                  "gives its own (then it is killed, with everything it started)")
    max_processes: int = Field(64, ge=1, le=65_536, description="processes and threads of one command at once")
    file_size_mb: int = Field(64, ge=1, le=MAX_MB, description="largest file a command or write_file may write")
    disk_mb: int = Field(
        256, ge=1, le=MAX_MB, description="all files of the workspace together (its tree and /tmp: a tmpfs of this "
        "size; a write past it fails)"
    )
    max_output_kb: int = Field(
        256, ge=1, le=1 << 20, description="bytes (KiB) each of a command's stdout/stderr may carry; past it the "
        "command is killed and its output marked [truncated]"
    )
    backend: Literal["native", "docker", "podman"] = Field(
        "native", description="native: rollart's own sandbox (namespaces, private root, cgroups); docker/podman: "
        "one container per workspace through that CLI (rollart/sandbox/container.py)"
    )
    image: str = Field(
        "localhost/rollart-env:bookworm", description="container image of the docker/podman backend; it must be in "
        "the engine's local store (nothing is pulled): the default is built from Debian's packages by `make "
        "env-image`", json_schema_extra=TRUST_CODE
    )
    container_runtime: str = Field(
        "", max_length=256, pattern=r"^[A-Za-z0-9_./-]*$", description="OCI runtime the docker/podman backend "
        "asks for (`--runtime`); empty = the engine's default (runc where crun refuses a hybrid cgroup layout)",
        json_schema_extra=TRUST_CODE,
    )
