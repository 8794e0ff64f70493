"""Env servers that rollart runs itself (`domains.<d>.env_servers: N`), kept whole by the resource plane.

In: the resource plane's `Resources`, the `RunConfig` and a domain whose `env_servers` > 0. Out:
`EnvServerFleet.place(...)` — N `EnvServerActor`s on the `env_server` role's pool (the `env` pool unless
`roles.env_server` says otherwise), each serving the domain's envs over the env server protocol
(rollart/envs/serving/server.py) on its node's address, and a `ServerDirectory` actor that holds the live
servers' URLs and the fleet's token. The env workers reach the domain through `RemoteEnv(directory=...)`.

Failures, as for every worker (docs/architecture.md §7): an env server that dies leaves the worker set's
view and a replacement is placed in its slot; the directory follows the membership events (`died`: its
URL leaves at once; `joined`: the new one's URL is added). A trajectory whose server died ends FAILED
with the reason (`RemoteEnvError` names the server) and the control plane replaces it with the same seed;
nothing else of the run is lost.

Trust: the servers listen on the Ray node's address, as Ray's own ports do, so the Ray network is the
trust boundary (docs: Ray access is full access); every session still needs the fleet's token.
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Any

from rollart.config import RunConfig
from rollart.resources import affinity

log = logging.getLogger(__name__)
URL_TIMEOUT_S = 30.0


@affinity("env", role="env_server")
class EnvServerActor:
    def __init__(self, cfg: RunConfig, domain: str, token: str, name: str = "env_server/env/0") -> None:
        import ray

        from rollart.envs.serving.server import EnvServer
        from rollart.envs.spec import domain_env_factory

        domain_cfg = cfg.domains[domain]
        server_cfg = cfg.envs.server.model_copy(update={"host": ray.util.get_node_ip_address(), "port": 0})
        pool = cfg.envs.warm_pool.size if cfg.envs.pooled(domain, domain_cfg) else 0
        self.name = name
        factory = domain_env_factory(domain, domain_cfg, None, cfg.seed, cfg.envs.workspace)
        self.server = EnvServer(domain, domain_cfg.env, factory, server_cfg, cfg.envs, token=token,
                                pool_size=pool).start()

    def url(self) -> str:
        return self.server.url

    def shutdown(self) -> None:
        self.server.stop()


class ServerDirectory:
    """The live servers of each managed domain, and their token (a control actor)."""

    def __init__(self) -> None:
        self._servers: dict[str, tuple[list[str], str]] = {}

    def set(self, domain: str, urls: list[str], token: str) -> None:
        self._servers[domain] = (list(urls), token)

    def get(self, domain: str) -> tuple[list[str], str]:
        return self._servers.get(domain, ([], ""))


class EnvServerFleet:
    def __init__(self, domain: str, worker_set: Any, directory: Any, token: str) -> None:
        self.domain, self.worker_set, self.directory, self._token = domain, worker_set, directory, token
        self._lock = threading.Lock()
        self._urls: dict[str, str] = {}  # actor id → url
        worker_set.on_change(self._changed)

    @classmethod
    def place(cls, resources: Any, cfg: RunConfig, domain: str, directory: Any) -> EnvServerFleet:
        import ray

        token = secrets.token_urlsafe(24)
        worker_set = resources.place(EnvServerActor, replicas=cfg.domains[domain].env_servers,
                                  kwargs={"cfg": cfg, "domain": domain, "token": token},
                                  worker_kwargs=lambda p: {"name": p.worker})
        fleet = cls(domain, worker_set, directory, token)
        urls = ray.get([m.actor.url.remote() for m in worker_set.members()], timeout=URL_TIMEOUT_S)
        with fleet._lock:
            fleet._urls = {m.actor_id: u for m, u in zip(worker_set.members(), urls)}
        fleet._publish()
        return fleet

    def _publish(self) -> None:
        import ray

        with self._lock:
            urls = sorted(self._urls.values())
        ray.get(self.directory.set.remote(self.domain, urls, self._token), timeout=URL_TIMEOUT_S)

    def _changed(self, event: Any) -> None:
        """A membership event (on the thread that learnt it: the slow part runs on a thread of its own)."""
        if event.kind == "died":
            with self._lock:
                self._urls.pop(event.actor._actor_id.hex(), None)
        elif event.kind != "joined":
            return
        threading.Thread(target=self._follow, args=(event,), name=f"env-fleet-{self.domain}", daemon=True).start()

    def _follow(self, event: Any) -> None:
        import ray

        try:
            if event.kind == "joined":
                url = ray.get(event.actor.url.remote(), timeout=URL_TIMEOUT_S)
                with self._lock:
                    self._urls[event.actor._actor_id.hex()] = url
            self._publish()
            log.info("env servers of %s: %s %s; serving from %s", self.domain, event.worker, event.kind,
                     sorted(self._urls.values()))
        except Exception as exc:  # the directory keeps the servers it had; the next event fixes it
            log.warning("env servers of %s: could not follow %s %s: %s", self.domain, event.worker, event.kind, exc)

    def urls(self) -> list[str]:
        with self._lock:
            return sorted(self._urls.values())

    def shutdown(self) -> None:
        self.worker_set.shutdown()
