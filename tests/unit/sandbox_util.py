"""What the sandbox tests look for on the host: processes a run left, its cgroups, its mounts."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from rollart.sandbox import cgroups
from rollart.sandbox.process import SandboxResult


def host_processes(word: str, where: str = "environ") -> list[int]:
    """Other processes whose /proc/PID/`where` (environ or cmdline) holds `word`: survivors of a run."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if word.encode() in Path(f"/proc/{entry}/{where}").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def groups_of(pid: int) -> list[Path]:
    """Sandbox cgroup directories made by process `pid`."""
    return [d for base in cgroups.support().bases.values() for d in base.glob(f"rollart-{pid}-*")]


def mounted(path: Path) -> bool:
    """Is anything mounted at or below `path` (in this process's mount namespace)?"""
    return any(line.split()[4].startswith(str(path)) for line in Path("/proc/self/mountinfo").read_text().splitlines())


def killed_by_limit(res: SandboxResult) -> bool:
    """Killed by a CPU or memory limit, the wall timeout or the output cap."""
    return (res.timed_out or res.output_capped or res.limit_hit in ("memory", "cpu")
            or res.signal in (signal.SIGXCPU, signal.SIGKILL))
