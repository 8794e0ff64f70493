"""The online profiler: what each domain's episodes look like now, and how far that has drifted.

In: finished trajectories (`observe_trajectory`: a real run's, from their turns, spans and the prefix-cache
counts their env runner kept) or, in the cluster twin, each turn as the engine saw it (`observe_turn`) and
each episode's end. Out: `metrics()` — `profile/<domain>/{turns, prompt_tokens, obs_tokens,
response_tokens, prefix_hit, env_s, reward_s}`, means over the last `window` observations; `measured(d)`
— those means as a `DomainProfileConfig` (what the planner takes); `drift(d, declared)` — the largest
relative change of the token and turn means against a declared profile (0.5 = some mean moved by 50%).

`DriftWatch` says, at each weight sync, which domains have drifted past `rollout.remap_drift` from the
profile their mapping was made for — confirmed on fresh observations first — for the re-mapping of a real
run and of the twin alike (`rollart.loop.remapping`). Pure bookkeeping: no clocks, no I/O.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Deque, Mapping

from rollart.config import CountConfig, DomainProfileConfig, LatencyConfig
from rollart.types import Trajectory

FIELDS = ("turns", "prompt_tokens", "obs_tokens", "response_tokens", "prefix_hit", "env_s", "reward_s")


class DomainProfiler:
    def __init__(self, window: int = 2000) -> None:
        self.window = window
        self._obs: dict[str, dict[str, Deque[float]]] = defaultdict(
            lambda: {f: deque(maxlen=window) for f in FIELDS})

    # --- observations ---------------------------------------------------------------------------------
    def observe_turn(self, domain: str, new_prompt: int, generated: int, context: int, prefill: int,
                     env_s: float, first: bool) -> None:
        d = self._obs[domain]
        d["prompt_tokens" if first else "obs_tokens"].append(float(new_prompt))
        d["response_tokens"].append(float(generated))
        if context:
            d["prefix_hit"].append(1.0 - prefill / context)
        d["env_s"].append(env_s)

    def observe_episode(self, domain: str, turns: int, reward_s: float = 0.0) -> None:
        self._obs[domain]["turns"].append(float(turns))
        self._obs[domain]["reward_s"].append(reward_s)

    def observe_trajectory(self, trajectory: Trajectory) -> None:
        """A finished trajectory of a real run: its turns' tokens, env.step and reward spans, and the share of
        its contexts a prefix cache held (`context_tokens`, `prefill_tokens` in its metrics)."""
        d = self._obs[trajectory.domain]
        for k, turn in enumerate(trajectory.turns):
            env = sum(s.duration for s in turn.spans if s.name == "env.step")
            d["prompt_tokens" if k == 0 else "obs_tokens"].append(float(len(turn.prompt_token_ids)))
            d["response_tokens"].append(float(len(turn.response_token_ids)))
            d["env_s"].append(env)
        context = trajectory.metrics.get("context_tokens", 0.0)
        if context:
            d["prefix_hit"].append(1.0 - trajectory.metrics.get("prefill_tokens", context) / context)
        reward = sum(s.duration for s in trajectory.spans if s.name == "reward")
        self.observe_episode(trajectory.domain, len(trajectory.turns), reward)

    def reset(self, domain: str) -> None:
        """Forget a domain's observations (after a drift: what comes next measures the new workload alone)."""
        self._obs.pop(domain, None)

    def count(self, domain: str, field: str = "turns") -> int:
        return len(self._obs[domain][field]) if domain in self._obs else 0

    # --- what it says -----------------------------------------------------------------------------------
    def mean(self, domain: str, field: str) -> float | None:
        values = self._obs[domain][field] if domain in self._obs else ()
        return sum(values) / len(values) if values else None

    def metrics(self) -> dict[str, float]:
        out = {}
        for domain in sorted(self._obs):
            for field in FIELDS:
                value = self.mean(domain, field)
                if value is not None:
                    out[f"profile/{domain}/{field}"] = value
        return out

    def measured(self, domain: str, declared: DomainProfileConfig) -> DomainProfileConfig:
        """`declared` with every mean this profiler has observed put in (spreads kept as declared)."""
        update = {}
        for field in ("turns", "prompt_tokens", "obs_tokens", "response_tokens"):
            value = self.mean(domain, field)
            if value is not None:
                old: CountConfig = getattr(declared, field)
                update[field] = old.model_copy(update={"mean": value, "dist": "constant" if old.dist == "empirical"
                                                       else old.dist, "samples": []})
        env = self.mean(domain, "env_s")
        if env is not None:
            update["env_step"] = LatencyConfig(dist="constant", mean_s=env)
        return declared.model_copy(update=update)

    def drift(self, domain: str, declared: DomainProfileConfig) -> float:
        """Largest relative change of the turn and token means against `declared` (0 with no data)."""
        worst = 0.0
        for field in ("turns", "prompt_tokens", "obs_tokens", "response_tokens"):
            value = self.mean(domain, field)
            base = getattr(declared, field).mean
            if value is not None and base > 0:
                worst = max(worst, abs(value - base) / base)
        return worst


class DriftWatch:
    """Which domains' workloads have drifted past `threshold` from the profile their mapping was made for.

    `planned[d]` is that profile: declared (`domains.<d>.profile`), or None — then the domain's first
    `min_episodes` measured episodes become it. A drift seen for the first time is confirmed on fresh
    observations only (the profiler's window still mixes the old workload in): the domain's observations are
    forgotten, and it counts as drifted at a later look, once `min_episodes` new episodes still show the
    drift. `replan` says what a domain's mapping is made for from now on.
    """

    def __init__(self, planned: Mapping[str, DomainProfileConfig | None], threshold: float,
                 min_episodes: int) -> None:
        self.planned = dict(planned)
        self.threshold, self.min_episodes = threshold, min_episodes
        self._suspect: set[str] = set()  # drifted at the last look, awaiting fresh observations

    def confirmed(self, profiler: DomainProfiler) -> dict[str, float]:
        """The domains whose drift is confirmed now, with their drift (call at each weight sync)."""
        for domain, planned in self.planned.items():
            if planned is None and profiler.count(domain) >= self.min_episodes:
                self.planned[domain] = profiler.measured(domain, DomainProfileConfig())
        drift = {d: profiler.drift(d, p) for d, p in self.planned.items() if p is not None}
        drifted = {d: x for d, x in drift.items() if x > self.threshold}
        fresh = {d for d in drifted if d not in self._suspect}
        for domain in fresh:
            profiler.reset(domain)
        self._suspect = {d for d in self._suspect if d in drifted} | fresh
        confirmed = {d: x for d, x in drifted.items() if d not in fresh and profiler.count(d) >= self.min_episodes}
        self._suspect -= set(confirmed)
        return confirmed

    def replan(self, profiles: Mapping[str, DomainProfileConfig]) -> None:
        self.planned.update(profiles)
