"""The twin's hardware description: the catalogue of GPU and node kinds, and the cluster a run is simulated on.

In: `catalogue.yaml` beside this module (or a user's catalogue with the same fields) and a hardware file
(`rollart sim RUN.yaml --hardware HW.yaml`). Out: a validated `SimHardware` — the model's shape, one
`GpuPoolSpec` per generation or training pool of the run config (which GPU kind, how many, tensor
parallelism), the reward backend's shape, the network, and the efficiency factors of the cost models —
plus `Catalogue` lookups. Every catalogue figure carries its source; unknown keys and kinds are errors
that name the field and what would be valid.

A hardware file, sparse like a run file:

    model: qwen3-8b                      # a known shape, or {params: 8.2e9, layers: 36, ...}
    pools:
      h800: {gpu: H800, count: 64, tp: 2}
      h20:  {gpu: H20, count: 24, tp: 2}
      train: {gpu: H800, count: 32}
    reward: {mode: serverless, max_replicas: 32}
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

CATALOGUE_PATH = Path(__file__).with_name("catalogue.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuKind(_Strict):
    peak_bf16_tflops: float = Field(gt=0, description="dense bf16 tensor-core TFLOP/s")
    hbm_gb: float = Field(gt=0, description="device memory, GB")
    hbm_gbps: float = Field(gt=0, description="device memory bandwidth, GB/s")
    nvlink_gbps: float = Field(ge=0, description="per-GPU scale-up bandwidth, GB/s (0: PCIe only)")
    price_per_hour: float = Field(gt=0, description="USD per GPU-hour")
    sources: dict[str, str] = Field(description="where each figure comes from")


class CpuKind(_Strict):
    cores: int = Field(gt=0)
    env_slots: int = Field(gt=0, description="environments one node runs at once")
    price_per_hour: float = Field(gt=0, description="USD per node-hour")
    sources: dict[str, str]


class NetworkSpec(_Strict):
    rdma_400g_gbps: float = Field(gt=0, description="effective GB/s of a weight transfer over 400 Gb/s RDMA")
    ethernet_200g_gbps: float = Field(gt=0, description="effective GB/s over 200 Gb/s Ethernet")
    tcp_cross_cluster_gbps: float = Field(gt=0, description="effective GB/s of TCP between clusters")
    sources: dict[str, str]


class Catalogue(_Strict):
    gpus: dict[str, GpuKind]
    cpus: dict[str, CpuKind]
    network: NetworkSpec

    def gpu(self, kind: str, where: str = "gpu") -> GpuKind:
        if kind not in self.gpus:
            raise ValueError(f"{where}: unknown GPU kind {kind!r}; the catalogue has {sorted(self.gpus)}")
        return self.gpus[kind]


def load_catalogue(path: str | Path | None = None) -> Catalogue:
    """The catalogue at `path` (default: the built-in one)."""
    return _load_catalogue(str(path or CATALOGUE_PATH))


@lru_cache(maxsize=8)
def _load_catalogue(path: str) -> Catalogue:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"hardware catalogue {path}: cannot read it ({exc})") from None
    try:
        return Catalogue.model_validate(data)
    except Exception as exc:
        raise ValueError(f"hardware catalogue {path}: {exc}") from None


# --- model shapes ------------------------------------------------------------------------------------


class ModelShape(_Strict):
    """What the cost models need of a transformer: parameters, layers, attention width, KV layout."""

    name: str = "custom"
    hub_id: str = Field("", description="the model's Hugging Face id (what `rollart plan` writes as model.path)")
    params: float = Field(gt=0, description="parameter count")
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    bytes_per_param: float = Field(2.0, gt=0, description="2 = bf16 weights")

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param


# Qwen3 dense shapes from the models' published config.json (hidden_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, head_dim) and model cards (parameter counts).
MODEL_SHAPES: dict[str, ModelShape] = {
    # rollart's built-in tiny model (rollart/config/model.py TinyModelConfig defaults), float32
    "tiny": ModelShape(name="tiny", params=0.53e6, layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32,
                       bytes_per_param=4),
    "qwen3-8b": ModelShape(name="qwen3-8b", hub_id="Qwen/Qwen3-8B", params=8.2e9, layers=36, hidden=4096, heads=32,
                           kv_heads=8, head_dim=128),
    "qwen3-14b": ModelShape(name="qwen3-14b", hub_id="Qwen/Qwen3-14B", params=14.8e9, layers=40, hidden=5120,
                            heads=40, kv_heads=8, head_dim=128),
    "qwen3-32b": ModelShape(name="qwen3-32b", hub_id="Qwen/Qwen3-32B", params=32.8e9, layers=64, hidden=5120,
                            heads=64, kv_heads=8, head_dim=128),
}


# --- the cluster a run is simulated on ---------------------------------------------------------------


class GpuPoolSpec(_Strict):
    gpu: str = Field(description="a GPU kind of the catalogue")
    count: int = Field(ge=0, description="GPUs in the pool")
    tp: int = Field(1, ge=1, description="tensor parallelism: GPUs per inference engine")


class EngineEfficiency(_Strict):
    """How close an engine gets to the hardware's peaks (defaults: typical of vLLM on Hopper)."""

    mfu_prefill: float = Field(0.5, gt=0, le=1, description="fraction of peak FLOP/s reached by prefill")
    mfu_decode: float = Field(0.5, gt=0, le=1, description="fraction of peak FLOP/s for decode's matmuls")
    bandwidth: float = Field(0.8, gt=0, le=1, description="fraction of HBM bandwidth reached by decode")
    step_overhead_s: float = Field(0.003, ge=0, description="fixed scheduling/launch cost of each engine step")
    memory_utilisation: float = Field(0.9, gt=0, le=1, description="share of HBM the engine may use (weights+KV)")
    max_batch: int = Field(256, ge=1, description="sequences decoded at once per engine (vLLM max_num_seqs)")
    prefix_cache_share: float = Field(0.5, ge=0, le=1, description="share of KV kept for idle multi-turn prefixes")


