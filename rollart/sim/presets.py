"""The paper's experiments as twin scenarios: run configs and hardware files built in code.

In: nothing (each function takes the knob its experiment varies). Out: `(RunConfig, SimHardware)` pairs
that `rollart.sim.run.simulate` runs; `rollart bench sim` runs them all and `rollart sim --preset NAME`
one of them.

The five task kinds of the paper (§7.1: SWE-bench, WebShop, FrozenLake, GEM-math, GEM-game), and code with
tests, are declared as episode profiles (`TASKS`; `rollart/sim/profiles.py` gives them to a run's domains
that declare none). The paper gives their character, not their token counts: FrozenLake is
prefill-heavy (the whole map every turn, short moves), GEM-math decode-heavy (one turn, long reasoning),
SWE-bench long multi-turn with slow environments; production tasks average 1–48 turns, prompts up to
12K and responses up to 46K tokens (§8). The counts below are our reading of that — declared, so any run
can replace them with measured ones (`profile/<domain>/*` metrics). The paper's training setup: GRPO,
batch 512, group size 8 (§7.1); cost-equivalent clusters price 1 H800 as 3 H20.
"""

from __future__ import annotations

from typing import Any

from rollart.config import RunConfig
from rollart.config.loader import load_config
from rollart.sim.hardware import SimHardware

# episode profiles of the paper's five task kinds (declared, see the module docstring)
TASKS: dict[str, dict[str, Any]] = {
    "frozenlake": {  # prefill-heavy: a long map observation each turn, a one-word move
        "profile": {"turns": {"dist": "gaussian", "mean": 8, "std": 3}, "prompt_tokens": {"mean": 1500},
                    "obs_tokens": {"mean": 1200}, "response_tokens": {"dist": "lognormal", "mean": 40, "std": 20},
                    "env_step": {"dist": "lognormal", "mean_s": 0.05, "std_s": 0.05}},
        "max_turns": 20, "max_new_tokens": 1024,
    },
    "math": {  # decode-heavy: one turn, long reasoning
        "profile": {"turns": {"mean": 1}, "prompt_tokens": {"mean": 300},
                    "response_tokens": {"dist": "lognormal", "mean": 4000, "std": 3000},
                    "reward": {"dist": "lognormal", "mean_s": 1.0, "std_s": 0.5}},
        "max_turns": 1, "max_new_tokens": 16384,
    },
    "game": {  # GEM games: a few turns, medium observations and answers
        "profile": {"turns": {"dist": "gaussian", "mean": 4, "std": 2}, "prompt_tokens": {"mean": 600},
                    "obs_tokens": {"mean": 300}, "response_tokens": {"dist": "lognormal", "mean": 600, "std": 400},
                    "env_step": {"dist": "lognormal", "mean_s": 0.1, "std_s": 0.1}},
        "max_turns": 12, "max_new_tokens": 4096,
    },
    "webshop": {  # web pages as observations, short actions, a slower env
        "profile": {"turns": {"dist": "gaussian", "mean": 6, "std": 2}, "prompt_tokens": {"mean": 2000},
                    "obs_tokens": {"mean": 1500}, "response_tokens": {"dist": "lognormal", "mean": 80, "std": 40},
                    "env_step": {"dist": "lognormal", "mean_s": 1.0, "std_s": 1.0},
                    "env_reset": {"dist": "lognormal", "mean_s": 5.0, "std_s": 3.0}},
        "max_turns": 15, "max_new_tokens": 1024,
    },
    "swe": {  # SWE-bench: long repository context, tool calls, slow containers (the paper's env.reset tail)
        "profile": {"turns": {"dist": "gaussian", "mean": 12, "std": 5}, "prompt_tokens": {"mean": 6000},
                    "obs_tokens": {"mean": 800}, "response_tokens": {"dist": "lognormal", "mean": 400, "std": 300},
                    "env_step": {"dist": "lognormal", "mean_s": 3.0, "std_s": 3.0},
                    "env_reset": {"dist": "lognormal", "mean_s": 30.0, "std_s": 30.0},
                    "reward": {"dist": "lognormal", "mean_s": 20.0, "std_s": 10.0}},
        "max_turns": 30, "max_new_tokens": 4096,
    },
    "code": {  # a program written in one turn, scored by running its tests in a sandbox
        "profile": {"turns": {"mean": 1}, "prompt_tokens": {"mean": 400},
                    "response_tokens": {"dist": "lognormal", "mean": 1000, "std": 800},
                    "reward": {"dist": "lognormal", "mean_s": 2.0, "std_s": 1.0}},
        "max_turns": 1, "max_new_tokens": 8192,
    },
}

# what a domain "is" for the hardware: where the paper maps it (prefill-heavy → H800, decode-heavy → H20)
PAPER_MAPPING = {"frozenlake": "h800", "webshop": "h800", "swe": "h800", "math": "h20", "game": "h20", "code": "h20"}

