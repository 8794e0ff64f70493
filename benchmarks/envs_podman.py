"""The podman arm of `rollart bench envs` (benchmarks/envs.py): what only a container backend needs measured or
checked — whether it can run here, a command's round trip beside the native one's, what a run left behind.
"""

from __future__ import annotations

import subprocess
import time


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
