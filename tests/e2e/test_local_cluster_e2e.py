"""The one-machine cluster recipe of docs/cluster.md, run as written: `rollart local-cluster` with the default run's
pools on three loopback nodes, `rollart pools` joined to it (each pool on its own node), a short `rollart train`
joined to it, then Ctrl-C stops every process the cluster started and nothing it started listens beyond
127.0.0.1."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rollart.resources.loopback import ray_processes

pytestmark = [pytest.mark.slow]
DOC = Path(__file__).parents[2] / "docs" / "cluster.md"
SHORT = ["train.steps=2", "train.warm_start.steps=2", "eval.every=2", "eval.episodes_per_domain=4",
         "rollout.batch_size=8", "observability.progress=plain", "observability.tensorboard=false"]


def recipe() -> list[list[str]]:
    """The commands of the doc's local-cluster block, as argument lists (continuations joined, comments dropped)."""
    text = DOC.read_text()
    block = text[text.index("<!-- local-cluster recipe"):]
    block = block[block.index("```bash") + len("```bash"):]
    block = block[: block.index("```")].replace("\\\n", " ")
    return [shlex.split(line) for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def rollart(argv: list[str]) -> list[str]:
    assert argv[0] == "rollart"
    return [sys.executable, "-m", "rollart.cli", *argv[1:]]


def test_the_documented_local_cluster_recipe_works_as_written(tmp_path: Path) -> None:
    start, pools, train = recipe()
    assert start[:2] == ["rollart", "local-cluster"] and pools[:2] == ["rollart", "pools"] and train[:2] == [
        "rollart", "train"]
    cluster = subprocess.Popen(rollart(start), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen: list[str] = []
    tmp = None
    try:
        address = None
        deadline = time.monotonic() + 180
        for line in cluster.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if m := re.search(r"logs in (\S+)\):", line):
                tmp = Path(m.group(1))
            if m := re.match(r"address (127\.0\.0\.1:\d+) ", line):
                address = m.group(1)
                break
            assert time.monotonic() < deadline, "".join(seen)
        assert address and tmp, "".join(seen)

        def joined(argv: list[str]) -> list[str]:
            return [a.replace("127.0.0.1:PORT", address) for a in rollart(argv)]

        shown = subprocess.run(joined(pools), capture_output=True, text=True, timeout=300, cwd=tmp_path,
                               env={**os.environ, "COLUMNS": "200"})
        assert shown.returncode == 0, shown.stdout + shown.stderr
        nodes = {}
        for line in shown.stdout.splitlines():
            cells = [c.strip() for c in line.split("│")]
            if len(cells) > 2 and cells[1] in ("train", "gen_prefill", "gen_decode"):
                nodes[cells[1]] = set(re.findall(r"127\.0\.0\.1 \((\w{8})\)", line))
        assert len(nodes) == 3 and all(len(n) == 1 for n in nodes.values()), shown.stdout
        assert len(set().union(*nodes.values())) == 3, shown.stdout  # each pool on its own node

        run = subprocess.run([*joined(train), f"run_dir={tmp_path / 'run'}", *SHORT], capture_output=True, text=True,
                             timeout=600, cwd=tmp_path)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
        assert (tmp_path / "run" / "summary.json").is_file()
        listening = {c.laddr.ip for p in ray_processes(tmp).values() for c in _connections(p)
                     if c.status == psutil.CONN_LISTEN}
        assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGINT)  # Ctrl-C, as in a terminal
        cluster.wait(timeout=120)
    assert cluster.returncode == 0, "".join(seen) + (cluster.stdout.read() if cluster.stdout else "")
    assert tmp is not None
    time.sleep(1.0)
    left = ray_processes(tmp)
    assert not [p for p in left.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], left


def _connections(proc: psutil.Process) -> list:
    try:
        return proc.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
