"""The podman arm of `rollart bench envs` (benchmarks/envs.py): what only a container backend needs measured or
checked — whether it can run here, a command's round trip beside the native one's, what a run left behind, and
how many SWE envs a second the machine can make and remove (`capacity`: what a warm pool can prepare at most,
beside the rate a reset arm asks for).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable


def missing(backend: str) -> str:
    """'' when the backend can run here, else why not."""
    if backend == "native":
        return ""
    from rollart.sandbox import image
    from rollart.sandbox.container_engine import engine_cli
    from rollart.sandbox.isolation import SandboxUnavailable

    try:
        engine_cli(backend)
    except SandboxUnavailable as exc:
        return str(exc)
    if image.current_label(backend) is None:
        return f"{backend} has no {image.IMAGE} image (make env-image)"
    return ""


def exec_costs(count: int, backend: str) -> tuple[list[float], list[float]]:
    """(`run("true")` in a `backend` workspace, the same in a native one), interleaved: a command's round trip."""
    from rollart.config import WorkspaceConfig
    from rollart.sandbox.workspace import open_workspace

    timed: tuple[list[float], list[float]] = ([], [])
    with open_workspace(WorkspaceConfig(backend=backend), {}, owner="bench") as there, \
            open_workspace(WorkspaceConfig(), {}, owner="bench") as native:
        for _ in range(count):
            for times, ws in zip(timed, (there, native)):
                t0 = time.perf_counter()
                ws.run("true")
                times.append(time.perf_counter() - t0)
    return timed


def leftovers(backend: str, owner: str) -> tuple[int, int]:
    """(the trajectories' bait processes still alive — `sleep 300`, run as nobody in a container —, containers
    of `owner` still there) after a run."""
    import psutil

    processes = [p for p in psutil.process_iter(["uids", "cmdline"])
                 if p.info["uids"] and p.info["uids"].real == 65534 and (p.info["cmdline"] or [])[:2] == ["sleep", "300"]]
    listed = subprocess.run([backend, "ps", "-a", "--filter", f"label=rollart.owner={owner}", "--format",
                             "{{.Names}}"], capture_output=True, text=True, timeout=60)
    return len(processes), len(listed.stdout.split())


def _busy_s() -> float:
    """CPU seconds every process of the machine has used since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


async def capacity(factory: Callable[[], Any], count: int, parallel: int) -> tuple[float, float]:
    """(SWE envs a second, CPU core-seconds of the machine per env) of `count` env lifecycles — built (a container
    started), staged (a seed's package written in) and closed (removed), `parallel` at once, nothing else of the
    bench running: what a warm pool can prepare at most here, and what each costs. The CPU is the whole
    machine's (the engine's CLI, conmon and runc are other processes): others' work beside it counts too."""
    from rollart.envs.warm_pool import build_prepared

    executor = ThreadPoolExecutor(parallel * 2)
    queue = list(range(count))

    async def worker() -> None:
        while queue:
            seed = queue.pop()
            env = await build_prepared(factory, executor, 60.0)
            try:
                await env.preload(seed)
            finally:
                await env.close()

    busy, start = _busy_s(), time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(parallel)))
    finally:
        executor.shutdown()
    wall, used = time.perf_counter() - start, _busy_s() - busy
    return count / wall, used / count
