"""Keeping clusters whole on the shared local Ray: a worker killed with SIGKILL is noticed by the health
check within `cluster.health_interval_s` (or at once by a caller), leaves the membership view, is counted
and replaced in its slot; a call it ended fails fast naming it; a cluster placed without `replace_dead`
only reports the death."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid

import pytest
import ray.cloudpickle
from testutil import wait_until

from rollart.config.loader import load_config
from rollart.resources import affinity
from rollart.resources.errors import WorkerDied
from rollart.resources.placement import Resources

pytestmark = pytest.mark.ray

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

INTERVAL_S = 0.5
POOLS = ["pools.test_a.kind=cpu", "pools.test_a.capacity=2", "pools.test_b.kind=cpu", "pools.test_b.capacity=1",
         "cluster.placement_timeout_s=5", f"cluster.health_interval_s={INTERVAL_S}"]


@affinity("test_a", role="victim")
class Victim:
    def __init__(self, name: str = "") -> None:
        self.name = name

    def pid(self) -> int:
        return os.getpid()

    def who(self) -> str:
        return self.name

    def sleep(self, s: float) -> float:
        time.sleep(s)
        return s


@pytest.fixture
def resources(ray_local):
    res = Resources.connect(load_config(None, POOLS), name=f"rm-health-{uuid.uuid4().hex[:8]}")
    yield res
    ray_local.kill(res.manager)


class Events:
    def __init__(self, cluster) -> None:
        self.seen: list = []
        self._lock = threading.Lock()
        cluster.on_change(self._add)

    def _add(self, event) -> None:
        with self._lock:
            self.seen.append(event)

    def kinds(self) -> list[str]:
        with self._lock:
            return [e.kind for e in self.seen]


def _sigkill(cluster, index: int) -> str:
    name = cluster.names[index]
    os.kill(cluster.gather([cluster.call_one(index, "pid")])[0], signal.SIGKILL)
    return name


def test_a_killed_worker_is_noticed_by_the_health_check_counted_and_replaced(resources):
    with resources.place(Victim, replicas=2, worker_kwargs=lambda p: {"name": p.worker}) as cluster:
        events = Events(cluster)
        old_ids = {m.actor_id for m in cluster.members()}
        killed_at = time.monotonic()
        victim = _sigkill(cluster, 1)
        wait_until(lambda: "died" in events.kinds(), "the death to be noticed", timeout_s=INTERVAL_S * 2 + 10)
        noticed_s = time.monotonic() - killed_at
        died = events.seen[0]
        assert (died.worker, died.pool, died.slot) == (victim, "test_a", 1)
        wait_until(lambda: "joined" in events.kinds(), "the replacement to join", timeout_s=60)
        joined = next(e for e in events.seen if e.kind == "joined")
        assert joined.slot == 1 and joined.pool == "test_a"
        assert len(cluster) == 2 and {m.actor_id for m in cluster.members()} - old_ids == {joined.actor._actor_id.hex()}
        assert cluster.gather(cluster.call_all("who")) == cluster.names  # the new worker answers, in slot order
        m = resources.metrics()
        assert m["pools/test_a/worker_deaths"] == 1 and m["pools/test_a/replacements"] == 1
        assert m["pools/test_a/workers"] == 2 and m["pools/test_a/free"] == 0
    assert noticed_s < 10, f"the death took {noticed_s:.1f} s to notice"
    assert {s.name: s for s in resources.snapshot()}["test_a"].free == 2  # shutdown freed the new slot too


def test_a_call_the_death_ended_fails_fast_naming_the_worker(resources):
    with resources.place(Victim, replicas=2, replace_dead=False) as cluster:
        events = Events(cluster)
        victim = cluster.names[0]
        pid = cluster.gather([cluster.call_one(0, "pid")])[0]
        refs = cluster.call_all("sleep", 60)
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerDied, match=rf"worker {victim} died"):
            cluster.gather(refs)  # the other worker still sleeps: fail fast, do not wait for it
        assert time.monotonic() - start < 10
        assert cluster.names == [n for n in cluster.names if n != victim] and len(cluster) == 1
        time.sleep(INTERVAL_S * 3)
        assert events.kinds() == ["died"]  # reported once (the caller and the health check agree), not replaced
        assert resources.metrics()["pools/test_a/worker_deaths"] == 1
        assert resources.metrics()["pools/test_a/replacements"] == 0


def test_report_dead_is_idempotent_and_the_health_check_stops_with_the_last_cluster(resources):
    cluster = resources.place(Victim, replicas=1, replace_dead=False)
    actor = cluster.actors[0]
    ray.kill(actor)
    assert cluster.report_dead(actor, "killed by the test") is True
    assert cluster.report_dead(actor, "again") is False
    assert len(cluster) == 0
    assert resources._health is not None
    cluster.shutdown()
    assert resources._health is None
    assert resources.metrics()["pools/test_a/worker_deaths"] == 1
