"""What `rollart plan` writes for a chosen candidate: the run file, the `ray start` lines, a KubeRay manifest —
all three from one planned run config, so the nodes' resources add up to exactly the run's pools.

In: the run config the plan was made for (`Plan.run`), the hardware template and the `Candidate` the search
chose (with `tp` and the node size). Out:
- `planned_config` — the run on the cluster: one GPU pool per generation pool of the candidate with a slot
  per inference engine (the other generation pools its fallback), the training pool with a slot per GPU
  (`train.workers` = its GPUs), the run's CPU and serverless pools as they were, every domain on its
  planned pool; the model the hardware file names (`model.path` = its Hugging Face id) in its dtype, vLLM
  with the plan's tensor parallelism (the built-in engine under `train.lora`, which vLLM cannot serve yet),
  and `inference.replicas`: each generation pool's engine count, so every engine slot is filled;
- `nodes` — the cluster's Ray nodes: the head (the first training GPUs, and every CPU and serverless pool's
  slots), the other training nodes, then each generation pool's nodes; each with its GPUs and its
  `pool_<name>` custom resources;
- `run_yaml` — `planned_config` as a sparse run file (defaults it does not use set to null), its header the
  plan and the notes on what was filled in or raised;
- `ray_start_lines` — one `ray start` per node;
- `raycluster_manifest` — a KubeRay `RayCluster` (ray.io/v1): the head group and one worker group per pool
  and node size, each pod asking for its node's GPUs on that GPU kind (`nvidia.com/gpu.product`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import yaml

from rollart.config import PoolConfig, RunConfig, default_domains, default_pools
from rollart.plan.search import Candidate, apply
from rollart.sim.hardware import SimHardware

RAY_VERSION = "2.60.0"
GPU_PRODUCT = {  # the node label the NVIDIA GPU feature discovery puts on nodes of each kind
    "H800": "NVIDIA-H800", "H20": "NVIDIA-H20", "H100": "NVIDIA-H100-80GB-HBM3", "A100": "NVIDIA-A100-SXM4-80GB",
    "L40S": "NVIDIA-L40S",
}
DTYPE_OF_BYTES = {2: "bfloat16", 4: "float32"}


@dataclass(frozen=True)
class Node:
    """One Ray node of the planned cluster."""

    role: str  # "head", or the pool whose GPUs it holds
    gpu: str  # its GPU kind ("" for none)
    gpus: int
    resources: dict[str, float]  # Ray custom resources: pool_<name> → slots
    comment: str


def planned_config(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int,
                   address: str = "HEAD_IP:6379") -> RunConfig:
    """The run on the planned cluster (see the module docstring)."""
    planned, _ = apply(cfg, hardware, cand, tp)
    train = hardware.pools[hardware.train_pool]
    if train.count < 1:
        raise ValueError(f"hardware pools.{hardware.train_pool}: the training pool has no GPUs")
    engines = {name: gpus // tp for name, _, gpus in cand.pools}
    pools = {name: pool for name, pool in planned.pools.items()
             if pool.kind != "gpu" or name in engines or name == hardware.train_pool}
    pools[hardware.train_pool] = PoolConfig(kind="gpu", device="cuda", capacity=train.count,
                                            description=f"{train.count} {train.gpu}")
    for name, kind, gpus in cand.pools:
        pools[name] = pools[name].model_copy(update={"description": f"{gpus} {kind}, tp {tp}"})
    shape = hardware.model
    model = planned.model.model_copy(update={
        "path": shape.hub_id or f"SET-ME: a checkpoint of the hardware file's {shape.params:.3g}-parameter model",
        "dtype": DTYPE_OF_BYTES.get(int(shape.bytes_per_param), "bfloat16"),
    })
    inference = planned.inference.model_copy(update={"replicas": engines})
    if planned.train.lora is None:  # vLLM does not serve LoRA adapters yet (the config refuses it)
        inference = inference.model_copy(update={
            "engine": "vllm", "vllm": inference.vllm.model_copy(update={"tensor_parallel_size": tp, "kv_cache_mb": 0})})
    data = planned.model_dump()
    data.update(pools={n: p.model_dump() for n, p in pools.items()}, model=model.model_dump(),
                inference=inference.model_dump(),
                cluster={**data["cluster"], "address": address}, train={**data["train"], "workers": train.count})
    return RunConfig.model_validate(data)


def _node_sizes(gpus: int, node: int) -> list[int]:
    return [min(node, gpus - start) for start in range(0, gpus, node)]


def _slots(capacity: float) -> float:
    return int(capacity) if float(capacity).is_integer() else capacity


def nodes(planned: RunConfig, hardware: SimHardware, cand: Candidate, tp: int, node: int) -> list[Node]:
    """The planned cluster's Ray nodes, the head first (see the module docstring)."""
    train_pool = hardware.train_pool
    train = hardware.pools[train_pool]
    shared = {f"pool_{name}": _slots(pool.capacity) for name, pool in sorted(planned.pools.items())
              if pool.kind != "gpu"}
    sizes = _node_sizes(train.count, node)
    out = [Node("head", train.gpu, sizes[0], {f"pool_{train_pool}": sizes[0], **shared},
                f"head: {sizes[0]} {train.gpu} of pool {train_pool}, the CPU and serverless pools' slots")]
    out += [Node(train_pool, train.gpu, n, {f"pool_{train_pool}": n}, f"training node {i}")
            for i, n in enumerate(sizes[1:], start=1)]
    for name, kind, gpus in cand.pools:
        out += [Node(name, kind, n, {f"pool_{name}": n // tp}, f"{kind} node {i} of pool {name}: {n // tp} engines")
                for i, n in enumerate(_node_sizes(gpus, node))]
    return out


def run_yaml(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int, notes: Sequence[str] = (),
             address: str = "HEAD_IP:6379") -> str:
    planned = planned_config(cfg, hardware, cand, tp, address)
    data = planned.model_dump(mode="json", exclude_defaults=True)
    # a run file merges into the defaults: defaults the plan does not use are dropped explicitly
    data["pools"] = {**{p: None for p in default_pools() if p not in planned.pools}, **data.get("pools", {})}
    data["domains"] = {**{d: None for d in default_domains() if d not in planned.domains}, **data.get("domains", {})}
    lines = [f"# rollart plan: {cand.describe()}"]
    lines += [f"# {note}" for note in notes]
    return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False)


def _resources(resources: dict[str, float]) -> str:
    return json.dumps(resources)


def ray_start_lines(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int, node: int,
                    port: int = 6379) -> list[str]:
    lines = []
    for n in nodes(planned_config(cfg, hardware, cand, tp), hardware, cand, tp, node):
        where = f"--head --port={port}" if n.role == "head" else f"--address=HEAD_IP:{port}"
        lines.append(f"ray start {where} --num-gpus={n.gpus} --resources='{_resources(n.resources)}'   # {n.comment}")
    return lines


def raycluster_manifest(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int, node: int,
                        name: str = "rollart", image: str = f"rayproject/ray:{RAY_VERSION}-gpu") -> dict[str, Any]:
    def pod(kind: str, gpus: int, role: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{
            "name": f"ray-{role}", "image": image,
            "resources": {"limits": {"nvidia.com/gpu": gpus, "cpu": "32", "memory": "256Gi"},
                          "requests": {"nvidia.com/gpu": gpus, "cpu": "32", "memory": "256Gi"}},
        }]}
        if kind in GPU_PRODUCT:
            spec["nodeSelector"] = {"nvidia.com/gpu.product": GPU_PRODUCT[kind]}
        return {"spec": spec}

    head, *workers = nodes(planned_config(cfg, hardware, cand, tp), hardware, cand, tp, node)
    groups: dict[tuple[str, int], list[Node]] = {}  # one worker group per pool and node size
    for n in workers:
        groups.setdefault((n.role, n.gpus), []).append(n)
    sizes_of: dict[str, int] = {}
    for role, _ in groups:
        sizes_of[role] = sizes_of.get(role, 0) + 1
    specs = []
    for (role, gpus), members in groups.items():
        group_name = role if sizes_of[role] == 1 else f"{role}-{gpus}gpu"
        specs.append(_group(group_name, len(members), members[0].resources, gpus, pod(members[0].gpu, gpus, "worker")))
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "rollart-plan"}},
        "spec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": {
                "rayStartParams": {"num-gpus": str(head.gpus), "resources": json.dumps(_resources(head.resources))},
                "template": pod(head.gpu, head.gpus, "head"),
            },
            "workerGroupSpecs": specs,
        },
    }


def _group(name: str, replicas: int, resources: dict[str, float], gpus: int, template: dict[str, Any]
           ) -> dict[str, Any]:
    return {
        "groupName": name.replace("_", "-"),
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": replicas,
        "rayStartParams": {"num-gpus": str(gpus), "resources": json.dumps(_resources(resources))},
        "template": template,
    }
