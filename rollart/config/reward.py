"""The `reward` section: where trajectories are scored (locally, the serverless reward service, an HTTP
endpoint), with which retries, limits and sandbox (the domains pick the reward functions).

In: `Section`, the trust markers and `is_loopback_host` (`base`), the bounds (`bounds`), `SandboxConfig`
(`sandbox`). Out: `RewardConfig`, its `ServerlessConfig` and `HttpRewardConfig`.

Guarantees: the serverless deployment's replica range and autoscaling window are consistent;
`RewardConfig.plain_http_problem` says when a config would put a bearer token on the network in clear (the
whole run's check, `rollart.config.run`, refuses it).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from rollart.config.base import TRUST_GUARD, TRUST_NETWORK, Section, is_loopback_host
from rollart.config.bounds import DAY_S, HOUR_S, MAX_BATCH, MAX_MB, MAX_RETRIES, MAX_THREADS, MAX_WORKERS, WEEK_S
from rollart.config.sandbox import SandboxConfig


class ServerlessConfig(Section):
    """The Ray Serve deployment of the reward service (`reward` backend `serverless`)."""

    pool: str = Field("reward", description="the serverless pool whose `pool_<name>` resource hosts replicas")
    min_replicas: int = Field(0, ge=0, le=MAX_WORKERS, description="0 allows scale to zero")
    max_replicas: int = Field(2, ge=1, le=MAX_WORKERS, description="at most the pool's capacity (one slot per replica)")
    target_ongoing_requests: float = Field(4.0, gt=0, le=1e6, description="autoscaling target per replica")
    max_ongoing_requests: int = Field(16, ge=1, le=1_000_000, description="requests one replica runs at once")
    upscale_delay_s: float = Field(
        0.0, ge=0, le=DAY_S, description="how long load must stay high before adding replicas"
    )
    downscale_delay_s: float = Field(10.0, ge=0, le=DAY_S, description="also the delay before scaling to zero")
    metrics_interval_s: float = Field(
        0.5, gt=0, le=HOUR_S, description="how often load is reported to the autoscaler (Serve's default 10 s makes a "
        "cold start from zero take ~10 s; 0.5 s makes it ~2 s)"
    )
    look_back_period_s: float = Field(
        2.0, gt=0, le=DAY_S, description="autoscaler averaging window (> metrics_interval_s)"
    )
    replica_cpus: float = Field(
        0.0, ge=0, le=MAX_THREADS, description="CPUs each replica reserves from Ray (0 = shares)"
    )
    host: str = Field("127.0.0.1", description="address Serve's HTTP proxy binds", json_schema_extra=TRUST_GUARD)
    port: int = Field(8123, ge=1, le=65535, description="port of Serve's HTTP proxy")
    route: str = Field("/reward", pattern=r"^/[A-Za-z0-9_\-/]*$", description="URL path of the reward endpoint")

    @model_validator(mode="after")
    def _check(self) -> ServerlessConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be ≤ max_replicas ({self.max_replicas})")
        if self.look_back_period_s <= self.metrics_interval_s:
            raise ValueError(
                f"look_back_period_s ({self.look_back_period_s}) must be > metrics_interval_s ({self.metrics_interval_s})"
            )
        return self


class HttpRewardConfig(Section):
    """An external reward endpoint (`reward` backend `http`), speaking the reward service's protocol."""

    url: str = Field(
        "", description="full URL of an external reward endpoint (backend `http`)",
        json_schema_extra=TRUST_NETWORK,
    )
    token_env: str = Field(
        "ROLLART_REWARD_TOKEN", description="env var holding the bearer token",
        json_schema_extra=TRUST_NETWORK,
    )
    batch: bool = Field(
        False, description="the endpoint is a rollart reward service (`rollart serve-reward`), which takes several "
        "trajectories in one request: send them batched (reward.batch_ms); off for an endpoint that speaks only "
        "one-trajectory requests"
    )


