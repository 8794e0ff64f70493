"""`rollart report RUN_DIR`: write RUN_DIR/report/index.html (plots of a finished or running run)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("report", help="write a self-contained HTML report of a run")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (its run_dir)")
    parser.add_argument("--gantt-rows", type=int, default=None,
                        help="trajectories in the Gantt chart (default: observability.gantt_rows of the run)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rollart.observability import build_report

    if args.gantt_rows is not None and args.gantt_rows < 1:
        print(f"rollart: --gantt-rows must be ≥ 1, got {args.gantt_rows}", file=sys.stderr)
        return 2
    try:
        path = build_report(args.run_dir, gantt_rows=args.gantt_rows)
    except ValueError as exc:
        print(f"rollart: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
