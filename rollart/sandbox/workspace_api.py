"""What every kind of workspace shares (the process-sandbox one in `workspace.py`, the container one in
`container.py`): the result of a command, the error of a closed workspace, the rule for paths inside the
tree and for owner names. In: nothing. Out: these names. It imports nothing of the sandbox, so both kinds
build on it without importing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
