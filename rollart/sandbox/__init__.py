"""rollart.sandbox — run untrusted programs (a policy's code, a test harness) confined; a layer below the planes.

Both the reward plane (the `code` reward scores programs here) and the env plane use it; it imports nothing
of rollart but `config` (its limits, `SandboxConfig`) and `types`.

Public API:
- `run_sandboxed(files, command, cfg, stdin=b"", env=None) -> SandboxResult` — one program (process.py);
- `run_pair(primary, peer, cfg)` — two `Program`s, each in its own sandbox, joined by two pipes;
- `check_isolation(cfg) -> str` — the isolation label this machine gives, or `SandboxUnavailable`;
- `probe_isolation()` — what this machine offers (cached).
"""

from __future__ import annotations

from rollart.sandbox.process import (
    Program, SandboxResult, SandboxUnavailable, check_isolation, probe_isolation, run_pair, run_sandboxed,
)

__all__ = [
    "Program", "SandboxResult", "SandboxUnavailable", "check_isolation", "probe_isolation", "run_pair",
    "run_sandboxed",
]
