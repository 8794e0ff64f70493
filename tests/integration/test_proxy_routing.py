"""LLMProxy over real InferenceWorkers: domain → pool routing, stickiness, suspend/resume, abort, weights."""

from __future__ import annotations

import asyncio
import pickle
import sys
import time

import pytest

from rollart.config import InferenceConfig, ModelConfig, RunConfig
from rollart.types import GenerationRequest, SamplingParams
from testutil import wait_until

pytestmark = pytest.mark.ray


class FakeSubscriber:
    """A `WeightSubscriber` (coroutines, as the protocol says) serving versions from memory."""

    def __init__(self, versions):
        self.versions = versions

    async def latest_version(self):
        return max(self.versions)

    async def pull(self, version):
        return self.versions[version]


def req(rid, traj, domain, n=4, **kw):
    return GenerationRequest(rid, traj, domain, (3, 4, 5), SamplingParams(temperature=0.0, max_new_tokens=n, **kw))


def long_req(rid, traj, domain="math", n=3000):
    return req(rid, traj, domain, n=n, ignore_eos=True)



@pytest.fixture(scope="module")
def cluster(ray_local, tiny_model_path):
    """Two workers on gen_decode, one on gen_prefill (the default config's generation pools)."""
    ray = ray_local
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    from rollart.inference.worker import InferenceWorker
    from rollart.models import load_model

    model = load_model(tiny_model_path)
    subscriber = FakeSubscriber({1: {n: p.detach() * 1.01 for n, p in model.named_parameters()}})
    cfg = RunConfig(model=ModelConfig(path=str(tiny_model_path)), inference=InferenceConfig(weights_poll_s=0.1))
    actor = ray.remote(InferenceWorker)

    def start(pool, index):
        return actor.options(num_cpus=0, resources={f"pool_{pool}": 0.5}).remote(cfg, pool, index, subscriber)

    workers = {"gen_decode": [start("gen_decode", 0), start("gen_decode", 1)], "gen_prefill": [start("gen_prefill", 0)]}
    all_workers = [w for ws in workers.values() for w in ws]
    ray.get([w.ready.remote() for w in all_workers], timeout=180)
    yield cfg, workers
    ray.get([w.shutdown.remote() for w in all_workers], timeout=30)
    for w in all_workers:
        ray.kill(w)


def make_proxy(ray, workers, domain_pools, **inference):
    from rollart.inference.proxy import LLMProxy

    return ray.remote(LLMProxy).options(num_cpus=0).remote(workers, domain_pools, InferenceConfig(**inference))


def default_domain_pools():
    return {d: c.pool for d, c in RunConfig().domains.items()}  # frozenlake → gen_prefill, math → gen_decode


def test_domain_routing_follows_config_and_trajectories_stick(ray_local, cluster):
    ray = ray_local
    _, workers = cluster
    proxy = make_proxy(ray, workers, default_domain_pools())
    results = ray.get(
        [proxy.generate.remote(req(f"f{i}", f"fl{i}", "frozenlake")) for i in range(3)]
        + [proxy.generate.remote(req(f"m{i}", f"ma{i}", "math")) for i in range(4)],
        timeout=120,
    )
    assert {r.worker for r in results[:3]} == {"inference/gen_prefill/0"}
    assert {r.worker for r in results[3:]} == {"inference/gen_decode/0", "inference/gen_decode/1"}
    # every later turn of a trajectory goes where its first went
    for i, first in enumerate(results[3:]):
        again = ray.get([proxy.generate.remote(req(f"m{i}-{t}", f"ma{i}", "math")) for t in range(3)], timeout=120)
        assert {r.worker for r in again} == {first.worker}
    # another mapping sends math to the prefill pool
    other = make_proxy(ray, workers, {"math": "gen_prefill"})
    assert ray.get(other.generate.remote(req("o", "o1", "math")), timeout=60).worker == "inference/gen_prefill/0"
    with pytest.raises(ValueError, match="'chess' is not a configured domain"):
        ray.get(proxy.generate.remote(req("c", "c1", "chess")), timeout=60)
    stats = ray.get(proxy.stats.remote(), timeout=30)
    assert stats["routed"] == 3 + 4 + 12 and sum(stats["in_flight"].values()) == 0


