"""What every kind of workspace shares (the process-sandbox one in `workspace.py`, the container one in
`container.py`): the `Workspace` protocol both implement, the result of a command, the error of a closed
workspace, the rule for paths inside the tree and for owner names. In: nothing. Out: these names. It imports
nothing of the sandbox, so both kinds build on it without importing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol

OWNER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class WorkspaceClosed(RuntimeError):
    """The workspace was closed (its trajectory ended); nothing more runs in it."""


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None when killed by a signal
    stdout: str  # at most max_output_kb, then "[truncated]"
    stderr: str
    timed_out: bool
    limit_hit: str | None  # "memory" | "cpu" | "pids" | "disk" | None
    duration_s: float
    signal: int | None = None


class Workspace(Protocol):
    """One trajectory's own tree and processes (`open_workspace`'s result, whichever backend holds it); the
    module docstring of `workspace.py` is the contract every implementation keeps."""

    root: Path  # where the tree is for rollart's own code (a container's is not a host path)
    isolation: str  # the mechanisms it got, e.g. process+rlimits+uid+landlock+netns+... or container(podman)

    @property
    def closed(self) -> bool: ...

    def run(self, command: str, *, timeout_s: float | None = None, stdin: str = "") -> CommandResult: ...

    def read_file(self, path: str, max_bytes: int) -> str: ...

    def write_file(self, path: str, text: str) -> None: ...

    def write_files(self, files: Mapping[str, str]) -> None: ...

    def snapshot(self, max_bytes: int) -> dict[str, str]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Workspace: ...

    def __exit__(self, *exc: object) -> None: ...


def tree_parts(path: str) -> list[str]:
    """The components of a path inside the tree (relative, or absolute under /workspace); ValueError if it leaves."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(f"workspace path {path!r}: expected a non-empty path inside the workspace")
    rel = path
    if path.startswith("/"):
        if path != "/workspace" and not path.startswith("/workspace/"):
            raise ValueError(f"workspace path {path!r} leaves the workspace (absolute paths must be under /workspace)")
        rel = path[len("/workspace"):]
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"workspace path {path!r} leaves the workspace ('..')")
    if not parts:
        raise ValueError(f"workspace path {path!r} names the workspace itself, not a file in it")
    return parts
