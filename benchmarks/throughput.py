"""`rollart bench throughput`: what keeps the trainer from waiting for its batch (RollArt's limit 5), side by side.

On the cluster twin (rollart.sim: the production control plane in virtual time) at 1,000 GPUs — the preset of
`rollart sim --preset 1000gpu` — each arm runs `STEPS` RL steps with the same seed, measured over steps 2 to
`UPTO` (the first fills the pipeline; near its end a run admits less):

- `sync`: α = 0, `rollout.barrier=batch` — rollout and training alternate, every trajectory advancing on its own
  (the paper's Sync+: its environments and reward asynchronous);
- `sync_turn`: α = 0, `rollout.barrier=turn` — rollout and training alternate and the batch's trajectories
  advance turn by turn in lock step (the paper's Sync, whose environments step together; its reward is still
  scored as each trajectory ends, as Sync+'s is);
- `async`: α = 1, no barrier (rollout and training overlap);
- `async_elastic`, `sync_elastic`: the same with `train.elastic_generation` — between train steps the trainer
  pool's GPUs run engines on the trainer's weights, take new trajectories and the busiest engines' turns, and
  hand everything running there back when the batch is ready (`rollart/sim/elastic.py`);
- `async_paced`: async with `rollout.pacing=measured` — a group whose domain's measured latency does not fit in
  the time its window has left waits for the next weights (`rollart/control/pacing.py`);
- `async_adaptive`: async with `rollout.min_batch_fraction=0.5` — once the trainer is idle, a batch of at least
  half the groups goes when taking it makes no running work stale (`rollart/control/buffer.py`, scheduler.py);
- `async_all`: async with elastic generation, pacing and the adaptive batch together;
- `async_alpha2`, `async_alpha2_all`: α = 2 (up to three batches' worth in flight), alone and with all three —
  whether the window, not the mechanisms, bounds the ratio.

Per arm, over the steady steps (the first fills the pipeline): step time, trained trajectories per second,
`get_batch idle` — the part of each batch wait with no train step in flight (`time/get_batch_idle`) as a share
of the step —, the trainer pool's busy share (training, and generating while lent), trajectories cancelled as
stale and the response tokens wasted, the batch's mean share of `rollout.batch_size`, groups held back by
pacing, turns taken back from the trainer's GPUs, and the invariants (ledger, staleness). Ratios:
`<arm>_vs_sync_throughput`, `get_batch_idle_share_<arm>`, `trainer_pool_busy_<arm>`, `stale_share_<arm>`
(trajectories cancelled stale per trajectory started), and against the paper's Sync
`<arm>_vs_sync_turn_throughput` for `sync`, `async` and `async_all`.

`--quick`: a tenth of the cluster and of the batch, 6 steps measured over 2–5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.common import BenchResult
from rollart.sim import presets
from rollart.sim.run import SimReport, simulate

STEPS, UPTO = 12, 9  # runs of 12 steps measured over steps 2–9: near its end a run admits less (its last batches)
ADAPTIVE_FLOOR = 0.5  # rollout.min_batch_fraction of the adaptive arms


@dataclass(frozen=True)
class Arm:
    alpha: int
    barrier: str
    elastic: bool = False
    pacing: str = "off"
    min_batch_fraction: float = 1.0


ARMS = {
    "sync": Arm(0, "batch"),
    "sync_turn": Arm(0, "turn"),  # α = 0 admits nothing until the step's weights are served: a batch barrier too
    "async": Arm(1, "none"),
    "async_elastic": Arm(1, "none", elastic=True),
    "sync_elastic": Arm(0, "batch", elastic=True),
    "async_paced": Arm(1, "none", pacing="measured"),
    "async_adaptive": Arm(1, "none", min_batch_fraction=ADAPTIVE_FLOOR),
    "async_all": Arm(1, "none", elastic=True, pacing="measured", min_batch_fraction=ADAPTIVE_FLOOR),
    # α = 2: what a wider window (more work in flight) does, alone and with the three mechanisms
    "async_alpha2": Arm(2, "none"),
    "async_alpha2_all": Arm(2, "none", elastic=True, pacing="measured", min_batch_fraction=ADAPTIVE_FLOOR),
}
VS_SYNC_TURN = ("sync", "async", "async_all")  # the arms also compared with the paper's Sync (turns in lock step)


def arm(name: str, scale: float, steps: int) -> SimReport:
    spec = ARMS[name]
    cfg, hw = presets.scaled_cluster(scale, alpha=spec.alpha, barrier=spec.barrier, steps=steps)
    cfg = cfg.model_copy(update={
        "train": cfg.train.model_copy(update={"elastic_generation": spec.elastic}),
        "rollout": cfg.rollout.model_copy(update={"pacing": spec.pacing,
                                                  "min_batch_fraction": spec.min_batch_fraction}),
    })
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
        "preempted_turns_per_step": round(mean("train/lent_preempted_turns"), 1),
        "started": report.counters.get("rollout/started", 0.0), "stale": report.counters.get("buffer/stale", 0.0),
        "wasted_response_tokens": report.counters.get("buffer/wasted_tokens", 0.0),
        "batch_fraction": round(mean("rollout/batch_fraction") if steady and "rollout/batch_fraction" in steady[0]
                                else 1.0, 3),
        "pacing_held_back": report.counters.get("rollout/pacing_held_back", 0.0),
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
    sync_turn = reports["sync_turn"].steady_trajectories_per_s(upto=upto)
    for name in VS_SYNC_TURN:
        ratios[f"{name}_vs_sync_turn_throughput"] = reports[name].steady_trajectories_per_s(upto=upto) / sync_turn
    for name, report in reports.items():
        ratios[f"get_batch_idle_share_{name}"] = report.get_batch_idle_share(upto=upto)
        ratios[f"trainer_pool_busy_{name}"] = report.trainer_pool_busy_fraction()
        started = report.counters.get("rollout/started", 0.0)
        ratios[f"stale_share_{name}"] = report.counters.get("buffer/stale", 0.0) / started if started else 0.0
    gpus = sum(p.count for p in presets.scaled_cluster(scale)[1].pools.values())
    notes = [f"the cluster twin, {gpus} GPUs, {steps} RL steps per arm measured over steps 2-{upto} (the first fills "
             "the pipeline; the last ones admit less, the run ending); the trainer pool's busy share is over the whole "
             "run; every "
             "figure virtual (production control plane, rollart/sim cost models); the switch of the trainer's GPUs "
             "to an engine and back is the hardware file's declared trainer.lend_switch_s (3 s each way)",
             f"adaptive arms: rollout.min_batch_fraction={ADAPTIVE_FLOOR}; paced arms: rollout.pacing=measured; "
             "stale_share: trajectories cancelled STALE per trajectory started, over the whole run"]
    return BenchResult("throughput", ratios, rows, notes)
