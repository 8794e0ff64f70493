"""`rollart sim [RUN.yaml] --hardware HW.yaml [overrides]`: what a configuration does on a cluster, before renting it.

Runs the cluster twin (rollart.sim): the production control plane and driver loop in virtual time, with
simulated engines, environments, reward and trainer whose times come from the hardware file's cost models.
Says first what it simulates (steps, batch, model, each pool with its GPUs and domains, where each domain's
episode profile comes from: declared, or its kind's default, rollart/sim/profiles.py), then prints the step
time and the parts that add up to it, throughput and its price, each pool's utilisation and the invariants
checked; `--json PATH` writes it all. `--preset 1000gpu` (or `10000gpu`) runs a built-in scenario instead
of a run file. A bad run or hardware file exits 2 with the field named.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import TYPE_CHECKING, Mapping, Sequence

from rollart.cli.commands.common import add_run_args, config_from_args
from rollart.config.loader import ConfigError

if TYPE_CHECKING:
    from rollart.config import RunConfig
    from rollart.sim.hardware import SimHardware


# --preset NAME: (function of rollart.sim.presets, what it is)
PRESETS = {"1000gpu": ("thousand_gpus", "the paper's scale, 50 steps"),
           "10000gpu": ("ten_thousand_gpus", "ten times the paper's scale, 10 steps")}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("sim", help="simulate a run on a cluster in virtual time (the cluster twin)")
    add_run_args(parser)
    parser.add_argument("--hardware", metavar="HW.yaml", help="the cluster: model shape, GPU pools, costs")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a built-in scenario instead of RUN.yaml + HW.yaml")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH")
    parser.set_defaults(func=_sim)


def _sim(args: argparse.Namespace) -> int:
    from rollart.sim.hardware import load_hardware
    from rollart.sim.profiles import with_profiles
    from rollart.sim.run import simulate

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.preset:
        from rollart.sim import presets

        cfg, hw = getattr(presets, PRESETS[args.preset][0])()
        print(f"preset {args.preset}: {PRESETS[args.preset][1]} — frozenlake, math and game domains at paper-scale "
              "episode profiles (rollart/sim/presets.py)")
    else:
        if not args.hardware:
            raise ConfigError("rollart sim needs --hardware HW.yaml (or --preset 1000gpu)")
        cfg = config_from_args(args, local=False)  # the twin needs no rows, checkpoint or vLLM here
        try:
            hw = load_hardware(args.hardware)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    try:
        cfg, notes = with_profiles(cfg)
        print(describe(cfg, hw, notes), flush=True)
        report = simulate(cfg, hw, on_step=StepProgress(cfg.train.steps))
    except ValueError as exc:  # the run config and the hardware file disagree (a pool without GPUs …)
        raise ConfigError(str(exc)) from None
    print(render(report, cfg))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": report.summary(), "steps": report.steps, "pools": report.pools,
                       "reward": report.reward, "counters": report.counters}, f, indent=2, default=str)
        print(f"wrote {args.json}")
    return 0 if not report.ledger_violations and not report.staleness_violations else 1


class StepProgress:
    """One line per simulated step: its cluster time, the wall time so far and an estimate of what is left
    (a large twin runs for minutes)."""

    def __init__(self, steps: int) -> None:
        self.steps, self.started = steps, time.monotonic()

    def __call__(self, step: int, record: Mapping[str, float]) -> None:
        from rollart.observability.progress import format_duration

        done, wall = step + 1, time.monotonic() - self.started
        left = wall / done * (self.steps - done)
        print(f"  step {done}/{self.steps}: {record['step_s']:.1f} s of cluster time, {record['trajectories']:.0f} "
              f"trajectories; {format_duration(wall)} so far, about {format_duration(left)} left", flush=True)


def describe(cfg: RunConfig, hardware: SimHardware, notes: Sequence[str] = ()) -> str:
    """What the twin is about to simulate: the steps and batch, the model, each pool and its domains, the
    weight link, the reward, and where each domain's episode profile comes from."""
    r = cfg.rollout
    model = hardware.model
    lines = [f"simulating {cfg.train.steps} RL step{'s' if cfg.train.steps != 1 else ''} of batches of "
             f"{r.batch_size} trajectories (groups of {r.group_size}, α={r.alpha}, barrier {r.barrier}) of "
             f"{model.name} ({model.params:.3g} parameters) on:"]
    for name, pool in sorted(hardware.pools.items()):
        if name == hardware.train_pool:
            lines.append(f"  {name}: {pool.count} {pool.gpu}, the trainer")
            continue
        domains = sorted(d for d, dc in cfg.domains.items() if dc.pool == name)
        lines.append(f"  {name}: {pool.count} {pool.gpu}, tp {pool.tp} = {pool.count // pool.tp} engines, generating "
                     f"for {', '.join(domains) if domains else 'no domain'}")
    w = hardware.weights
    lines.append(f"  weights over {w.link} in {w.bucket_gb:g} GB buckets"
                 f"{', overlapped with rollout' if w.overlap else ', stop-the-world'}; reward "
                 + {"none": "takes no time", "reserved": f"on {hardware.reward.workers} reserved {hardware.reward.gpu}",
                    "serverless": f"serverless, up to {hardware.reward.max_replicas} replicas"}[hardware.reward.mode])
    lines += [f"  {note}" for note in notes]
    for name, dc in sorted(cfg.domains.items()):
        prof = dc.profile
        if prof is not None and prof.response_tokens.mean > dc.max_new_tokens:
            lines.append(f"  {name}: its responses are cut at max_new_tokens={dc.max_new_tokens} (the profile's mean is "
                         f"{prof.response_tokens.mean:g}); raise domains.{name}.max_new_tokens to simulate them whole")
        if prof is not None and prof.turns.mean > dc.max_turns:
            lines.append(f"  {name}: its episodes are cut at max_turns={dc.max_turns} (the profile's mean is "
                         f"{prof.turns.mean:g} turns)")
    return "\n".join(lines)


