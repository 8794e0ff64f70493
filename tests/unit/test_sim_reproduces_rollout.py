"""The twin runs the production control plane and reproduces `rollart bench rollout` on this machine.

The real bench cannot run in a test (minutes of env latency). The comparison is with the committed result
of a real run, `benchmarks/rollout.json` (its date and commit are in the file): the twin, with its cost
models set to this machine's measured costs (`rollart.sim.calibration`: engine figures from `rollart bench
engine`, token counts of the bench's FrozenLake prompts under the tiny tokenizer), runs the bench's own
configuration and measuring function (`benchmarks.rollout._measure`, through `rollart bench sim`'s
`rollout_ratios_vs_real`), and every ratio "trajectory-level over turn barrier" must be within 15% of the
real one.
"""

import json
from pathlib import Path

from benchmarks.rollout import bench_config
from benchmarks.sim import REAL_ROLLOUT, rollout_ratios_vs_real
from rollart.control import RolloutScheduler, SampleBuffer, LocalTurnBarrier
from rollart.inference.proxy import LLMProxy
from rollart.reward.client import LocalRewardClient
from rollart.sim.calibration import build_machine, frozenlake_tiny, with_profiles
from rollart.sim.clock import run_virtual
from rollart.sim.system import SimSystem


def test_the_twin_wires_the_production_classes(tmp_path: Path) -> None:
    cfg = with_profiles(bench_config(1.0, 4, 16, str(tmp_path)), frozenlake_tiny(4))

    async def main() -> SimSystem:
        system = SimSystem(cfg, build_machine())
        system.start_rollout(1)
        await system.close()
        return system

    system = run_virtual(main())
    assert type(system.scheduler) is RolloutScheduler and type(system.scheduler.buffer) is SampleBuffer
    assert type(system.proxy_impl) is LLMProxy and type(system.reward.client) is LocalRewardClient
    assert type(system.turn_barrier) is LocalTurnBarrier and system.scheduler.collection.turn_barrier is system.turn_barrier


def test_ratios_within_15_percent_of_the_real_bench() -> None:
    real = json.loads(REAL_ROLLOUT.read_text())
    assert not real["quick"] and real["bench"] == "rollout"
    twin, errors = rollout_ratios_vs_real(real)
    assert len(twin) == 6  # three σ/μ at both measured scales
    assert max(errors.values()) <= 0.15, {k: (round(twin[k], 3), round(real["ratios"][k], 3)) for k in twin}
