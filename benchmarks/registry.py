"""The one list of benchmarks: what `rollart bench NAME` runs, and the options only some of them take.

Each `Benchmark` names a module under `benchmarks/` that exposes `run(quick: bool, **options) ->
BenchResult` (`common.py`), a one-line summary (`rollart bench list` and `rollart bench --help` print it),
and the options it alone takes. A study (`study=True`) also gets `json_path`: it is run piece by piece into
its `--json` file. This module imports nothing heavy: `rollart bench --help` reads it without loading
torch or Ray; a benchmark's module is imported only when it runs.

To add a benchmark: write `benchmarks/NAME.py` with `run(quick, **options)`, add one `Benchmark` to
`BENCHMARKS` below (its options with it), and record its figures in `benchmarks/RESULTS.md`. It joins `make
bench-smoke` (benchmarks/smoke.py, run by CI) by being here: with `--quick`, unless it declares `smoke`, the
arguments of a smaller run (an option of its own that shrinks it), and `smoke_timeout_s`; `smoke_expect`
names ratios that must hold even then.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable


def count(text: str) -> int:
    """An option's count, ≥ 1 (argparse `type=`: its error names the option and the value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a count ≥ 1, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a count ≥ 1, not {value}")
    return value


@dataclass(frozen=True)
class Option:
    """One `--FLAG` of some benchmarks: argparse's keywords, given once. Its dest is the `run()` keyword."""

    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    switch: bool = False  # a flag without a value (True when given)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Benchmark:
    name: str  # `rollart bench NAME`
    module: str  # exposes run(quick: bool, **options) -> BenchResult
    summary: str  # one line
    options: tuple[Option, ...] = field(default=())
    study: bool = False  # run() also gets json_path (the study file it reads and extends)
    smoke: tuple[str, ...] = ("--quick",)  # `make bench-smoke`: the arguments of its smallest run
    smoke_timeout_s: int = 300  # … and how long that may take on a 2-core CPU machine (a hang fails it)
    smoke_expect: dict[str, float] = field(default_factory=dict)  # ratios that must hold even in the smoke run


# the training benchmarks' size knob: their smoke runs take a couple of RL steps
STEPS = Option("--steps", "RL steps of each training run (default: the benchmark's own; a smoke run's ratios "
               "mean nothing)", type=count, metavar="N")

