"""Real Ray processes for tests, each Ray in its own temp dir (RAY_TMPDIR) so the session's shared Ray and
other people's Rays are never touched: a multi-node cluster on loopback (`ray start --head` + `ray start
--address=...`), and helpers to find, check and kill the processes of such a Ray.

Loopback only: every node runs with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which makes Ray resolve and bind
127.0.0.1. With that setting `ray start --address=...` refuses to add a second node (a guard meant for
Windows/macOS), and setting it to 1 would make the node pick the machine's external address. So added nodes
run `ray start` through `JOIN_ON_LOOPBACK`, which lifts only that CLI guard.

Our processes are found by their RAY_TMPDIR (set only for what we start) and by pid ancestry, and only
they are ever signalled.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Mapping

import psutil
from testutil import free_port

BIN = Path(sys.executable).parent
BASE_ENV = {
    **os.environ,
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
}

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

# The start of a driver script that joins such a cluster: `joined_runtime(path)` returns a started
# rollart Runtime for the run file at `path`, waiting (up to 120 s) for the nodes that hold its pools.
JOINED_RUNTIME = textwrap.dedent("""\
    import json, sys, threading, time
    import rollart.resources  # sets Ray's environment before Ray is imported
    import ray
    from rollart.config_loader import load_config
    from rollart.resources import ClusterError, affinity
    from rollart.resources.runtime import Runtime

    def joined_runtime(path):
        deadline = time.monotonic() + 120
        while True:  # the other nodes may still be joining
            try:
                return Runtime(load_config(path)).start()
            except ClusterError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

""")


def ours(tmp: Path, roots: list[int] = ()) -> dict[int, psutil.Process]:
    """Processes of the Ray we started: RAY_TMPDIR is our temp dir, or a descendant of one of `roots`."""
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


def alive(procs: dict[int, psutil.Process]) -> list[str]:
    out = []
    for proc in procs.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {proc.name()}")
        except psutil.NoSuchProcess:
            pass
    return out


def kill_all(procs: dict[int, psutil.Process]) -> None:
    for proc in procs.values():
        try:
            if proc.is_running():  # is_running also checks the pid was not reused
                proc.kill()
        except psutil.NoSuchProcess:
            pass


def read_json_line(proc: subprocess.Popen, timeout: float, what: str = "a result line",
                   log: Path | None = None) -> dict[str, Any]:
    """The next line of `proc`'s stdout that is a JSON object (other lines are skipped); on failure the
    message ends with the tail of `log` (the driver's stderr)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("{"):
                return json.loads(line)
            if not line and proc.poll() is not None:
                break
    tail = log.read_text()[-3000:] if log is not None and log.is_file() else ""
    raise AssertionError(f"no {what} from the driver within {timeout} s (exit code {proc.poll()})\n{tail}")


def two_pool_run_file(tmp: Path, address: str, namespace: str, cluster: str = "", n2: str = "") -> Path:
    """A run file for a cluster of nodes holding pools `n1` and `n2` (the default pools removed); `cluster`
    and `n2` add YAML flow-mapping entries to those sections (e.g. `n2="elastic: true"`)."""
    path = tmp / "run.yaml"
    path.write_text(textwrap.dedent(f"""\
        cluster: {{address: "{address}", namespace: {namespace}{', ' + cluster if cluster else ''}}}
        pools:
          train: null
          gen_prefill: null
          gen_decode: null
          env: null
          reward: null
          n1: {{kind: cpu, capacity: 1}}
          n2: {{kind: cpu, capacity: 1{', ' + n2 if n2 else ''}}}
        domains:
          frozenlake: {{pool: n1}}
          math: {{pool: n2}}
        """))
    return path


class LoopbackCluster:
    """A Ray cluster of several nodes on 127.0.0.1, each a `ray start --block` process group of its own.

    `head(resources)` starts the head and returns the address; `add(resources)` joins a node; `kill(node)`
    SIGKILLs a node's whole process group (raylet and workers: a machine that vanishes); `close()` stops
    everything still running, newest first, and kills whatever of this Ray is left."""

    def __init__(self, tmp: Path, env: Mapping[str, str] | None = None) -> None:
        self.tmp = tmp  # short: Ray's socket paths live under it
        self.env = {**BASE_ENV, "RAY_TMPDIR": str(tmp), **(env or {})}
        self.nodes: list[subprocess.Popen] = []
        self.address = ""

    def _start(self, args: list[str], launcher: list[str]) -> subprocess.Popen:
        common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=100000000",
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
                     f"--resources={json.dumps(dict(resources))}"], [str(BIN / "ray")])
        deadline = time.monotonic() + timeout_s
        while True:  # wait for the head's GCS port before a node joins
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, (self.tmp / "node0.log").read_text()
            time.sleep(0.3)
        self.address = f"127.0.0.1:{port}"
        return self.address

    def add(self, resources: Mapping[str, float]) -> subprocess.Popen:
        return self._start([f"--address={self.address}", f"--resources={json.dumps(dict(resources))}"],
                           [sys.executable, "-c", JOIN_ON_LOOPBACK])

    def kill(self, node: subprocess.Popen) -> None:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=30)

    def close(self) -> None:
        procs = ours(self.tmp, [p.pid for p in self.nodes])
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
        kill_all({**procs, **ours(self.tmp)})

    def __enter__(self) -> LoopbackCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
