"""`rollart pools [RUN.yaml] [overrides]`: start (or join) the cluster, place nothing, show every pool.

Prints, per pool: kind, device, capacity, free slots, fallback chain, fallbacks taken (in/out) and the
Ray nodes that hold its resource. A config error exits 2 before anything starts; a cluster that lacks a
declared pool exits 1 with the `ray start --resources` line that would declare it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Iterable

from rollart.cli.commands.common import add_run_args, config_from_args

COLUMNS = ("pool", "kind", "device", "capacity", "free", "fallback", "fallbacks in/out", "nodes")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("pools", help="start or join the cluster and show each resource pool")
    add_run_args(parser)
    parser.set_defaults(func=_run)


def pool_rows(statuses: Iterable) -> list[tuple[str, ...]]:
    """Table rows (strings, in COLUMNS order) from `PoolStatus` records."""
    rows = []
    for s in statuses:
        nodes = ", ".join(f"{n.address} ({n.node_id[:8]}) ×{n.amount:g}" for n in s.nodes) or "-"
        rows.append((
            s.name, s.kind, s.device or "-", f"{s.capacity:g}", f"{s.free:g}",
            " → ".join(s.fallback) or "-", f"{s.fallbacks_in}/{s.fallbacks_out}", nodes,
        ))
    return rows


def _run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # a bad config exits 2 here, before Ray is imported

    from rich.console import Console
    from rich.table import Table

    from rollart.resources.errors import ResourceError
    from rollart.resources.runtime import Runtime

    try:
        with Runtime(cfg) as rt:
            statuses = rt.resources.snapshot()
            where = rt.describe()
    except ResourceError as exc:
        print(f"rollart: {exc}", file=sys.stderr)
        return 1
    table = Table(title=f"pools — {where}")
    for col in COLUMNS:
        table.add_column(col, justify="right" if col in ("capacity", "free") else "left")
    for row in pool_rows(statuses):
        table.add_row(*row)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0