# the options of a resumable study (staleness, algos): one piece at a time into its --json file
STUDY_OPTIONS = (
    Option("--piece", "run one arm × seed of the study (holding --lock) and add it to --json; 'next' = the first "
           "one missing (algos: an arm is an algorithm)", metavar="ARM/SEED|next"),
    Option("--report", "rebuild the summary (and a study's PNG curves) from --json without running anything",
           switch=True),
    Option("--lock", "file each piece holds an exclusive flock on while it runs (default: heavy.lock in the "
           "study's work directory; '' = none); a symlink or a non-regular file is refused", metavar="PATH"),
)

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("engine", "benchmarks.engine",
              "the built-in continuous-batching engine vs transformers generate (--engine vllm: vLLM vs both)",
              (Option("--engine", "builtin (default) vs generate, or vllm vs builtin vs generate (run it from "
                      ".venv-vllm)", choices=("builtin", "vllm")),)),
    Benchmark("weights", "benchmarks.weights",
              "how much of a weight sync stays exposed when the store path overlaps rollout (full and LoRA)"),
    Benchmark("reward", "benchmarks.reward",
              "a reserved local reward worker vs the serverless reward service (--jobs N: N jobs sharing one)",
              (Option("--jobs", "N jobs sharing one reward service", type=count, metavar="N"),)),
    Benchmark("rollout", "benchmarks.rollout",
              "trajectory-level rollout vs a turn barrier under env-step latency N(μ, σ)"),
    Benchmark("async", "benchmarks.async_training",
              "bounded-staleness asynchronous training (α = 1) vs the synchronous loop on the default job",
              (STEPS, Option("--arm", "run one arm only and add it to --json (the ratios come once both arms are "
                             "there)", choices=("async", "sync", "async_elastic")),
               Option("--seeds", "run both arms for seeds 0..N-1; the ratios are the pairs' medians", type=count,
                      metavar="N"),
               Option("--elastic", "also an arm with train.elastic_generation (α = 1), between async and sync",
                      switch=True)),
              study=True, smoke=("--quick", "--steps", "2", "--elastic")),
    Benchmark("staleness", "benchmarks.staleness",
              "the validation score vs α, staleness mode and importance weights over seeds (resumable study)",
              (*STUDY_OPTIONS, STEPS), study=True, smoke=("--quick", "--steps", "2"), smoke_timeout_s=600),
    Benchmark("chaos", "benchmarks.chaos",
              "the default job, shortened, run clean and under a fault schedule (--nodes N: lose a Ray node)",
              (Option("--nodes", "run on a loopback Ray cluster of N nodes and lose one", type=count,
                      metavar="N"), STEPS),
              # the fewest steps that hold its four faults; both arms must finish and lose nothing
              smoke=("--quick", "--steps", "7"), smoke_timeout_s=600,
              smoke_expect={"run_completed": 1.0, "trajectories_lost": 0.0, "trajectories_duplicated": 0.0}),
    Benchmark("sim", "benchmarks.sim",
              "the paper's scale experiments on the cluster twin, and the twin's own speed and accuracy"),
    Benchmark("throughput", "benchmarks.throughput",
              "what keeps the trainer from waiting for a batch (elastic generation, admission pacing, the adaptive "
              "batch, α = 2) side by side on the twin"),
    Benchmark("scale", "benchmarks.scale",
              "the control plane at 10,000 GPUs: the real proxy's cost per turn, the twin at 1k and 10k, proxy shards",
              (Option("--proxy-only", "measure only the real proxy, one and two shards (no twin runs)",
                      switch=True),)),
    Benchmark("gateway", "benchmarks.gateway",
              "what the OpenAI-compatible agent gateway adds to a turn, and whether it holds many open ones"),
    Benchmark("sandbox", "benchmarks.sandbox",
              "what the sandbox costs per run at each isolation level, a cgroup and a workspace, side by side"),
    Benchmark("envs", "benchmarks.envs",
              "envs with slow, failing resets and sandboxed tools: the SWE domain, the warm pool, env servers; "
              "native and podman workspaces",
              (Option("--backends", "workspace backends to measure, comma-separated (default native,podman: podman "
                      "where it and the env image are there)", metavar="native,podman"),),
              smoke_timeout_s=600),  # (the podman arm's containers, where podman is)
    Benchmark("trainer", "benchmarks.trainer",
              "the trainer's strategies (ddp, fsdp2), bf16, activation checkpointing, packing, chunked log-probs",
              (Option("--rows", "measure only these parts, comma-separated (setting rows, packing, equality, "
                      "logprobs, confirmation); the ratios they give are reported", metavar="A,B,…"),)),
    Benchmark("overhead", "benchmarks.overhead",
              "the cost of a trajectory: single-turn math through rollart beside TRL's GRPOTrainer, CPU by role",
              smoke_timeout_s=600),
    Benchmark("data", "benchmarks.data",
              "a dataset domain of a 100,000-row Parquet file vs a built-in one: start-up, peak RSS, the preview"),
    Benchmark("algos", "benchmarks.algos",
              "every registered algorithm (train.algorithm) on the default job over seeds: score, gain, time-to-score, "
              "tokens/s, groups filtered, mismatch KL (resumable study)", STUDY_OPTIONS, study=True,
              smoke_timeout_s=900),  # (--quick: a warm-started base, then three algorithms of 10 steps each)
)


def by_name() -> dict[str, Benchmark]:
    return {b.name: b for b in BENCHMARKS}


def options() -> dict[str, tuple[Option, tuple[str, ...]]]:
    """Every option once: its dest → (the option, the benchmarks that take it). Two benchmarks may share an
    option only if they declare it identically."""
    seen: dict[str, tuple[Option, tuple[str, ...]]] = {}
    for bench in BENCHMARKS:
        for option in bench.options:
            if option.dest in seen and seen[option.dest][0] != option:
                raise ValueError(f"benchmarks {seen[option.dest][1]} and '{bench.name}' declare {option.flag} "
                                 "differently: declare it identically or name it apart")
            previous = seen.get(option.dest, (option, ()))[1]
            seen[option.dest] = (option, (*previous, bench.name))
    return seen
