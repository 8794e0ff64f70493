"""The LLM proxy split by group (`inference.proxy_shards`): the shard choice is stable, keeps a group together
and spreads groups evenly; an env worker's `ShardedLLMClient` sends every turn and abort of a trajectory to that
shard; `ProxyShards` drives real in-process `LLMProxy` shards as one — suspend, weight updates, membership
events and merged counters — over engines every shard sees."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from rollart.base.proxy_shard import proxy_shard
from rollart.config import InferenceConfig
from rollart.config.loader import load_config
from rollart.envs.sharded_llm import ShardedLLMClient
from rollart.envs.worker import as_llm_client
from rollart.inference.proxy import LLMProxy
from rollart.inference.proxy_shards import ProxyShards, merge_stats
from rollart.sim.control import ShardedProxyCost
from rollart.sim.engine import LocalHandle
from rollart.sim.hardware import ControlPlaneSpec
from rollart.types import GenerationRequest, GenerationResult, SamplingParams


def request(trajectory_id: str, turn: int = 0) -> GenerationRequest:
    return GenerationRequest(f"{trajectory_id}/{turn}", trajectory_id, "math", (1, 2, 3),
                             SamplingParams(max_new_tokens=2))


# --- the shard choice ---------------------------------------------------------------------------------------
def test_the_shard_is_stable_across_processes_and_keeps_a_group_on_one_shard():
    # pinned values: CRC-32 of the group, not Python's per-process salted hash
    assert [proxy_shard(f"g{i:06d}/3", 4) for i in range(8)] == [0, 2, 0, 2, 1, 3, 1, 3]
    for i in range(200):
        group = f"g{i:06d}"
        assert len({proxy_shard(f"{group}/{member}", 5) for member in range(16)}) == 1
    assert proxy_shard("g000007/2", 1) == 0 and proxy_shard("no-slash", 3) == proxy_shard("no-slash", 3)
    with pytest.raises(ValueError, match="must be ≥ 1"):
        proxy_shard("g000000/0", 0)


@pytest.mark.parametrize("shards", [2, 3, 4, 7, 10])
def test_groups_spread_evenly_over_the_shards(shards):
    counts = Counter(proxy_shard(f"g{i:06d}/0", shards) for i in range(10_000))
    mean = 10_000 / shards
    assert sorted(counts) == list(range(shards)) and max(abs(n - mean) for n in counts.values()) <= 0.1 * mean


def test_the_twin_splits_its_turns_with_the_same_choice():
    cost = ShardedProxyCost(ControlPlaneSpec(us_per_turn=1.0, shards=3, shard_by="group"), proxy=None,
                            domains=["math"])
    for i in range(100):
        assert cost.shard_of(request(f"g{i:06d}/1")) == proxy_shard(f"g{i:06d}/1", 3)


# --- the env worker's client ----------------------------------------------------------------------------------
class RecordingClient:
    def __init__(self) -> None:
        self.generated: list[str] = []
        self.aborted: list[str] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.generated.append(request.trajectory_id)
        return GenerationResult(request.request_id, request.trajectory_id, (5,), (0.0,), (0,), "stop")

    async def abort(self, trajectory_id: str) -> None:
        self.aborted.append(trajectory_id)


def test_every_turn_and_abort_of_a_trajectory_reaches_its_groups_shard():
    shards = [RecordingClient(), RecordingClient()]
    client = as_llm_client(shards)
    assert isinstance(client, ShardedLLMClient) and as_llm_client([shards[0]]) is shards[0]

    async def main():
        for i in range(16):
            for turn in range(3):
                await client.generate(request(f"g{i:06d}/{i % 4}", turn))
            await client.abort(f"g{i:06d}/{i % 4}")

    asyncio.run(main())
    for index, shard in enumerate(shards):
        assert shard.generated and shard.aborted  # both shards served
        assert all(proxy_shard(t, 2) == index for t in shard.generated + shard.aborted)
        assert Counter(shard.generated) == Counter({t: 3 for t in shard.aborted})  # a trajectory's turns together


# --- the driver's view of the shards -------------------------------------------------------------------------
class Engine:
    """An inference worker answering at once at the version it serves; a swap counts once per version."""

    def __init__(self, name: str) -> None:
        self.name, self.version, self.swaps = name, 0, 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return GenerationResult(request.request_id, request.trajectory_id, (5,), (0.0,), (self.version,), "stop",
                                worker=self.name)

    async def update_weights(self, version: int) -> dict[str, float]:
        if version <= self.version:
            return {"swapped": 0.0, "pull_s": 0.0}
        self.version, self.swaps = version, self.swaps + 1
        return {"swapped": 1.0, "pull_s": 0.25}

    async def ready(self) -> str:
        return self.name

    async def abort(self, trajectory_id: str) -> None:
        return None

    async def stats(self) -> dict[str, float]:
        return {"swaps": float(self.swaps)}


def test_proxy_shards_drive_every_shard_as_one_proxy():
    async def main():
        engines = [Engine("e0"), Engine("e1")]
        handles = [LocalHandle(e) for e in engines]
        proxies = [LLMProxy({"decode": handles}, {"math": "decode"}, InferenceConfig(admission_timeout_s=5))
                   for _ in range(2)]
        shards = ProxyShards([LocalHandle(p) for p in proxies])
        assert shards.clients == [shards.handles[0], shards.handles[1]]
        client = ShardedLLMClient(proxies)  # the proxies are LLMClients themselves
        trajectories = [f"g{i:06d}/0" for i in range(12)]
        for t in trajectories:
            assert (await client.generate(request(t))).versions == (0,)

        timings = await shards.update_weights(3)  # both shards ask both engines: each swaps once
        assert [e.version for e in engines] == [3, 3] and [e.swaps for e in engines] == [1, 1]
        assert timings == {"e0": {"swapped": 1.0, "pull_s": 0.25}, "e1": {"swapped": 1.0, "pull_s": 0.25}}

        await shards.suspend()
        waiting = asyncio.ensure_future(client.generate(request(trajectories[0], 1)))
        other = asyncio.ensure_future(client.generate(request(trajectories[-1], 1)))
        await asyncio.sleep(0.05)
        assert not waiting.done() and not other.done()  # held on either shard
        await shards.resume()
        assert (await waiting).versions == (3,) and (await other).versions == (3,)

        stats = await shards.stats(workers=True)
        assert stats["routed"] == 14 and sum(stats["routed_by_shard"]) == 14 and min(stats["routed_by_shard"]) > 0
        assert stats["routed_by_domain"] == {"math": {"decode": 14}}
        assert stats["workers"] == {"e0": {"swaps": 1.0}, "e1": {"swaps": 1.0}}

        # membership events go to every shard: a death leaves both routings (counted once), a join enters both
        assert await asyncio.gather(*shards.each("remove_worker", str(id(handles[0])), "killed")) == [True, True]
        joined = Engine("e2")
        assert await asyncio.gather(*shards.each("add_worker", "decode", LocalHandle(joined))) == ["e2", "e2"]
        assert joined.version == 3 and joined.swaps == 1
        for t in trajectories[6:]:
            assert (await client.generate(request(t, 2))).worker != "e0"
        stats = await shards.stats()
        assert stats["workers_lost"] == 1 and stats["workers_joined"] == 1 and "workers" not in stats
        assert set(stats["in_flight"]) == {"e1", "e2"}

    asyncio.run(main())


def test_merged_stats_sum_traffic_and_count_membership_once():
    one = {"suspended": False, "waiting_admission": 1, "routed": 5, "turn_retries": 1, "preempted_turns": 0,
           "preempted_tokens": 0, "workers_lost": 1, "workers_joined": 0, "in_flight": {"a": 2, "b": 0},
           "trajectories_assigned": {"a": 3}, "routed_by_domain": {"math": {"p": 5}}}
    two = {**one, "suspended": True, "routed": 7, "in_flight": {"a": 1, "c": 0},
           "routed_by_domain": {"math": {"p": 4, "q": 3}, "code": {"p": 0}}}
    merged = merge_stats([one, two])
    assert merged["suspended"] and merged["routed"] == 12 and merged["routed_by_shard"] == [5, 7]
    assert merged["turn_retries"] == 2 and merged["waiting_admission"] == 2 and merged["workers_lost"] == 1
    assert merged["in_flight"] == {"a": 3, "b": 0, "c": 0} and merged["trajectories_assigned"] == {"a": 6}
    assert merged["routed_by_domain"] == {"code": {"p": 0}, "math": {"p": 9, "q": 3}}


def test_lending_the_trainers_devices_is_refused_beside_proxy_shards():
    with pytest.raises(ValueError, match=r"inference.proxy_shards: 2 shards cannot lend the trainer's devices "
                                         r"\(train.elastic_generation\)"):
        load_config(None, ["inference.proxy_shards=2", "train.elastic_generation=true"])
    assert load_config(None, ["inference.proxy_shards=2"]).inference.proxy_shards == 2
