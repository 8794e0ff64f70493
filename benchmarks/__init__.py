"""Benchmarks: `rollart bench NAME` measures the system's own paths, with ratios taken side by side in one run.

This package sits in the repository beside its results (`RESULTS.md`, the JSON files, `gpu/`), not in the
rollart package: the wheel does not ship it, and nothing in rollart imports it (`.importlinter`). The
`rollart bench` command of a checkout finds it beside the running rollart (rollart/cli/commands/bench.py).

`registry.py` is the one list of benchmarks, their one-line summaries and the options each takes;
`cli.py` parses `rollart bench`'s arguments and runs one; `common.py` holds the result record and the JSON
it writes. Each benchmark module exposes `run(quick: bool, **options) -> BenchResult`; `--quick` is its
smallest run. Helpers shared by several benchmarks have modules of their own (`engine_workloads`,
`reward_workload`, `faults`, `nodes`), so no two benchmark modules import each other both ways. Speed and
memory targets live here and in RESULTS.md (command, machine, date), never in timed tests. A benchmark may
wire planes as the driver does.
"""
