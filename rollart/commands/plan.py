"""`rollart plan [RUN.yaml] --hardware HW.yaml --budget USD_PER_HOUR [--gpus H800,H20] --out DIR`.

Chooses pool sizes and the domain → pool mapping that maximise trained trajectories per second per dollar
(the twin scores the candidates, rollart/plan/search.py), prints the mapping, the predicted step time
breakdown and the gain over the best homogeneous cluster, and writes to DIR: `run.yaml` (the run file),
`ray_start.sh` (one `ray start` per node) and `raycluster.yaml` (a KubeRay RayCluster). The hardware file
gives the model, the training pool and the cost-model settings; its generation pools are replaced.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rollart.commands.common import add_run_args, config_from_args
from rollart.config_loader import ConfigError


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

    from rollart.commands.sim import render
    from rollart.plan import plan, ray_start_lines, raycluster_manifest, run_yaml
    from rollart.sim.hardware import load_hardware

    cfg = config_from_args(args)
    try:
        hw = load_hardware(args.hardware)
        kinds = [k.strip() for k in args.gpus.split(",") if k.strip()]
        result = plan(cfg, hw, kinds, args.budget, node=args.node, tp=args.tp, steps=args.steps, top_k=args.top_k,
                      progress=lambda i, n, s: print(f"  twin {i}/{n}: {s.candidate.describe()}: "
                                                     f"{s.score * 3600:.2f} trajectories per dollar"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    best = result.best
    print(f"plan: {best.candidate.describe()}")
    assert best.report is not None
    print(render(best.report))
    homo = result.best_homogeneous
    print(f"gain over the best homogeneous cluster ({homo.candidate.describe()}): "
          f"{result.gain_over_homogeneous:.2f}× trajectories per second per dollar")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.yaml").write_text(run_yaml(cfg, hw, best.candidate, args.tp))
    (out / "ray_start.sh").write_text("\n".join(ray_start_lines(cfg, hw, best.candidate, args.tp, args.node)) + "\n")
    (out / "raycluster.yaml").write_text(yaml.safe_dump(raycluster_manifest(cfg, hw, best.candidate, args.tp, args.node),
                                                        sort_keys=False))
    print(f"wrote {out}/run.yaml, {out}/ray_start.sh, {out}/raycluster.yaml")
    return 0
