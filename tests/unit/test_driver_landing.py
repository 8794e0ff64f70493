"""The RL loop serves a train step's weights as soon as the step ends, while the next batch fills (not after
it is taken), and a background landing that fails stops the loop at once, even while it waits for a batch; a
loop that stops on an error leaves no train step or landing running behind it.

The first test runs the real loop in the cluster twin (production scheduler, virtual time)."""

import asyncio
from types import SimpleNamespace

import pytest

from rollart.config.loader import load_config
from rollart.control.scheduler import RolloutScheduler
from rollart.loop import RLLoop, TrainStepInFlight
from rollart.sim.hardware import SimHardware
from rollart.sim.run import simulate
from rollart.types import RunState

HW = SimHardware.model_validate({"model": "qwen3-8b", "pools": {
    "gen_prefill": {"gpu": "H800", "count": 2}, "gen_decode": {"gpu": "H20", "count": 4},
    "train": {"gpu": "H800", "count": 8}}, "weights": {"link": "rdma_400g"}})


def test_without_a_barrier_each_batch_is_taken_with_its_own_version_already_served(monkeypatch):
    """Batch k trains at version k; its rollout overlaps train step k − 1, whose weights (version k) must
    reach the engines while batch k fills — the old loop served them only after batch k was taken."""
    taken: list[tuple[int, int]] = []  # (train version of the batch, version the engines served then)
    original = RolloutScheduler.get_batch

    async def get_batch(self, train_version):
        batch = await original(self, train_version)
        taken.append((train_version, self.inference_version))
        return batch

    monkeypatch.setattr(RolloutScheduler, "get_batch", get_batch)
    slow_env = "{step_latency: {dist: lognormal, mean_s: 5.0, std_s: 1.0}}"  # rollout outlasts a train step
    cfg = load_config(None, ["train.steps=6", "rollout.batch_size=32", "rollout.group_size=4", "rollout.alpha=1",
                             "rollout.barrier=none", "train.checkpoint_every=1000", "eval.every=1000",
                             f"domains.frozenlake.inject={slow_env}", f"domains.math.inject={slow_env}"])
    report = simulate(cfg, HW)
    assert report.staleness_violations == [] and report.ledger_violations == []
    assert [v for v, _ in taken] == list(range(6))
    # batch 1 was admitted at the pipeline fill with batch 0 and completes before train step 0 ends
    assert all(served == version for version, served in taken[2:]), taken


class _NeverFills:
    async def get_batch(self, version):
        await asyncio.Event().wait()


class _FillsSoon:
    async def get_batch(self, version):
        await asyncio.sleep(0.02)
        return ["batch"]


def _bare_loop() -> RLLoop:
    """The loop over stand-ins of just what these tests reach (a run state, a recorder that takes phases)."""
    recorder = SimpleNamespace(phases=[])
    recorder.phase = recorder.phases.append
    return RLLoop(load_config(None, []), system=SimpleNamespace(resumed=RunState()), recorder=recorder)  # type: ignore[arg-type]


def test_a_failing_background_landing_raises_while_the_loop_waits_for_a_batch():
    async def scenario():
        loop = _bare_loop()

        async def fails():
            await asyncio.sleep(0.01)
            raise RuntimeError("train step 3 failed: worker died")

        loop.rollout = _NeverFills()  # type: ignore[assignment]
        loop.landing = asyncio.create_task(fails())
        with pytest.raises(RuntimeError, match="train step 3 failed"):
            await asyncio.wait_for(loop.get_batch(4), timeout=5)

        async def lands():
            await asyncio.sleep(0)

        loop.rollout = _FillsSoon()  # type: ignore[assignment]
        loop.landing = asyncio.create_task(lands())  # a landing that succeeds leaves the wait alone
        assert await asyncio.wait_for(loop.get_batch(5), timeout=5) == ["batch"]
        assert loop.recorder.phases[-1].metrics["time/get_batch_wait"] > 0  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_loop_that_stops_on_an_error_cancels_its_train_step_and_landing_and_raises_that_error():
    async def scenario():
        loop = _bare_loop()
        forever = asyncio.Event()
        training = asyncio.create_task(forever.wait())
        landing = asyncio.create_task(forever.wait())

        async def steps():
            loop.training, loop.landing = TrainStepInFlight(3, training), landing
            await asyncio.sleep(0)
            raise RuntimeError("get_batch: no batch in 600 s")

        loop._steps = steps  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="no batch in 600 s"):
            await asyncio.wait_for(loop.run(), timeout=5)
        assert training.cancelled() and landing.cancelled()
        assert loop.training is None and loop.landing is None

    asyncio.run(scenario())
