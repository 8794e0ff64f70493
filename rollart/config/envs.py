"""The `envs` section: the environment plane's runtime (env workers, retries, the agent gateway, warm pools
and `rollart env serve`).

In: `Section` (`base`), the bounds (`bounds`), `DomainConfig` (`domains`, to tell which domains are pooled) and
`WorkspaceConfig` (`sandbox`). Out: `EnvsConfig` and its subsections `GatewayConfig`, `WarmPoolConfig`,
`EnvServerConfig`.

Guarantee: every request the gateway or an env server takes is adversarial input, and each of its costs
(body, headers, connections, sessions, time) has a bound here. That the warm pool's domains are env domains is
checked once the whole config is known (`rollart.config.run`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollart.config.base import Section
from rollart.config.bounds import (
    DAY_S,
    HOUR_S,
    MAX_BATCH,
    MAX_ENTRIES,
    MAX_RETRIES,
    MAX_THREADS,
    MAX_WORKERS,
    WEEK_S,
)
from rollart.config.domains import DomainConfig
from rollart.config.sandbox import WorkspaceConfig


class GatewayConfig(Section):
    """The OpenAI-compatible gateway each env worker serves agent domains through (on 127.0.0.1 only, an
    ephemeral port). Every request is adversarial input: these bound what one may cost."""

    max_body_mb: float = Field(4.0, gt=0, le=1024, description="largest request body; larger ones get 413")
    max_messages: int = Field(512, ge=1, le=100_000, description="messages in one chat request")
    max_tools: int = Field(64, ge=1, le=10_000, description="tools in one chat request")
    max_concurrent_calls: int = Field(
        4, ge=1, le=1024, description="calls of one trajectory in flight, queued or still sending their body at "
        "once (they run one at a time); more get 429 before their body is read"
    )
    max_open_trajectories: int = Field(
        4096, ge=1, le=MAX_BATCH, description="agent trajectories one env worker's gateway holds open at once"
    )
    max_connections: int = Field(
        4096, ge=1, le=MAX_BATCH, description="HTTP connections the gateway holds open at once; one more is "
        "answered 503 and closed"
    )
    header_timeout_s: float = Field(
        10.0, gt=0, le=HOUR_S, description="a request's line and headers must arrive within this of its first "
        "byte (or of the connection); a slower one is answered 408 and closed"
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=HOUR_S, description="a request's whole body must arrive within this of its headers; a "
        "slower one is answered 408"
    )
    max_header_kb: int = Field(
        64, ge=1, le=1024, description="largest request line plus headers, in KiB; larger get 431"
    )
    max_headers: int = Field(128, ge=1, le=10_000, description="header fields in one request; more get 431")
    # the families of rollart/envs/tool_calls/ (a unit test holds the two lists equal)
    tool_parser: Literal["auto", "none", "hermes", "qwen3_coder", "llama3_json", "mistral", "deepseek_v3", "glm45",
                         "kimi_k2"] = Field(
        "auto", description="how tool calls are parsed out of model output (and forced ones written): auto = the "
        "family whose markers the chat template holds, a family name = that family's format, none = never (requests "
        "with tools are refused)"
    )
    model_name: str = Field("rollart-policy", description="the model name responses carry (any name is accepted)")


class WarmPoolConfig(Section):
    """Prepared environments each env worker keeps ready per domain (rollart/envs/warm_pool.py): a reset then
    only seeds one, while the pool prepares the next in the background."""

    size: int = Field(
        0, ge=0, le=1024, description="prepared envs kept per domain on each env worker; 0 = no pool (every reset "
        "builds and prepares its env)"
    )
    domains: list[str] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="the env domains pooled; empty = all of them (agent "
        "domains have no env)"
    )
    prepare_timeout_s: float = Field(60.0, gt=0, le=DAY_S, description="bound on building and preparing one env")
    parallel: int = Field(
        1, ge=1, le=64, description="envs the pool prepares at once: more where a prepare mostly waits (a container "
        "start: envs.workspace.backend=podman), so a group's envs are ready within one prepare time"
    )


class EnvServerConfig(Section):
    """`rollart env serve DOMAIN`: one domain's environments over HTTP for `remote` envs elsewhere
    (rollart/envs/serving/server.py). Every request is untrusted: these bound what one may cost."""

    host: str = Field("127.0.0.1", description="address to listen on; anything but loopback needs "
                      "allow_non_loopback (the protocol is plain HTTP: put TLS in front of it)")
    port: int = Field(8710, ge=0, le=65535, description="TCP port (0 = an ephemeral one, printed at start)")
    allow_non_loopback: bool = Field(False, description="allow a host other than 127.0.0.1/::1/localhost")
    token_env: str = Field("ROLLART_ENV_TOKEN", description="env var holding the server token that opening a "
                           "session needs (unset: a fresh random one is printed at start)")
    max_body_kb: int = Field(
        1024, ge=1, le=1 << 20, description="largest request body (an action); larger ones get 413"
    )
    max_sessions: int = Field(256, ge=1, le=MAX_BATCH, description="open sessions (trajectories) at once; more get 429")
    idle_timeout_s: float = Field(
        600.0, gt=0, le=WEEK_S, description="a session with no call for this long is closed (its client died, say)"
    )
    threads: int = Field(16, ge=1, le=MAX_THREADS, description="threads running sync env calls")


class EnvsConfig(Section):
    """Runtime of the environment workers (CPU pool)."""

    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="env worker actors; each holds many EnvManagers")
    reset_timeout_s: float = Field(30.0, gt=0, le=DAY_S, description="bound on one env reset (then it is retried)")
    step_timeout_s: float = Field(
        30.0, gt=0, le=DAY_S, description="bound on one env step (then the trajectory ends FAILED)"
    )
    reset_retries: int = Field(
        3, ge=0, le=MAX_RETRIES, description="tries after the first failed reset, each on a fresh env"
    )
    retry_backoff_s: float = Field(
        0.2, ge=0, le=HOUR_S, description="delay before the first reset retry; doubles each try"
    )
    retry_backoff_max_s: float = Field(5.0, ge=0, le=HOUR_S, description="cap on the reset retry delay")
    threads: int = Field(4, ge=1, le=MAX_THREADS, description="thread pool for CPU-heavy env calls")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="the agent gateway's limits")
    workspace: WorkspaceConfig = Field(default_factory=WorkspaceConfig, description="each trajectory's workspace "
                                       "sandbox (domains whose tools run commands, e.g. swe): the keys a run sets "
                                       "apply under a domain's own options.workspace")
    warm_pool: WarmPoolConfig = Field(default_factory=WarmPoolConfig, description="prepared envs kept ready")
    server: EnvServerConfig = Field(default_factory=EnvServerConfig, description="`rollart env serve`")

    def pooled(self, domain: str, domain_cfg: DomainConfig) -> bool:
        """Whether `domain` gets a warm pool."""
        return self.warm_pool.size > 0 and not domain_cfg.runs_agent and (
            not self.warm_pool.domains or domain in self.warm_pool.domains)
