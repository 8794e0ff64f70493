"""The twin's model of the control plane's CPU (rollart/sim/control.py): each proxy shard serves one turn at a time
for `us_per_turn`, first come first served; turns split by domain or by group; off by default (nothing wrapped)."""

import asyncio

import pytest

from rollart.sim import presets
from rollart.sim.clock import run_virtual
from rollart.sim.control import ShardedProxyCost
from rollart.sim.hardware import ControlPlaneSpec
from rollart.sim.system import SimSystem
from rollart.types import GenerationRequest, GenerationResult


class RecordingProxy:
    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []
        self.aborted: list[str] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.seen.append((request.request_id, asyncio.get_running_loop().time()))
        return GenerationResult(request.request_id, request.trajectory_id, (), (), (), "stop")

    async def abort(self, trajectory_id: str) -> None:
        self.aborted.append(trajectory_id)


def request(trajectory_id: str, domain: str = "math") -> GenerationRequest:
    return GenerationRequest(f"{trajectory_id}/0", trajectory_id, domain, (1, 2, 3))


def test_one_shard_serves_turns_one_at_a_time_in_arrival_order() -> None:
    proxy = RecordingProxy()
    model = ShardedProxyCost(ControlPlaneSpec(us_per_turn=1000, shards=1), proxy, ["math"])

    async def main() -> dict:
        await asyncio.gather(*(model.generate(request(f"g{i}/0")) for i in range(4)))
        await asyncio.sleep(0.01)  # idle: the next turn waits for nobody
        await model.generate(request("g9/0"))
        await model.abort("g9/0")
        return model.stats(asyncio.get_running_loop().time())

    stats = run_virtual(main())
    times = [t for _, t in proxy.seen]
    assert times[:4] == pytest.approx([0.001, 0.002, 0.003, 0.004])  # a queue: the k-th waits for k − 1 others
    assert times[4] == pytest.approx(0.004 + 0.01 + 0.001)
    assert [r for r, _ in proxy.seen][:4] == [f"g{i}/0/0" for i in range(4)]
    assert proxy.aborted == ["g9/0"]
    shard = stats["shards"][0]
    assert shard["turns"] == 5 and shard["mean_wait_us"] == pytest.approx((0 + 1000 + 2000 + 3000 + 0) / 5)
    assert stats["mean_control_us_per_turn"] == pytest.approx(1000 + 6000 / 5)
    assert stats["max_utilisation"] == pytest.approx(0.005 / 0.015)


def test_turns_split_by_group_keep_a_group_together_and_by_domain_per_domain() -> None:
    by_group = ShardedProxyCost(ControlPlaneSpec(us_per_turn=1, shards=4, shard_by="group"), RecordingProxy(), ["a"])
    shards = {by_group.shard_of(request(f"g{i:06d}/{m}")) for i in range(1) for m in range(8)}
    assert len(shards) == 1  # every member of a group on one shard
    spread = {by_group.shard_of(request(f"g{i:06d}/0")) for i in range(64)}
    assert spread == {0, 1, 2, 3}
    by_domain = ShardedProxyCost(ControlPlaneSpec(us_per_turn=1, shards=2, shard_by="domain"), RecordingProxy(),
                                 ["math", "game", "frozenlake"])
    assert [by_domain.shard_of(request("g0/0", d)) for d in ("frozenlake", "game", "math")] == [0, 1, 0]


def test_two_shards_halve_the_queue() -> None:
    async def burst(shards: int) -> float:
        model = ShardedProxyCost(ControlPlaneSpec(us_per_turn=1000, shards=shards, shard_by="domain"),
                                 RecordingProxy(), ["a", "b"])
        await asyncio.gather(*(model.generate(request(f"g{i}/0", "ab"[i % 2])) for i in range(100)))
        return asyncio.get_running_loop().time()

    assert run_virtual(burst(1)) == pytest.approx(0.1)
    assert run_virtual(burst(2)) == pytest.approx(0.05)


def test_off_by_default_and_the_twin_reports_it_when_on() -> None:
    cfg, hw = presets.scaled_cluster(0.02, steps=2)
    assert hw.control.us_per_turn == 0

    async def runner_client(hardware) -> object:  # noqa: ANN001
        system = SimSystem(cfg, hardware)
        try:
            return system.env_router.llm
        finally:
            await system.close()

    assert type(run_virtual(runner_client(hw))).__name__ == "LLMProxy"  # nothing wrapped: figures unchanged
    modelled = hw.model_copy(update={"control": ControlPlaneSpec(us_per_turn=500, shards=2)})
    assert isinstance(run_virtual(runner_client(modelled)), ShardedProxyCost)
