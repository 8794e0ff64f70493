"""The environment plane: env protocol and adapters, EnvManager, env workers, built-in domains.

Public API (what the driver and other planes call):
- `resolve_env(spec, options)` / `make_env` — a factory from a domain's `env` spec (built-in name,
  `gem:<id>`, `gym:<id>`, `module.path:Class`); `check_env_spec(spec)` — that it names something real;
  `BUILTIN_ENVS`.
- `EnvManager` — one trajectory's lifecycle → `Trajectory`.
- `EnvWorker` — the actor (on the `env` hardware pool) holding many EnvManagers; `EnvRouter` — the
  `TrajectoryRunner` that routes trajectories to several of them (`EnvRouter.place(resources, cfg, llm, turn_barrier)`).
- `ActorLLMClient` — the `LLMClient` over a Ray actor handle (the inference plane's LLMProxy);
  `ShardedLLMClient` — over N of them, the proxy's shards, each trajectory on its group's shard.
- `ChatTokens` — token-in/token-out prompt ids under a chat template (also lays out demonstrations).
- `expert_action`, `random_action`, `demonstrations`, `Demonstration` — oracle policies for warm starts.
- `FaultInjectingEnv`, `sample_latency` — latency/failure injection (`domains.<name>.inject`).
- `episode_seed` — the train/val seed split.
"""

import importlib
from typing import TYPE_CHECKING, Any

# The public names, each imported from its module on first use: importing one part of the plane (the chat
# template, the dataset reader) does not import the rest (Ray, the env adapters, the workers).
_EXPORTS = {
    "ChatTokens": "rollart.envs.chat",
    "Demonstration": "rollart.envs.expert",
    "demonstrate": "rollart.envs.expert",
    "demonstrations": "rollart.envs.expert",
    "expert_action": "rollart.envs.expert",
    "random_action": "rollart.envs.expert",
    "FaultInjectingEnv": "rollart.envs.injection",
    "InjectedFault": "rollart.envs.injection",
    "sample_latency": "rollart.envs.injection",
    "EnvManager": "rollart.envs.manager",
    "AsyncEnv": "rollart.envs.protocol",
    "Env": "rollart.envs.protocol",
    "EnvFactory": "rollart.envs.protocol",
    "EnvRouter": "rollart.envs.router",
    "domain_sampling": "rollart.envs.sampling",
    "episode_seed": "rollart.envs.seeds",
    "BUILTIN_ENVS": "rollart.envs.spec",
    "EnvSpecError": "rollart.envs.spec",
    "check_env_spec": "rollart.envs.spec",
    "make_env": "rollart.envs.spec",
    "resolve_env": "rollart.envs.spec",
    "ShardedLLMClient": "rollart.envs.sharded_llm",
    "ActorLLMClient": "rollart.envs.worker",
    "EnvWorker": "rollart.envs.worker",
}

if TYPE_CHECKING:
    from rollart.envs.chat import ChatTokens
    from rollart.envs.expert import Demonstration, demonstrate, demonstrations, expert_action, random_action
    from rollart.envs.injection import FaultInjectingEnv, InjectedFault, sample_latency
    from rollart.envs.manager import EnvManager
    from rollart.envs.protocol import AsyncEnv, Env, EnvFactory
    from rollart.envs.router import EnvRouter
    from rollart.envs.sampling import domain_sampling
    from rollart.envs.seeds import episode_seed
    from rollart.envs.sharded_llm import ShardedLLMClient
    from rollart.envs.spec import BUILTIN_ENVS, EnvSpecError, check_env_spec, make_env, resolve_env
    from rollart.envs.worker import ActorLLMClient, EnvWorker


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rollart.envs' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


__all__ = [
    "ActorLLMClient",
    "AsyncEnv",
    "BUILTIN_ENVS",
    "ChatTokens",
    "Demonstration",
    "Env",
    "EnvFactory",
    "EnvManager",
    "EnvRouter",
    "EnvSpecError",
    "EnvWorker",
    "FaultInjectingEnv",
    "InjectedFault",
    "ShardedLLMClient",
    "demonstrate",
    "demonstrations",
    "domain_sampling",
    "episode_seed",
    "expert_action",
    "make_env",
    "random_action",
    "resolve_env",
    "check_env_spec",
    "sample_latency",
]
