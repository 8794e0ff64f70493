"""Cost models of the twin: how long an engine step, a prefill, a train step and a weight sync take.

In: a `ModelShape`, a `GpuKind` from the catalogue and the efficiency factors of `SimHardware`. Out: seconds.
Pure arithmetic (no clocks, no state), each formula here and tested against hand computation.

Engine (one inference engine = `tp` GPUs of one kind, tensor parallel):
- prefill of n new tokens after c cached ones is compute-bound:
      FLOPs = 2·params·n + 4·layers·(heads·head_dim)·n·(c + n/2)        (matmuls + causal attention)
      t = FLOPs / (tp · peak · mfu_prefill)
- a decode step of B sequences holding K KV tokens in all is bandwidth- or compute-bound, whichever is
  slower, plus a fixed step overhead:
      t = max((weight_bytes + K·kv_bytes_per_token) / (tp · hbm_bw · bandwidth),
              (2·params·B + 4·layers·(heads·head_dim)·K) / (tp · peak · mfu_decode)) + overhead
- KV capacity (continuous batching admits while it fits) = tp·hbm·memory_utilisation − weight_bytes.

Trainer: t = flops_per_token_factor · params · tokens / (gpus · peak · mfu) + fixed_s.

Weights (bytes = params · bytes_per_param) over a link of L GB/s (an effective figure: the paper's
measured transfer rates), T = bytes / L per copy:
- naive (stop the world, a synchronous NCCL-style scheme): the trainer pushes, then sends to the engines
  `naive_streams` at a time: exposed = T + ⌈engines / naive_streams⌉ · T + swap;
- overlapped (the paper's bucketed store, Mooncake-like: distributed, every engine pulls in parallel):
  publishing starts when the train step ends and each engine's pull follows the push bucket by bucket, so a
  pull is done at publish + T + one bucket's time; at the sync an engine waits only for what is left of
  it, then swaps. Exposed = max(0, T + bucket − background) + swap.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import ceil

from rollart.sim.hardware import EngineEfficiency, GpuKind, ModelShape, TrainerSpec, WeightSyncSpec

GB = 1e9
TFLOP = 1e12


@dataclass(frozen=True)
class EngineCost:
    model: ModelShape
    gpu: GpuKind
    tp: int
    eff: EngineEfficiency

    @property
    def flops(self) -> float:
        return self.tp * self.gpu.peak_bf16_tflops * TFLOP

    @property
    def bandwidth(self) -> float:
        return self.tp * self.gpu.hbm_gbps * GB * self.eff.bandwidth

    @property
    def _attn_width(self) -> int:
        return self.model.heads * self.model.head_dim

    def kv_capacity_tokens(self) -> int:
        free = self.tp * self.gpu.hbm_gb * GB * self.eff.memory_utilisation - self.model.weight_bytes
        if free <= 0:
            raise ValueError(
                f"{self.model.name} ({self.model.weight_bytes / GB:.1f} GB of weights) does not fit on {self.tp} "
                f"GPU(s) of {self.gpu.hbm_gb:g} GB: raise the pool's tp"
            )
        return int(free / self.model.kv_bytes_per_token)

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        n = new_tokens
        flops = 2 * self.model.params * n + 4 * self.model.layers * self._attn_width * n * (cached_tokens + n / 2)
        return flops / (self.flops * self.eff.mfu_prefill)

    def decode_step_s(self, batch: int, kv_tokens: float) -> float:
        if batch <= 0:
            return 0.0
        weight_bytes, kv_bytes, bandwidth, two_params, four_layers_width, compute_rate, overhead = self._decode
        memory = (weight_bytes + kv_tokens * kv_bytes) / bandwidth
        compute = (two_params * batch + four_layers_width * kv_tokens) / compute_rate
        return max(memory, compute) + overhead

    @cached_property
    def _decode(self) -> tuple[float, float, float, float, float, float, float]:
        """The decode formula's constants (an engine asks for a step time at every event of the twin)."""
        m = self.model
        return (m.weight_bytes, m.kv_bytes_per_token, self.bandwidth, 2 * m.params, 4 * m.layers * self._attn_width,
                self.flops * self.eff.mfu_decode, self.eff.step_overhead_s)


@dataclass(frozen=True)
class TrainerCost:
    model: ModelShape
    gpu: GpuKind
    gpus: int
    spec: TrainerSpec

    def step_s(self, tokens: int) -> float:
        flops = self.spec.flops_per_token_factor * self.model.params * tokens
        return flops / (self.gpus * self.gpu.peak_bf16_tflops * TFLOP * self.spec.mfu) + self.spec.fixed_s


@dataclass(frozen=True)
class WeightSyncCost:
    model: ModelShape
    link_gbps: float
    spec: WeightSyncSpec
    engines: int

    @property
    def transfer_s(self) -> float:
        """One copy of the weights over the link."""
        return self.model.weight_bytes / (self.link_gbps * GB)

    @property
    def bucket_s(self) -> float:
        return min(self.spec.bucket_gb * GB, self.model.weight_bytes) / (self.link_gbps * GB)

    def naive_exposed_s(self) -> float:
        return self.transfer_s + ceil(self.engines / self.spec.naive_streams) * self.transfer_s + self.spec.swap_s

    def overlapped_exposed_s(self, background_s: float) -> float:
        """Exposed time when the pull had `background_s` of rollout since publishing began."""
        return max(0.0, self.transfer_s + self.bucket_s - background_s) + self.spec.swap_s

    def exposed_s(self, background_s: float) -> float:
        return self.overlapped_exposed_s(background_s) if self.spec.overlap else self.naive_exposed_s()
