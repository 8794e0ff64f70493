"""What `rollart plan` writes for a chosen candidate: the run file, the `ray start` lines, a KubeRay manifest.

In: the run config, the hardware template and the `Candidate` the search chose (with `tp` and the node
size). Out:
- `run_yaml` — the planned run as a sparse run file (what differs from the defaults; defaults it does not
  use set to null): one pool per GPU kind with a slot per inference engine and the other generation pools
  as its fallback, the training pool, every domain on its planned pool, and `inference.replicas_per_pool` (one number for every pool in this version of rollart:
  the smallest pool's engine count, so every engine slot of a larger pool is not filled — said in a
  comment in the file);
- `ray_start_lines` — one `ray start` per node: the head (training GPUs, the run's CPU and serverless
  pools' slots), then the other training nodes and each
  generation node with `--num-gpus` and its pool's custom resource (`pool_<name>`: engine slots);
- `raycluster_manifest` — a KubeRay `RayCluster` (ray.io/v1) with a head group and one worker group per
  pool, each pod asking for its node's GPUs and landing on that GPU kind (`nvidia.com/gpu.product`).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from rollart.config import PoolConfig, RunConfig, default_domains, default_pools
from rollart.plan.search import Candidate, apply
from rollart.sim.hardware import SimHardware

RAY_VERSION = "2.60.0"
GPU_PRODUCT = {  # the node label the NVIDIA GPU feature discovery puts on nodes of each kind
    "H800": "NVIDIA-H800", "H20": "NVIDIA-H20", "H100": "NVIDIA-H100-80GB-HBM3", "A100": "NVIDIA-A100-SXM4-80GB",
    "L40S": "NVIDIA-L40S",
}


def run_yaml(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int, address: str = "HEAD_IP:6379") -> str:
    planned, _ = apply(cfg, hardware, cand, tp)
    engines = {name: gpus // tp for name, _, gpus in cand.pools}
    train = hardware.pools[hardware.train_pool]
    pools = {**planned.pools, hardware.train_pool: PoolConfig(kind="gpu", device="cuda", capacity=train.count,
                                                              description=f"{train.count} {train.gpu}")}
    for name, kind, gpus in cand.pools:
        pools[name] = pools[name].model_copy(update={"description": f"{gpus} {kind}, tp {tp}"})
    planned = planned.model_copy(update={
        "pools": pools,
        "cluster": planned.cluster.model_copy(update={"address": address}),
        "inference": planned.inference.model_copy(update={"replicas_per_pool": min(engines.values())}),
        "train": planned.train.model_copy(update={"workers": train.count}),
    })
    data = planned.model_dump(mode="json", exclude_defaults=True)
    # a run file merges into the defaults: defaults the plan does not use are dropped explicitly
    data["pools"] = {**{p: None for p in default_pools() if p not in planned.pools}, **data.get("pools", {})}
    data["domains"] = {**{d: None for d in default_domains() if d not in planned.domains}, **data.get("domains", {})}
    header = (f"# rollart plan: {cand.describe()}\n"
              f"# inference.replicas_per_pool is one number for all pools: the smallest pool's engines "
              f"({min(engines.values())}); pools' engine slots: {engines}\n")
    return header + yaml.safe_dump(data, sort_keys=False)


def _nodes(gpus: int, node: int) -> int:
    return -(-gpus // node)


def cpu_slots(cfg: RunConfig) -> dict[str, int]:
    """The run's CPU and serverless pools as Ray resources (`pool_<name>`: slots), hosted by the head."""
    return {f"pool_{name}": int(pool.capacity) for name, pool in sorted(cfg.pools.items()) if pool.kind != "gpu"}


def ray_start_lines(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int, node: int,
                    port: int = 6379) -> list[str]:
    train = hardware.pools[hardware.train_pool]
    head_resources = {f"pool_{hardware.train_pool}": min(train.count, node), **cpu_slots(cfg)}
    lines = [f"ray start --head --port={port} --num-gpus={min(train.count, node)} "
             f"--resources='{json.dumps(head_resources)}'   # head: training GPUs, the CPU and serverless pools"]
    for i in range(1, _nodes(train.count, node)):
        n = min(node, train.count - i * node)
        lines.append(f"ray start --address=HEAD_IP:{port} --num-gpus={n} "
                     f"--resources='{json.dumps({f'pool_{hardware.train_pool}': n})}'   # training node {i}")
    for name, kind, gpus in cand.pools:
        for i in range(_nodes(gpus, node)):
            n = min(node, gpus - i * node)
            lines.append(f"ray start --address=HEAD_IP:{port} --num-gpus={n} "
                         f"--resources='{json.dumps({f'pool_{name}': n // tp})}'   # {kind} node {i} of pool {name}")
    return lines


def raycluster_manifest(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int, node: int,
                        name: str = "rollart", image: str = f"rayproject/ray:{RAY_VERSION}-gpu") -> dict[str, Any]:
    train = hardware.pools[hardware.train_pool]

    def pod(kind: str, gpus: int, role: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{
            "name": f"ray-{role}", "image": image,
            "resources": {"limits": {"nvidia.com/gpu": gpus, "cpu": "32", "memory": "256Gi"},
                          "requests": {"nvidia.com/gpu": gpus, "cpu": "32", "memory": "256Gi"}},
        }]}
        if kind in GPU_PRODUCT:
            spec["nodeSelector"] = {"nvidia.com/gpu.product": GPU_PRODUCT[kind]}
        return {"spec": spec}

    head_gpus = min(train.count, node)
    head_resources = {f"pool_{hardware.train_pool}": head_gpus, **cpu_slots(cfg)}
    groups = []
    rest = _nodes(train.count, node) - 1
    if rest > 0:
        groups.append(_group(f"{hardware.train_pool}", rest, {f"pool_{hardware.train_pool}": node}, node,
                             pod(train.gpu, node, "worker")))
    for pool, kind, gpus in cand.pools:
        per_node = min(node, gpus)
        groups.append(_group(pool, _nodes(gpus, node), {f"pool_{pool}": per_node // tp}, per_node,
                             pod(kind, per_node, "worker")))
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "rollart-plan"}},
        "spec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": {
                "rayStartParams": {"num-gpus": str(head_gpus), "resources": json.dumps(json.dumps(head_resources))},
                "template": pod(train.gpu, head_gpus, "head"),
            },
            "workerGroupSpecs": groups,
        },
    }


def _group(name: str, replicas: int, resources: dict[str, int], gpus: int, template: dict[str, Any]) -> dict[str, Any]:
    return {
        "groupName": name.replace("_", "-"),
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": replicas,
        "rayStartParams": {"num-gpus": str(gpus), "resources": json.dumps(json.dumps(resources))},
        "template": template,
    }
