"""`rollart bench envs`: environments with slow, failing resets and sandboxed tools — the SWE repair domain
on the real workspace sandbox, the warm pool, env servers. No Ray: the env plane's parts, as an env worker
runs them.

Measured side by side in one run:
- `warm_pool_reset_p99_reduction` (target ≥ 5): `concurrency` trajectory loops each reset a SWE env, hold it
  for `episode_s` (its turns), close it, and go again — the loops' k-th episodes are one GRPO group (one
  seed, so its task is generated once); the reset latency (what a trajectory waits: build + prepare the
  workspace + the task, or a pooled env + what of the task is not staged) with no pool and with a pool of
  `concurrency` envs told each group when the one before it starts (as the scheduler forecasts the group
  admission waits for): its envs hold the task's package before their resets. Each arm with the task cache
  emptied. Also their p50s; `warm_pool2_reset_p99_reduction` (and `_p50_`, `reset_ms_p50_with_pool2`,
  `reset_ms_p99_with_pool2`): the same forecast pool holding two groups (`2 * concurrency` envs: the group
  resetting and the one forecast ahead of it, which with `concurrency` envs compete for one group's room); and
  `warm_pool_unforecast_reset_p99_reduction`: the pool told nothing (seed-free envs only: the task is
  generated and written at reset).
- `sandbox_create_ms_p50`/`_p99`, `sandbox_destroy_ms_p50`/`_p99`: `open_workspace` and `close` of an empty
  workspace (tmpfs, cgroup, private root are made and removed).
- `remote_step_overhead_ms_p50` (target ≤ 5), `_p99`: an env step through `remote:<url>` (an env server in
  this process, on its own thread) minus the same step in process, interleaved step by step on frozenlake.
- `swe_trajectories_per_s`: SWE trajectories run by EnvManagers (`concurrency` at once, warm pool on) with
  the scripted expert as the model (apply the fix as a patch, then submit: the hidden tests in a fresh
  sandbox) — the env side's throughput here; generation is scripted. `expert_solve_rate` over them (1.0).
- `leftover_processes_after_<N>`, `leftover_files_after_<N>` (target 0): after those N trajectories — one
  in ten starts background processes meant to outlive it (`sleep 300 &`, `nohup`, `setsid`), one in
  twenty is cancelled mid-episode — the processes of workspace uids and the entries left under the
  workspaces' directory, once every env and pool is closed.
- `cross_trajectory_reads` (target 0): pairs of open trajectories where one tries to read the other's
  files on purpose (its host path with cat and find, read_file of it, /proc/*/root); a read counts if the
  other's secret appears in what it got back.
- `apply_patch_worst_cpu_s` (target ≤ 1): CPU seconds of the SWE `apply_patch` tool on the costliest patches
  found within its caps — every hunk's header line wrong, so every hunk is searched for: `MAX_HUNKS` one-line
  hunks over 13,000 unique lines, and `MAX_HUNKS` hunks of 235 lines over 32,000 near-matching lines (the
  most of either shape; it runs in the env worker's thread, where no timeout can stop it).

The same figures for the container backend, `podman_...` (where podman answers and the env image is built;
`--backends podman` runs only that arm): every SWE workspace is a container, its pool prepares `concurrency`
envs at once (a prepare waits on a container start), and `podman_sandbox_create_ms` is a container start; the
reset arms are the native ones' (the same loops, the pool told each group ahead, the no-pool arm paying a
container start per reset: the SWE env's workspace; its scoring one opens at a submit). Target of
`podman_warm_pool_reset_p99_reduction` (and of `podman_warm_pool2_reset_p99_reduction`, the pool of two groups):
≥ 10 (issue 37). Also
`podman_exec_ms_p50` (`run("true")`: one command's round trip) and `podman_exec_overhead_ms_p50` (minus the
native one's, interleaved), and `podman_leftover_containers_after_<N>` with the processes left
(benchmarks/envs_podman.py). Demand against capacity: `podman_reset_arm_demand_envs_per_s` (the envs a second
the reset arm's loops would take if no reset waited: `concurrency / episode_s`) beside
`podman_env_capacity_per_s` (SWE envs built, staged and removed a second, `concurrency` at once, nothing else
running) and `podman_env_cpu_core_s` (the machine's CPU per such env) — and the paced reset arm,
`podman_paced_...`: the same two reset arms (no pool, a pool told each group ahead) with episodes of
`PACED_EPISODE_S`, asking for envs at a rate the machine can make them.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks import envs_podman
from benchmarks.common import BenchResult


# The paced reset arm of a container backend: episodes as long as a few turns of a real model (seconds each), so
# the loops ask for envs at a rate the machine can start containers (`env_capacity_per_s`) — the reset arm of
# 0.5-1 s episodes asks for more than a 2-core machine makes, which no pool can hide.
PACED_EPISODE_S = 4.0


def _ms(values: list[float], q: int) -> float:
    from rollart.envs.reset_stats import quantile

    return round(quantile(sorted(values), q) * 1e3, 2)


def _swe(backend: str, owner: str = "swe") -> Any:
    """A factory of SWE envs whose workspaces use `backend`."""
    from rollart.envs.domains.swe.env import SweEnv

    return lambda: SweEnv(workspace={"backend": backend}, owner=owner)


async def _reset_loops(concurrency: int, episodes: int, episode_s: float, pool_size: int,
                       forecast: bool = False, backend: str = "native") -> list[float]:
    """Reset latencies of `concurrency` loops × `episodes`; with `forecast`, the pool is told each group when
    the one before it starts (what the scheduler does when admission stops to wait: `UpcomingGroup`). The pool
    prepares `concurrency` envs at once for a container backend (a prepare waits on a container start)."""
    from rollart.envs.domains.swe import env as swe_env
    from rollart.envs.warm_pool import WarmPool, build_prepared

    swe_env._task.cache_clear()  # each arm generates its tasks anew
    executor = ThreadPoolExecutor(max(4, concurrency * 2))
    factory = _swe(backend)
    parallel = concurrency if backend != "native" else 1
    pool = WarmPool("swe", factory, pool_size, executor=executor, parallel=parallel) if pool_size else None
    if pool is not None:  # a warm start: the pool filled before the first trajectory, as at worker start
        if forecast:
            pool.expect(0, concurrency)  # the first group, forecast when the run's admission began
        pool.start()
        while pool.ready < pool_size or (forecast and pool.staged < concurrency):
            await asyncio.sleep(0.05)
    latencies: list[float] = []
    told = {0}

    async def loop(index: int) -> None:
        for k in range(episodes):
            if pool is not None and forecast and k + 1 not in told:  # group k is admitted: k + 1 is next
                told.add(k + 1)
                pool.expect(k + 1, concurrency)
            start = time.perf_counter()
            env = (await pool.acquire(k))[0] if pool else await build_prepared(factory, executor, 60.0)
            await env.reset(k)  # the loops' k-th episodes are one GRPO group: one seed
            latencies.append(time.perf_counter() - start)
            await asyncio.sleep(episode_s)
            await env.close()

    await asyncio.gather(*(loop(i) for i in range(concurrency)))
    if pool is not None:
        await pool.close()
    executor.shutdown()
    return latencies


def _sandbox_costs(count: int, backend: str = "native") -> tuple[list[float], list[float]]:
    """`open_workspace` (a container start, for a container backend) and `close` of an empty workspace."""
    from rollart.config import WorkspaceConfig
    from rollart.sandbox.workspace import open_workspace

    create, destroy = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        ws = open_workspace(WorkspaceConfig(backend=backend), {}, owner="bench")
        t1 = time.perf_counter()
        ws.close()
        create.append(t1 - t0)
        destroy.append(time.perf_counter() - t1)
    return create, destroy


async def _remote_overhead(steps: int) -> list[float]:
    from rollart.config import EnvServerConfig, EnvsConfig
    from rollart.envs.expert import random_action
    from rollart.envs.protocol import AsyncEnv
    from rollart.envs.serving.server import EnvServer
    from rollart.envs.spec import make_env, resolve_env

    token = "bench-envs"
    os.environ.setdefault("ROLLART_ENV_TOKEN", token)
    server = EnvServer("frozenlake", "frozenlake", resolve_env("frozenlake"), EnvServerConfig(port=0), EnvsConfig(),
                       token=os.environ["ROLLART_ENV_TOKEN"]).start()
    executor = ThreadPoolExecutor(2)
    overheads: list[float] = []
    try:
        seed = 0
        while len(overheads) < steps:
            local = AsyncEnv(make_env("frozenlake"), executor)
            remote = AsyncEnv(make_env(f"remote:{server.url}"), executor)
            await local.reset(seed)
            await remote.reset(seed)
            for _ in range(8):
                action = random_action(local)
                t0 = time.perf_counter()
                a = await local.step(action)
                t1 = time.perf_counter()
                b = await remote.step(action)
                t2 = time.perf_counter()
                assert a[:4] == b[:4], "the remote env must step exactly like the local one"
                overheads.append((t2 - t1) - (t1 - t0))
                if a[2] or a[3]:
                    break
            await local.close()
            await remote.close()
            seed += 1
    finally:
        server.stop()
        executor.shutdown()
    return overheads[:steps]


UIDS: set[int] = set()  # every workspace uid this run used: a process of one of them is a leftover
OWNER = f"bench-envs-{os.getpid()}"


def _tracked_swe(backend: str) -> Any:
    from rollart.envs.domains.swe.env import SweEnv

    class TrackedSweEnv(SweEnv):
        def open_workspace(self, files: Any) -> Any:
            workspace = super().open_workspace(files)
            if getattr(workspace, "_uid", None) is not None:
                UIDS.add(workspace._uid)
            return workspace

    return lambda: TrackedSweEnv(owner=OWNER, workspace={"backend": backend})


class _ExpertLLM:
    """The scripted expert as an `LLMClient`: it answers the expert's tool calls for the trajectory's task
    (apply the fix as a patch, then submit), encoded with the real tokenizer and ended by the stop token;
    for one trajectory in ten the first turn starts background processes meant to outlive it."""

    def __init__(self, tokenizer: Any, difficulty: int) -> None:
        self.tokenizer, self.difficulty = tokenizer, difficulty
        self.stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, request: Any) -> Any:
        from rollart.envs.domains.swe.expert import expert_patch
        from rollart.envs.domains.swe.generator import generate
        from rollart.envs.domains.swe.tools import call_text
        from rollart.types import GenerationResult

        index = int(request.trajectory_id.split("-")[1])  # swe-<seed>: the episode's seed (train split)
        turn = int(request.request_id.rsplit("/", 1)[1])
        if index % 10 == 0:
            turn -= 1
            if turn < 0:
                text = call_text("bash", command="(sleep 300 &); nohup sleep 300 >/dev/null 2>&1 & setsid sleep 300 & "
                                                 "echo ok")
        if turn == 0:
            text = call_text("apply_patch", patch=expert_patch(generate(index, self.difficulty)))
        elif turn > 0:
            text = call_text("submit")
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.stop]
        return GenerationResult(request.request_id, request.trajectory_id, tuple(ids), tuple([-1.0] * len(ids)),
                                tuple([0] * len(ids)), "stop", len(request.prompt_token_ids), worker="bench/expert")

    async def abort(self, trajectory_id: str) -> None:
        pass


async def _trajectories(count: int, concurrency: int, backend: str = "native") -> tuple[float, float, int]:
    """(trajectories/s, solve rate over those not cancelled, cancelled) of `count` SWE trajectories."""
    from rollart.config import DomainConfig, EnvsConfig
    from rollart.envs.chat import ChatTokens
    from rollart.envs.manager import EnvManager
    from rollart.envs.warm_pool import WarmPool
    from rollart.models.tiny import build_tokenizer
    from rollart.types import SamplingParams, Status, Task

    chat = ChatTokens(build_tokenizer())
    executor = ThreadPoolExecutor(concurrency * 2)
    factory = _tracked_swe(backend)
    pool = WarmPool("swe", factory, concurrency, executor=executor, parallel=concurrency if backend != "native" else 1)
    llm = _ExpertLLM(chat.tokenizer, difficulty=1)
    domain = DomainConfig(env="swe", max_turns=4, max_new_tokens=4096, max_total_tokens=1 << 16)
    sampling = SamplingParams(max_new_tokens=4096, stop_token_ids=chat.stop_token_ids)
    results: list[Any] = []
    queue = list(range(count))

    async def worker() -> None:
        while queue:
            i = queue.pop(0)
            task = Task(f"swe-{i}", "swe", "swe", i, f"g{i}")
            manager = EnvManager(task, 0, make_env=factory, domain_cfg=domain, envs=EnvsConfig(), llm=llm, chat=chat,
                                 sampling=sampling, executor=executor, pool=pool)
            if i % 20 == 7:  # cancelled mid-episode, as a stale trajectory is
                running = asyncio.ensure_future(manager.run())
                await asyncio.sleep(0.05)
                await manager.cancel(Status.ABORTED, "bench: cancelled")
                results.append(await running)
            else:
                results.append(await manager.run())

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await pool.close()
    executor.shutdown()
    scored = [t for t in results if t.status is not Status.ABORTED]
    solved = sum(1 for t in scored if t.env_return >= 1.0)
    return count / wall, solved / max(1, len(scored)), len(results) - len(scored)


def _leftovers(backend: str = "native") -> tuple[int, int]:
    """(processes left, things left on disk) by this run's workspaces: natively, processes of their uids and
    entries of their directory; in containers, `envs_podman.leftovers`."""
    import psutil

    from rollart.sandbox.workspace import BASE

    if backend != "native":
        return envs_podman.leftovers(backend, OWNER)
    processes = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in UIDS]
    parent = BASE / OWNER
    return len(processes), len(list(parent.iterdir()) if parent.exists() else [])


def _cross_reads(pairs: int, backend: str = "native") -> tuple[int, int]:
    """(reads that leaked, attempts) of trajectory A reading trajectory B's workspace on purpose."""
    from rollart.envs.domains.swe.tools import call_text

    leaks = attempts = 0
    for k in range(pairs):
        a, b = _swe(backend)(), _swe(backend)()
        a.reset(2 * k)
        b.reset(2 * k + 1)
        try:
            secret = f"secret-{random.getrandbits(64):x}"
            b.step(call_text("write_file", path="notes.txt", content=secret))
            b.step(call_text("bash", command="sleep 2 &"))
            target = b._workspace.root / "notes.txt"
            tries = [
                call_text("bash", command=f"cat {target} 2>&1"),
                call_text("bash", command=f"find / -name notes.txt -exec cat {{}} \\; 2>/dev/null"),
                call_text("bash", command="cat /proc/*/root/workspace/notes.txt 2>/dev/null; ls /proc/*/root/ 2>/dev/null"),
                call_text("bash", command=f"cat /var/lib/containers/storage/overlay/*/diff/workspace/notes.txt "
                                          f"/proc/1/root/workspace/notes.txt {target}; ls / 2>&1"),
                call_text("bash", command=f"cat {target} {target.parent.parent} 2>&1"),
                call_text("read_file", path=str(target)),
                call_text("read_file", path=os.path.relpath(target, a._workspace.root)),
            ]
            for action in tries:
                attempts += 1
                leaks += secret in a.step(action)[0]
        finally:
            a.close()
            b.close()
    return leaks, attempts


