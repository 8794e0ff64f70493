"""The environment plane: env protocol and adapters, EnvManager, env workers, built-in domains.

Public API (what the driver and other planes call):
- `resolve_env(spec, options)` / `make_env` — a factory from a domain's `env` spec (built-in name,
  `gem:<id>`, `gym:<id>`, `module.path:Class`); `check_env_spec(spec)` — that it names something real;
  `BUILTIN_ENVS`.
- `EnvManager` — one trajectory's lifecycle → `Trajectory`.
- `EnvWorker` — the actor (on the `env` hardware pool) holding many EnvManagers; `EnvRouter` — the
  `TrajectoryRunner` that routes trajectories to several of them (`EnvRouter.place(resources, cfg, llm, turn_barrier)`).
- `ActorLLMClient` — the `LLMClient` over a Ray actor handle (the inference plane's LLMProxy).
- `ChatTokens` — token-in/token-out prompt ids under a chat template (also lays out demonstrations).
- `expert_action`, `random_action`, `demonstrations`, `Demonstration` — oracle policies for warm starts.
- `FaultInjectingEnv`, `sample_latency` — latency/failure injection (`domains.<name>.inject`).
- `episode_seed` — the train/val seed split.
"""

from rollart.envs.chat import ChatTokens
from rollart.envs.expert import Demonstration, demonstrate, demonstrations, expert_action, random_action
from rollart.envs.injection import FaultInjectingEnv, InjectedFault, sample_latency
from rollart.envs.manager import EnvManager
from rollart.envs.protocol import AsyncEnv, Env, EnvFactory
from rollart.envs.router import EnvRouter
from rollart.envs.sampling import domain_sampling
from rollart.envs.seeds import episode_seed
from rollart.envs.spec import BUILTIN_ENVS, EnvSpecError, check_env_spec, make_env, resolve_env
from rollart.envs.worker import ActorLLMClient, EnvWorker

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
