"""Benchmarks: `rollart bench NAME` measures the system's own paths, with ratios taken side by side in one run.

One module per benchmark (`engine`, `engine_vllm`, `weights`, `reward`, `rollout`, `async_training`), each
exposing `run(quick) -> BenchResult` (`common.py`); `--quick` is a smoke version. Speed and memory targets
live here and in benchmarks/RESULTS.md (command, machine, date), never in timed tests. The package sits
above the driver in the import layers (docs/architecture.md §3): a benchmark may wire planes as the driver
does.
"""
