"""The one typed configuration schema of rollart (pydantic v2), one section per plane.

In: nothing (the schema and its defaults). Out: `RunConfig`, every section and the schema's helpers, each
importable from here. Loading YAML run files and `key.path=value` overrides, with errors that name the key,
its source and what would be valid, lives in `loader.py`; `config explain`, the schema described for people,
in `explain.py`.

Guarantees:
- Every section forbids unknown keys; every value is typed and range-checked.
- Cross-references are checked once the whole config is known: a domain's pool, a pool's fallbacks and a
  role's pool must be declared pools; the batch holds whole GRPO groups.
- The defaults describe a complete multi-task job on one 2-core CPU machine: pools standing in for the
  paper's (compute-rich `gen_prefill`, bandwidth-rich `gen_decode`, CPU `env`, serverless `reward`, `train`),
  `frozenlake` on `gen_prefill` and `math` on `gen_decode`, α = 1.

Where each section lives (a section belongs to the plane that reads it):

    base.py           Section, the base of every section; the TRUST_* markers; how far a value reaches
    bounds.py         the MAX_* bounds and the units of time
    model.py          model (the policy checkpoint, the built-in tiny model)
    resources.py      cluster, pools, roles; whether a device computes in bfloat16
    domains.py        domains (env or agent, dataset rows, reward fn, fault injection, episode profile)
    sandbox.py        the sandboxes' limits: reward.sandbox, envs.workspace
    envs.py           envs (env workers, the agent gateway, warm pools, `rollart env serve`)
    inference.py      inference (engines, vLLM, replicas per pool)
    reward.py         reward (backends, retries, the serverless service, an HTTP endpoint)
    rollout.py        rollout (batch, groups, staleness, barriers, redundancy, circuit breaker, re-mapping,
                      pacing, the adaptive batch)
    train.py          train (optimizer, loss, parallelism, warm start, LoRA), weights (the weight store)
    algorithm.py      train.algorithm's presets over the train.* settings; train.critic (the value model)
    evaluation.py     eval (validation)
    observability.py  observability (metric sinks, progress, timeline, samples, logs)
    run.py            RunConfig, the whole run: the top-level keys and the checks across sections
"""

from __future__ import annotations

from rollart.config.algorithm import ALGORITHM_PRESETS, CriticConfig
from rollart.config.base import TRUST_IMPORT, is_loopback_host, reaches_beyond
from rollart.config.domains import (
    CHEAP_REWARDS,
    REWARD_ROLES,
    CountConfig,
    DatasetConfig,
    DomainConfig,
    DomainProfileConfig,
    DomainRewardConfig,
    FaultInjectionConfig,
    LatencyConfig,
)
from rollart.config.envs import EnvsConfig, EnvServerConfig, GatewayConfig, WarmPoolConfig
from rollart.config.evaluation import EvalConfig
from rollart.config.inference import InferenceConfig, OnUpdate, VLLMConfig
from rollart.config.model import ModelConfig, TinyModelConfig
from rollart.config.observability import ObservabilityConfig
from rollart.config.resources import ClusterConfig, PoolConfig, RoleConfig, device_lacks_bf16
from rollart.config.reward import HttpRewardConfig, RewardConfig, ServerlessConfig
from rollart.config.rollout import CircuitBreakerConfig, RedundancyConfig, RolloutConfig, min_batch_groups
from rollart.config.run import RunConfig, default_domains, default_pools
from rollart.config.sandbox import SandboxConfig, SandboxLimits, WorkspaceConfig
from rollart.config.train import LoraConfig, TrainConfig, WarmStartConfig, WeightsConfig

__all__ = [
    "ALGORITHM_PRESETS",
    "CriticConfig",
    "CHEAP_REWARDS",
    "REWARD_ROLES",
    "TRUST_IMPORT",
    "CircuitBreakerConfig",
    "ClusterConfig",
    "CountConfig",
    "DatasetConfig",
    "DomainConfig",
    "DomainProfileConfig",
    "DomainRewardConfig",
    "EnvServerConfig",
    "EnvsConfig",
    "EvalConfig",
    "FaultInjectionConfig",
    "GatewayConfig",
    "HttpRewardConfig",
    "InferenceConfig",
    "LatencyConfig",
    "LoraConfig",
    "ModelConfig",
    "ObservabilityConfig",
    "OnUpdate",
    "PoolConfig",
    "RedundancyConfig",
    "RewardConfig",
    "RoleConfig",
    "RolloutConfig",
    "RunConfig",
    "SandboxConfig",
    "SandboxLimits",
    "ServerlessConfig",
    "TinyModelConfig",
    "TrainConfig",
    "VLLMConfig",
    "WarmPoolConfig",
    "WarmStartConfig",
    "WeightsConfig",
    "WorkspaceConfig",
    "default_domains",
    "default_pools",
    "device_lacks_bf16",
    "is_loopback_host",
    "min_batch_groups",
    "reaches_beyond",
]
