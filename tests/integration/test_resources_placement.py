"""Placement on the shared local Ray (pools test_a: 2 slots, test_b: 1 slot): workers land where declared,
a full pool falls back (logged, counted), an impossible placement fails fast and leaves nothing behind,
and a WorkerSet can be called as one."""

from __future__ import annotations

import logging
import sys
import time
import uuid

import pytest
import ray.cloudpickle

from rollart.config.loader import load_config
from rollart.resources import PlacementError, affinity
from rollart.resources.errors import ClusterError
from rollart.resources.placement import Resources
from rollart.resources.runtime import Runtime

pytestmark = pytest.mark.ray

# Ray workers cannot import this test module by name: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TEST_POOLS = [
    "pools.test_a.kind=cpu", "pools.test_a.capacity=2",
    "pools.test_b.kind=cpu", "pools.test_b.capacity=1",
    "cluster.placement_timeout_s=3",
]


@affinity("test_a", role="probe")
class Probe:
    def __init__(self, name: str = "", device: str = "") -> None:
        self.name, self.device = name, device

    def where(self) -> dict:
        import ray

        ctx = ray.get_runtime_context()
        pools = sorted({k.split("_group_")[0] for k in ctx.get_assigned_resources() if k.startswith("pool_")})
        return {"name": self.name, "device": self.device, "pools": pools, "node": ctx.get_node_id()}

    def echo(self, x):
        return x

    def fail(self):
        raise ValueError("boom")

    def sleep(self, s: float) -> float:
        time.sleep(s)
        return s


@affinity("test_a", role="broken")
class Broken:
    def __init__(self) -> None:
        raise RuntimeError("cannot start")


@pytest.fixture
def resources(ray_local):
    cfg = load_config(None, TEST_POOLS)
    res = Resources.connect(cfg, name=f"rm-test-{uuid.uuid4().hex[:8]}")
    yield res
    ray_local.kill(res.manager)


def _status(res: Resources, pool: str):
    return {s.name: s for s in res.snapshot()}[pool]


def test_workers_land_on_the_declared_pool(resources):
    with resources.place(Probe, replicas=2, worker_kwargs=lambda p: {"name": p.worker, "device": p.device}) as c:
        assert c.names == ["probe/test_a/0", "probe/test_a/1"]
        info = c.gather(c.call_all("where"))
        assert [i["pools"] for i in info] == [["pool_test_a"], ["pool_test_a"]]  # Ray granted that resource
        assert [i["name"] for i in info] == c.names and info[0]["device"] == "cpu"
        status = _status(resources, "test_a")
        assert status.free == 0
        assert {p.worker for p in status.holders} == set(c.names)
        assert all(p.node_id == info[0]["node"] for p in status.holders)
        assert status.nodes and status.nodes[0].amount == 2
    assert _status(resources, "test_a").free == 2  # shutdown gave the slots back


def test_a_full_pool_falls_back_logs_a_warning_and_counts_it(resources, caplog):
    with resources.place(Probe, replicas=2):
        with caplog.at_level(logging.WARNING, logger="rollart.resources"):
            extra = resources.place(Probe, fallback=["test_b"])
        try:
            assert extra.names == ["probe/test_b/0"]
            assert extra.gather(extra.call_all("where"))[0]["pools"] == ["pool_test_b"]
            assert extra.placements[0].fell_back and extra.placements[0].preferred == "test_a"
            warning = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert warning and "fallback: worker probe/test_b/0" in warning[0].getMessage()
            assert "preferred pool 'test_a'" in warning[0].getMessage()
            assert _status(resources, "test_a").fallbacks_out == 1
            assert _status(resources, "test_b").fallbacks_in == 1
            metrics = resources.metrics()
            assert metrics["pools/test_b/fallbacks_in"] == 1 and metrics["pools/fallbacks"] == 1
            assert metrics["pools/test_a/held"] == 2 and metrics["pools/test_b/workers"] == 1
        finally:
            extra.shutdown()


def test_an_impossible_placement_fails_within_seconds_naming_worker_and_pools(resources):
    with resources.place(Probe, replicas=2), resources.place(Probe, pool="test_b"):
        start = time.monotonic()
        with pytest.raises(PlacementError) as info:
            resources.place(Probe, fallback=["test_b"])
        assert time.monotonic() - start <= 10
        msg = str(info.value)
        assert "cannot place worker probe/test_a/2" in msg
        assert "test_a: 0 of 2 free" in msg and "test_b: 0 of 1 free" in msg


def test_a_multi_replica_placement_is_all_or_nothing(resources):
    with pytest.raises(PlacementError, match="probe/test_a/2"):
        resources.place(Probe, replicas=3, fallback=[])
    assert _status(resources, "test_a").free == 2 and not _status(resources, "test_a").holders


