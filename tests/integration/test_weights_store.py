"""The weight store on the shared local Ray: bit-identical pulls, at most K versions, never backwards."""

import asyncio
import threading
import time
import uuid

import pytest
import torch

from rollart.config import WeightsConfig
from rollart.types import WeightPublisher, WeightSubscriber
from rollart.weights import PUBLISH, PULL, WeightStore

pytestmark = pytest.mark.ray


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    emb = torch.randn(32, 8, generator=g)
    return {"emb": emb, "lm_head": emb, "w": torch.randn(8, 8, generator=g), "b16": torch.randn(4, generator=g).bfloat16()}


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)) for k in a
    )


@pytest.fixture
def store(ray_local):
    s = WeightStore(WeightsConfig(bucket_mb=0.001, keep_versions=2, timeout_s=30), name=f"ws-{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


def test_pulled_weights_are_bit_identical_and_store_keeps_k_versions(store):
    pub, sub = store.publisher(), store.subscriber()
    assert isinstance(pub, WeightPublisher) and isinstance(sub, WeightSubscriber)
    assert asyncio.run(sub.latest_version()) == -1
    for v in range(4):
        m = pub.publish(v, weights(v))
        assert m[PUBLISH] > 0 and m["weights/buckets"] >= 2
        assert asyncio.run(sub.latest_version()) == v
        got = asyncio.run(sub.pull(v))
        assert same_bits(got, weights(v)) and sub.last_metrics[PULL] > 0
        assert got["lm_head"] is got["emb"]
        assert len(store.versions()) <= 2
    assert sorted(store.versions()) == [2, 3]
    with pytest.raises(KeyError, match=r"held: \[2, 3\]"):
        asyncio.run(store.subscriber().pull(1))
    with pytest.raises(ValueError, match="not newer"):
        pub.publish(3, weights(3))


def test_subscriber_in_another_process_gets_the_same_bits(store, ray_local):
    ray = ray_local
    pub = store.publisher()
    pub.publish(0, weights(0))

    @ray.remote(num_cpus=0)
    def pull_remote(sub, version):
        t = asyncio.run(sub.pull(version))
        return {k: v.clone() for k, v in t.items()}

    remote = ray.get(pull_remote.remote(store.subscriber(), 0), timeout=60)
    assert same_bits(remote, weights(0))


def test_a_subscriber_version_never_goes_backwards(store):
    pub, sub = store.publisher(), store.subscriber()
    seen: list[int] = []
    stop = threading.Event()

    def background():  # what an inference worker does: poll latest, pull it
        while not stop.is_set():
            v = asyncio.run(sub.latest_version())
            if v > sub.version:
                try:
                    assert same_bits(asyncio.run(sub.pull(v)), weights(v))
                except KeyError:  # dropped between latest() and get(): the next poll sees newer
                    continue
                seen.append(sub.version)

    thread = threading.Thread(target=background, daemon=True)
    thread.start()
    for v in range(6):
        pub.publish(v, weights(v))
    deadline = time.monotonic() + 60
    while sub.version < 5 and thread.is_alive() and time.monotonic() < deadline:
        thread.join(timeout=0.05)
    stop.set()
    thread.join(timeout=30)
    assert seen and seen == sorted(set(seen)) and seen[-1] == 5
    with pytest.raises(ValueError, match="backwards"):
        asyncio.run(sub.pull(4))


def test_an_adapter_version_travels_with_its_config(store):
    """A LoRA run publishes only adapter tensors; the subscriber gets a LoraAdapter: same config, same bits."""
    from rollart.types import LoraAdapter

    pub, sub = store.publisher(), store.subscriber()
    pub.publish(0, weights(0))
    g = torch.Generator().manual_seed(7)
    adapter = LoraAdapter({"r": 2, "lora_alpha": 4.0, "target_modules": ["q_proj"]},
                          {"base_model.model.q_proj.lora_A.weight": torch.randn(2, 8, generator=g),
                           "base_model.model.q_proj.lora_B.weight": torch.randn(8, 2, generator=g)})
    m = pub.publish(1, adapter)
    assert m["weights/publish_mb"] * 2**20 == adapter.nbytes == 2 * 16 * 4
    got = asyncio.run(sub.pull(1))
    assert isinstance(got, LoraAdapter) and got.config == adapter.config
    assert same_bits(dict(got.tensors), dict(adapter.tensors))
    assert isinstance(asyncio.run(store.subscriber().pull(0)), dict)  # a full-weights version stays a plain mapping
