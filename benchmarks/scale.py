"""`rollart bench scale`: the control plane at 10,000 GPUs — what one turn costs, and whether one process keeps up.

Three measurements, side by side in one run:

1. **Real** (Ray on this machine): the production `LLMProxy` as a Ray actor over two instant engines (actors
   that answer at once, so what is measured is the proxy), `CALLERS` callers sending turns whose context is
   the twin's mean context length: the proxy process's CPU µs per turn (psutil) and the turns/s it served →
   `proxy_us_per_turn`. Every turn of a real run passes through that one process (the env worker's call in,
   the routing, the call to the engine, both answers back, the context's token ids pickled each way). Then
   the same with the proxy split in `REAL_SHARDS` (`inference.proxy_shards`: each turn to its group's shard,
   `rollart.base.proxy_shard`), side by side: CPU µs per turn summed over the shards' processes, turns/s and
   the busiest shard's core share → `proxy_us_per_turn_2_shards_over_1`, `proxy_turns_per_s_2_shards_over_1`.
2. **The twin in one process**, the 1,000- and 10,000-GPU presets (`rollart/sim/presets.py`) for the same
   steps: wall and CPU seconds, generation turns, CPU µs per turn, and where that CPU goes — a sampling
   profiler in this process files each sample under the production control plane's modules, the twin's
   cost models (`rollart/sim/`) or the event loop and the rest → `twin_cpu_us_per_turn_10k_over_1k` and
   `control_plane_cpu_us_per_turn_10k_over_1k` (the production modules' share alone; targets ≤ 1.5).
3. **The proxy's cost modelled** (`rollart/sim/control.py`, at the `proxy_us_per_turn` just measured): 1,000
   GPUs with one proxy process; 10,000 GPUs with one, and with `SHARDS` shards by group (ten times the
   clusters, ten times the processes) — step time, the busiest shard's utilisation, the control plane's
   µs per turn (queue wait + service) → `control_us_per_turn_10k_sharded_over_1k` (target ≤ 1.5: the cost
   per turn stays flat) and `step_time_10k_one_proxy_over_sharded` (what the one process's ceiling costs).

`--quick`: the presets at a tenth and a fiftieth of their batch (scales 0.1 and 0.2 of the 1,000-GPU
cluster), 2 steps, a 2-second proxy measurement. `--proxy-only`: only measurement 1 (the real proxy, one and
`REAL_SHARDS` shards), at `MEAN_CONTEXT` tokens a turn instead of the twin's mean of this run.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections import Counter
from typing import Any

from benchmarks.common import BenchResult
from rollart.sim import presets
from rollart.sim.hardware import ControlPlaneSpec
from rollart.sim.run import SimReport, simulate
from rollart.types import GenerationRequest, GenerationResult, SamplingParams

CALLERS = 128  # concurrent turns sent to the proxy (enough to keep it busy: it serves one at a time)
SHARDS = 10  # proxy shards at 10,000 GPUs: ten times the cluster, ten times the processes
REAL_SHARDS = 2  # the real proxy split this many ways beside one (a 2-core machine holds no more)
MEAN_CONTEXT = 4752  # the 1,000-GPU preset's mean context per turn (benchmarks/scale.json, 2026-12-03)


# --- 1. the real proxy's cost per turn -----------------------------------------------------------------
class InstantEngine:
    """An inference worker that answers every request at once with 8 tokens: the proxy's own cost is what
    remains (it isolates the proxy; no engine is being measured)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return GenerationResult(request.request_id, request.trajectory_id, (1,) * 8, (0.0,) * 8, (0,) * 8, "stop",
                                len(request.prompt_token_ids), worker=self.name)

    async def ready(self) -> str:
        return self.name

    async def abort(self, trajectory_id: str) -> None:
        return None


