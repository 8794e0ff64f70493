"""`rollart bench NAME [--quick] [--json PATH] [options]` and `rollart bench list`: run one benchmark of
`registry.BENCHMARKS` and print (and save) its ratios.

In: the arguments after `rollart bench` (the `rollart` command forwards them here from a checkout). Out: an
exit code — 0 after a run, 2 for a bad name or option (the message names it, before anything runs). An
option belongs to the benchmarks that declare it in the registry; giving it to another one is an error
naming both. A study (`staleness`) is run in resumable pieces: `--piece ARM/SEED|next` runs one arm × seed
and adds it to the study file `--json`; `--report` only rebuilds the summary and curves from that file.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from benchmarks.registry import BENCHMARKS, by_name, options


def listing() -> str:
    width = max(len(b.name) for b in BENCHMARKS)
    return "\n".join(f"  {b.name:<{width}}  {b.summary}" for b in BENCHMARKS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollart bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one benchmark: ratios measured side by side in one run (absolute times on a shared "
                    "machine are noise).",
        epilog=f"benchmarks (`rollart bench list`):\n{listing()}",
    )
    parser.add_argument("name", nargs="?", help="a benchmark below, or 'list'")
    parser.add_argument("--quick", action="store_true", help="smoke version, the smallest run it offers")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH (a study: its file, "
                        "read and extended)")
    for option, benches in options().values():
        owners = "|".join(benches)
        if option.switch:
            parser.add_argument(option.flag, action="store_true", default=None, help=f"{owners}: {option.help}")
        else:
            parser.add_argument(option.flag, type=option.type, choices=option.choices, metavar=option.metavar,
                                help=f"{owners}: {option.help}")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad option (2, argparse's message already printed)
        return int(exc.code or 0)
    if args.name == "list":
        print(listing())
        return 0
    benches = by_name()
    if args.name not in benches:
        given = f"unknown benchmark '{args.name}'" if args.name else "no benchmark named"
        print(f"rollart bench: {given}; choose one of: {', '.join(benches)} (or 'list')", file=sys.stderr)
        return 2
    bench = benches[args.name]
    declared = options()
    chosen = {dest: getattr(args, dest) for dest in declared if getattr(args, dest) is not None}
    for dest in chosen:
        option, owners = declared[dest]
        if bench.name not in owners:
            print(f"rollart bench: {option.flag} applies to 'rollart bench {'|'.join(owners)}' only, not "
                  f"'{bench.name}'", file=sys.stderr)
            return 2
    from benchmarks.common import to_json, write_json

    module = importlib.import_module(bench.module)
    if bench.study:
        try:
            result = module.run(quick=args.quick, json_path=args.json, **chosen)
        except ValueError as exc:  # a bad --piece or study file: the message names it
            print(f"rollart bench: {exc}", file=sys.stderr)
            return 2
    else:  # a ValueError inside another benchmark is a bug: its traceback stays
        result = module.run(quick=args.quick, **chosen)
    command = ["bench", bench.name] + (["--quick"] if args.quick else []) + (["--json", args.json] if args.json else [])
    for dest, value in chosen.items():
        flag = declared[dest][0].flag
        command += [flag] if value is True else [flag, str(value)]
    payload = to_json(result, args.quick, command)
    for row in result.rows:
        print("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
    for note in result.notes:
        print(f"  note: {note}")
    for name, value in result.ratios.items():  # None: a ratio without a finite value (its notes say why)
        print(f"{name}: {value:.3f}" if value is not None else f"{name}: null")
    if args.json:  # a study's file: its records so far (result.data), this piece's included
        write_json(payload, args.json)
        print(f"wrote {args.json}")
    return 0
