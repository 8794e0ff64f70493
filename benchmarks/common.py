"""What every `rollart bench NAME` shares: the result record, machine facts and the JSON file.

A benchmark module under `benchmarks/` (listed in `registry.py`) exposes `run(quick: bool, **options) ->
BenchResult`; `rollart bench NAME [--quick] [--json PATH]` runs it, prints its ratios and rows, and writes
`{"bench", "ratios", "rows", "machine", "commit", "date", "command", "quick"}` to PATH.

Ratios are measured side by side in one run (absolute times on shared machines are noise); `--quick` is a
smoke version that finishes in under a minute.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class BenchResult:
    bench: str
    ratios: dict[str, float | None]  # None: no finite value (e.g. a reduction to zero); the notes say why
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # more top-level JSON keys (e.g. a study's raw runs)


def machine_info() -> dict[str, Any]:
    import psutil

    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def peak_rss_mb(pid: int | None = None) -> float:
    """Peak resident set size of a process (this one by default), from /proc (VmHWM)."""
    try:
        for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def to_json(result: BenchResult, quick: bool, argv: list[str]) -> dict[str, Any]:
    return {
        "bench": result.bench,
        "ratios": result.ratios,
        "rows": result.rows,
        "notes": result.notes,
        "machine": machine_info(),
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": "rollart " + " ".join(argv),
        "quick": quick,
        **result.data,
    }


def write_json(payload: dict[str, Any], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2, default=str))
