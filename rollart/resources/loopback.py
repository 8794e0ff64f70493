"""A Ray cluster of several nodes on this machine, all on 127.0.0.1 — `rollart local-cluster` (a multi-node
cluster to try a run's pools and `cluster.address` on one machine), `rollart bench chaos --nodes 2` (a worker node
to lose) and the multi-node tests.

In: a temp dir (Ray's sockets and logs live under it; keep its path short) and per node the custom
resources it declares (`{"pool_gen_decode": 1}`). Out: the head's address (`cluster.address` of a run that
joins it), nodes started with `ray start --block`, each a process group of its own so `kill(node)` takes
the raylet and its workers at once — a machine that vanishes.

Why not plain `ray start` twice: on Linux Ray binds its ports on every interface and registers the machine's
external address as the node's, even with `--node-ip-address=127.0.0.1` (measured with Ray 2.60);
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray resolve and bind 127.0.0.1 only — but with it `ray start
--address=...` refuses to add a node ("Multi-node Ray clusters are not supported on Windows and OSX": a
guard meant for those systems), and a node started with the variable at 1 picks the external address and
cannot reach a loopback head. So every node runs with the variable at 0, and added nodes run `ray start`
through `JOIN_ON_LOOPBACK`, which lifts only that CLI guard (Ray's address resolution still sees 0). Every
process started is found again by its RAY_TMPDIR and stopped by `close()`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Mapping

import psutil

BIN = Path(sys.executable).parent
# `ray …` as the installed CLI runs it, from this interpreter (whether or not its bin directory is on PATH)
RAY_CLI = "import sys; import ray.scripts.scripts as scripts; sys.argv = ['ray', *sys.argv[1:]]; sys.exit(scripts.main())"
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
}
# Ray declares a node dead after missed health checks: faster ones than its default (~15 s), yet a live node
# must survive ~5 s of not answering — on a loaded 2-core machine a raylet starting workers missed 3 checks
# 0.5 s apart and a live node was declared dead (its worker never started: the node-loss test's failure).
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5",
                   "RAY_health_check_timeout_ms": "1000"}

# `ray start` with the "multi-node needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1" guard lifted for the CLI only:
# Ray's address resolution (services.py) still sees the real constant (0) and keeps everything on loopback.
JOIN_ON_LOOPBACK = textwrap.dedent("""\
    import sys
    import ray._private.ray_constants as constants
    import ray.scripts.scripts as scripts

    class _Constants:
        ENABLE_RAY_CLUSTER = True

        def __getattr__(self, name):
            return getattr(constants, name)

    scripts.ray_constants = _Constants()
    sys.argv = ["ray", *sys.argv[1:]]
    sys.exit(scripts.main())
""")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_processes(tmp: Path, roots: list[int] = ()) -> dict[int, psutil.Process]:
    """Processes of the Ray whose RAY_TMPDIR is `tmp`, or descendants of one of `roots`."""
    found: dict[int, psutil.Process] = {}
    for root in roots:
        try:
            proc = psutil.Process(root)
            found.update({p.pid: p for p in proc.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RAY_TMPDIR") == str(tmp) and proc.pid not in roots:
                found[proc.pid] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def kill_all(procs: Mapping[int, psutil.Process]) -> None:
    for proc in procs.values():
        try:
            if proc.is_running():  # is_running also checks the pid was not reused
                proc.kill()
        except psutil.NoSuchProcess:
            pass


class LoopbackCluster:
    """A Ray cluster of several nodes on 127.0.0.1, each a `ray start --block` process group of its own.

    `head(resources)` starts the head and returns the address; `add(resources)` joins a node; `kill(node)`
    SIGKILLs a node's whole process group (raylet and workers: a machine that vanishes); `close()` stops
    everything still running, newest first, and kills whatever of this Ray is left."""

    def __init__(self, tmp: Path, env: Mapping[str, str] | None = None, cpus: int = 1,
                 object_store_bytes: int = 100_000_000) -> None:
        self.tmp = tmp  # short: Ray's socket paths live under it
        self.env = {**os.environ, **LOOPBACK_ENV, "RAY_TMPDIR": str(tmp), **(env or {})}
        self.cpus, self.object_store_bytes = cpus, object_store_bytes
        self.nodes: list[subprocess.Popen] = []
        self.address = ""

    def _start(self, args: list[str], launcher: list[str]) -> subprocess.Popen:
        common = ["--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}",
                  f"--object-store-memory={self.object_store_bytes}",
                  "--disable-usage-stats", "--block", f"--dashboard-agent-listen-port={free_port()}",
                  f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]
        log = open(self.tmp / f"node{len(self.nodes)}.log", "w")
        proc = subprocess.Popen([*launcher, "start", *args, *common], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.nodes.append(proc)
        return proc

    def head(self, resources: Mapping[str, float], timeout_s: float = 60.0) -> str:
        port = free_port()
        self._start(["--head", f"--port={port}", f"--temp-dir={self.tmp}", "--include-dashboard=false",
                     f"--resources={json.dumps(dict(resources))}"], [sys.executable, "-c", RAY_CLI])
        deadline = time.monotonic() + timeout_s
        while True:  # wait for the head's GCS port before a node joins
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or self.nodes[0].poll() is not None:
                raise RuntimeError(f"the head node did not start within {timeout_s:.0f} s: "
                                   f"{(self.tmp / 'node0.log').read_text()[-2000:]}")
            time.sleep(0.3)
        self.address = f"127.0.0.1:{port}"
        return self.address

    def add(self, resources: Mapping[str, float]) -> subprocess.Popen:
        return self._start([f"--address={self.address}", f"--resources={json.dumps(dict(resources))}"],
                           [sys.executable, "-c", JOIN_ON_LOOPBACK])

    def wait_started(self, timeout_s: float = 90.0) -> None:
        """Until every node says it started (a joined node: once it reached the head), or RuntimeError."""
        deadline = time.monotonic() + timeout_s
        for i, node in enumerate(self.nodes):
            log = self.tmp / f"node{i}.log"
            while "Ray runtime started" not in (log.read_text(errors="replace") if log.is_file() else ""):
                if node.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"node {i} did not start within {timeout_s:.0f} s: "
                                       f"{log.read_text(errors='replace')[-2000:] if log.is_file() else ''}")
                time.sleep(0.3)

    def kill(self, node: subprocess.Popen) -> None:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=30)

    def close(self) -> None:
        procs = ray_processes(self.tmp, [p.pid for p in self.nodes])
        for proc in reversed(self.nodes):  # added nodes drain through the head's GCS: stop them first
            if proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=5)  # a head drains for up to 30 s; these are throwaway nodes
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        kill_all({**procs, **ray_processes(self.tmp)})

    def __enter__(self) -> LoopbackCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