def _arm(backend: str, quick: bool, concurrency: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One workspace backend's figures: resets without a pool, with a pool told nothing, with a pool told
    each group ahead and with such a pool of two groups; workspace create/destroy; SWE trajectories with their
    leftovers; cross-trajectory reads.
    Container arms (named `<backend>_...`) also time a command's round trip beside the native one's."""
    episodes, episode_s = (5, 0.5) if quick else (25, 1.0)
    cold = asyncio.run(_reset_loops(concurrency, episodes, episode_s, pool_size=0, backend=backend))
    seed_free = asyncio.run(_reset_loops(concurrency, episodes, episode_s, pool_size=concurrency, backend=backend))
    warm = asyncio.run(_reset_loops(concurrency, episodes, episode_s, pool_size=concurrency, forecast=True,
                                    backend=backend))
    warm2 = asyncio.run(_reset_loops(concurrency, episodes, episode_s, pool_size=2 * concurrency, forecast=True,
                                     backend=backend))
    create, destroy = _sandbox_costs(10 if quick else 50, backend)
    count = 100 if quick else 1000
    per_s, solve_rate, cancelled = asyncio.run(_trajectories(count, concurrency, backend))
    processes, files = _leftovers(backend)
    leaks, attempts = _cross_reads(3 if quick else 20, backend)
    ratios = {
        "warm_pool_reset_p99_reduction": round(_ms(cold, 99) / _ms(warm, 99), 2),
        "warm_pool_reset_p50_reduction": round(_ms(cold, 50) / _ms(warm, 50), 2),
        "reset_ms_p50_without_pool": _ms(cold, 50), "reset_ms_p99_without_pool": _ms(cold, 99),
        "reset_ms_p50_with_pool": _ms(warm, 50), "reset_ms_p99_with_pool": _ms(warm, 99),
        "warm_pool2_reset_p99_reduction": round(_ms(cold, 99) / _ms(warm2, 99), 2),
        "warm_pool2_reset_p50_reduction": round(_ms(cold, 50) / _ms(warm2, 50), 2),
        "reset_ms_p50_with_pool2": _ms(warm2, 50), "reset_ms_p99_with_pool2": _ms(warm2, 99),
        "warm_pool_unforecast_reset_p99_reduction": round(_ms(cold, 99) / _ms(seed_free, 99), 2),
        "reset_ms_p50_with_unforecast_pool": _ms(seed_free, 50), "reset_ms_p99_with_unforecast_pool": _ms(seed_free, 99),
        "sandbox_create_ms_p50": _ms(create, 50), "sandbox_create_ms_p99": _ms(create, 99),
        "sandbox_destroy_ms_p50": _ms(destroy, 50), "sandbox_destroy_ms_p99": _ms(destroy, 99),
        "swe_trajectories_per_s": round(per_s, 2),
        "expert_solve_rate": round(solve_rate, 4),
        f"leftover_processes_after_{count}": float(processes),
        f"leftover_{'files' if backend == 'native' else 'containers'}_after_{count}": float(files),
        "cross_trajectory_reads": float(leaks),
    }
    if backend != "native":
        there, native = envs_podman.exec_costs(20 if quick else 200, backend)
        ratios["exec_ms_p50"] = _ms(there, 50)
        ratios["exec_overhead_ms_p50"] = round(_ms(there, 50) - _ms(native, 50), 2)
        envs_per_s, core_s = asyncio.run(envs_podman.capacity(_swe(backend), 12 if quick else 40, concurrency))
        ratios["env_capacity_per_s"] = round(envs_per_s, 2)
        ratios["env_cpu_core_s"] = round(core_s, 3)
        ratios["reset_arm_demand_envs_per_s"] = round(concurrency / episode_s, 2)
        paced_episodes = 5 if quick else 25
        paced_cold = asyncio.run(_reset_loops(concurrency, paced_episodes, PACED_EPISODE_S, pool_size=0,
                                              backend=backend))
        paced_warm = asyncio.run(_reset_loops(concurrency, paced_episodes, PACED_EPISODE_S, pool_size=concurrency,
                                              forecast=True, backend=backend))
        ratios["paced_reset_arm_demand_envs_per_s"] = round(concurrency / PACED_EPISODE_S, 2)
        ratios["paced_warm_pool_reset_p99_reduction"] = round(_ms(paced_cold, 99) / _ms(paced_warm, 99), 2)
        ratios["paced_warm_pool_reset_p50_reduction"] = round(_ms(paced_cold, 50) / _ms(paced_warm, 50), 2)
        ratios["paced_reset_ms_p50_without_pool"] = _ms(paced_cold, 50)
        ratios["paced_reset_ms_p99_without_pool"] = _ms(paced_cold, 99)
        ratios["paced_reset_ms_p50_with_pool"] = _ms(paced_warm, 50)
        ratios["paced_reset_ms_p99_with_pool"] = _ms(paced_warm, 99)
        ratios = {f"{backend}_{k}": v for k, v in ratios.items()}
    rows = [
        {"what": f"{backend}: resets", "without_pool": len(cold), "with_unforecast_pool": len(seed_free),
         "with_pool": len(warm), "with_pool2": len(warm2), "concurrency": concurrency, "episode_s": episode_s},
        *([{"what": f"{backend}: paced resets", "without_pool": len(paced_cold), "with_pool": len(paced_warm),
            "concurrency": concurrency, "episode_s": PACED_EPISODE_S}] if backend != "native" else []),
        {"what": f"{backend}: trajectories", "count": count, "cancelled": cancelled, "concurrency": concurrency},
        {"what": f"{backend}: cross-trajectory reads", "attempts": attempts, "leaked": leaks},
    ]
    return ratios, rows


def run(quick: bool = False, backends: str = "") -> BenchResult:
    """The native arm, and a podman arm where podman and the env image are there (`backends` chooses:
    e.g. "native", "podman", "native,podman")."""
    concurrency = 4
    isolation = _isolation()  # probes the machine once, before anything is timed
    chosen = [b.strip() for b in backends.split(",") if b.strip()] or ["native", "podman"]
    unknown = set(chosen) - {"native", "podman", "docker"}
    if unknown:
        raise ValueError(f"--backends: {sorted(unknown)} is not a workspace backend (native, podman, docker)")
    notes = [
        "the SWE trajectories' model is the scripted expert (apply the fix, submit); their throughput is the env "
        "side's: workspaces, tools, hidden-test scoring in fresh sandboxes",
        f"workspace isolation here: {isolation}",
        "remote: the env server runs in this process on its own thread (one machine: loopback HTTP)",
    ]
    ratios: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    for backend in chosen:
        missing = envs_podman.missing(backend)
        if missing:
            if backends:  # asked for by name: not a silent skip
                raise RuntimeError(f"--backends {backend}: {missing}")
            notes.append(f"no {backend} arm: {missing}")
            continue
        arm_ratios, arm_rows = _arm(backend, quick, concurrency)
        ratios.update(arm_ratios)
        rows += arm_rows
        if backend != "native":
            notes.append(f"{backend}: each workspace is a container of the env image (`make env-image`); its pool "
                         f"prepares {concurrency} envs at once (envs.warm_pool.parallel): a prepare waits on a "
                         "container start")
    overhead = asyncio.run(_remote_overhead(100 if quick else 1000))
    ratios["remote_step_overhead_ms_p50"] = _ms(overhead, 50)
    ratios["remote_step_overhead_ms_p99"] = _ms(overhead, 99)
    patch_cpu = _patch_worst()
    ratios["apply_patch_worst_cpu_s"] = round(max(patch_cpu.values()), 3)
    rows.append({"what": "apply_patch worst shapes (CPU s)", **{k: round(v, 3) for k, v in patch_cpu.items()}})
    return BenchResult("envs", ratios, rows, notes)


def _patch_worst() -> dict[str, float]:
    """CPU seconds of `apply_patch` on the costliest shapes within its caps (see the module docstring)."""
    from rollart.envs.domains.swe.patch import MAX_HUNKS, apply_patch

    head = "--- a/f.py\n+++ b/f.py\n"
    lines = [f"{i:x}" for i in range(13000)]
    unique = "\n".join(lines) + "\n"
    blank = "\n" * 32000 + "end\n"
    shapes = {
        "one_line_hunks": (unique, "".join(f"@@ -1 +1 @@\n-{lines[-1 - k]}\n+{lines[-1 - k]}\n" for k in range(MAX_HUNKS))),
        "long_hunks": (blank, ("@@ -1,236 +1,236 @@\n" + " \n" * 235 + "-end\n+end\n") * MAX_HUNKS),
    }
    out = {}
    for name, (text, hunks) in shapes.items():
        start = time.process_time()
        apply_patch(head + hunks, {"f.py": text}.get)
        out[name] = time.process_time() - start
    return out


def _isolation() -> str:
    from rollart.config import WorkspaceConfig
    from rollart.sandbox.workspace import open_workspace

    from rollart.sandbox import cgroups

    ws = open_workspace(WorkspaceConfig(), {}, owner="bench")
    try:
        version = cgroups.support().version
        return f"{ws.isolation} (native backend; cgroup v{version})" if version else f"{ws.isolation} (native backend)"
    finally:
        ws.close()
