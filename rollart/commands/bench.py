"""`rollart bench NAME [--quick] [--json PATH] [options]`: run one benchmark and print (and save) its ratios.

Options that only some benchmarks take are declared once in `ONLY_FOR` (option → benchmarks); giving one to
another benchmark is an error that names both. `staleness` is a long study run in resumable pieces:
`--piece ARM/SEED|next` runs one arm × seed and adds it to the study file `--json`; `--report` only rebuilds
the summary and curves from that file.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# CLI name → module under rollart.bench exposing run(quick: bool, **options) -> BenchResult
BENCHES: dict[str, str] = {
    "engine": "rollart.bench.engine",
    "weights": "rollart.bench.weights",
    "reward": "rollart.bench.reward",
    "rollout": "rollart.bench.rollout",
    "async": "rollart.bench.async_training",
    "staleness": "rollart.bench.staleness",
    "chaos": "rollart.bench.chaos",
    "sim": "rollart.bench.sim",
    "gateway": "rollart.bench.gateway",
    "sandbox": "rollart.bench.sandbox",
    "envs": "rollart.bench.envs",
}
# option (its argparse dest, also the run() keyword) → the benchmarks that take it
ONLY_FOR: dict[str, tuple[str, ...]] = {
    "engine": ("engine",),
    "jobs": ("reward",),
    "piece": ("staleness",),
    "report": ("staleness",),
    "lock": ("staleness",),
    "nodes": ("chaos",),
}
STUDIES = {"staleness"}  # benches run piece by piece into their --json file (run() gets json_path)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="run a benchmark (ratios measured side by side)")
    parser.add_argument("name", help=f"one of: {', '.join(sorted(BENCHES)) or '(none yet)'}")
    parser.add_argument("--quick", action="store_true", help="smoke version, under a minute")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH (a study: its file, "
                        "read and extended)")
    parser.add_argument("--engine", choices=("builtin", "vllm"),
                        help="engine bench only: builtin (default) vs generate, or vllm vs builtin vs generate "
                             "(run it from .venv-vllm)")
    parser.add_argument("--jobs", type=int, metavar="N", help="reward bench only: N jobs sharing one service")
    parser.add_argument("--piece", metavar="ARM/SEED|next", help="staleness: run one arm × seed of the study "
                        "(holding the heavy-job lock) and add it to --json; 'next' = the first one missing")
    parser.add_argument("--report", action="store_true", default=None, help="staleness: rebuild the summary and "
                        "PNG curves from --json without running anything")
    parser.add_argument("--lock", metavar="PATH", help="staleness: file each piece holds an exclusive flock on "
                        "while it runs (default /tmp/rollart-heavy.lock; '' = none)")
    parser.add_argument("--nodes", type=int, metavar="N",
                        help="chaos bench only: run on a loopback Ray cluster of N nodes and lose one")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rollart.bench.common import to_json, write_json

    if args.name not in BENCHES:
        print(f"rollart: unknown benchmark '{args.name}'; choose one of: {', '.join(sorted(BENCHES))}",
              file=sys.stderr)
        return 2
    options = {dest: getattr(args, dest) for dest in ONLY_FOR if getattr(args, dest, None) is not None}
    for dest in options:
        if args.name not in ONLY_FOR[dest]:
            print(f"rollart: --{dest} applies to 'rollart bench {'|'.join(ONLY_FOR[dest])}' only, not "
                  f"'{args.name}'", file=sys.stderr)
            return 2
    for dest in ("jobs", "nodes"):
        if options.get(dest, 1) < 1:
            print(f"rollart: --{dest} takes a count ≥ 1, not {options[dest]}", file=sys.stderr)
            return 2
    module = importlib.import_module(BENCHES[args.name])
    if args.name in STUDIES:
        try:
            result = module.run(quick=args.quick, json_path=args.json, **options)
        except ValueError as exc:  # a bad --piece or study file: the message names it
            print(f"rollart: {exc}", file=sys.stderr)
            return 2
    else:  # a ValueError inside another benchmark is a bug: its traceback stays
        result = module.run(quick=args.quick, **options)
    argv = ["bench", args.name] + (["--quick"] if args.quick else []) + (["--json", args.json] if args.json else [])
    for dest, value in options.items():
        argv += [f"--{dest}"] if value is True else [f"--{dest}", str(value)]
    payload = to_json(result, args.quick, argv)
    for row in result.rows:
        print("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    for note in result.notes:
        print(f"  note: {note}")
    for name, value in result.ratios.items():
        print(f"{name}: {value:.3f}")
    if args.json:  # a study's file: its records so far (result.data), this piece's included
        write_json(payload, args.json)
        print(f"wrote {args.json}")
    return 0
