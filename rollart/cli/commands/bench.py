"""`rollart bench NAME [...]`, `rollart bench list`: run a benchmark of the source checkout this rollart runs from.

The benchmarks are not part of the rollart package: they live in the repository's top-level `benchmarks/`
package, beside their results (`benchmarks/RESULTS.md`, the JSON files), and the wheel does not ship them.
This command finds the checkout from its own location — the directory holding the running `rollart`
package, when it also holds `benchmarks/registry.py` and `pyproject.toml` (an editable install, or
PYTHONPATH set to a checkout) — so the benchmarks always measure the rollart beside them. It puts that root
first on `sys.path` and on `PYTHONPATH` (the subprocesses and Ray workers a benchmark starts import
`benchmarks` too), then hands every argument after `bench` to `benchmarks.cli.main`, which owns the
options, the list and the help. Without a checkout it says where the benchmarks live and exits 2.

rollart imports nothing from `benchmarks` statically (`.importlinter` forbids it); this import by name is
the one way in, and only at run time.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

import rollart

NO_CHECKOUT = ("rollart bench runs the benchmarks of a source checkout: they live in the repository's "
               "benchmarks/ folder, beside rollart/, and are not installed with the package. This rollart "
               "({where}) has no checkout around it: clone the repository, `pip install -e .` in it, and run "
               "`rollart bench list` there.")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", add_help=False,
                            help="run a benchmark from a source checkout's benchmarks/ (`rollart bench list`)")
    parser.add_argument("-h", "--help", action="store_true", help="the benchmarks, their options")
    parser.add_argument("name", nargs="?", help="a benchmark, or 'list'")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="its options (`rollart bench --help`)")
    parser.set_defaults(func=_run)


def checkout_root() -> Path | None:
    """The source checkout the running rollart package sits in, if it holds the benchmarks."""
    root = Path(rollart.__file__).resolve().parents[1]
    if (root / "benchmarks" / "registry.py").is_file() and (root / "pyproject.toml").is_file():
        return root
    return None


def _run(args: argparse.Namespace) -> int:
    root = checkout_root()
    if root is None:
        print("rollart: " + NO_CHECKOUT.format(where=Path(rollart.__file__).resolve().parent), file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(root) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, paths)])
    cli = importlib.import_module("benchmarks.cli")
    found = Path(cli.__file__).resolve().parents[1]
    if found != root:  # another `benchmarks` package was imported first
        print(f"rollart: `benchmarks` was imported from {found}, not this checkout ({root}); run without "
              "that package on the path", file=sys.stderr)
        return 2
    argv = (["--help"] if args.help else []) + ([args.name] if args.name else []) + list(args.rest)
    return int(cli.main(argv))
