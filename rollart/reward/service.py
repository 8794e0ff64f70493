"""The serverless reward service: a Ray Serve deployment (autoscaling, scale to zero, HTTP) and its lifecycle.

In: a `RunConfig` (`reward.*`, `reward.serverless.*`, the domains' reward fns) and a connected Ray.
Out: `RewardService.start() -> URL` (`http://<host>:<port><route>`), requests answered as in protocol.py,
`stats()`, `stop()`.

What runs where:
- one Serve deployment `RewardDeployment`, min..max replicas (`reward.serverless`), autoscaled on ongoing
  requests, scale to zero allowed; each replica asks for one slot of the pool's Ray resource
  `pool_<reward.serverless.pool>` (so the pool's capacity caps the replicas; `max_replicas` above it is
  lowered to it, with a warning) and `replica_cpus` CPUs. Each replica holds a `RewardHandler` and builds
  the reward functions (process pools, judge model) on first use.
- one Ray actor `SharedClaimBook` (claims.py), named, shared by all replicas: a retried request is answered
  from it whichever replica it lands on (exactly-once across replicas).
- for the shared service (`shared=True`, `rollart serve-reward`), a named `ServiceDirectory` actor: a job in
  the same Ray cluster (`reward.backend=serverless`) attaches through it (`join_shared_service`) instead of
  deploying its own, getting the URL and a job token of its own — one service, many jobs, their keys apart
  (tokens.py). Jobs elsewhere use backend `http` with a token from `rollart serve-reward --issue-token`.
- a poller thread samples the number of running replicas every `poll_s` (replicas over time, the
  denominator of the pool's utilisation).
Serve's HTTP proxy binds `reward.serverless.host` (127.0.0.1 by default; a non-loopback host needs
`reward.allow_plain_http`, since bearer tokens would cross the network in clear), and each replica's
internal gRPC server binds the node's IP, not every interface (`_replica_grpc_off_public_interfaces`). If
Serve is already running in this Ray (another app), its HTTP options stay and the URL uses its port.

Failures: Ray Serve replaces a replica that dies (its in-flight requests fail and are retried by the
client). If the app itself is gone or broken (deleted, its deployment failed, Serve lost), `revive()`
deploys it again (and its claim-book actor, if that died too) and counts it (`restarts`); the router calls it
while the service is out. `stop()` never hangs: Serve's delete, which waits on its controller unbounded, gets
`_STOP_TIMEOUT_S`, past which stop logs it and goes on (Ray's shutdown takes Serve with it).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import warnings
from typing import Any, Callable

import ray
from ray import serve

from rollart.config import RunConfig
from rollart.resources.manager import on_driver_node
from rollart.resources.names import pool_resource
from rollart.reward import tokens
from rollart.reward.handler import RewardHandler, ServiceFaults
from rollart.reward.claims import SharedClaimBook
from rollart.reward.metrics import Timeline

log = logging.getLogger("rollart.reward")
# One access-log line per scored trajectory drowns a training run's output; warnings and errors still show.
_QUIET_LOGS = {"enable_access_log": False, "log_level": "WARNING"}

REWARD_NAMESPACE = "rollart-reward"
SHARED_APP = "rollart-reward"  # the app of `rollart serve-reward`: jobs in its Ray cluster attach to it
_CALL_TIMEOUT_S = 30.0
# Serve's own delete waits on its controller with no bound (`ray.get`): a controller that is gone or stuck
# (a SIGTERM mid-run) held `rollart train` in its teardown for good. Past this, stop goes on without it.
_STOP_TIMEOUT_S = 30.0
# Ray Serve 2.60 builds a RequestRouterConfig for every deployment it describes (serve.status(), a new
# deployment), and each one registers then unregisters a module in cloudpickle's global by-value set
# without a lock: two threads doing it at once fail ("... is not registered for pickle by value"). Every
# Serve API call rollart makes (the replica pollers' included) holds this lock.
_SERVE_API = threading.Lock()


class ActorClaimBook:
    """The handler's `ClaimBook`, backed by the shared `SharedClaimBook` actor."""

    def __init__(self, handle: Any) -> None:
        self.h = handle

    async def claim(self, key: str, digest: str) -> tuple[str, Any]:
        return await self.h.claim.remote(key, digest)

    async def complete(self, key: str, token: int, answer: dict[str, Any]) -> bool:
        return await self.h.complete.remote(key, token, answer)

    async def release(self, key: str, token: int) -> None:
        await self.h.release.remote(key, token)

    async def claim_many(self, items: list[tuple[str, str]]) -> list[tuple[str, Any]]:
        return await self.h.claim_many.remote(items)

    async def complete_many(self, items: list[tuple[str, int, dict[str, Any]]]) -> list[bool]:
        return await self.h.complete_many.remote(items)

    async def release_many(self, items: list[tuple[str, int]]) -> None:
        await self.h.release_many.remote(items)

    async def wait(self, key: str, timeout_s: float) -> dict[str, Any] | None:
        return await self.h.wait.remote(key, timeout_s)

    def report(self, replica: str, busy_s: float, alive_s: float) -> None:
        self.h.report.remote(replica, busy_s, alive_s)  # fire and forget: stats only


