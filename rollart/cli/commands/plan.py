"""`rollart plan [RUN.yaml] --hardware HW.yaml --budget USD_PER_HOUR [--gpus H800,H20] --out DIR`.

Chooses pool sizes and the domain → pool mapping that maximise trained trajectories per second per dollar
(the twin scores the candidates, rollart/plan/search.py). It first says what it filled in for the cluster
(a domain's default profile, token budgets raised to hold its episodes: rollart/plan/cluster.py), then
prints each twin run as it ends, the mapping, the predicted step time breakdown, the cost (the budget buys
the generation GPUs; the training pool and any reserved reward GPUs come on top, and it says so), a
warning when the batch cannot keep the engines busy, and the gain over the best homogeneous cluster. It
writes to DIR `run.yaml` (the run on the cluster: its model, pools and budgets), `ray_start.sh` (one `ray
start` per node) and `raycluster.yaml` (a KubeRay RayCluster), whose nodes' resources add up to the run's
pools (rollart/plan/outputs.py). The hardware file gives the model, the training pool and the cost-model
settings; its generation pools are replaced.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rollart.cli.commands.common import add_run_args, config_from_args
from rollart.config.loader import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="choose GPU pools and the domain → pool mapping for a budget")
    add_run_args(parser)
    parser.add_argument("--hardware", metavar="HW.yaml", required=True,
                        help="model shape, training pool, cost-model settings")
    parser.add_argument("--budget", type=float, required=True, help="USD per hour for the generation GPUs")
    parser.add_argument("--gpus", default="H800,H20", help="GPU kinds to consider (catalogue names)")
    parser.add_argument("--node", type=int, default=8, help="GPUs per node: pools grow in whole nodes")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallelism of each inference engine")
    parser.add_argument("--steps", type=int, default=4, help="RL steps the twin runs per candidate")
    parser.add_argument("--top-k", type=int, default=4, help="candidates the twin scores (by the analytic rank)")
    parser.add_argument("--out", default="plan", help="directory for run.yaml, ray_start.sh, raycluster.yaml")
    parser.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    import yaml

    from rollart.cli.commands.sim import render
    from rollart.plan import plan, ray_start_lines, raycluster_manifest, run_yaml
    from rollart.plan.cluster import for_the_cluster
    from rollart.plan.outputs import planned_config
    from rollart.plan.search import costs
    from rollart.sim.hardware import load_hardware

    cfg = config_from_args(args)
    try:
        hw = load_hardware(args.hardware)
        cfg, notes = for_the_cluster(cfg, hw)
        for note in notes:
            print(f"note: {note}")
        kinds = [k.strip() for k in args.gpus.split(",") if k.strip()]
        result = plan(cfg, hw, kinds, args.budget, node=args.node, tp=args.tp, steps=args.steps, top_k=args.top_k,
                      progress=lambda i, n, s: print(f"  twin {i}/{n}: {s.candidate.describe()}: "
                                                     f"{s.score * 3600:.2f} trajectories per dollar", flush=True),
                      check=lambda run, cand: planned_config(run, hw, cand, args.tp))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    best = result.best
    print(f"plan: {best.candidate.describe()}")
    assert best.report is not None
    print(render(best.report, result.run))
    price = costs(hw, best.candidate)
    extra = [f"${price[k]:,.2f}/h {what}" for k, what in (
        ("training", f"training ({hw.pools[hw.train_pool].count} {hw.pools[hw.train_pool].gpu} of the hardware "
                     f"file's pool {hw.train_pool})"),
        ("reward", "reserved reward GPUs"), ("env", "CPU env nodes")) if price[k]]
    print(f"cost ${price['total']:,.2f}/h = ${price['generation']:,.2f}/h generation GPUs (the budget: "
          f"${args.budget:,.2f}/h, spent in whole nodes of {args.node})" + "".join(f" + {e}" for e in extra)
          + (" — the budget buys the generation GPUs only" if extra else ""))
    engines = sum(gpus // args.tp for _, _, gpus in best.candidate.pools)
    in_flight = (result.run.rollout.alpha + 1) * result.run.rollout.batch_size
    if in_flight < engines:
        print(f"warning: rollout.batch_size={result.run.rollout.batch_size} with α={result.run.rollout.alpha} keeps "
              f"at most {in_flight} trajectories in flight for {engines} inference engines: most engines idle; "
              "a cluster this size wants a far larger batch")
    homo = result.best_homogeneous
    if homo is best:
        print("the best plan is a homogeneous cluster")
    else:
        print(f"gain over the best homogeneous cluster ({homo.candidate.describe()}): "
              f"{result.gain_over_homogeneous:.2f}× trajectories per second per dollar")
    out = Path(args.out)
    try:
        files = {
            "run.yaml": run_yaml(result.run, hw, best.candidate, args.tp, notes),
            "ray_start.sh": "\n".join(ray_start_lines(result.run, hw, best.candidate, args.tp, args.node)) + "\n",
            "raycluster.yaml": yaml.safe_dump(raycluster_manifest(result.run, hw, best.candidate, args.tp, args.node),
                                              sort_keys=False),
        }
    except ValueError as exc:  # the planned run is not a valid config (e.g. more trainer GPUs than the batch)
        raise ConfigError(f"the planned run is not a valid run config: {exc}") from None
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    print(f"wrote {out}/run.yaml, {out}/ray_start.sh, {out}/raycluster.yaml (`rollart config show {out}/run.yaml "
          "--cluster` checks the run here)")
    return 0
