"""`rollart config show [RUN.yaml] [overrides]`: print the resolved config (defaults + file + overrides)."""

from __future__ import annotations

import argparse

from rollart.commands.common import add_run_args, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("config", help="inspect configuration")
    inner = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = inner.add_parser("show", help="print the resolved config as YAML")
    add_run_args(show)
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    from rollart.config_loader import dump_config

    print(dump_config(config_from_args(args)), end="")
    return 0
