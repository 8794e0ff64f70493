"""`rollart bench sandbox`: what the sandbox costs per run, at each isolation level, side by side.

Arms, interleaved round by round so the machine's load falls on all alike:
- one-shot runs (`run_sandboxed`, what a code reward pays per candidate: create, run `print(1)` in the sandbox's
  Python, destroy) at `full`, `namespaces`, `landlock` and `rlimits` — each weaker level by taking the stronger
  mechanisms out of the probe's answer, so one machine shows what each adds (levels it lacks are left out);
- the cgroup alone: make one with its limits, remove it;
- a workspace: `open_workspace` with 3 small files + `close`, and one `true` command in it.
Out: p50/p90 wall time per arm and this process's plus its children's CPU time per operation; ratios of each
level's p50 to `rlimits` (the price of the stronger isolation). Wall times on a shared 2-core machine are
noise-prone: read the ratios and the CPU figures.
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from typing import Callable

from benchmarks.common import BenchResult
from rollart.config import SandboxConfig, WorkspaceConfig
from rollart.sandbox import LEVELS, cgroups, isolation, open_workspace, run_sandboxed


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _at_level(level: str) -> Callable[[], None]:
    """One one-shot run (create, `print(1)`, destroy) with exactly the mechanisms of `level`: on a machine that
    has more, the probe's answer with the stronger ones taken away (what a machine without them runs)."""
    real = isolation.probe_isolation()
    weaker = {
        "full": real,
        "namespaces": dataclasses.replace(real, cgroups=0),
        "landlock": dataclasses.replace(real, cgroups=0, namespaces=False, netns=False),
        "rlimits": dataclasses.replace(real, cgroups=0, namespaces=False, netns=False, landlock_abi=0),
    }[level]
    cfg = SandboxConfig(min_isolation=level)

    def run() -> None:
        saved = isolation.probe_isolation
        isolation.probe_isolation = lambda: weaker
        try:
            res = run_sandboxed({"main.py": "print(1)"}, ["python", "main.py"], cfg)
        finally:
            isolation.probe_isolation = saved
        if res.stdout != "1\n":
            raise RuntimeError(f"the sandbox at level {level} failed: {res.stderr[-300:]}")
    return run


def _cgroup() -> None:
    cgroups.new_group(256 << 20, 16).remove()


def _workspace_open_close() -> None:
    open_workspace(WorkspaceConfig(), {"a.py": "x = 1\n", "b/c.txt": "hello", "README": "r"}, owner="bench").close()


def run(quick: bool = False) -> BenchResult:
    rounds = 5 if quick else 40
    arms: dict[str, Callable[[], None]] = {}
    notes = []
    have = isolation.probe_isolation().level("deny")
    for level in reversed(LEVELS):  # full first
        if LEVELS.index(level) > LEVELS.index(have):
            notes.append(f"level {level} not measured: this machine gives only {have}")
            continue
        arms[f"run_{level}"] = _at_level(level)
    if cgroups.support().version:
        arms["cgroup_create_remove"] = _cgroup
    arms["workspace_open_close"] = _workspace_open_close
    ws = open_workspace(WorkspaceConfig(), {}, owner="bench")
    arms["workspace_command"] = lambda: ws.run("true")
    times: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, float] = {name: 0.0 for name in arms}
    try:
        for name, fn in arms.items():  # warm up (probes, imports)
            fn()
        for _ in range(rounds):
            for name, fn in arms.items():
                c0, t0 = _cpu_s(), time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                cpu[name] += _cpu_s() - c0
    finally:
        ws.close()
    rows = []
    for name, ts in times.items():
        qs = statistics.quantiles(ts, n=10) if len(ts) >= 2 else ts * 9
        rows.append({"arm": name, "p50_ms": round(statistics.median(ts) * 1e3, 2), "p90_ms": round(qs[-1] * 1e3, 2),
                     "cpu_ms": round(cpu[name] / len(ts) * 1e3, 2), "n": len(ts)})
    by = {r["arm"]: r for r in rows}
    ratios = {}
    if "run_rlimits" in by:
        for level in LEVELS[1:]:
            if f"run_{level}" in by:
                ratios[f"{level}_vs_rlimits_p50"] = round(by[f"run_{level}"]["p50_ms"] / by["run_rlimits"]["p50_ms"], 3)
                ratios[f"{level}_vs_rlimits_cpu"] = round(by[f"run_{level}"]["cpu_ms"] / by["run_rlimits"]["cpu_ms"], 3)
    for arm in ("run_full", "cgroup_create_remove", "workspace_open_close", "workspace_command"):
        if arm in by:
            ratios[f"{arm}_p50_ms"] = by[arm]["p50_ms"]
    return BenchResult("sandbox", ratios, rows, notes)
