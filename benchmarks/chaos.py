"""`rollart bench chaos [--nodes 2]`: the default job, shortened, run clean and under a fault schedule.

Both arms run the default job (the one `make demo` runs, `train.steps` and the warm start shortened)
through the real driver, in this process, with the same seed. The `faulty` arm gets a fault schedule
(`benchmarks.faults`): at seeded RL steps, and a seeded moment within each, SIGKILL of one inference
worker, one env worker, the reward service's replica and the trainer rank — and with `--nodes 2` a whole
worker node. Nothing in rollart is told; it has to notice and recover.

Fairness on a shared, loaded machine: the arms alternate — clean, faulty, faulty, clean (ABBA) in the full
bench, clean then faulty in `--quick` — so a load that drifts during the bench weighs on both arms alike,
and times are means over an arm's runs. `RAY_worker_niceness=0`: workers are not outcompeted by the
machine's other processes.

With `--nodes 2` every run joins its own loopback two-node Ray (`rollart.resources.loopback`): the head holds the
train, env, reward and gen_prefill pools (gen_prefill with a spare slot), the worker node holds gen_decode
(the math domain's pool); losing it replaces its worker on gen_prefill through the pool's fallback.

Ratios: `faults_injected`; `faults_survived` (faults whose component was seen dead and came back — a
replacement, a trainer rebuild, a reward replica started again — in a run that completed);
`trajectories_lost` (started, never ended, from the runs' ledger files: must be 0);
`trajectories_duplicated` (ended twice or trained twice: must be 0); `run_completed` (1 when every faulty
run did all its steps); `slowdown_vs_clean` (RL-phase wall time — first evaluation to last — faulty ÷
clean, means over each arm's runs; target ≤ 1.5); `eval_delta_vs_clean` (final mean validation score,
faulty − clean). Rows: one per run, and the fault timeline of each faulty run (seconds since its RL phase
began, kind, victim).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult
from benchmarks.faults import Injector, plan
from rollart.resources.loopback import FAST_NODE_DEATH, LoopbackCluster
from rollart.config.loader import load_config
from rollart.job.driver import train
from rollart.observability import read_metrics
from rollart.observability.ledger import audit_ledger

log = logging.getLogger("benchmarks")

SEED = 0
KINDS = ["inference", "env", "reward", "trainer"]
# what shows that a fault's component came back (the metric, and how much of it one fault makes)
RECOVERY = {
    "inference": ("pools/{inference}/replacements", 1),
    "env": ("pools/env/replacements", 1),
    "reward": ("reward/serverless/replica_starts", 2),  # the one killed, and the one Serve started instead
    "trainer": ("train/restarts", 1),
    "node": ("pools/gen_decode/replacements", 1),
}
HEAD_POOLS = {"pool_train": 1, "pool_gen_prefill": 2, "pool_env": 4, "pool_reward": 2}
WORKER_NODE_POOLS = {"pool_gen_decode": 1}


def _overrides(quick: bool) -> list[str]:
    shortened = ["train.steps=16", "train.warm_start.steps=40"] if quick else ["train.steps=40",
                                                                                "train.warm_start.steps=100"]
    return [*shortened, "train.checkpoint_every=5", "eval.every=1000", "eval.episodes_per_domain=32",
            "cluster.health_interval_s=1.0", "observability.progress=quiet", "observability.tensorboard=false",
            f"seed={SEED}"]


def run(quick: bool, nodes: int = 1) -> BenchResult:
    if nodes not in (1, 2):
        raise ValueError(f"--nodes {nodes}: the chaos bench runs on 1 node or a loopback cluster of 2")
    os.environ["RAY_worker_niceness"] = "0"
    kinds = KINDS + (["node"] if nodes == 2 else [])
    arms = ["clean", "faulty"] if quick else ["clean", "faulty", "faulty", "clean"]
    rows, timelines = [], []
    with tempfile.TemporaryDirectory(prefix="rollart-chaos-", dir="/tmp") as tmp:
        for i, arm in enumerate(arms):
            row, timeline = _one_run(Path(tmp) / f"{i}-{arm}", arm, quick, kinds, nodes)
            rows.append(row)
            if timeline:
                timelines.append({"run": i, "faults": timeline})
    return _result(rows, timelines, kinds, nodes)


def _one_run(work: Path, arm: str, quick: bool, kinds: list[str], nodes: int) -> tuple[dict[str, Any], list]:
    work.mkdir(parents=True)
    run_dir = work / "run"
    overrides = [f"run_dir={run_dir}", *_overrides(quick)]
    cluster = None
    if nodes == 2:  # its own short temp dir: Ray's socket paths live under it
        cluster = LoopbackCluster(Path(tempfile.mkdtemp(prefix="rc", dir="/tmp")), env=FAST_NODE_DEATH)
        address = cluster.head(HEAD_POOLS)
        worker_node = cluster.add(WORKER_NODE_POOLS)
        overrides += [f"cluster.address={address}", "pools.gen_prefill.capacity=2"]
        _wait_for_pool(address, "pool_gen_decode")
    cfg = load_config(None, overrides)
    steps = cfg.train.steps
    injector = None
    if arm == "faulty":
        faults = plan(kinds, steps, SEED, first_step=2)
        injector = Injector(faults, run_dir, SEED,
                            kill_node=(lambda: cluster.kill(worker_node)) if cluster else None)
        injector.start()
    started = time.time()
    completed, error = True, ""
    try:
        train(cfg)
    except Exception as exc:  # noqa: BLE001 — a run that did not survive is a result, reported as such
        completed, error = False, f"{type(exc).__name__}: {exc}"
        log.exception("the %s run failed", arm)
    finally:
        if injector is not None:
            injector.stop()
        if cluster is not None:
            cluster.close()
            shutil.rmtree(cluster.tmp, ignore_errors=True)
    timeline = [vars(f) for f in injector.timeline] if injector else []
    return _measure(run_dir, arm, steps, completed, error, started, injector), timeline


def _wait_for_pool(address: str, resource: str, timeout_s: float = 120.0) -> None:
    """The worker node has joined (its pool is in the cluster's resources)."""
    import ray

    deadline = time.monotonic() + timeout_s
    ray.init(address=address)
    try:
        while ray.cluster_resources().get(resource, 0) <= 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no node with {resource} joined {address} within {timeout_s:g} s")
            time.sleep(0.5)
    finally:
        ray.shutdown()


def _measure(run_dir: Path, arm: str, steps: int, completed: bool, error: str, started: float,
             injector: Injector | None) -> dict[str, Any]:
    records = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    last: dict[str, float] = {}
    for record in records:
        last.update(record)
    evals = [(r["wall_s"], r["eval/mean"]) for r in records if "eval/mean" in r]
    done = int(max((r["step"] + 1 for r in records if "time/step" in r), default=0))
    audit = audit_ledger(run_dir / "ledger.jsonl")
    row: dict[str, Any] = {
        "arm": arm, "completed": int(completed and done == steps), "steps": done,
        "rl_wall_s": round(evals[-1][0] - evals[0][0], 1) if len(evals) >= 2 else None,
        "wall_s": round(time.time() - started, 1),
        "eval_first": round(evals[0][1], 3) if evals else None,
        "eval_last": round(evals[-1][1], 3) if len(evals) >= 2 else None,
        "started": audit.started, "trained": audit.fates.get("trained", 0),
        "lost": len(audit.lost), "duplicated": audit.duplicated,
        "turn_retries": last.get("rollout/turn_retries", 0.0), "train_restarts": last.get("train/restarts", 0.0),
        "reward_outage_retries": last.get("reward/serverless/outage_retries", 0.0),
    }
    for key, value in last.items():
        if key.endswith(("/worker_deaths", "/replacements")) and value:
            row[key] = value
    if injector is not None:
        row["faults"] = len(injector.timeline)
        row["survived"] = sum(_recovered(f.kind, last) for f in injector.timeline) if row["completed"] else 0
        row["injector_errors"] = injector.errors
    if error:
        row["error"] = error[:500]
    return row


def _recovered(kind: str, metrics: dict[str, float]) -> bool:
    key, at_least = RECOVERY[kind]
    if kind == "inference":
        return sum(metrics.get(key.format(inference=p), 0.0) for p in ("gen_prefill", "gen_decode")) >= at_least
    return metrics.get(key, 0.0) >= at_least


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _result(rows: list[dict[str, Any]], timelines: list, kinds: list[str], nodes: int) -> BenchResult:
    clean = [r for r in rows if r["arm"] == "clean"]
    faulty = [r for r in rows if r["arm"] == "faulty"]

    def arm_mean(arm_rows: list[dict[str, Any]], key: str) -> float:
        return _mean([r[key] for r in arm_rows if r.get(key) is not None])

    ratios = {
        "faults_injected": float(sum(r.get("faults", 0) for r in faulty)),
        "faults_survived": float(sum(r.get("survived", 0) for r in faulty)),
        "trajectories_lost": float(sum(r["lost"] for r in rows)),
        "trajectories_duplicated": float(sum(r["duplicated"] for r in rows)),
        "run_completed": float(all(r["completed"] for r in faulty)),
        "slowdown_vs_clean": arm_mean(faulty, "rl_wall_s") / arm_mean(clean, "rl_wall_s"),
        "eval_delta_vs_clean": arm_mean(faulty, "eval_last") - arm_mean(clean, "eval_last"),
    }
    notes = [
        f"arms in order {[r['arm'] for r in rows]} (alternated: a drifting machine load weighs on both), "
        f"{nodes} node(s); fault kinds {kinds}, one of each per faulty run, SIGKILL at seeded moments",
        *(f"faults of run {t['run']}: " + "; ".join(
            f"{f['at_s']:.1f}s {f['kind']} ({f['victim']}, pid {f['pid']}, after step {f['step']})"
            for f in t["faults"]) for t in timelines),
    ]
    return BenchResult("chaos", ratios, rows, notes)
