"""Real Ray processes for tests, each Ray in its own temp dir (RAY_TMPDIR) so the session's shared Ray and
other people's Rays are never touched: the loopback multi-node cluster of `rollart.resources.loopback` (re-exported
here), a driver-script preamble and run file for it, and helpers to find, check and kill the processes of
such a Ray. Our processes are found by their RAY_TMPDIR (set only for what we start) and by pid ancestry,
and only they are ever signalled.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

from rollart.resources.loopback import BIN, FAST_NODE_DEATH, LOOPBACK_ENV, LoopbackCluster, kill_all
from rollart.resources.loopback import ray_processes as ours

__all__ = ["BASE_ENV", "BIN", "FAST_NODE_DEATH", "JOINED_RUNTIME", "LoopbackCluster", "alive", "kill_all", "ours",
           "read_json_line", "two_pool_run_file"]

BASE_ENV = {**os.environ, **LOOPBACK_ENV}

# The start of a driver script that joins such a cluster: `joined_runtime(path)` returns a started
# rollart Runtime for the run file at `path`, waiting (up to 120 s) for the nodes that hold its pools.
JOINED_RUNTIME = textwrap.dedent("""\
    import json, sys, threading, time
    import rollart.resources  # sets Ray's environment before Ray is imported
    import ray
    from rollart.config.loader import load_config
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


def alive(procs: dict[int, psutil.Process]) -> list[str]:
    out = []
    for proc in procs.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {proc.name()}")
        except psutil.NoSuchProcess:
            pass
    return out


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
