"""`RewardRouter`: the one object the driver uses to score trajectories (implements `types.RewardScorer`).

In: a `RunConfig`; then finished trajectories, one `await score(trajectory)` each, called the moment a
trajectory ends (scoring overlaps everything else). Out: a `RewardResult` per trajectory — never an
exception: `ok=False` with `error` when the reward kept failing, so the control plane marks it FAILED.

`score_group(trajectories)` scores a finished group with one call where the domain's function takes a batch
(TRL's shape) on the local backend (`scores_groups(domain)`); the scheduler uses it for such domains.

Dispatch: by `trajectory.domain` → `domains.<d>.reward.fn` on `cfg.domain_reward_backend(d)`:
- `local`: `LocalRewardClient` in this process;
- `serverless`: `HttpRewardClient` to the shared reward service of this Ray cluster if one runs (`rollart
  serve-reward`: the router attaches with a job token of its own), else to a Ray Serve `RewardService` this
  router starts (or one given);
- `http`: `HttpRewardClient` to `reward.http.url`, bearer token from the env var `reward.http.token_env`.

Run ids: remote scorings carry `Idempotency-Key: <run id>/<attempt>/<trajectory id>`. The run id is random
per run (the driver keeps it in checkpoints, so a resumed run keeps it) and `attempt` counts the run's
(re)starts, so trajectory ids that repeat — in every run, in a resume, in every evaluation (`for_run` gives
each its own run id) — never meet another scoring's key.

Lifecycle (the driver's, from a RunConfig, inside a started `rollart.resources.Runtime`):
    router = RewardRouter(cfg)      # checks specs, backends and the code sandbox's isolation; starts nothing
    router.start()                  # warms local fns, starts the Serve app if a domain uses it; returns self
    result = await router.score(t)  # RewardResult, any number concurrently
    router.metrics()                # {"reward/...": float}; router.replica_timeline() → [(t, replicas)]
    router.stop()                   # stops what start() started; idempotent
(`with RewardRouter(cfg) as router:` does start/stop.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from typing import TYPE_CHECKING, Sequence

from rollart.config import RunConfig
from rollart.reward.client import HttpRewardClient, LocalRewardClient, backend_metrics
from rollart.reward.registry import BUILTINS, RewardFns, check_spec, import_reward
from rollart.sandbox import check_isolation
from rollart.types import RewardResult, Trajectory

if TYPE_CHECKING:
    from rollart.reward.service import RewardService

log = logging.getLogger("rollart.reward")
_REVIVE_LOOK_S = 2.0


class RewardRouter:
    def __init__(
        self,
        cfg: RunConfig,
        *,
        service: RewardService | None = None,
        seed: int | None = None,
        run_id: str | None = None,
        attempt: int = 0,
    ) -> None:
        """`service`: an already started `RewardService` to use for `serverless` domains (else start() makes
        one). `seed`: retry-jitter seed (tests). `run_id`, `attempt`: the run these trajectories belong to
        and how many times it was (re)started (default: a fresh random run) — see the module docstring."""
        self.cfg = cfg
        self.run_id, self.attempt = run_id or new_run_id(), attempt
        self.run_key = f"{self.run_id}/{attempt}"
        self.backends: dict[str, str] = {}
        for name, dom in cfg.domains.items():
            self.backends[name] = cfg.domain_reward_backend(name)
            check_spec(dom.reward.fn, f"domains.{name}.reward.fn", here=self.backends[name] != "http")
            if self.backends[name] == "local" and ":" in dom.reward.fn:
                import_reward(dom.reward.fn)  # a class's constructor fails now, not on the first trajectory
        sl_pool = cfg.reward.serverless.pool
        if "serverless" in self.backends.values() and (sl_pool not in cfg.pools or cfg.pools[sl_pool].kind != "serverless"):
            raise ValueError(
                f"reward.serverless.pool: {sl_pool!r} is not a declared serverless pool "
                f"(serverless pools: {sorted(n for n, p in cfg.pools.items() if p.kind == 'serverless')})"
            )
        # the code sandbox runs here (local) or on this machine's Ray (serverless, embedded): refuse now,
        # before any work, if it cannot have reward.sandbox.min_isolation
        if any(cfg.domains[d].reward.fn == "code" and (b == "local" or (b == "serverless" and not cfg.cluster.address))
               for d, b in self.backends.items()):
            check_isolation(cfg.reward.sandbox)
        http_domains = sorted(d for d, b in self.backends.items() if b == "http")
        if http_domains and not cfg.reward.http.url:
            raise ValueError(f"reward.http.url is empty but domains {http_domains} use the http reward backend")
        self._fns = RewardFns(cfg)
        self.local = LocalRewardClient(self._fns.get, cfg.reward, seed)
        self.http: HttpRewardClient | None = None
        if http_domains:
            token = os.environ.get(cfg.reward.http.token_env)
            if not token:
                log.warning("env var %s is not set: requests to %s carry no bearer token",
                            cfg.reward.http.token_env, cfg.reward.http.url)
            self.http = HttpRewardClient(cfg.reward.http.url, cfg.reward, token=token, backend="http", seed=seed,
                                         run_key=self.run_key)
        self._seed = seed
        self.service = service
        self._own_service = False
        self.serverless: HttpRewardClient | None = None
        if service is not None:
            self._connect_serverless()
        self._started_at = time.monotonic()
        self._reviving: asyncio.Future | None = None
        self._last_revive_look = 0.0

    def _connect_serverless(self) -> None:
        assert self.service is not None and self.service.url, "the reward service is not started"
        self.serverless = HttpRewardClient(self.service.url, self.cfg.reward, token=self.service.token,
                                           backend="serverless", seed=self._seed, run_key=self.run_key,
                                           on_outage=self._revive,
                                           outage_status=frozenset({404}))  # its app is gone: revive it

    async def _revive(self) -> None:
        """The serverless service is out: bring it back if it died (one look at a time, at most every 2 s;
        only a service this router started)."""
        if not self._own_service or self.service is None:
            return
        if self._reviving is None or self._reviving.done():
            if time.monotonic() - self._last_revive_look < _REVIVE_LOOK_S:
                return
            self._last_revive_look = time.monotonic()
            self._reviving = asyncio.ensure_future(asyncio.to_thread(self.service.revive))
        try:
            await asyncio.shield(self._reviving)
        except Exception as exc:  # noqa: BLE001 — a failed revival: the next outage retry looks again
            log.error("could not bring the reward service back: %s", exc)

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> RewardRouter:
        """Warm the local reward fns (process pools, models: the first trajectory must not pay for them) and
        start the serverless service if a domain uses it."""
        local = sorted({self.cfg.domains[d].reward.fn for d, b in self.backends.items() if b == "local"})
        self._fns.warm(local)
        if self.serverless is None and "serverless" in self.backends.values():
            from rollart.reward.service import SHARED_APP, RewardService, join_shared_service

            joined = join_shared_service(f"run-{self.run_id[:16]}")
            if joined is not None:  # `rollart serve-reward` runs in this Ray cluster: one service, many jobs
                url, token = joined
                self.serverless = HttpRewardClient(url, self.cfg.reward, token=token, backend="serverless",
                                                   seed=self._seed, run_key=self.run_key)
                log.info("reward: the shared reward service at %s", url)
                return self
            suffix = self.run_id[:8]  # names of its own: other jobs' services in this cluster stay untouched
            self.service = RewardService(self.cfg, app_name=f"{SHARED_APP}-{suffix}",
                                         route=f"{self.cfg.reward.serverless.route.rstrip('/')}-{suffix}")
            self.service.start()
            self._own_service = True
            self._connect_serverless()
            log.info("reward service at %s", self.service.url)
        return self

    def stop(self, ray_ends_next: bool = False) -> None:
        """Stop what `start` started. `ray_ends_next=True`: leave the Serve app and its actors to the end of
        the Ray instance, which the caller shuts down next (see `RewardService.stop`)."""
        if self._own_service and self.service is not None:
            self.service.stop(ray_ends_next)
            self.service, self.serverless, self._own_service = None, None, False
        self._fns.close()

    def __enter__(self) -> RewardRouter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- scoring ----------------------------------------------------------------------------------
    async def score(self, trajectory: Trajectory, run_key: str | None = None) -> RewardResult:
        """Score one trajectory of this run (`run_key`: of another run, see `for_run`); never raises."""
        domain = trajectory.domain
        backend = self.backends.get(domain)
        if backend is None:
            return RewardResult(trajectory.trajectory_id, 0.0, ok=False, attempts=0,
                                error=f"no reward for domain {domain!r} (configured: {sorted(self.backends)})")
        spec = self.cfg.domains[domain].reward.fn
        if backend == "local":
            return await self.local.score(trajectory, spec)
        client = self.serverless if backend == "serverless" else self.http
        if client is None:
            return RewardResult(trajectory.trajectory_id, 0.0, ok=False, attempts=0, backend=backend,
                                error="the serverless reward service is not started (call RewardRouter.start())")
        return await client.score(trajectory, spec, run_key)

    def scores_groups(self, domain: str) -> bool:
        """Whether `domain`'s reward is scored a group at a time: a batched (TRL-shaped) function on the local
        backend (a service's payload is one trajectory: there it is called per trajectory)."""
        spec = self.cfg.domains[domain].reward.fn if domain in self.cfg.domains else ""
        return (self.backends.get(domain) == "local" and spec not in BUILTINS
                and bool(getattr(self._fns.get(spec), "batched", False)))

    async def score_group(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """Score trajectories of one domain: with one call of a batched function where `scores_groups`, else each
        on its own (concurrently); never raises."""
        if not trajectories:
            return []
        domain = trajectories[0].domain
        if self.scores_groups(domain):
            return await self.local.score_group(trajectories, self.cfg.domains[domain].reward.fn)
        return list(await asyncio.gather(*(self.score(t) for t in trajectories)))

    def for_run(self, run_id: str) -> RunScorer:
        """A `RewardScorer` for another run on the same clients — an evaluation is a run of its own, so its
        ids (`eval/<tag>/<domain>/<i>`, the same in every evaluation) never meet another's keys."""
        return RunScorer(self, f"{run_id}/0")

    # --- metrics ----------------------------------------------------------------------------------
    def replica_timeline(self) -> list[tuple[float, float]]:
        """(wall time, running replicas) at each change of the serverless service ([] without one)."""
        return self.service.replica_timeline() if self.service is not None else []

    def metrics(self) -> dict[str, float]:
        """`reward/<backend>/{requests,failures,retries,latency_p50_s,latency_p95_s,...}` per backend used,
        totals `reward/{retries,failures,cold_starts}`, and for the serverless service
        `reward/serverless/{replicas,replicas_max,replicas_mean,replica_starts,pool_util,...}`; for local
        scoring `reward/local/util` (time with a scoring in progress / time since the router was made)."""
        out = backend_metrics({"local": self.local, "serverless": self.serverless, "http": self.http},
                              time.monotonic() - self._started_at)
        if self.service is not None:
            stats = self.service.stats()
            for k in ("replicas", "replicas_max", "replicas_mean", "replica_starts", "replica_s", "busy_s",
                      "pool_util", "completed", "duplicates", "replays", "evicted", "restarts"):
                if k in stats:
                    out[f"reward/serverless/{k}"] = float(stats[k])
        return out


class RunScorer:
    """`RewardRouter.for_run(run_id)`: scores through the router under another run's idempotency keys."""

    def __init__(self, router: RewardRouter, run_key: str) -> None:
        self.router, self.run_key = router, run_key

    async def score(self, trajectory: Trajectory) -> RewardResult:
        return await self.router.score(trajectory, self.run_key)


def new_run_id() -> str:
    """A fresh random run id (128 bits, hex): what keeps one run's idempotency keys from another's."""
    return secrets.token_hex(16)