class TrainerSpec(_Strict):
    mfu: float = Field(0.35, gt=0, le=1, description="model FLOP utilisation of the training step")
    flops_per_token_factor: float = Field(
        8.0, gt=0, description="FLOPs per token ÷ params: 6 (forward+backward) + 2 (old-policy logprobs)"
    )
    fixed_s: float = Field(2.0, ge=0, description="per-step cost independent of tokens (optimizer, collectives)")
    lend_switch_s: float = Field(
        3.0, ge=0, description="train.elastic_generation: the trainer's devices switching to an inference engine on "
        "its weights, and back, each way (a declared guess: waking an engine whose weights are in memory, freeing its KV)"
    )


class WeightSyncSpec(_Strict):
    link: Literal["rdma_400g", "ethernet_200g", "tcp"] = Field(
        "tcp", description="the path from the training cluster to the inference clusters"
    )
    bucket_gb: float = Field(1.0, gt=0, description="weights move in buckets of this size (paper: ~1 GB)")
    overlap: bool = Field(True, description="publish and pull in the background (False: the naive stop-the-world)")
    naive_streams: int = Field(
        2, ge=1, description="naive scheme: engines the trainer sends to at once, the rest wait their turn"
    )
    swap_s: float = Field(0.2, ge=0, description="swapping pulled weights in, per engine")


class RewardSpec(_Strict):
    mode: Literal["none", "reserved", "serverless"] = Field(
        "none", description="none: reward costs no time; reserved workers; an elastic serverless pool"
    )
    workers: int = Field(4, ge=0, description="reserved: reward workers (each one GPU of `gpu`)")
    gpu: str = Field("H800", description="reserved: GPU kind of a reward worker (priced)")
    concurrency: int = Field(8, ge=1, description="requests one worker or replica scores at once")
    max_replicas: int = Field(32, ge=1, description="serverless: replicas the pool may run")
    cold_start_s: float = Field(2.0, ge=0, description="serverless: a new replica's start time")
    scale_down_s: float = Field(10.0, ge=0, description="serverless: an idle replica is released after this")