def proxy_cost(context_tokens: int, seconds: float, shards: int = 1) -> dict[str, float]:
    """The production LLMProxy actors' CPU µs per turn (summed over `shards` shards, each turn on its group's
    shard) and turns/s, `CALLERS` callers of a group each, `context_tokens` each."""
    import psutil
    import ray

    from rollart.base.proxy_shard import proxy_shard
    from rollart.config import InferenceConfig
    from rollart.inference.proxy import LLMProxy

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    try:
        engines = [ray.remote(InstantEngine).options(num_cpus=0).remote(f"instant/{i}") for i in range(2)]
        proxies = [ray.remote(LLMProxy).options(num_cpus=0).remote({"p": engines}, {"d": "p"}, InferenceConfig())
                   for _ in range(shards)]
        processes = [psutil.Process(pid) for pid in ray.get(
            [p.__ray_call__.remote(lambda self: os.getpid()) for p in proxies], timeout=60)]
        prompt = tuple(range(context_tokens))
        sampling = SamplingParams(max_new_tokens=8)

        def cpu_s() -> list[float]:
            return [sum(process.cpu_times()[:2]) for process in processes]

        async def measure(duration: float) -> tuple[int, float, list[float]]:
            stop = time.perf_counter() + duration
            done = 0

            async def caller(i: int) -> None:
                nonlocal done
                trajectory_id = f"g{i:06d}/0"  # as the scheduler names them: a group each
                proxy = proxies[proxy_shard(trajectory_id, shards)]
                k = 0
                while time.perf_counter() < stop:
                    request = GenerationRequest(f"{trajectory_id}/{k}", trajectory_id, "d", prompt, sampling)
                    await asyncio.wait_for(proxy.generate.remote(request), 60)
                    k += 1
                    done += 1

            cpu0, t0 = cpu_s(), time.perf_counter()
            await asyncio.gather(*(caller(i) for i in range(CALLERS)))
            return done, time.perf_counter() - t0, [b - a for a, b in zip(cpu0, cpu_s())]

        asyncio.run(measure(min(1.0, seconds)))  # warm-up: imports, connections
        turns, wall, cpu = asyncio.run(measure(seconds))
        return {"proxy_us_per_turn": sum(cpu) / turns * 1e6, "proxy_turns_per_s": turns / wall,
                "proxy_core_share": sum(cpu) / wall, "busiest_shard_core_share": max(cpu) / wall,
                "shards": float(shards), "turns": float(turns), "context_tokens": float(context_tokens)}
    finally:
        ray.shutdown()


def real_proxy(context_tokens: int, seconds: float, ratios: dict[str, float | None]) -> list[dict[str, Any]]:
    """Measurement 1, one proxy and `REAL_SHARDS` shards one after the other: its rows, its ratios into `ratios`."""
    one, split = proxy_cost(context_tokens, seconds), proxy_cost(context_tokens, seconds, REAL_SHARDS)
    ratios["proxy_us_per_turn"] = one["proxy_us_per_turn"]
    ratios[f"proxy_us_per_turn_{REAL_SHARDS}_shards"] = split["proxy_us_per_turn"]
    ratios[f"proxy_us_per_turn_{REAL_SHARDS}_shards_over_1"] = split["proxy_us_per_turn"] / one["proxy_us_per_turn"]
    ratios[f"proxy_turns_per_s_{REAL_SHARDS}_shards_over_1"] = split["proxy_turns_per_s"] / one["proxy_turns_per_s"]
    return [{"experiment": "proxy", **{k: round(v, 3) for k, v in cost.items()}} for cost in (one, split)]