def render(report, cfg: RunConfig | None = None) -> str:  # noqa: ANN001 — a rollart.sim.run.SimReport
    """The twin's report. The step time's two parts add up to it: the wait for the batch, and the rest of the
    loop — waiting for the train step in flight to land (its train step and weight sync), an evaluation. The
    train step and weight sync start in the background while the next batch fills when they overlap rollout
    (α ≥ 1, no batch barrier), else they run in line."""
    steady = report.steps[1:] or report.steps
    mean = lambda key: sum(s.get(key, 0.0) for s in steady) / len(steady)  # noqa: E731
    step_s, wait_s = report.mean_step_s(), mean("time/get_batch_wait")
    overlapped = cfg is None or (cfg.rollout.alpha >= 1 and cfg.rollout.barrier != "batch")
    lines = [
        f"{len(report.steps)} steps in {report.virtual_s:.1f} s of cluster time ({report.wall_s:.1f} s to simulate)",
        f"step time {step_s:.2f} s (steady state) = waiting for the batch {wait_s:.2f} s + waiting for the train "
        f"step in flight to land, or an evaluation {max(step_s - wait_s, 0.0):.2f} s",
        f"  per step: train step {mean('train_s'):.2f} s, weight sync {mean('time/weights.exposed'):.2f} s with "
        "generation suspended; "
        + ("both start in the background while the next batch fills" if overlapped else "both in line"),
        f"throughput {report.steady_trajectories_per_s():.3f} trajectories/s at ${report.price_per_hour:,.2f}/h "
        f"= {report.per_dollar_hour() * 3600:.2f} trajectories per dollar",
    ]
    for pool, stats in sorted(report.pools.items()):
        lines.append(f"  {pool}: {stats['engines']:.0f} engines, {stats['busy_fraction']:.0%} busy, "
                     f"prefix hits {stats['prefix_hit_rate']:.0%}")
    lines.append(f"the twin: {report.turns:,.0f} generation turns, {report.cpu_us_per_turn:.0f} µs of CPU per turn "
                 f"(control plane + cost models), {report.control_core_share:.1%} of one core per second of cluster time")
    lines.append(f"invariants: {len(report.ledger_violations)} ledger and {len(report.staleness_violations)} "
                 "staleness violations")
    return "\n".join(lines)