class ControlPlaneSpec(_Strict):
    """The control plane's own CPU (rollart/sim/control.py): each LLM-proxy shard one process, one server."""

    us_per_turn: float = Field(
        0.0, ge=0, description="CPU µs one generation turn costs its proxy process (calls in and out, routing); "
        "0 = not modelled (the proxy takes no virtual time)"
    )
    shards: int = Field(1, ge=1, description="proxy processes the turns are split over (a real run's "
                        "inference.proxy_shards)")
    shard_by: Literal["domain", "group"] = Field(
        "group", description="domain: a shard per task domain (modulo shards); group: a stable hash of the group"
    )


class SimHardware(_Strict):
    catalogue: str = Field("", description="path of a catalogue YAML; empty = the built-in one")
    model: ModelShape
    pools: dict[str, GpuPoolSpec] = Field(description="GPU pools by run-config pool name")
    train_pool: str = Field("train", description="the pool the trainer runs on")
    engine: EngineEfficiency = EngineEfficiency()
    trainer: TrainerSpec = TrainerSpec()
    weights: WeightSyncSpec = WeightSyncSpec()
    reward: RewardSpec = RewardSpec()
    control: ControlPlaneSpec = ControlPlaneSpec()
    env_nodes: int = Field(0, ge=0, description="CPU environment nodes (priced; 0 = not counted)")

    @model_validator(mode="before")
    @classmethod
    def _model_by_name(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            name = data["model"]
            if name not in MODEL_SHAPES:
                raise ValueError(f"model: unknown shape {name!r}; known: {sorted(MODEL_SHAPES)} or give its fields")
            data = {**data, "model": MODEL_SHAPES[name]}
        return data

    @model_validator(mode="after")
    def _check(self) -> SimHardware:
        cat = self.load_catalogue()
        for name, pool in self.pools.items():
            cat.gpu(pool.gpu, f"pools.{name}.gpu")
            if pool.count and pool.count % pool.tp:
                raise ValueError(f"pools.{name}: count {pool.count} is not a multiple of tp {pool.tp}")
        if self.train_pool not in self.pools:
            raise ValueError(f"train_pool: {self.train_pool!r} is not one of pools {sorted(self.pools)}")
        if self.reward.mode == "reserved":
            cat.gpu(self.reward.gpu, "reward.gpu")
        return self

    def load_catalogue(self) -> Catalogue:
        return load_catalogue(self.catalogue or None)

    def gpu_kind(self, pool: str) -> GpuKind:
        return self.load_catalogue().gpu(self.pools[pool].gpu)

    def price_per_hour(self) -> float:
        """USD per hour of every GPU and node this hardware holds."""
        cat = self.load_catalogue()
        total = sum(p.count * cat.gpu(p.gpu).price_per_hour for p in self.pools.values())
        if self.reward.mode == "reserved":
            total += self.reward.workers * cat.gpu(self.reward.gpu).price_per_hour
        if self.env_nodes:
            total += self.env_nodes * next(iter(cat.cpus.values())).price_per_hour
        return total

    def link_gbps(self) -> float:
        net = self.load_catalogue().network
        return {"rdma_400g": net.rdma_400g_gbps, "ethernet_200g": net.ethernet_200g_gbps,
                "tcp": net.tcp_cross_cluster_gbps}[self.weights.link]


def load_hardware(path: str | Path) -> SimHardware:
    """Read and validate a hardware file; errors name the file and the field."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ValueError(f"hardware file {path}: cannot read it ({exc})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"hardware file {path}: malformed YAML ({exc})") from None
    try:
        return SimHardware.model_validate(data)
    except Exception as exc:
        raise ValueError(f"hardware file {path}: {exc}") from None