class RewardConfig(Section):
    """How trajectories are scored: where, with which retries and limits (the domains pick the functions)."""

    backend: Literal["local", "serverless", "http"] = Field(
        "local", description="where a domain's reward runs unless it names its own or is cheap (a cheap reward is "
        "scored in the env worker: domains.<d>.reward.cheap): local (in the driver), serverless (the Ray Serve "
        "reward service), http (reward.http.url)"
    )
    timeout_s: float = Field(30.0, gt=0, le=DAY_S, description="per request (client) and per scoring (service)")
    retries: int = Field(3, ge=0, le=MAX_RETRIES, description="tries after the first; then the trajectory ends FAILED")
    outage_budget_s: float = Field(
        120.0, ge=0, le=WEEK_S, description="how long a reward service that is down or hung (connection errors, "
        "timeouts, 502/503/504) is retried past `retries` — reviving it if it died — before the trajectory ends "
        "FAILED"
    )
    backoff_s: float = Field(0.2, ge=0, le=HOUR_S, description="first retry delay; doubles each try, full jitter")
    backoff_max_s: float = Field(5.0, ge=0, le=HOUR_S, description="cap on the retry delay")
    max_in_flight: int = Field(64, ge=1, le=1_000_000, description="requests in flight per backend")
    batch_ms: float = Field(
        5.0, ge=0, le=HOUR_S * 1000, description="how long a trajectory bound for the reward service (serverless, or "
        "http with reward.http.batch) waits for others to go with it in one request — a group's members end "
        "within milliseconds of each other; 0 = one request per trajectory"
    )
    max_batch: int = Field(64, ge=1, le=MAX_BATCH, description="trajectories in one batched reward request at most")
    max_payload_mb: float = Field(4.0, gt=0, le=1024, description="largest request the service accepts")
    dedupe_max_mb: float = Field(
        64.0, gt=0, le=MAX_MB, description="memory the service's claim book may hold (keys, payload digests "
        "and stored answers); past it the oldest entries are forgotten first"
    )
    dedupe_ttl_s: float = Field(
        3600.0, gt=0, le=30 * DAY_S, description="how long the service remembers a scored key (then it is dropped, "
        "whether or not anyone asks)"
    )
    math_timeout_s: float = Field(
        5.0, gt=0, le=HOUR_S, description="bound on checking one math answer (then it scores 0)"
    )
    math_workers: int = Field(1, ge=1, le=MAX_THREADS, description="processes of the math reward's pool")
    judge_model: str = Field("", description="checkpoint of the `judge` reward (a local "
        "directory or a hub id, like model.path); empty = the run's model")
    allow_plain_http: bool = Field(
        False, description="serve (reward.serverless.host) or send (reward.http.url) bearer tokens over plain HTTP "
        "on a non-loopback address; off, such a config is refused (use a TLS proxy, or allow it inside a "
        "trusted network)",
        json_schema_extra=TRUST_GUARD,
    )
    serverless: ServerlessConfig = ServerlessConfig()
    http: HttpRewardConfig = HttpRewardConfig()
    sandbox: SandboxConfig = SandboxConfig()

    def plain_http_problem(self, serving: bool, sending: bool) -> str:
        """Why this config would put a bearer token on the network in clear, or ''."""
        if self.allow_plain_http:
            return ""
        if serving and not is_loopback_host(self.serverless.host):
            return (f"reward.serverless.host: {self.serverless.host!r} is not a loopback address, so the reward "
                    "service would take bearer tokens over plain HTTP from the network; keep 127.0.0.1 (put a "
                    "TLS proxy in front), or set reward.allow_plain_http=true inside a trusted network")
        url = urlsplit(self.http.url)
        if sending and url.scheme == "http" and not is_loopback_host(url.hostname or ""):
            return (f"reward.http.url: {self.http.url!r} is plain HTTP to a non-loopback host, so the bearer token "
                    "would cross the network in clear; use https://, or set reward.allow_plain_http=true inside "
                    "a trusted network")
        return ""
