"""The runtime against real Ray processes, each in its own subprocess and Ray temp dir (RAY_TMPDIR), so
the session's shared Ray and other people's Rays are never touched:

- a two-node Ray cluster on loopback (`ray start --head` + `ray start --address=...`, each node holding a
  different pool resource): a driver that joins it places a worker on the node that holds its pool, and
  `rollart pools` lists each pool's node, or says how to declare a pool the cluster lacks;
- Ctrl-C (SIGINT) or SIGTERM to a driver with an embedded Ray and placed workers shuts it down cleanly and
  leaves no process of that Ray session alive; while it runs, every listening socket is on 127.0.0.1, and
  the workers format their logs like the driver (the job's worker setup hook ran in them).

How the nodes are started on loopback, and how our processes are found (and only they signalled): see
tests/raynodes.py.
"""

from __future__ import annotations

import ipaddress
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from raynodes import (BASE_ENV, BIN, JOINED_RUNTIME, LoopbackCluster, alive, kill_all, ours, read_json_line,
                      two_pool_run_file)

from rollart.resources.logs import LOG_FORMAT


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.NoSuchProcess:  # an idle worker may exit while we look
        return ""


def _listening(procs: dict[int, psutil.Process]) -> set[tuple[str, str]]:
    """(process name, address) of every listening TCP socket of `procs`."""
    out = set()
    for proc in procs.values():
        try:
            out |= {(proc.name(), c.laddr.ip) for c in proc.net_connections(kind="tcp")
                    if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            pass
    return out


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback


# --- a two-node cluster on loopback ----------------------------------------------------------------


DRIVER = JOINED_RUNTIME + textwrap.dedent("""\
    @affinity("n2", role="probe")
    class Probe:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    with joined_runtime(sys.argv[1]) as rt:
        cluster = rt.resources.place(Probe)
        spill = rt.resources.place(Probe, fallback=["n1"])  # n2 is full: falls back to n1's node
        snapshot = {s.name: [n.node_id for n in s.nodes] for s in rt.resources.snapshot()}
        print(json.dumps({
            "mode": rt.mode, "session_dir": rt.session_dir, "nodes": len(ray.nodes()),
            "worker": cluster.names[0], "placed_on": cluster.gather(cluster.call_all("node"))[0],
            "recorded_node": cluster.placements[0].node_id, "pool_nodes": snapshot,
            "spill": spill.names[0], "spill_on": spill.gather(spill.call_all("node"))[0],
        }), flush=True)
        sys.stdin.readline()  # stay alive (holding the workers) until the test has looked
""")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    with LoopbackCluster(tmp_path_factory.mktemp("rn")) as nodes:
        nodes.head({"pool_n1": 1})
        nodes.add({"pool_n2": 1})
        yield nodes.address, nodes.tmp


def test_two_node_cluster_places_the_worker_on_the_node_holding_its_pool(two_nodes):
    address, tmp = two_nodes
    run = two_pool_run_file(tmp, address, "rollart-two-nodes")
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script), str(run)], env={**BASE_ENV, "RAY_TMPDIR": str(tmp)},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(tmp / "driver.log", "w"),
                              text=True)
    try:
        info = read_json_line(driver, timeout=150)
        assert info["mode"] == "joined" and info["session_dir"] is None
        assert info["nodes"] == 2  # joining started no node of its own
        (n1,), (n2,) = info["pool_nodes"]["n1"], info["pool_nodes"]["n2"]
        assert n1 != n2
        assert info["worker"] == "probe/n2/0"
        assert info["placed_on"] == n2 == info["recorded_node"]
        assert info["spill"] == "probe/n1/0" and info["spill_on"] == n1

        # `rollart pools` joins the same cluster and namespace while the run is live: each pool with the
        # node holding it, the run's holders (free 0) and its fallback (n2 → n1)
        shown = subprocess.run([str(BIN / "rollart"), "pools", str(run)], env=BASE_ENV, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert f"joined the Ray cluster at {address}" in shown.stdout
        rows = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[1:-1]]
                for ln in shown.stdout.splitlines() if ln.count("│") > 5}
        assert rows["n1"][3:] == ["1", "0", "-", "1/0", f"127.0.0.1 ({n1[:8]}) ×1"]
        assert rows["n2"][3:] == ["1", "0", "-", "0/1", f"127.0.0.1 ({n2[:8]}) ×1"]
    finally:
        driver.stdin.close()
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            driver.kill()
    assert driver.returncode == 0, (tmp / "driver.log").read_text()[-3000:]

    # a pool the cluster lacks: exit 1, naming it and the `ray start` line that declares it
    missing = subprocess.run([str(BIN / "rollart"), "pools", str(run), "pools.n3.kind=cpu"], env=BASE_ENV,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1
    assert "holds no resource for pools ['n3']" in missing.stderr
    assert f"ray start --address={address} --resources='{{\"pool_n3\": 1}}'" in missing.stderr


# --- Ctrl-C and SIGTERM ----------------------------------------------------------------------------


SLEEPER = textwrap.dedent("""\
    import json, logging, os, sys, time
    from rollart.config.loader import load_config
    from rollart.resources import affinity
    from rollart.resources.runtime import Runtime

    @affinity("env", role="sleeper")
    class Sleeper:
        def pid(self):
            return os.getpid()

        def log_setup(self):
            root = logging.getLogger()
            return {"formats": [h.formatter._fmt for h in root.handlers if h.formatter],
                    "root": logging.getLevelName(root.level),
                    "rollart": logging.getLevelName(logging.getLogger("rollart").level)}

    cfg = load_config(None, ["cluster.num_cpus=1", "cluster.object_store_mb=100"])
    try:
        with Runtime(cfg) as rt:
            cluster = rt.resources.place(Sleeper, replicas=2)
            pids = cluster.gather(cluster.call_all("pid"))
            logs = cluster.gather(cluster.call_all("log_setup"))
            print(json.dumps({"session_dir": rt.session_dir, "pids": pids, "logs": logs}), flush=True)
            while True:
                time.sleep(0.2)
    except KeyboardInterrupt:
        sys.exit(130)
""")


@pytest.mark.parametrize("sig, exit_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_shuts_down_and_leaves_no_ray_process(tmp_path_factory, sig, exit_code):
    tmp = tmp_path_factory.mktemp("rs")
    script = tmp / "sleeper.py"
    script.write_text(SLEEPER)
    driver = subprocess.Popen([sys.executable, str(script)], env={**BASE_ENV, "RAY_TMPDIR": str(tmp)},
                              stdout=subprocess.PIPE, stderr=open(tmp / "driver.log", "w"), text=True,
                              start_new_session=True)
    mine: dict[int, psutil.Process] = {}
    try:
        info = read_json_line(driver, timeout=120)
        assert info["session_dir"].startswith(str(tmp))
        mine = ours(tmp, [driver.pid])
        names = {_name(p) for p in mine.values()}
        assert {"gcs_server", "raylet"} <= names, names
        assert set(info["pids"]) <= set(mine)  # the placed workers are among them
        assert info["logs"] == [{"formats": [LOG_FORMAT], "root": "WARNING", "rollart": "INFO"}] * 2
        listening = _listening(mine)
        assert listening and all(_loopback(ip) for _, ip in listening), listening

        driver.send_signal(sig)
        assert driver.wait(timeout=60) == exit_code, (tmp / "driver.log").read_text()[-3000:]
        deadline = time.monotonic() + 15
        while alive({**mine, **ours(tmp)}) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert alive({**mine, **ours(tmp)}) == []
    finally:
        if driver.poll() is None:
            driver.kill()
        kill_all({**mine, **ours(tmp)})
