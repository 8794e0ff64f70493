"""Nodes that leave and join a loopback Ray cluster while a driver holds workers (tests/raynodes.py).

A worker on node 2 (pool n2, fallback n1) loses its node (SIGKILL of the node's processes): the health
check notices, pool n2's capacity drops to nothing, and the worker is replaced on n1 — a fallback, logged
and counted. Then node 3 joins holding pool n2, which is `elastic`: the cluster grows a worker on it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from raynodes import BASE_ENV, FAST_NODE_DEATH, JOINED_RUNTIME, LoopbackCluster, read_json_line, two_pool_run_file

pytestmark = pytest.mark.ray

DRIVER = JOINED_RUNTIME + textwrap.dedent("""\
    @affinity("n2", fallback=["n1"], role="probe")
    class Probe:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    events, changed = [], threading.Condition()

    def seen(event):
        with changed:
            events.append(event)
            changed.notify_all()

    with joined_runtime(sys.argv[1]) as rt:
        cluster = rt.resources.place(Probe)
        cluster.on_change(seen)
        for count in (0, 2, 3):  # placed; died + joined (the replacement); joined (elastic growth)
            with changed:
                assert changed.wait_for(lambda: len(events) >= count, timeout=240), [e.kind for e in events]
            print(json.dumps({
                "workers": cluster.names, "nodes": cluster.gather(cluster.call_all("node")),
                "events": [[e.kind, e.worker, e.pool] for e in events], "metrics": rt.resources.metrics(),
            }), flush=True)
            sys.stdin.readline()  # go on when the test has acted
""")


def test_a_lost_node_s_worker_falls_back_and_a_joining_elastic_node_gets_one(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nl")
    with LoopbackCluster(tmp, env=FAST_NODE_DEATH) as nodes:
        address = nodes.head({"pool_n1": 1})
        node2 = nodes.add({"pool_n2": 1})
        run = two_pool_run_file(tmp, address, "rollart-node-loss", cluster="health_interval_s: 0.5",
                                n2="elastic: true")
        script = tmp / "driver.py"
        script.write_text(DRIVER)
        driver = subprocess.Popen([sys.executable, str(script), str(run)], env={**BASE_ENV, "RAY_TMPDIR": str(tmp)},
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(tmp / "driver.log", "w"), text=True)
        log = tmp / "driver.log"
        try:
            placed = read_json_line(driver, 180, "the placement", log)
            assert placed["workers"] == ["probe/n2/0"]
            on_node2 = placed["nodes"][0]

            nodes.kill(node2)
            driver.stdin.write("\n")
            driver.stdin.flush()
            replaced = read_json_line(driver, 240, "the replacement", log)
            assert replaced["events"] == [["died", "probe/n2/0", "n2"], ["joined", "probe/n1/0", "n1"]]
            assert replaced["workers"] == ["probe/n1/0"] and replaced["nodes"][0] != on_node2
            m = replaced["metrics"]
            assert m["pools/n2/worker_deaths"] == 1 and m["pools/n2/replacements"] == 1
            assert m["pools/n2/capacity"] == 0 and m["pools/n1/fallbacks_in"] == 1

            nodes.add({"pool_n2": 1})  # a node joins with the elastic pool's resource
            driver.stdin.write("\n")
            driver.stdin.flush()
            grown = read_json_line(driver, 240, "the elastic growth", log)
            assert grown["events"][2] == ["joined", "probe/n2/0", "n2"]
            assert grown["workers"] == ["probe/n1/0", "probe/n2/0"]
            assert len(set(grown["nodes"])) == 2 and on_node2 not in grown["nodes"]
            assert grown["metrics"]["pools/n2/capacity"] == 1 and grown["metrics"]["pools/n2/workers"] == 1
            driver.stdin.write("\n")
            driver.stdin.close()
            assert driver.wait(timeout=120) == 0, (tmp / "driver.log").read_text()[-3000:]
        finally:
            if driver.poll() is None:
                driver.kill()
        text = log.read_text()
        assert "placed on 'n1'" in text and "replaced by probe/n1/0 (fallback from pool n2)" in text, text[-3000:]