SCALE_OVERRIDES = [
    "observability.progress=quiet", "inference.request_timeout_s=36000", "inference.admission_timeout_s=36000",
    "envs.step_timeout_s=3600", "envs.reset_timeout_s=3600", "rollout.get_batch_timeout_s=36000",
    "reward.max_in_flight=100000", "reward.timeout_s=3600", "eval.every=1000000", "train.checkpoint_every=1000000",
]


def task(kind: str, pool: str, **profile: Any) -> dict[str, Any]:
    """The domain config of task kind `kind` (from `TASKS`) generated on `pool`; `profile` replaces parts of
    its profile (e.g. `turns={"mean": 10}`)."""
    spec = TASKS[kind]
    return {"env": kind, "pool": pool, "max_total_tokens": 32768, **spec,
            "profile": {**spec["profile"], **profile}}


def run_config(domains: dict[str, dict[str, Any]], *, batch: int = 512, group: int = 8, steps: int = 10,
               alpha: int = 1, barrier: str = "none", extra: list[str] | None = None,
               pools: tuple[str, ...] = ("h800", "h20")) -> RunConfig:
    """A run config with `domains` ({name: domain config, see `task`}), GPU pools `pools` + `train`, equal
    weights, the paper's GRPO batch by default, and timeouts sized for paper-scale episodes."""
    data: dict[str, Any] = {
        "pools": {p: {"kind": "gpu", "device": "cuda", "capacity": 1} for p in (*pools, "train")}
        | {"env": {"kind": "cpu", "capacity": 1}, "reward": {"kind": "serverless", "device": "", "capacity": 1}},
        "domains": domains,
    }
    overrides = SCALE_OVERRIDES + [
        f"train.steps={steps}", f"rollout.batch_size={batch}", f"rollout.group_size={group}",
        f"rollout.alpha={alpha}", f"rollout.barrier={barrier}", "rollout.redundancy.selection=stratified",
    ] + list(extra or [])
    return RunConfig.model_validate({**load_config(None, overrides).model_dump(), **data})


def mapped(mapping: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Domains of the given task kinds, each on its pool ({task kind: pool})."""
    return {kind: task(kind, pool) for kind, pool in mapping.items()}


def hardware(pools: dict[str, tuple[str, int, int]], *, model: str = "qwen3-8b", train: tuple[str, int] = ("H800", 32),
             **sections: Any) -> SimHardware:
    """A hardware spec: `pools` {name: (gpu kind, count, tp)} for generation, `train` (kind, count)."""
    spec: dict[str, Any] = {
        "model": model,
        "pools": {name: {"gpu": g, "count": n, "tp": tp} for name, (g, n, tp) in pools.items()}
        | {"train": {"gpu": train[0], "count": train[1]}},
        "weights": {"link": "rdma_400g"},
        **sections,
    }
    return SimHardware.model_validate(spec)


def thousand_gpus(alpha: int = 1, barrier: str = "none", steps: int = 50) -> tuple[RunConfig, SimHardware]:
    """1,000 GPUs (256 H800 train, 512 H800 + 232 H20 rollout, Qwen3-8B on TP 2), batch 5,120 (640 groups of 8):
    with α = 1 up to two batches (10,240 trajectories) are in flight: at the pipeline fill, and after each train
    step once its weights are served (the admission window, rollart/control/staleness.py)."""
    return scaled_cluster(1, alpha, barrier, steps)


def ten_thousand_gpus(alpha: int = 1, barrier: str = "none", steps: int = 10) -> tuple[RunConfig, SimHardware]:
    """10,000 GPUs: the 1,000-GPU preset times ten (2,560 H800 train, 5,120 H800 + 2,320 H20 rollout), batch
    51,200 (6,400 groups of 8): up to 102,400 trajectories in flight, ~220,000 generation turns a step."""
    return scaled_cluster(10, alpha, barrier, steps)


def scaled_cluster(scale: float, alpha: int = 1, barrier: str = "none", steps: int = 50) -> tuple[RunConfig, SimHardware]:
    """The 1,000-GPU preset's cluster and batch times `scale` (same domains, mapping, model and profiles; GPU
    counts rounded to whole TP-2 engines, the batch to whole groups of 8: scale 0.1 is 52 + 24 H800/H20, 26
    to train, batch 512)."""
    domains = mapped({"frozenlake": "h800", "math": "h20", "game": "h20"})
    cfg = run_config(domains, batch=8 * max(1, round(640 * scale)), group=8, steps=steps, alpha=alpha, barrier=barrier)
    pairs = lambda n: 2 * max(1, round(n * scale / 2))  # noqa: E731 — GPUs in whole pairs (TP 2)
    hw = hardware({"h800": ("H800", pairs(512), 2), "h20": ("H20", pairs(232), 2)}, train=("H800", pairs(256)))
    return cfg, hw
