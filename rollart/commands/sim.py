"""`rollart sim [RUN.yaml] --hardware HW.yaml [overrides]`: what a configuration does on a cluster, before renting it.

Runs the cluster twin (rollart.sim): the production control plane and driver loop in virtual time, with
simulated engines, environments, reward and trainer whose times come from the hardware file's cost models.
Prints the step time and its parts, throughput and its price, each pool's utilisation and the invariants
checked; `--json PATH` writes it all. `--preset 1000gpu` runs the built-in 1,000-GPU scenario instead of a
run file. A bad run or hardware file exits 2 with the field named.
"""

from __future__ import annotations

import argparse
import json
import logging

from rollart.commands.common import add_run_args, config_from_args
from rollart.config_loader import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("sim", help="simulate a run on a cluster in virtual time (the cluster twin)")
    add_run_args(parser)
    parser.add_argument("--hardware", metavar="HW.yaml", help="the cluster: model shape, GPU pools, costs")
    parser.add_argument("--preset", choices=["1000gpu"], help="a built-in scenario instead of RUN.yaml + HW.yaml")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH")
    parser.set_defaults(func=_sim)


def _sim(args: argparse.Namespace) -> int:
    from rollart.sim.hardware import load_hardware
    from rollart.sim.run import simulate

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.preset:
        from rollart.sim.presets import thousand_gpus

        cfg, hw = thousand_gpus()
    else:
        if not args.hardware:
            raise ConfigError("rollart sim needs --hardware HW.yaml (or --preset 1000gpu)")
        cfg = config_from_args(args, sources=False)  # the twin draws episodes from profiles, not rows
        try:
            hw = load_hardware(args.hardware)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    try:
        report = simulate(cfg, hw)
    except ValueError as exc:  # the run config and the hardware file disagree (a pool without GPUs …)
        raise ConfigError(str(exc)) from None
    print(render(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": report.summary(), "steps": report.steps, "pools": report.pools,
                       "reward": report.reward, "counters": report.counters}, f, indent=2, default=str)
        print(f"wrote {args.json}")
    return 0 if not report.ledger_violations and not report.staleness_violations else 1


def render(report) -> str:  # noqa: ANN001 — a rollart.sim.run.SimReport
    steady = report.steps[1:] or report.steps
    mean = lambda key: sum(s.get(key, 0.0) for s in steady) / len(steady)  # noqa: E731
    lines = [
        f"{len(report.steps)} steps in {report.virtual_s:.1f} s of cluster time ({report.wall_s:.1f} s to simulate)",
        f"step time {report.mean_step_s():.2f} s (steady state): waiting for the batch {mean('time/get_batch_wait'):.2f} s, "
        f"exposed weight sync {mean('time/weights.exposed'):.2f} s, train step {mean('train_s'):.2f} s (overlapped)",
        f"throughput {report.steady_trajectories_per_s():.3f} trajectories/s at ${report.price_per_hour:,.2f}/h "
        f"= {report.per_dollar_hour() * 3600:.2f} trajectories per dollar",
    ]
    for pool, stats in sorted(report.pools.items()):
        lines.append(f"  {pool}: {stats['engines']:.0f} engines, {stats['busy_fraction']:.0%} busy, "
                     f"prefix hits {stats['prefix_hit_rate']:.0%}")
    lines.append(f"invariants: {len(report.ledger_violations)} ledger and {len(report.staleness_violations)} "
                 "staleness violations")
    return "\n".join(lines)
