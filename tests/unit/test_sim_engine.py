"""SimEngine: continuous batching in virtual time against the cost model, abort, prefix reuse, versions."""

import asyncio

import pytest

from rollart.sim.clock import run_virtual
from rollart.sim.costs import EngineCost, WeightSyncCost
from rollart.sim.engine import SimEngine
from rollart.sim.hardware import MODEL_SHAPES, EngineEfficiency, WeightSyncSpec, load_catalogue
from rollart.sim.tokens import Runs
from rollart.sim.trainer import WeightChannel
from rollart.types import GenerationRequest, SamplingParams

COST = EngineCost(MODEL_SHAPES["qwen3-8b"], load_catalogue().gpu("H800"), 1, EngineEfficiency(max_batch=4))


def engine() -> SimEngine:
    channel = WeightChannel(WeightSyncCost(MODEL_SHAPES["qwen3-8b"], 50.0, WeightSyncSpec(swap_s=0.1), engines=1))
    return SimEngine("inference/h800/0", COST, channel, 0)


def request(tid: str, context: int, new: int, turn: int = 0) -> GenerationRequest:
    return GenerationRequest(f"{tid}/{turn}", tid, "d", Runs.of(0, context), SamplingParams(max_new_tokens=new))


def test_one_request_takes_its_prefill_then_its_decode_steps() -> None:
    async def main() -> tuple[float, object]:
        result = await engine().generate(request("t", 1000, 100))
        return asyncio.get_running_loop().time(), result

    now, result = run_virtual(main())
    # the fluid model evaluates the step time at the start (KV grows by 100 tokens over the request: <1%)
    expected = COST.prefill_s(1000) + 100 * COST.decode_step_s(1, 1000)
    assert now == pytest.approx(expected, rel=0.01)
    assert len(result.token_ids) == 100 and result.finish_reason == "stop" and set(result.versions) == {0}
    assert result.prompt_tokens == 1000 and result.prefill_tokens == 1000


def test_batching_beats_running_one_after_another_and_the_batch_is_capped() -> None:
    async def main(n: int) -> float:
        e = engine()
        await asyncio.gather(*(e.generate(request(f"t{i}", 100, 200)) for i in range(n)))
        return asyncio.get_running_loop().time()

    one, four, eight = (run_virtual(main(n)) for n in (1, 4, 8))
    assert four < 1.5 * one  # decode is bandwidth-bound: four share each step
    assert eight == pytest.approx(2 * four, rel=0.1)  # max_batch 4: the second four wait


def test_abort_returns_the_tokens_so_far() -> None:
    async def main() -> object:
        e = engine()
        task = asyncio.ensure_future(e.generate(request("t", 100, 1000)))
        await asyncio.sleep(COST.prefill_s(100) + 10.5 * COST.decode_step_s(1, 100))
        await e.abort("t")
        return await task

    result = run_virtual(main())
    assert result.finish_reason == "abort" and 9 <= len(result.token_ids) <= 11


def test_sticky_trajectory_reuses_its_prefix() -> None:
    async def main() -> tuple[int, int]:
        e = engine()
        await e.generate(request("t", 1000, 50))
        second = await e.generate(request("t", 1000 + 50 + 200, 50, turn=1))
        return second.prefill_tokens, second.prompt_tokens

    assert run_virtual(main()) == (200, 1250)


def test_tokens_after_a_weight_update_carry_the_new_version() -> None:
    async def main() -> object:
        e = engine()
        task = asyncio.ensure_future(e.generate(request("t", 100, 100)))
        await asyncio.sleep(COST.prefill_s(100) + 40 * COST.decode_step_s(1, 100))
        e.weights.publish(1, asyncio.get_running_loop().time() - 1000)  # pulled long ago: only the swap waits
        timings = await e.update_weights(1)
        assert timings["exposed_s"] == pytest.approx(0.1)
        return await task

    result = run_virtual(main())
    versions = list(result.versions)
    assert len(versions) == 100 and versions[0] == 0 and versions[-1] == 1
    assert versions == sorted(versions) and 38 <= versions.count(0) <= 42