def _replica_grpc_off_public_interfaces() -> None:
    """Ray Serve 2.60 starts every replica's inter-deployment gRPC server on `[::]:0` — every interface —
    with no option to change it (`ray.serve._private.replica`, `_on_initialized`, which runs right after
    this deployment's constructor and calls the module-level `add_port_to_grpc_server`). Called first thing
    in the constructor, this makes that call bind the node's own IP instead (127.0.0.1 on an embedded or
    loopback cluster), which is where Serve connects to it. If a Ray upgrade moves the call, this warns, and
    the listening-socket test of a live run fails."""
    from ray.serve._private import replica as replica_module

    original = getattr(replica_module, "add_port_to_grpc_server", None)
    if original is None:
        log.warning("Ray Serve changed: cannot keep the replica's gRPC server off public interfaces")
        return
    if getattr(original, "rollart_loopback", False):
        return
    node_ip = ray.util.get_node_ip_address()
    host = f"[{node_ip}]" if ":" in node_ip else node_ip

    def bind_node_ip(server: Any, address: str) -> int:
        if address.startswith("[::]:"):
            address = f"{host}:{address[len('[::]:'):]}"
        return original(server, address)

    bind_node_ip.rollart_loopback = True  # type: ignore[attr-defined]
    replica_module.add_port_to_grpc_server = bind_node_ip


class RewardDeployment:
    """One Serve replica: POST → score (handler.py); GET → health."""

    def __init__(self, cfg_data: dict[str, Any], claims_name: str, token: str | None, faults: ServiceFaults | None) -> None:
        from starlette.responses import JSONResponse

        _replica_grpc_off_public_interfaces()

        self._json = JSONResponse
        cfg = RunConfig.model_validate(cfg_data)
        claims = ActorClaimBook(ray.get_actor(claims_name, namespace=REWARD_NAMESPACE))
        tag = serve.get_replica_context().replica_id.unique_id
        replica = f"reward/{cfg.reward.serverless.pool}/serverless-{tag}"  # worker name, one per replica
        self.handler = RewardHandler(cfg, claims, token=token, replica=replica, faults=faults)
        # warm up (process pools, judge model) before Serve routes requests here: part of the cold start
        self.handler.fns.warm(sorted({d.reward.fn for d in cfg.domains.values()}))
        claims.report(replica, 0.0, 0.0)  # counts the replica start

    async def __call__(self, request: Any) -> Any:
        if request.method == "GET":
            return self._json({"status": "ok", "replica": self.handler.replica})
        if request.method != "POST":
            return self._json({"error": f"method {request.method} not allowed; POST a payload", "code": "not_found"}, 405)
        status, body = await self.handler.handle(request.headers, request.stream())
        return self._json(body, status_code=status)

    def __del__(self) -> None:
        handler = getattr(self, "handler", None)
        if handler is not None:
            handler.close()


