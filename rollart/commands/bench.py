"""`rollart bench NAME [--quick] [--json PATH]`: run one benchmark and print (and save) its ratios."""

from __future__ import annotations

import argparse
import importlib
import sys

# CLI name → module under rollart.bench exposing run(quick: bool) -> BenchResult
BENCHES: dict[str, str] = {
    "engine": "rollart.bench.engine",
    "weights": "rollart.bench.weights",
    "reward": "rollart.bench.reward",
    "rollout": "rollart.bench.rollout",
    "async": "rollart.bench.async_training",
}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="run a benchmark (ratios measured side by side)")
    parser.add_argument("name", help=f"one of: {', '.join(sorted(BENCHES)) or '(none yet)'}")
    parser.add_argument("--quick", action="store_true", help="smoke version, under a minute")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    parser.add_argument("--engine", choices=("builtin", "vllm"),
                        help="engine bench only: builtin (default) vs generate, or vllm vs builtin vs generate "
                             "(run it from .venv-vllm)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rollart.bench.common import to_json, write_json

    if args.name not in BENCHES:
        print(f"rollart: unknown benchmark '{args.name}'; choose one of: {', '.join(sorted(BENCHES))}",
              file=sys.stderr)
        return 2
    engine = getattr(args, "engine", None)
    if engine and args.name != "engine":
        print(f"rollart: --engine applies to 'rollart bench engine' only, not '{args.name}'", file=sys.stderr)
        return 2
    options = {"engine": engine} if engine else {}
    result = importlib.import_module(BENCHES[args.name]).run(quick=args.quick, **options)
    argv = (["bench", args.name] + (["--engine", engine] if engine else []) + (["--quick"] if args.quick else [])
            + (["--json", args.json] if args.json else []))
    payload = to_json(result, args.quick, argv)
    for row in result.rows:
        print("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    for note in result.notes:
        print(f"  note: {note}")
    for name, value in result.ratios.items():
        print(f"{name}: {value:.3f}")
    if args.json:
        write_json(payload, args.json)
        print(f"wrote {args.json}")
    return 0
