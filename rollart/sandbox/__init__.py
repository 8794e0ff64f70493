"""rollart.sandbox — run untrusted programs (a policy's code, a test harness) confined; a layer below the planes.

Both the reward plane (the `code` reward scores programs here) and the env plane use it; it imports nothing
of rollart but `config` (its limits, `SandboxConfig`) and `types`.

Public API:
- `run_sandboxed(files, command, cfg, stdin=b"", env=None) -> SandboxResult` — one program (process.py);
- `run_pair(primary, peer, cfg)` — two `Program`s, each in its own sandbox, joined by two pipes;
- `check_isolation(cfg) -> str` — the isolation label this machine gives, or `SandboxUnavailable`;
  `LEVELS`, weakest first, what `min_isolation` may ask for (isolation.py);
- `probe_isolation()` — what this machine offers (cached);
- `encode_text(name, text)` — text as UTF-8, or ValueError naming what is not valid text;
- `open_workspace(limits, files, owner=...) -> Workspace`, `CommandResult`, `reap_leftovers(owner)` — one
  trajectory's own tree and processes for environments (workspace.py; its docstring is the API). `Workspace`
  (workspace_api.py) is the protocol both backends implement: `NativeWorkspace` (workspace.py) and
  `ContainerWorkspace` (container.py, `envs.workspace.backend: docker | podman`).
Modules: isolation.py (probing, levels, the launcher's spec), launch.py (the sandbox's first process),
cgroups.py (whole-tree limits), process.py (one-shot runs), workspace.py (native workspaces),
container.py (container workspaces; container_engine.py the engine's CLI, container_scripts.py what runs in the
container), image.py (the containers' default image, from Debian's packages), workspace_api.py (what both
kinds of workspace share), servers.py (servers a process starts for itself: a local ASGI app or a container).
"""

from __future__ import annotations

from rollart.sandbox.isolation import LEVELS, SandboxUnavailable, check_isolation, probe_isolation
from rollart.sandbox.process import Program, SandboxResult, encode_text, run_pair, run_sandboxed
from rollart.sandbox.workspace import open_workspace, reap_leftovers
from rollart.sandbox.workspace_api import CommandResult, Workspace, WorkspaceClosed

__all__ = [
    "LEVELS", "CommandResult", "Program", "SandboxResult", "SandboxUnavailable", "Workspace", "WorkspaceClosed",
    "check_isolation", "encode_text", "open_workspace", "probe_isolation", "reap_leftovers", "run_pair",
    "run_sandboxed",
]