class ServiceDirectory:
    """The named actor `rollart-reward-directory` of the shared service (`rollart serve-reward`): where it
    answers, and a job token for each job of its Ray cluster that asks (`join_shared_service`)."""

    def __init__(self, url: str, secret: str) -> None:
        self.url, self.secret = url, secret

    def join(self, job: str) -> tuple[str, str]:
        return self.url, tokens.issue(self.secret, job)


def join_shared_service(job: str) -> tuple[str, str] | None:
    """(URL, job token) of the shared reward service running in this Ray cluster, or None if there is none
    (or Ray is not connected)."""
    if not ray.is_initialized():
        return None
    try:
        directory = ray.get_actor(f"{SHARED_APP}-directory", namespace=REWARD_NAMESPACE)
    except ValueError:
        return None
    return tuple(ray.get(directory.join.remote(job), timeout=_CALL_TIMEOUT_S))  # type: ignore[return-value]


class RewardService:
    """Start/stop the Serve app; `url`, `token`; `stats()` and `scorings(key)` for metrics and tests.

    `app_name` / `route`: the Serve application and its route prefix (a job's own service uses names of its
    own, so jobs sharing a Ray cluster never replace each other's). `shared=True` (what `rollart
    serve-reward` does) also registers the directory through which jobs in the same Ray cluster attach."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        token: str | None = None,
        port: int | None = None,
        app_name: str = SHARED_APP,
        route: str | None = None,
        shared: bool = False,
        faults: ServiceFaults | None = None,
        poll_s: float = 0.5,
    ) -> None:
        self.cfg = cfg
        sl = cfg.reward.serverless
        self.token = token if token is not None else (os.environ.get(cfg.reward.http.token_env) or secrets.token_urlsafe(24))
        self.port = port or sl.port
        self.app_name = app_name
        self.route = route or sl.route
        self.shared = shared
        self.faults = faults
        self.poll_s = poll_s
        self.url = ""
        self.replicas = Timeline()
        self._claims: Any = None
        self._directory: Any = None
        self._started_serve = False
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self.restarts = 0
        self._claims_alive = False

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> str:
        if not ray.is_initialized():
            raise RuntimeError(
                "RewardService.start needs a running Ray (rollart.resources.Runtime, or ray.init) — the "
                "serverless reward backend runs on Ray Serve"
            )
        try:
            return self._start()
        except BaseException:
            self.stop()  # nothing half-started is left behind (claim-book actor, app, Serve)
            raise

    def _start(self) -> str:
        sl = self.cfg.reward.serverless
        if problem := self.cfg.reward.plain_http_problem(serving=True, sending=False):
            raise ValueError(problem)
        claims_name = f"{self.app_name}-claims"
        lease = self.cfg.reward.timeout_s + 5.0
        if self._claims is None or not self._claims_alive:
            if self._claims is None and self.shared and join_shared_service("probe") is not None:
                raise RuntimeError(f"a shared reward service already runs in this Ray cluster (app {SHARED_APP})")
            self._claims = (
                ray.remote(SharedClaimBook)
                .options(name=claims_name, namespace=REWARD_NAMESPACE, num_cpus=0, max_concurrency=1000,
                         scheduling_strategy=on_driver_node())  # not on a node that may leave
                .remote(int(self.cfg.reward.dedupe_max_mb * 2**20), self.cfg.reward.dedupe_ttl_s, lease)
            )
            self._claims_alive = True
        port = self._start_serve()
        self.url = f"http://{sl.host}:{port}{self.route}"
        with warnings.catch_warnings(), _SERVE_API:
            warnings.simplefilter("ignore")  # metrics_interval_s is "deprecated" but the only way to set it
            app = serve.deployment(RewardDeployment).options(
                name="RewardDeployment",
                autoscaling_config={
                    "min_replicas": sl.min_replicas,
                    "initial_replicas": sl.min_replicas,
                    "max_replicas": self._max_replicas(),
                    "target_ongoing_requests": sl.target_ongoing_requests,
                    "upscale_delay_s": sl.upscale_delay_s,
                    "downscale_delay_s": sl.downscale_delay_s,
                    "downscale_to_zero_delay_s": sl.downscale_delay_s,
                    "metrics_interval_s": sl.metrics_interval_s,
                    "look_back_period_s": sl.look_back_period_s,
                },
                max_ongoing_requests=sl.max_ongoing_requests,
                ray_actor_options=self._actor_options(),
                logging_config=_QUIET_LOGS,
            ).bind(self.cfg.model_dump(mode="json"), claims_name, self.token or None, self.faults)
            serve.run(app, name=self.app_name, route_prefix=self.route, blocking=False)
        if self.shared:
            self._directory = (
                ray.remote(ServiceDirectory)
                .options(name=f"{SHARED_APP}-directory", namespace=REWARD_NAMESPACE, num_cpus=0,
                         scheduling_strategy=on_driver_node())
                .remote(self.url, self.token)
            )
        self._stop.clear()
        self._poller = threading.Thread(target=self._poll, name="reward-replica-poller", daemon=True)
        self._poller.start()
        return self.url

    def alive(self) -> bool:
        """The app is deployed and Serve runs it (RUNNING, or DEPLOYING a change such as a new replica)."""
        try:
            app = serve.status().applications.get(self.app_name)
        except Exception:  # noqa: BLE001 — Serve itself is not answering: not alive
            return False
        return app is not None and str(getattr(app.status, "value", app.status)) in ("RUNNING", "DEPLOYING")

    def revive(self) -> bool:
        """Deploy the app again if it is gone or broken (see the module doc); True if it had to be."""
        if not self.url or self.alive():
            return False
        log.warning("the reward service %s is down: deploying it again", self.app_name)
        try:
            serve.delete(self.app_name)
        except Exception:  # noqa: BLE001 — already gone
            pass
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
            self._poller = None
        try:
            ray.get(self._claims.stats.remote(), timeout=_CALL_TIMEOUT_S)
            self._claims_alive = True
        except Exception:  # noqa: BLE001 — the claim book died with it: a new one (its keys are lost, not reused)
            self._claims_alive = False
        self._start()
        self.restarts += 1
        return True

    def _start_serve(self) -> int:
        sl = self.cfg.reward.serverless
        # Serve has no public "is it running, on which port" call; its client exposes both
        running = serve.context._get_global_client(raise_if_no_controller_running=False)
        if running is None:
            with _SERVE_API:
                serve.start(http_options={"host": sl.host, "port": self.port}, logging_config=_QUIET_LOGS)
            self._started_serve = True
            return self.port
        http = running.http_config
        if (http.host, http.port) != (sl.host, self.port):
            log.warning("Ray Serve already runs here with HTTP on %s:%s; the reward service uses it (asked for %s:%s)",
                        http.host, http.port, sl.host, self.port)
        return int(http.port)

    def _max_replicas(self) -> int:
        sl = self.cfg.reward.serverless
        capacity = ray.cluster_resources().get(pool_resource(sl.pool), 0.0)
        if capacity and sl.max_replicas > capacity:
            log.warning("reward.serverless.max_replicas=%d exceeds pool %s capacity %g: using %d",
                        sl.max_replicas, sl.pool, capacity, int(capacity))
            return max(1, int(capacity))
        return sl.max_replicas

    def _actor_options(self) -> dict[str, Any]:
        sl = self.cfg.reward.serverless
        options: dict[str, Any] = {"num_cpus": sl.replica_cpus}
        if ray.cluster_resources().get(pool_resource(sl.pool), 0.0) >= 1:
            options["resources"] = {pool_resource(sl.pool): 1.0}
        else:
            log.warning("pool %s has no Ray resource %s on this cluster: reward replicas run unconstrained by it",
                        sl.pool, pool_resource(sl.pool))
        return options

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                with _SERVE_API:
                    app = serve.status().applications.get(self.app_name)
                running = app.deployments["RewardDeployment"].replica_states.get("RUNNING", 0) if app else 0
                self.replicas.record(float(running))
            except Exception as exc:  # noqa: BLE001 — a missed sample is not worth stopping for
                log.debug("replica poll failed: %s", exc)
            self._stop.wait(self.poll_s)

    def stop(self, ray_ends_next: bool = False) -> None:
        """Delete the app (and Serve itself if this service started it) and the claim-book actor. Idempotent.

        `ray_ends_next=True` is for a caller that owns Ray and shuts it down next, which takes the app, Serve
        and the actors with it: only the replica poller stops here (deleting the app first waited ~2.5 s for
        its replicas to drain at the end of every run on 2 cores, for nothing)."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
            self._poller = None
        if not ray.is_initialized():
            return
        if ray_ends_next:
            self._directory = self._claims = None
            self.url, self._started_serve = "", False
            return
        if self._directory is not None:  # first: no job attaches to a service that is going away
            ray.kill(self._directory)
            self._directory = None
        if self.url:
            started_serve = self._started_serve

            def delete_app() -> None:
                with _SERVE_API:
                    serve.delete(self.app_name)
                    # Serve itself only if this service started it and no other app (another job's) runs on it
                    if started_serve and not serve.status().applications:
                        serve.shutdown()

            try:
                bounded(delete_app, _STOP_TIMEOUT_S, f"deleting the Serve app {self.app_name}")
            except Exception as exc:  # noqa: BLE001 — stopping must not raise, and goes on
                log.warning("stopping the reward service: %s", exc)
            self.url = ""
            self._started_serve = False
        if self._claims is not None:
            ray.kill(self._claims)
            self._claims = None

    def __enter__(self) -> RewardService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- observation ------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """ClaimBook counters, replica starts, replicas now/max/mean, busy seconds and pool utilisation."""
        out: dict[str, float] = {}
        if self._claims is not None:
            out.update(ray.get(self._claims.stats.remote(), timeout=_CALL_TIMEOUT_S))
        # replica-seconds: the poller's integral lags a replica's start by up to poll_s; each replica's own
        # alive time (as of its last report) lags its end — take the larger of two underestimates
        replica_s = max(self.replicas.integral(), out.get("alive_s", 0.0))
        out.update({
            "restarts": float(self.restarts),
            "replicas": self.replicas.current,
            "replicas_max": self.replicas.max,
            "replicas_mean": self.replicas.mean(),
            "replica_s": replica_s,
            "pool_util": out.get("busy_s", 0.0) / replica_s if replica_s > 0 else 0.0,
        })
        return out

    def scorings(self, key: str) -> int:
        """How many times the service scored `key` (while it remembers it)."""
        return int(ray.get(self._claims.scorings.remote(key), timeout=_CALL_TIMEOUT_S))

    def replica_timeline(self) -> list[tuple[float, float]]:
        return list(self.replicas.points)


def bounded(call: Callable[[], None], timeout_s: float, what: str) -> None:
    """Run `call` on a daemon thread and wait at most `timeout_s`: its error is raised here; past the
    bound it is left to finish (or not) on its own, and a TimeoutError names `what`."""
    done, errors = threading.Event(), []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 — handed to the waiting thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, name="reward-service-stop", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError(f"{what} did not finish within {timeout_s:g} s; going on without it (Ray's "
                           "shutdown takes Serve with it)")
    if errors:
        raise errors[0]
