"""The twin runs the production control plane and reproduces `rollart bench rollout` on this machine.

The real bench cannot run in a test (minutes of env latency). The comparison is with the committed result
of a real run, `benchmarks/rollout.json` (its date and commit are in the file): the twin, with its cost
models set to this machine's measured costs (`rollart.sim.calibration`: engine figures from `rollart bench
engine`, token counts of the bench's FrozenLake prompts under the tiny tokenizer), runs the bench's own
configuration and its own measuring function (`rollart.bench.rollout._measure`), and every ratio
"trajectory-level over turn barrier" must be within 15% of the real one.
"""

import json
from pathlib import Path

import pytest

from rollart.bench.rollout import SIGMAS, _measure, bench_config
from rollart.control import RolloutScheduler, SampleBuffer, TurnBarrier
from rollart.inference.proxy import LLMProxy
from rollart.reward.router import RewardRouter
from rollart.sim.calibration import build_machine, frozenlake_tiny, with_profiles
from rollart.sim.clock import run_virtual
from rollart.sim.system import SimSystem

REAL = json.loads((Path(__file__).parents[2] / "benchmarks" / "rollout.json").read_text())


def test_the_twin_wires_the_production_classes(tmp_path: Path) -> None:
    cfg = with_profiles(bench_config(1.0, 4, 16, str(tmp_path)), frozenlake_tiny(4))

    async def main() -> SimSystem:
        system = SimSystem(cfg, build_machine())
        system.start_rollout(1)
        await system.close()
        return system

    system = run_virtual(main())
    assert type(system.scheduler) is RolloutScheduler and type(system.scheduler.buffer) is SampleBuffer
    assert type(system.proxy_impl) is LLMProxy and type(system.reward) is RewardRouter
    assert type(system.barrier) is TurnBarrier and system.scheduler.gate is system.barrier


@pytest.mark.parametrize("batch,turns", [(16, 8), (64, 16)])
def test_ratios_within_15_percent_of_the_real_bench(tmp_path: Path, batch: int, turns: int) -> None:
    assert not REAL["quick"] and REAL["bench"] == "rollout"
    cfg = with_profiles(bench_config(1.0, turns, batch, str(tmp_path)), frozenlake_tiny(turns))

    async def main() -> list[dict]:
        system = SimSystem(cfg, build_machine())
        try:
            return await _measure(system, 2)
        finally:
            await system.close()

    rows = run_virtual(main())
    for rel in SIGMAS:
        by = {r["barrier"]: r["s_per_batch"] for r in rows if r["sigma_over_mu"] == rel}
        twin = by["turn"] / by["none"]
        real = REAL["ratios"][f"traj_vs_turn_barrier_sigma_{rel}_b{batch}_t{turns}"]
        assert abs(twin - real) / real <= 0.15, (rel, twin, real)
