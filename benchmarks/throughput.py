"""`rollart bench throughput`: what keeps the trainer from waiting for its batch (RollArt's limit 5), side by side.

On the cluster twin (rollart.sim: the production control plane in virtual time) at 1,000 GPUs — the preset of
`rollart sim --preset 1000gpu` — each arm runs `STEPS` RL steps with the same seed, measured over steps 2 to
`UPTO` (the first fills the pipeline; near its end a run admits less):

- `sync`: α = 0, `rollout.barrier=batch` (the paper's Sync);
- `async`: α = 1, no barrier (rollout and training overlap);
- `async_elastic`, `sync_elastic`: the same with `train.elastic_generation` — between train steps the trainer
  pool's GPUs run engines on the trainer's weights, take new trajectories and the busiest engines' turns, and
  hand everything running there back when the batch is ready (`rollart/sim/elastic.py`).

Per arm, over the steady steps (the first fills the pipeline): step time, trained trajectories per second,
`get_batch idle` — the part of each batch wait with no train step in flight (`time/get_batch_idle`) as a share
of the step —, the trainer pool's busy share (training, and generating while lent), trajectories cancelled as
stale, turns taken back from the trainer's GPUs, and the invariants (ledger, staleness). Ratios:
`<arm>_vs_sync_throughput`, `get_batch_idle_share_<arm>`, `trainer_pool_busy_<arm>`.

Admission paced by measured rollout throughput and an adaptive batch (the issue's items b and c) are not built.

`--quick`: a tenth of the cluster and of the batch, 6 steps measured over 2–5.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import BenchResult
from rollart.sim import presets
from rollart.sim.run import SimReport, simulate

STEPS, UPTO = 12, 9  # runs of 12 steps measured over steps 2–9: near its end a run admits less (its last batches)
ARMS = {  # name: (alpha, barrier, elastic generation)
    "sync": (0, "batch", False),
    "async": (1, "none", False),
    "async_elastic": (1, "none", True),
    "sync_elastic": (0, "batch", True),
}


def arm(name: str, scale: float, steps: int) -> SimReport:
    alpha, barrier, elastic = ARMS[name]
    cfg, hw = presets.scaled_cluster(scale, alpha=alpha, barrier=barrier, steps=steps)
    if elastic:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"elastic_generation": True})})
    return simulate(cfg, hw)


def row(name: str, report: SimReport, upto: int) -> dict[str, Any]:
    steady = report.steps[1:upto]
    mean = lambda key: sum(s.get(key, 0.0) for s in steady) / len(steady)  # noqa: E731
    return {
        "arm": name, "steps": len(report.steps), "measured_steps": f"2-{upto}",
        "mean_step_s": round(report.mean_step_s(upto=upto), 2),
        "trajectories_per_s": round(report.steady_trajectories_per_s(upto=upto), 3),
        "train_s": round(mean("train_s"), 2), "get_batch_wait_s": round(mean("time/get_batch_wait"), 2),
        "get_batch_idle_s": round(mean("time/get_batch_idle"), 2),
        "get_batch_idle_share": round(report.get_batch_idle_share(upto=upto), 3),
        "trainer_pool_busy": round(report.trainer_pool_busy_fraction(), 3),
        "reclaim_s": round(mean("time/trainer.reclaim"), 2),
        "preempted_turns_per_step": round(mean("elastic/preempted_turns"), 1),
        "started": report.counters.get("rollout/started", 0.0), "stale": report.counters.get("buffer/stale", 0.0),
        "busy_fraction": {p: round(v["busy_fraction"], 3) for p, v in report.pools.items()},
        "ledger_violations": len(report.ledger_violations), "staleness_violations": len(report.staleness_violations),
        "wall_s": round(report.wall_s, 1),
    }


def run(quick: bool) -> BenchResult:
    scale, steps, upto = (0.1, 6, 5) if quick else (1, STEPS, UPTO)
    reports = {name: arm(name, scale, steps) for name in ARMS}
    rows = [row(name, r, upto) for name, r in reports.items()]
    sync = reports["sync"].steady_trajectories_per_s(upto=upto)
    ratios: dict[str, float | None] = {}
    for name, report in reports.items():
        if name != "sync":
            ratios[f"{name}_vs_sync_throughput"] = report.steady_trajectories_per_s(upto=upto) / sync
    for name, report in reports.items():
        ratios[f"get_batch_idle_share_{name}"] = report.get_batch_idle_share(upto=upto)
        ratios[f"trainer_pool_busy_{name}"] = report.trainer_pool_busy_fraction()
    gpus = sum(p.count for p in presets.scaled_cluster(scale)[1].pools.values())
    notes = [f"the cluster twin, {gpus} GPUs, {steps} RL steps per arm measured over steps 2-{upto} (the first fills "
             "the pipeline; the last ones admit less, the run ending); the trainer pool's busy share is over the whole "
             "run; every "
             "figure virtual (production control plane, rollart/sim cost models); the switch of the trainer's GPUs "
             "to an engine and back is the hardware file's declared trainer.lend_switch_s (3 s each way)"]
    return BenchResult("throughput", ratios, rows, notes)
