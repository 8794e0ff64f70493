"""`EnvSideScorer`: the cheap rewards, scored in the process where a trajectory ends (an env worker).

In: a `RunConfig`. Out: an `EndScorer` (types.py) for the domains `cfg.reward_at_env` names — a cheap,
stateless reward (the rule built-ins, math-verify, a user function the domain marks `cheap`) whose domain asks
for no backend. The composition root hands one to each env worker; the worker calls `start()` once in its
own process and `await score(trajectory)` as each trajectory of those domains ends.

Why there: such a reward takes milliseconds, and sending it anywhere costs more than scoring it — a request
through Ray Serve's proxy to a replica and the claim book was ~0.6 s a trajectory at p50 in the measurement
issue 40 was opened with (`rollart bench overhead` has no recorded figures yet). Scored in the env worker it
costs the worker a call, and math-verify a trip to its process pool there (it bounds its own time with
`signal.alarm`, which only a process's main thread may use: a pool worker's is, an async actor's thread is not
— see math_reward.py).

What holds, as for the `local` backend (it is the same `LocalRewardClient`): each try bounded by
`reward.timeout_s`, `reward.retries` more tries with jittered backoff, then `ok=False` with the last error
(the worker ends the trajectory FAILED with it); at most `reward.max_in_flight` at once per worker. Nothing
is remembered between tries: scoring in the process that owns the trajectory, there is no other request to
dedupe against, and a worker that dies takes its trajectories with it (the control plane runs them again).
"""

from __future__ import annotations

from rollart.config import RunConfig
from rollart.reward.client import LocalRewardClient, backend_metrics
from rollart.reward.registry import RewardFns, check_spec
from rollart.types import RewardResult, Trajectory


class EnvSideScorer:
    """Picklable until `start()`; then holds this process's reward fns (pools) until `close()`."""

    def __init__(self, cfg: RunConfig, seed: int | None = None) -> None:
        self.cfg, self.seed = cfg, seed
        self.domains = frozenset(d for d in cfg.domains if cfg.reward_at_env(d))
        for domain in sorted(self.domains):
            check_spec(cfg.domains[domain].reward.fn, f"domains.{domain}.reward.fn")
        self._fns: RewardFns | None = None
        self._client: LocalRewardClient | None = None

    def __getstate__(self) -> dict[str, object]:
        if self._fns is not None:
            raise TypeError("EnvSideScorer is picklable until start(): it then holds this process's pools")
        return self.__dict__

    def start(self) -> None:
        """Make and warm the domains' reward fns here (math-verify's pool starts and imports it now, not on
        the first trajectory)."""
        if self._fns is not None:
            return
        self._fns = RewardFns(self.cfg)
        self._fns.warm(sorted({self.cfg.domains[d].reward.fn for d in self.domains}))
        self._client = LocalRewardClient(self._fns.get, self.cfg.reward, self.seed)

    async def score(self, trajectory: Trajectory) -> RewardResult:
        if trajectory.domain not in self.domains:
            return RewardResult(trajectory.trajectory_id, 0.0, ok=False, attempts=0, backend="env",
                                error=f"domain {trajectory.domain!r} is not scored where it ends "
                                      f"(those are {sorted(self.domains)})")
        if self._client is None:
            self.start()
        assert self._client is not None
        result = await self._client.score(trajectory, self.cfg.domains[trajectory.domain].reward.fn)
        return RewardResult(result.trajectory_id, result.reward, result.ok, result.error, result.attempts, "env",
                            result.latency_s, result.details)

    def metrics(self) -> dict[str, float]:
        """`reward/env/{requests,failures,retries,latency_p50_s,latency_p95_s,busy_s,…}` of this process."""
        if self._client is None or not self._client.stats.requests:
            return {}
        out = backend_metrics({"env": self._client}, 1.0)
        return {k: v for k, v in out.items() if k.startswith("reward/env/")}

    def close(self) -> None:
        if self._fns is not None:
            self._fns.close()
