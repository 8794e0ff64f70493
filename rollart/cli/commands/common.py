"""Arguments shared by subcommands that take a run file: `[RUN.yaml] [key.path=value ...]`."""

from __future__ import annotations

import argparse

from rollart.config import RunConfig


def add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "items",
        nargs="*",
        metavar="[RUN.yaml] [key.path=value ...]",
        help="an optional YAML run file, then overrides such as rollout.alpha=2",
    )


def config_from_args(args: argparse.Namespace, *, local: bool = True) -> RunConfig:
    """The run config of a command line, checked down to what it names (preflight.py; `local=False`: not what
    only the machines that run it need): exit 2 if not."""
    from rollart.config.loader import load_config

    items = list(args.items)
    path = items.pop(0) if items and "=" not in items[0] else None
    cfg = load_config(path, items)  # a bad config exits here, before anything imports Ray

    from rollart.job.preflight import check_config  # resolving env specs imports the env plane (and Ray)

    check_config(cfg, local=local)
    return cfg