def test_a_pool_held_outside_rollart_errors_after_the_placement_timeout(resources, ray_local):
    import ray

    squatter = ray.remote(num_cpus=0, resources={"pool_test_b": 1})(Probe).remote()
    ray.get(squatter.echo.remote(1), timeout=60)  # it holds test_b's only slot; the ledger does not know
    try:
        start = time.monotonic()
        with pytest.raises(PlacementError) as info:
            resources.place(Probe, pool="test_b")
        assert time.monotonic() - start <= 10
        msg = str(info.value)
        assert "probe/test_b/0" in msg and "Ray could not reserve" in msg
        assert "pool_test_b: 0 free of 1" in msg
        assert _status(resources, "test_b").free == 1  # the reservation was released
        groups = ray.util.placement_group_table().values()
        assert not [g for g in groups if g["name"].startswith("rollart:probe/") and g["state"] != "REMOVED"]
    finally:
        ray.kill(squatter)


def test_a_worker_that_fails_to_start_releases_its_slot(resources):
    with pytest.raises(PlacementError, match=r"(?s)broken/test_a/0 failed to start.*cannot start"):
        resources.place(Broken)
    assert _status(resources, "test_a").free == 2


def test_worker_set_call_one_call_all_gather_and_errors(resources):
    with resources.place(Probe, replicas=2) as c:
        assert c.gather([c.call_one(1, "echo", "x"), c.call_one(0, "echo", "y")]) == ["x", "y"]
        assert c.gather(c.call_all("echo", 7)) == [7, 7]
        with pytest.raises(ValueError, match="boom"):
            c.gather(c.call_all("fail"))
        with pytest.raises(TimeoutError, match=r"worker set 'probe': 2 of 2 calls not done.*probe/test_a/0"):
            c.gather(c.call_all("sleep", 3), timeout_s=0.3)
        with pytest.raises(IndexError):
            c.call_one(2, "echo", 1)
        with pytest.raises(AttributeError, match="no method 'nope'"):
            c.call_all("nope")
    with pytest.raises(RuntimeError, match="shut down"):
        c.call_all("echo", 1)


def test_runtime_attaches_to_a_running_ray_and_checks_its_pools(ray_local):
    cfg = load_config(None, TEST_POOLS)
    with Runtime(cfg, manager_name=f"rm-test-{uuid.uuid4().hex[:8]}") as rt:
        assert rt.mode == "attached"
        assert {s.name for s in rt.resources.snapshot()} >= {"test_a", "test_b", "env"}
        ray_local.kill(rt.resources.manager)
    assert ray_local.is_initialized()  # attached: the session's Ray keeps running
    cfg = load_config(None, TEST_POOLS + ["pools.h800.kind=gpu", "pools.h800.capacity=8"])
    with pytest.raises(ClusterError) as info:
        Runtime(cfg).start()
    msg = str(info.value)
    assert "holds no resource for pools ['h800']" in msg
    assert "--resources='{\"pool_h800\": 8}'" in msg


def test_each_run_in_one_process_gets_a_manager_of_its_own(ray_local):
    """Two runs one after the other in one process (as the e2e tests run): the first ends the manager it
    created, so the second is not handed it by name, and the first's handle, collected late (a run's objects
    sit in reference cycles), cannot end the second's manager mid-run. A driver that joins a live manager
    (as `rollart pools` does) shares it and leaves it running."""
    import gc

    cfg = load_config(None, TEST_POOLS)
    name = f"rm-test-{uuid.uuid4().hex[:8]}"
    with Runtime(cfg, manager_name=name) as first:
        earlier = first.resources
        earlier.reserve_extra = [earlier]  # a cycle: only the cyclic collector frees it, as a run's objects
        first_id = earlier.manager._actor_id
        assert earlier.owns_manager
        joined = Resources.connect(cfg, name=name)  # another driver of the same run
        assert joined.manager._actor_id == first_id and not joined.owns_manager
        joined.end_manager()  # not its to end
        assert {s.name for s in earlier.snapshot()} >= {"test_a", "test_b"}
    with Runtime(cfg, manager_name=name) as second:
        assert second.resources.manager._actor_id != first_id and second.resources.owns_manager
        del earlier, joined
        gc.collect()
        time.sleep(1.0)  # Ray ends an actor whose last handle went out of scope within milliseconds
        assert {s.name for s in second.resources.snapshot()} >= {"test_a", "test_b"}
    with pytest.raises(ValueError):  # the run that created it ended it with its Runtime
        ray_local.get_actor(name)


def test_actor_options_cannot_override_what_placement_decides(resources):
    with pytest.raises(ValueError, match=r"may not set \['num_cpus', 'resources'\]"):
        resources.place(Probe, actor_options={"num_cpus": 1, "resources": {"x": 1}, "max_concurrency": 4})
    assert _status(resources, "test_a").free == 2
