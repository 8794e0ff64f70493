"""`rollart train [RUN.yaml] [overrides]`: run a training job; `resume=true` continues the run in run_dir."""

from __future__ import annotations

import argparse
import json

from rollart.commands.common import add_run_args, config_from_args, setup_logging


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train an agent (the default config runs a multi-task job on CPU)")
    add_run_args(parser)
    parser.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # a bad config stops here, before anything starts
    setup_logging(cfg)
    from rollart.driver import train
    from rollart.observability.report import build_report

    summary = train(cfg)
    report = build_report(cfg.run_dir)
    print(_table(summary))
    print(json.dumps({k: summary[k] for k in ("eval_first", "eval_last", "steps", "wall_s")}, default=str))
    print(f"run directory: {cfg.run_dir}  (report: {report})")
    return 0


def _table(summary: dict) -> str:
    first, last = summary.get("eval_first_by_domain") or {}, summary.get("eval_last_by_domain") or {}
    rows = [f"{'domain':<14}{'first eval':>12}{'last eval':>12}{'change':>10}"]
    for d in sorted(set(first) | set(last)):
        a, b = first.get(d), last.get(d)
        change = f"{b - a:+.3f}" if a is not None and b is not None else "—"
        rows.append(f"{d:<14}{_fmt(a):>12}{_fmt(b):>12}{change:>10}")
    a, b = summary.get("eval_first"), summary.get("eval_last")
    rows.append(f"{'mean':<14}{_fmt(a):>12}{_fmt(b):>12}"
                f"{(f'{b - a:+.3f}' if a is not None and b is not None else '—'):>10}")
    return "\n".join(rows)


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"
