"""The runtime against real Ray processes, each in its own subprocess and Ray temp dir (RAY_TMPDIR), so
the session's shared Ray and other people's Rays are never touched:

- a two-node Ray cluster on loopback (`ray start --head` + `ray start --address=...`, each node holding a
  different pool resource): a driver that joins it places a worker on the node that holds its pool, and
  `rollart pools` lists each pool's node, or says how to declare a pool the cluster lacks;
- Ctrl-C (SIGINT) or SIGTERM to a driver with an embedded Ray and placed workers shuts it down cleanly and
  leaves no process of that Ray session alive; while it runs, every listening socket is on 127.0.0.1.

Loopback only: every node runs with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which makes Ray resolve and bind
127.0.0.1. With that setting `ray start --address=...` refuses to add a second node (a guard meant for
Windows/macOS), and setting it to 1 would make the node pick the machine's external address. So the
second node runs `ray start` through `JOIN_ON_LOOPBACK`, which lifts only that CLI guard.

Our processes are found by their RAY_TMPDIR (set only for what this file starts) and by pid ancestry, and
only they are ever signalled.
"""

from __future__ import annotations

import ipaddress
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

import psutil
import pytest
from testutil import free_port as _free_port

BIN = Path(sys.executable).parent
BASE_ENV = {
    **os.environ,
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
}


# --- helpers -------------------------------------------------------------------------------------



def _ours(tmp: Path, roots: list[int] = ()) -> dict[int, psutil.Process]:
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


def _alive(procs: dict[int, psutil.Process]) -> list[str]:
    out = []
    for proc in procs.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {proc.name()}")
        except psutil.NoSuchProcess:
            pass
    return out


def _kill_all(procs: dict[int, psutil.Process]) -> None:
    for proc in procs.values():
        try:
            if proc.is_running():  # is_running also checks the pid was not reused
                proc.kill()
        except psutil.NoSuchProcess:
            pass


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


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("{"):
                return line
            if not line and proc.poll() is not None:
                break
    raise AssertionError(f"no result line from the driver within {timeout} s (exit code {proc.poll()})")


# --- a two-node cluster on loopback ----------------------------------------------------------------


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


DRIVER = textwrap.dedent("""\
    import json, sys, time
    import rollart.resources  # sets Ray's environment before Ray is imported
    import ray
    from rollart.config_loader import load_config
    from rollart.resources import ClusterError, affinity
    from rollart.resources.runtime import Runtime

    @affinity("n2", role="probe")
    class Probe:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    cfg = load_config(sys.argv[1])
    deadline = time.monotonic() + 90
    while True:  # the second node may still be joining
        try:
            rt = Runtime(cfg).start()
            break
        except ClusterError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    with rt:
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
    tmp = tmp_path_factory.mktemp("rn")  # short: Ray's socket paths live under it
    env = {**BASE_ENV, "RAY_TMPDIR": str(tmp)}
    port = _free_port()
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=100000000",
              "--disable-usage-stats", "--block"]
    starts = []

    def node(*args: str, launcher: list[str]) -> subprocess.Popen:
        ports = [f"--dashboard-agent-listen-port={_free_port()}", f"--metrics-export-port={_free_port()}",
                 f"--runtime-env-agent-port={_free_port()}"]
        log = open(tmp / f"node{len(starts)}.log", "w")
        proc = subprocess.Popen([*launcher, "start", *args, *common, *ports], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        starts.append(proc)
        return proc

    try:
        node("--head", f"--port={port}", f"--temp-dir={tmp}", "--include-dashboard=false",
             '--resources={"pool_n1": 1}', launcher=[str(BIN / "ray")])
        deadline = time.monotonic() + 60
        while True:  # wait for the head's GCS port before the second node joins
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, (tmp / "node0.log").read_text()
            time.sleep(0.3)
        node(f"--address=127.0.0.1:{port}", '--resources={"pool_n2": 1}',
             launcher=[sys.executable, "-c", JOIN_ON_LOOPBACK])
        yield f"127.0.0.1:{port}", tmp
    finally:
        procs = _ours(tmp, [p.pid for p in starts])
        for proc in reversed(starts):  # the second node drains through the head's GCS: stop it first
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=5)  # a head drains for up to 30 s; these are throwaway nodes
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        _kill_all({**procs, **_ours(tmp)})


def _run_file(tmp: Path, address: str) -> Path:
    path = tmp / "run.yaml"
    path.write_text(textwrap.dedent(f"""\
        cluster: {{address: "{address}", namespace: rollart-two-nodes}}
        pools:
          train: null
          gen_prefill: null
          gen_decode: null
          env: null
          reward: null
          n1: {{kind: cpu, capacity: 1}}
          n2: {{kind: cpu, capacity: 1}}
        domains:
          frozenlake: {{pool: n1}}
          math: {{pool: n2}}
        """))
    return path


def test_two_node_cluster_places_the_worker_on_the_node_holding_its_pool(two_nodes):
    address, tmp = two_nodes
    run = _run_file(tmp, address)
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script), str(run)], env={**BASE_ENV, "RAY_TMPDIR": str(tmp)},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(tmp / "driver.log", "w"),
                              text=True)
    try:
        info = json.loads(_read_line(driver, timeout=150))
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
    import json, os, sys, time
    from rollart.config_loader import load_config
    from rollart.resources import affinity
    from rollart.resources.runtime import Runtime

    @affinity("env", role="sleeper")
    class Sleeper:
        def pid(self):
            return os.getpid()

    cfg = load_config(None, ["cluster.num_cpus=1", "cluster.object_store_mb=100"])
    try:
        with Runtime(cfg) as rt:
            cluster = rt.resources.place(Sleeper, replicas=2)
            pids = cluster.gather(cluster.call_all("pid"))
            print(json.dumps({"session_dir": rt.session_dir, "pids": pids}), flush=True)
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
    ours: dict[int, psutil.Process] = {}
    try:
        info = json.loads(_read_line(driver, timeout=120))
        assert info["session_dir"].startswith(str(tmp))
        ours = _ours(tmp, [driver.pid])
        names = {_name(p) for p in ours.values()}
        assert {"gcs_server", "raylet"} <= names, names
        assert set(info["pids"]) <= set(ours)  # the placed workers are among them
        listening = _listening(ours)
        assert listening and all(_loopback(ip) for _, ip in listening), listening

        driver.send_signal(sig)
        assert driver.wait(timeout=60) == exit_code, (tmp / "driver.log").read_text()[-3000:]
        deadline = time.monotonic() + 15
        while _alive({**ours, **_ours(tmp)}) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert _alive({**ours, **_ours(tmp)}) == []
    finally:
        if driver.poll() is None:
            driver.kill()
        _kill_all({**ours, **_ours(tmp)})
