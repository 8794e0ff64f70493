"""`rollart bench NAME [--quick] [--json PATH]`: run one benchmark and print (and save) its ratios.

`staleness` is a long study run in resumable pieces: `--piece ARM/SEED|next` runs one arm × seed and adds
it to the study file `--json`; `--report` only rebuilds the summary and curves from that file.
"""

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
    "staleness": "rollart.bench.staleness",
}
STUDIES = {"staleness"}  # benches run piece by piece into their --json file


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="run a benchmark (ratios measured side by side)")
    parser.add_argument("name", help=f"one of: {', '.join(sorted(BENCHES)) or '(none yet)'}")
    parser.add_argument("--quick", action="store_true", help="smoke version, under a minute")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH (a study: its file, "
                        "read and extended)")
    parser.add_argument("--piece", metavar="ARM/SEED|next", help="staleness: run one arm × seed of the study "
                        "(holding the heavy-job lock) and add it to --json; 'next' = the first one missing")
    parser.add_argument("--report", action="store_true", help="staleness: rebuild the summary and PNG curves "
                        "from --json without running anything")
    parser.add_argument("--lock", metavar="PATH", default="/tmp/rollart-heavy.lock",
                        help="staleness: file each piece holds an exclusive flock on while it runs ('' = none)")
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
    study_args = args.piece is not None or args.report
    if study_args and args.name not in STUDIES:
        print(f"rollart: --piece and --report are for {', '.join(sorted(STUDIES))}, not '{args.name}'", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHES[args.name])
    if args.name in STUDIES:
        try:
            result = module.run(quick=args.quick, piece=args.piece, report=args.report, json_path=args.json,
                                lock=args.lock)
        except ValueError as exc:
            print(f"rollart: {exc}", file=sys.stderr)
            return 2
    else:
        result = module.run(quick=args.quick, **({"engine": engine} if engine else {}))
    argv = (["bench", args.name] + (["--engine", engine] if engine else []) + (["--quick"] if args.quick else [])
            + (["--json", args.json] if args.json else []))
    argv += (["--piece", args.piece] if args.piece else []) + (["--report"] if args.report else [])
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