def test_suspend_blocks_new_requests_not_in_flight_ones(ray_local, cluster):
    ray = ray_local
    _, workers = cluster
    proxy = make_proxy(ray, workers, default_domain_pools())
    running = proxy.generate.remote(long_req("run", "t-run", n=600))
    wait_until(lambda: sum(ray.get(proxy.in_flight.remote(), timeout=10).values()) == 1, "the request to be admitted")
    ray.get(proxy.suspend.remote(), timeout=10)
    held = proxy.generate.remote(req("held", "t-held", "math"))
    wait_until(lambda: ray.get(proxy.stats.remote(), timeout=10)["waiting_admission"] == 1, "the new request to wait")
    assert ray.get(running, timeout=120).finish_reason == "length"  # in-flight work went on while suspended
    ready, _ = ray.wait([held], timeout=1.0)
    assert not ready and ray.get(proxy.stats.remote(), timeout=10)["waiting_admission"] == 1
    ray.get(proxy.resume.remote(), timeout=10)
    assert ray.get(held, timeout=60).finish_reason in ("length", "stop")


def test_suspended_admission_times_out_with_a_clear_error(ray_local, cluster):
    ray = ray_local
    _, workers = cluster
    proxy = make_proxy(ray, workers, default_domain_pools(), admission_timeout_s=0.3)
    ray.get(proxy.suspend.remote(), timeout=10)
    with pytest.raises(TimeoutError, match="waited 0.3 s.*admission_timeout_s"):
        ray.get(proxy.generate.remote(req("x", "t-x", "math")), timeout=30)


def test_abort_running_and_waiting_requests(ray_local, cluster):
    ray = ray_local
    _, workers = cluster
    proxy = make_proxy(ray, workers, default_domain_pools())
    running = proxy.generate.remote(long_req("a", "t-a", domain="frozenlake"))
    wait_until(lambda: ray.get(proxy.in_flight.remote(), timeout=10)["inference/gen_prefill/0"] == 1, "admission")
    time.sleep(0.2)  # let it produce some tokens
    ray.get(proxy.abort.remote("t-a"), timeout=10)
    result = ray.get(running, timeout=60)
    assert result.finish_reason == "abort" and len(result.token_ids) > 0
    assert ray.get(proxy.in_flight.remote(), timeout=10)["inference/gen_prefill/0"] == 0
    ray.get(proxy.suspend.remote(), timeout=10)
    waiting = proxy.generate.remote(req("w", "t-w", "math"))
    wait_until(lambda: ray.get(proxy.stats.remote(), timeout=10)["waiting_admission"] == 1, "the request to wait")
    ray.get(proxy.abort.remote("t-w"), timeout=10)
    assert ray.get(waiting, timeout=30).finish_reason == "abort"


def test_update_weights_on_every_worker_and_client(ray_local, cluster):
    ray = ray_local
    _, workers = cluster
    from rollart.envs import ActorLLMClient
    from rollart.types import LLMClient

    proxy = make_proxy(ray, workers, default_domain_pools())
    ray.get(proxy.suspend.remote(), timeout=10)
    report = ray.get(proxy.update_weights.remote(1), timeout=120)
    ray.get(proxy.resume.remote(), timeout=10)
    assert sorted(report) == ["inference/gen_decode/0", "inference/gen_decode/1", "inference/gen_prefill/0"]
    assert all(r["version"] == 1 for r in report.values())
    client = pickle.loads(pickle.dumps(ActorLLMClient(proxy)))
    assert isinstance(client, LLMClient)
    result = asyncio.run(client.generate(req("c", "t-c", "math")))
    assert result.versions and set(result.versions) == {1}
    stats = ray.get(proxy.stats.remote(workers=True), timeout=30)
    assert {s["version"] for s in stats["workers"].values()} == {1}
