"""The `rollart` command line: a thin argparse shell over `rollart/cli/commands/*`.

Each subcommand lives in its own module under `rollart/cli/commands/` with a `register(subparsers)` that
adds its parser and sets `func(args) -> int`. Errors meant for the user exit with one readable message,
never a traceback: a bad config or a missing file with code 2, a resource problem (a pool missing, full or
unreachable) or a code sandbox that cannot have `reward.sandbox.min_isolation` with code 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module names under rollart.cli.commands, in the order `--help` lists them
COMMANDS = ["config", "pools", "local_cluster", "bench", "report", "samples", "env", "data", "serve_reward", "train", "eval", "model",
            "sim", "plan"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollart",
        description="Disaggregated, multi-task, agentic RL training of LLMs (the RollArt system).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"rollart.cli.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from rollart.config.loader import ConfigError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"rollart: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from rollart.resources.errors import ResourceError  # no Ray import: errors.py is plain Python
        from rollart.sandbox import SandboxUnavailable

        if not isinstance(exc, (ResourceError, SandboxUnavailable)):
            raise
        # a pool missing, full or unreachable, or a code sandbox that cannot isolate: said in one message
        print(f"rollart: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rollart: interrupted", file=sys.stderr)
        return 130

