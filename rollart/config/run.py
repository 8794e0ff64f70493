"""`RunConfig`, a whole run: every section, and the checks that need more than one of them.

In: every section module. Out: `RunConfig`, and `default_pools` and `default_domains`, the defaults of its
`pools` and `domains`.

Guarantees:
- Cross-references are checked once the whole config is known: a domain's pool, a pool's fallbacks, a role's
  pool and the pools of `inference.replicas` must be declared pools; the warm pool's domains are env domains;
  the batch holds whole GRPO groups; trainer settings that cannot work together are refused, each problem on a
  line of its own.
- The defaults describe a complete multi-task job on one 2-core CPU machine: pools standing in for the paper's
  (compute-rich `gen_prefill`, bandwidth-rich `gen_decode`, CPU `env`, serverless `reward`, `train`),
  `frozenlake` on `gen_prefill` and `math` on `gen_decode`, α = 1.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from rollart.config.base import Section
from rollart.config.bounds import MAX_ENTRIES, MAX_SEED
from rollart.config.domains import CHEAP_REWARDS, DomainConfig, DomainRewardConfig
from rollart.config.envs import EnvsConfig
from rollart.config.evaluation import EvalConfig
from rollart.config.inference import InferenceConfig
from rollart.config.model import ModelConfig
from rollart.config.observability import ObservabilityConfig
from rollart.config.resources import ClusterConfig, PoolConfig, RoleConfig, device_lacks_bf16
from rollart.config.reward import RewardConfig
from rollart.config.rollout import RolloutConfig, min_batch_groups
from rollart.config.train import TINY_WARM_START_STEPS, TrainConfig, WeightsConfig


def default_pools() -> dict[str, PoolConfig]:
    return {
        "train": PoolConfig(kind="cpu", capacity=1, description="stands in for compute-rich training GPUs"),
        "gen_prefill": PoolConfig(
            kind="cpu", capacity=1, fallback=["gen_decode"], description="compute-rich (H800-like)"
        ),
        "gen_decode": PoolConfig(
            kind="cpu", capacity=1, fallback=["gen_prefill"], description="bandwidth-rich (H20-like)"
        ),
        "env": PoolConfig(kind="cpu", capacity=4, description="CPU environment workers"),
        "reward": PoolConfig(kind="serverless", device="", capacity=2, description="elastic reward"),
    }


def default_domains() -> dict[str, DomainConfig]:
    return {
        # multi-turn, prefill-heavy (the map every turn) → the compute-rich pool
        "frozenlake": DomainConfig(env="frozenlake", pool="gen_prefill", max_turns=6, max_new_tokens=12),
        # single-turn, decode-heavy → the bandwidth-rich pool; math-verify scores it in the env worker (cheap).
        # Small operands: a 0.5 M-parameter model learns them by RL within the CPU demo's minutes.
        "math": DomainConfig(
            env="math",
            weight=2.0,
            pool="gen_decode",
            reward=DomainRewardConfig(fn="math"),
            max_turns=1,
            max_new_tokens=12,
            options={"kinds": ["arithmetic"], "ops": "+", "max_operand": 3},
        ),
    }


class RunConfig(Section):
    """A whole run: every section, and the checks that need more than one of them."""

    run_dir: str = Field(
        "runs/default", description="where the run writes config, metrics, timeline, checkpoints and report"
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seeds the model init, task sampling and generation")
    resume: bool = Field(False, description="continue the run in run_dir from its newest checkpoint")
    model: ModelConfig = ModelConfig()
    cluster: ClusterConfig = ClusterConfig()
    pools: dict[str, PoolConfig] = Field(
        default_factory=default_pools, max_length=MAX_ENTRIES, description="hardware pools by name; null removes a "
        "default one"
    )
    roles: dict[str, RoleConfig] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="per-role overrides of a worker class's @affinity "
        "(inference, trainer, env …)"
    )
    domains: dict[str, DomainConfig] = Field(
        default_factory=default_domains, max_length=MAX_ENTRIES, description="task domains by name; null removes a "
        "default one"
    )
    envs: EnvsConfig = EnvsConfig()
    inference: InferenceConfig = InferenceConfig()
    reward: RewardConfig = RewardConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    weights: WeightsConfig = WeightsConfig()
    eval: EvalConfig = EvalConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="after")
    def _check_references(self) -> RunConfig:
        pools = sorted(self.pools)
        problems: list[str] = []
        for name, pool in self.pools.items():
            for fb in pool.fallback:
                if fb not in self.pools:
                    problems.append(f"pools.{name}.fallback: '{fb}' is not a declared pool (declared: {pools})")
                elif fb == name:
                    problems.append(f"pools.{name}.fallback: a pool cannot fall back to itself")
        for name, dom in self.domains.items():
            if dom.pool not in self.pools:
                problems.append(f"domains.{name}.pool: '{dom.pool}' is not a declared pool (declared: {pools})")
            elif self.pools[dom.pool].kind == "serverless":
                problems.append(
                    f"domains.{name}.pool: '{dom.pool}' is a serverless pool; generation needs a gpu or cpu pool"
                )
        for pool in self.inference.replicas:
            if pool not in self.pools:
                problems.append(f"inference.replicas: '{pool}' is not a declared pool (declared: {pools})")
        for role, rc in self.roles.items():
            for p in ([rc.pool] if rc.pool else []) + list(rc.fallback or []):
                if p not in self.pools:
                    problems.append(f"roles.{role}: pool '{p}' is not a declared pool (declared: {pools})")
        for name in self.envs.warm_pool.domains:
            if name not in self.domains or self.domains[name].runs_agent:
                env_domains = sorted(d for d, dc in self.domains.items() if not dc.runs_agent)
                problems.append(f"envs.warm_pool.domains: '{name}' is not an env domain (env domains: {env_domains})")
        if not self.domains:
            problems.append("domains: at least one task domain is needed")
        elif sum(d.weight for d in self.domains.values()) <= 0:
            problems.append("domains.*.weight: at least one domain needs a weight > 0")
        if self.train.lora is not None and self.inference.engine != "builtin":
            problems.append(
                f"train.lora: LoRA adapters are served by the builtin engine only (inference.engine="
                f"{self.inference.engine!r} cannot apply them yet); use inference.engine=builtin or train.lora=null"
            )
        problems += self._trainer_problems()
        if self.rollout.batch_size // self.train.mini_batches < self.train.workers:
            problems.append(
                f"train.mini_batches: a batch of {self.rollout.batch_size} split into {self.train.mini_batches} "
                f"mini-batches leaves fewer samples than train.workers ({self.train.workers}) in one; make "
                "rollout.batch_size ≥ train.mini_batches × train.workers"
            )
        floor = min_batch_groups(self.rollout) * self.rollout.group_size
        if floor < self.rollout.batch_size and floor // self.train.mini_batches < self.train.workers:
            problems.append(
                f"rollout.min_batch_fraction: {self.rollout.min_batch_fraction} lets a batch start with {floor} "
                f"trajectories, fewer than train.mini_batches × train.workers ({self.train.mini_batches} × "
                f"{self.train.workers}); raise it, or use 1.0 (always the full batch)"
            )
        backends = {self.domain_reward_backend(d) for d in self.domains}
        plain = self.reward.plain_http_problem(serving="serverless" in backends, sending="http" in backends)
        if plain:
            problems.append(plain)
        ro = self.rollout
        in_flight = (ro.alpha + 1) * (ro.batch_size // ro.group_size + ro.redundancy.extra_groups) * (
            ro.group_size + ro.redundancy.extra_per_group)
        if in_flight > self.inference.sticky_trajectories:
            problems.append(
                f"inference.sticky_trajectories: {self.inference.sticky_trajectories} is below the {in_flight} "
                "trajectories that may be in flight ((rollout.alpha + 1) × groups per batch × trajectories per group): "
                "the proxy would forget where live trajectories' prefixes are cached; raise it above that"
            )
        if self.inference.proxy_shards > 1 and self.train.elastic_generation:
            problems.append(
                f"inference.proxy_shards: {self.inference.proxy_shards} shards cannot lend the trainer's devices "
                "(train.elastic_generation): a loan's reclaim and rebalance move turns across every engine, which "
                "one proxy sees and a shard does not; use one or the other"
            )
        if self.rollout.batch_size % self.rollout.group_size:
            problems.append(
                f"rollout.batch_size: {self.rollout.batch_size} is not a multiple of rollout.group_size "
                f"({self.rollout.group_size}): a batch holds whole groups"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _trainer_problems(self) -> list[str]:
        """Trainer settings that cannot work together (refused here, before anything starts)."""
        train, problems = self.train, []
        if train.offload and train.strategy != "fsdp2":
            problems.append(
                f"train.offload: host offload is FSDP2's (train.strategy=fsdp2); train.strategy={train.strategy!r} "
                "keeps a full replica on every rank's device. Use train.strategy=fsdp2 or train.offload=false"
            )
        if train.precision == "bf16" and self.model.dtype != "float32":
            problems.append(
                f"train.precision: bf16 computes over float32 master weights, but model.dtype={self.model.dtype!r} "
                "would hold the weights themselves in low precision; use model.dtype=float32 with "
                "train.precision=bf16, or train.precision=fp32"
            )
        role = self.roles.get("trainer", RoleConfig())
        pool = role.pool or "train"
        if pool in self.pools:
            chain = [pool] + [p for p in (role.fallback if role.fallback is not None else self.pools[pool].fallback)
                              if p in self.pools and p != pool]
            serverless = [p for p in chain if self.pools[p].kind == "serverless"]
            if serverless:
                problems.append(f"roles.trainer: pool(s) {serverless} are serverless; trainer ranks need a gpu or "
                                "cpu pool")
            if train.precision == "bf16" and not self.cluster.address:  # a local cluster: its devices are here
                problems += [f"train.precision=bf16 on pools.{p}.device={self.pools[p].device!r}: {lacks}; use "
                             "train.precision=fp32 or a pool whose device computes in bfloat16"
                             for p in chain if (lacks := device_lacks_bf16(self.pools[p].device))]
            slots = sum(self.pools[p].capacity for p in chain)
            if not self.cluster.address and train.workers > slots:
                problems.append(
                    f"train.workers: {train.workers} ranks cannot be placed: the trainer's pools {chain} hold "
                    f"{slots:g} slot(s) (pools.<name>.capacity); raise pools.{pool}.capacity to at least "
                    f"{train.workers}, or lower train.workers"
                )
        return problems

    def warm_start_steps(self) -> int:
        """The warm start's steps: `train.warm_start.steps`, or when unset 100 for the built-in tiny model and 0 for
        a `model.path` checkpoint (which already writes its format)."""
        steps = self.train.warm_start.steps
        if steps is not None:
            return steps
        return 0 if self.model.path else TINY_WARM_START_STEPS

    def domain_reward_backend(self, domain: str) -> str:
        """The reward backend a domain uses when its trajectories come to it unscored (its own, else
        `reward.backend`); see `reward_at_env` for where they are scored first."""
        return self.domains[domain].reward.backend or self.reward.backend

    def reward_at_env(self, domain: str) -> bool:
        """Whether a domain's reward is scored in the env worker where its trajectories end: a cheap reward
        (`domains.<d>.reward.cheap`, by default the rule built-ins of `CHEAP_REWARDS`) whose domain names no
        backend of its own, of a domain with an env (an agent's trajectory ends in the same worker too)."""
        reward = self.domains[domain].reward
        cheap = reward.cheap if reward.cheap is not None else reward.fn in CHEAP_REWARDS
        return cheap and reward.backend is None
