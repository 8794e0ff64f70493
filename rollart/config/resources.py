"""The resource plane's sections: the Ray `cluster`, the hardware `pools` and the per-role placement `roles`.

In: `Section` and the trust markers (`base`), the bounds (`bounds`). Out: `ClusterConfig`, `PoolConfig`,
`RoleConfig`, and `device_lacks_bf16`, the check of a pool's device that `RunConfig` and the trainer ranks run.

Guarantees: a pool has a kind, a positive capacity and an ordered fallback list; that its fallbacks and the
roles' pools are declared pools is checked once the whole config is known (`rollart.config.run`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollart.config.base import TRUST_GUARD, TRUST_NETWORK, Section
from rollart.config.bounds import DAY_S, HOUR_S, MAX_ENTRIES, MAX_MB, MAX_THREADS, MAX_WORKERS


class ClusterConfig(Section):
    """The Ray runtime: embedded on this machine, or an existing cluster joined by address."""

    address: str = Field(
        "", description="existing Ray cluster address; empty = start Ray embedded",
        json_schema_extra=TRUST_NETWORK,
    )
    num_cpus: int | None = Field(None, gt=0, le=MAX_THREADS, description="CPUs for embedded Ray; None = all cores")
    object_store_mb: int = Field(
        512, ge=64, le=MAX_MB, description="object store of embedded Ray (holds weight buckets and batches), in MiB"
    )
    dashboard: bool = Field(
        False, description="embedded Ray: start Ray's dashboard (actors, logs, resources) on 127.0.0.1; its URL is "
        "printed at start, as a joined cluster's is. Off by default: it costs ~150 MB and a CPU share"
    )
    namespace: str = Field(
        "rollart", description="Ray namespace of the run's named actors; `rollart pools` in the same namespace "
        "sees a running job's holders and fallbacks"
    )
    placement_timeout_s: float = Field(10.0, gt=0, le=DAY_S, description="how long a placement may stay pending")
    start_timeout_s: float = Field(120.0, gt=0, le=DAY_S, description="how long a placed worker's constructor may take")
    allow_unauthenticated: bool = Field(
        False, description="join a non-loopback cluster.address without Ray's token auth (then anyone who can "
        "reach the cluster can run code on it); by default rollart keeps token auth on for such addresses",
        json_schema_extra=TRUST_GUARD,
    )
    health_interval_s: float = Field(
        2.0, gt=0, le=HOUR_S, description="how often every placed worker's liveness and the nodes' pool resources are "
        "checked: a dead worker is noticed within this (or at once by a caller whose call it ended)"
    )


def device_lacks_bf16(device: str) -> str | None:
    """Why a torch `device` of this machine cannot compute in bfloat16 (None: it can). A CUDA GPU needs compute
    capability ≥ 8.0 (Ampere; older ones only emulate bf16); a CPU always can (torch emulates it where the CPU has no
    bf16 instructions — correct, slower than fp32). torch is imported only for a CUDA device."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return "this machine has no CUDA device"
    indices = [int(device.split(":", 1)[1])] if ":" in device else list(range(torch.cuda.device_count()))
    for i in indices:
        if i >= torch.cuda.device_count():
            return f"this machine has {torch.cuda.device_count()} CUDA device(s), no cuda:{i}"
        major, minor = torch.cuda.get_device_capability(i)
        if major < 8:
            return (f"cuda:{i} ({torch.cuda.get_device_name(i)}, compute capability {major}.{minor}) has no bfloat16 "
                    "arithmetic (it needs 8.0, Ampere, or newer)")
    return None


class PoolConfig(Section):
    """A resource pool: a kind of hardware, how many worker slots it has, where to go when it is full."""

    kind: Literal["gpu", "cpu", "serverless"] = Field(
        description="gpu or cpu: hosts inference and trainer workers; serverless: hosts reward replicas"
    )
    device: str = Field("cpu", description="torch device workers on this pool use: cpu, cuda, cuda:1 …")
    capacity: float = Field(1.0, gt=0, le=MAX_WORKERS, description="worker slots (a Ray custom resource)")
    fallback: list[str] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="pools to try, in order, when full"
    )
    elastic: bool = Field(
        False, description="when a node joins with this pool's resource, place more workers (of worker sets that "
        "prefer this pool) on it while the run goes on"
    )
    description: str = Field("", description="free text for readers of the config (what hardware the pool is)")


class RoleConfig(Section):
    """Per-role override of a worker class's `@affinity` (pool, fallback) and its replica count."""

    pool: str | None = Field(None, description="preferred pool of this role's workers; None = the class's @affinity")
    fallback: list[str] | None = Field(
        None, max_length=MAX_ENTRIES, description="pools to try, in order, when the preferred one is full; None = the "
        "class's @affinity (if it prefers the same pool), else the pool's own fallback"
    )
    replicas: int | None = Field(
        None, ge=1, le=MAX_WORKERS, description="workers of this role when the placing code does not say (the "
        "built-in roles take theirs from inference.replicas_per_pool, train.workers and envs.workers); None = 1"
    )