# --- 2. where the twin's CPU goes ---------------------------------------------------------------------
class ModuleSampler:
    """Samples the main thread's innermost Python frame every `interval_s` and files it by module: the
    production control plane (`rollart/` outside `rollart/sim/`), the twin's cost models (`rollart/sim/`), or
    the event loop and everything else (asyncio, the standard library, pydantic...)."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.counts: Counter[str] = Counter()
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="module-sampler")

    def __enter__(self) -> ModuleSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            frame = sys._current_frames().get(self._main)
            if frame is not None:
                self.counts[self.kind(frame.f_code.co_filename)] += 1

    @staticmethod
    def kind(path: str) -> str:
        path = path.replace(os.sep, "/")
        if "/rollart/sim/" in path:
            return "twin_models"
        if "/rollart/" in path:
            return "control_plane"
        return "event_loop_and_rest"

    def shares(self) -> dict[str, float]:
        total = sum(self.counts.values()) or 1
        return {k: self.counts[k] / total for k in ("control_plane", "twin_models", "event_loop_and_rest")}


def _cluster(scale: float, steps: int, control: ControlPlaneSpec | None = None) -> tuple[Any, Any]:
    cfg, hw = presets.scaled_cluster(scale, steps=steps)
    if control is not None:
        hw = hw.model_copy(update={"control": control})
    return cfg, hw


def _row(name: str, scale: float, report: SimReport, **extra: Any) -> dict[str, Any]:
    gpus = sum(p.count for p in presets.scaled_cluster(scale)[1].pools.values())
    return {"experiment": name, "gpus": gpus, "steps": len(report.steps), "wall_s": round(report.wall_s, 1),
            "cpu_s": round(report.cpu_s, 1), "virtual_s": round(report.virtual_s, 1), "turns": report.turns,
            "cpu_us_per_turn": round(report.cpu_us_per_turn, 1),
            "mean_step_s": round(report.mean_step_s(), 2), "turns_per_virtual_s": round(report.turns / report.virtual_s, 1),
            "twin_core_share": round(report.control_core_share, 3),
            "ledger_violations": len(report.ledger_violations),
            "staleness_violations": len(report.staleness_violations), **extra}


def run(quick: bool, proxy_only: bool = False) -> BenchResult:
    small, large = (0.1, 0.2) if quick else (1, 10)
    steps = 2 if quick else 3
    ratios: dict[str, float | None] = {}
    rows: list[dict[str, Any]] = []
    seconds = 2.0 if quick else 10.0
    if proxy_only:
        rows = real_proxy(MEAN_CONTEXT, seconds, ratios)
        return BenchResult("scale", ratios, rows, [f"the real proxy only: Ray actors on this machine, {CALLERS} "
                                                   f"callers, {MEAN_CONTEXT} context tokens a turn"])

    # 2. the twin in one process, unmodelled control plane
    reports, shares = {}, {}
    for scale in (small, large):
        with ModuleSampler() as sampler:
            reports[scale] = simulate(*_cluster(scale, steps))
        shares[scale] = sampler.shares()
        rows.append(_row("twin", scale, reports[scale], cpu_shares={k: round(v, 3) for k, v in shares[scale].items()},
                         control_plane_cpu_us_per_turn=round(reports[scale].cpu_us_per_turn
                                                             * shares[scale]["control_plane"], 1)))
    ratios["twin_cpu_us_per_turn_10k_over_1k"] = reports[large].cpu_us_per_turn / reports[small].cpu_us_per_turn
    ratios["control_plane_cpu_us_per_turn_10k_over_1k"] = (
        reports[large].cpu_us_per_turn * shares[large]["control_plane"]
        / (reports[small].cpu_us_per_turn * shares[small]["control_plane"]))
    ratios["twin_wall_s_10k"] = reports[large].wall_s
    ratios["twin_wall_s_1k"] = reports[small].wall_s

    # 1. the real proxy, at the twin's mean context per turn
    context = round(sum(p["prompt_tokens"] for p in reports[small].pools.values()) / reports[small].turns)
    rows += real_proxy(context, seconds, ratios)

    # 3. the proxy's cost in the twin: one process vs shards
    modelled: dict[str, SimReport] = {}
    arms = (("1k_one_proxy", small, 1), ("10k_one_proxy", large, 1), (f"10k_{SHARDS}_shards", large, SHARDS))
    for name, scale, shards in arms:
        spec = ControlPlaneSpec(us_per_turn=ratios["proxy_us_per_turn"], shards=shards, shard_by="group")
        modelled[name] = report = simulate(*_cluster(scale, steps, spec))
        control = report.extra["control"]
        rows.append(_row("modelled_proxy", scale, report, arm=name, shards=shards,
                         max_shard_utilisation=round(control["max_utilisation"], 3),
                         control_us_per_turn=round(control["mean_control_us_per_turn"], 1)))
    per_turn = {k: r.extra["control"]["mean_control_us_per_turn"] for k, r in modelled.items()}
    ratios["control_us_per_turn_10k_sharded_over_1k"] = per_turn[f"10k_{SHARDS}_shards"] / per_turn["1k_one_proxy"]
    ratios["control_us_per_turn_10k_one_proxy_over_1k"] = per_turn["10k_one_proxy"] / per_turn["1k_one_proxy"]
    ratios["step_time_10k_one_proxy_over_sharded"] = (modelled["10k_one_proxy"].mean_step_s()
                                                      / modelled[f"10k_{SHARDS}_shards"].mean_step_s())
    notes = [f"the twin's figures are virtual (production control plane, rollart/sim cost models); CPU µs per turn "
             f"are this process's CPU seconds over generation turns, {steps} steps per preset (the first fills the "
             "pipeline); the proxy's cost is measured with real Ray actors on this machine"]
    return BenchResult("scale", ratios, rows, notes)
