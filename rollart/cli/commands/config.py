"""`rollart config show [RUN.yaml] [overrides] [--cluster]`: print the resolved config (defaults + file + overrides),
checked before anything starts — with `--cluster`, only what can be checked off the machines the run is for (not
its datasets, checkpoints or optional packages: a run `rollart plan` wrote for a cluster, read on a laptop).
`rollart config explain [KEY] [--markdown]`: describe a key (type, default, allowed values, description), list
a section's keys (all sections without KEY), or print the whole reference (docs/configuration.md)."""

from __future__ import annotations

import argparse

from rollart.cli.commands.common import add_run_args, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("config", help="inspect configuration")
    inner = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = inner.add_parser("show", help="print the resolved config as YAML")
    add_run_args(show)
    show.add_argument("--cluster", action="store_true",
                      help="a run for another cluster: check only what can be checked here (as `rollart sim` does)")
    show.set_defaults(func=_show)
    explain = inner.add_parser("explain", help="describe a config key, or list the keys of a section")
    explain.add_argument("key", nargs="?", metavar="KEY", help="e.g. rollout.alpha, rollout, domains.math.weight")
    explain.add_argument("--markdown", action="store_true",
                         help="print the reference of every key as Markdown (docs/configuration.md)")
    explain.set_defaults(func=_explain)


def _show(args: argparse.Namespace) -> int:
    from rollart.config.loader import dump_config

    print(dump_config(config_from_args(args, local=not args.cluster)), end="")
    return 0


def _explain(args: argparse.Namespace) -> int:
    from rollart.config.loader import ConfigError
    from rollart.config.explain import configuration_markdown, explain

    if args.markdown:
        if args.key:
            raise ConfigError("give either KEY or --markdown, not both")
        print(configuration_markdown(), end="")
        return 0
    try:
        print(explain(args.key))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return 0
