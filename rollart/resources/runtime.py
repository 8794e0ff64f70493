"""The Ray runtime of a run: embedded on this machine, or joined to a cluster by address.

In: a `RunConfig` (`cluster.*` and `pools.*`). Out, inside `with Runtime(cfg) as rt:`, a connected Ray and
`rt.resources` (placement and pool reports, see placement.py).

Modes:
- embedded (`cluster.address` empty): a new local Ray bound to 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
  is set before Ray is imported, see `rollart/resources/__init__.py`), no dashboard, `cluster.num_cpus`,
  `cluster.object_store_mb`, and one custom resource `pool_<name>` per pool with `pools.<name>.capacity`
  — serverless pools included: their resource caps how many Ray-hosted replicas (Ray Serve) run at once.
- joined (`cluster.address` set): connects to that cluster and starts no Ray process (a `host:port` where
  nothing listens fails within 5 s; Ray's own join would retry for minutes); a non-loopback address keeps
  Ray's token auth on (`keep_token_auth`); every declared
  gpu/cpu pool must exist there as a resource, else `ClusterError` names the missing pools and the
  `ray start --resources` line that declares them. A serverless pool may be missing (its reward may be an
  external HTTP endpoint): a WARNING says so and the pool has no capacity.
- attached (Ray already initialised in this process, e.g. the test session's Ray): uses it, checks the
  pools as when joined, and leaves it running on exit.

Logs: in the modes that start the Ray job (embedded, joined) every worker process formats Python logging
like the driver (logs.py, at `observability.log_level`) through Ray's `worker_process_setup_hook`, so
a worker's warning reaches the console as `(EnvWorker pid=…) <time> WARNING rollart.envs: …`, not as a bare
message from Python's last-resort handler.

Guarantees: Ctrl-C (SIGINT) raises KeyboardInterrupt (or, in a job run by `rollart.base.interrupts`, stops it
as that module says) and SIGTERM raises SystemExit(143) in the main thread, so the `with` block unwinds;
on exit an embedded Ray is shut down and its processes waited for (a second signal during that shutdown is
ignored), a joined one is disconnected. No Ray process this runtime started outlives it, nor any client
state of it in this process (Ray Serve's): the next runtime in the same process starts from nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from types import FrameType
from typing import Any, Literal

import ray
from ray._common.utils import get_default_ray_temp_dir  # where `ray.init` puts its sessions

from rollart.base import interrupts
from rollart.config import ClusterConfig, RunConfig, is_loopback_host
from rollart.resources import AUTH_MODE_DEFAULTED
from rollart.resources.errors import ClusterError
from rollart.resources.logs import LOG_LEVEL_VAR, configure_worker_logging
from rollart.resources.manager import MANAGER_NAME
from rollart.resources.names import pool_resource
from rollart.resources.nodes import declare_hint, missing_pools
from rollart.resources.placement import Resources

log = logging.getLogger("rollart.resources")

Mode = Literal["embedded", "joined", "attached"]
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_CONNECT_TIMEOUT_S = 5.0


class Runtime:
    def __init__(self, cfg: RunConfig, *, handle_signals: bool = True, manager_name: str = MANAGER_NAME) -> None:
        self.cfg = cfg
        self.mode: Mode | None = None
        self.resources: Resources | None = None
        self.session_dir: str | None = None  # embedded only: Ray's session directory
        self.dashboard_url = ""  # Ray's dashboard (embedded with cluster.dashboard, or the joined cluster's)
        self._handle_signals = handle_signals
        self._manager_name = manager_name
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Runtime:
        return self if self.mode is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self) -> Runtime:
        if self.mode is not None:
            raise RuntimeError("this Runtime is already started")
        if self._handle_signals and _main_thread():
            self._previous = {s: signal.getsignal(s) for s in _SIGNALS}
        try:
            self.mode = self._connect()
            if self.mode != "embedded":
                self._check_pools()
            self.resources = Resources.connect(self.cfg, name=self._manager_name)
            if self._previous:
                # after ray.init, which installs its own SIGTERM handler; a job run by `rollart.base.interrupts`
                # keeps its Ctrl-C handling (it stops the job gracefully where it can)
                before = self._previous[signal.SIGINT]
                signal.signal(signal.SIGINT, before if interrupts.handles(before) else signal.default_int_handler)
                signal.signal(signal.SIGTERM, _terminate)
        except BaseException:
            self.shutdown()
            raise
        return self

    def shutdown(self) -> None:
        """Stop (embedded) or leave (joined) Ray; idempotent."""
        mode, resources, self.mode, self.resources = self.mode, self.resources, None, None
        own_signals = bool(self._previous) and _main_thread()
        if own_signals:
            for sig in _SIGNALS:  # a second Ctrl-C must not cut the shutdown short and leave processes
                signal.signal(sig, signal.SIG_IGN)
        try:
            if resources is not None and ray.is_initialized():
                resources.end_manager()  # attached: the session's Ray lives on, and so would the manager
            if mode in ("embedded", "joined") and ray.is_initialized():
                try:
                    ray.shutdown(wait_for_processes=True)
                finally:
                    _forget_serve_client()
        finally:
            if own_signals:
                for sig, handler in self._previous.items():
                    signal.signal(sig, handler)
                self._previous = {}

    def describe(self) -> str:
        """One line saying which Ray this is."""
        if self.mode == "embedded":
            return f"embedded Ray on 127.0.0.1 (session {self.session_dir})"
        if self.mode == "joined":
            return f"joined the Ray cluster at {self.cfg.cluster.address}"
        if self.mode == "attached":
            return "attached to the Ray already running in this process"
        return "not started"

    # --- helpers ---------------------------------------------------------------------------------
    def _connect(self) -> Mode:
        cl = self.cfg.cluster
        if ray.is_initialized():
            return "attached"
        if cl.address:
            keep_token_auth(cl)
            _check_reachable(cl.address)
            try:
                context = ray.init(address=cl.address, namespace=cl.namespace, runtime_env=self._worker_env())
            except (ConnectionError, ValueError, RuntimeError, ray.exceptions.AuthenticationError) as exc:
                raise ClusterError(f"cannot join the Ray cluster at {cl.address} (cluster.address): {exc}") from exc
            self._announce_dashboard(context)
            return "joined"
        if ray._private.ray_constants.ENABLE_RAY_CLUSTER:
            log.warning("embedded Ray will listen on every interface: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER was not "
                        "0 when Ray was imported (import rollart.resources before ray to get loopback only)")
        try:
            context = ray.init(
                address="local",
                num_cpus=cl.num_cpus,
                resources={pool_resource(name): pool.capacity for name, pool in self.cfg.pools.items()},
                include_dashboard=cl.dashboard,  # on 127.0.0.1 (Ray's default dashboard_host)
                object_store_memory=cl.object_store_mb * 1024 * 1024,
                namespace=cl.namespace,
                runtime_env=self._worker_env(),
            )
        except Exception as exc:  # Ray raises a bare Exception when its GCS or raylet does not come up in time
            raise ClusterError(embedded_start_failed(exc, cl)) from exc
        self.session_dir = context.address_info.get("session_dir")
        self._announce_dashboard(context)
        return "embedded"

    def _announce_dashboard(self, context: Any) -> None:
        """Say where Ray's dashboard is (actors, logs, resources of the run), when there is one."""
        url = getattr(context, "dashboard_url", "") or ""
        if url:
            self.dashboard_url = url if "://" in url else f"http://{url}"
            log.info("Ray dashboard: %s", self.dashboard_url)

    def _worker_env(self) -> dict[str, Any]:
        """The job's runtime env: worker processes configure logging at start (see the module docstring)."""
        return {
            "worker_process_setup_hook": f"{configure_worker_logging.__module__}.{configure_worker_logging.__name__}",
            "env_vars": {LOG_LEVEL_VAR: self.cfg.observability.log_level},
        }

    def _check_pools(self) -> None:
        pools = self.cfg.pools
        missing = missing_pools(pools, ray.cluster_resources())
        soft = [n for n in missing if pools[n].kind == "serverless"]
        hard = [n for n in missing if pools[n].kind != "serverless"]
        where = self.cfg.cluster.address or "this process's Ray"
        if soft:
            log.warning(
                "serverless pools %s have no resource on %s: Ray-hosted replicas on them cannot start (fine if "
                "an external endpoint serves them). To host them on Ray: %s",
                soft, where, declare_hint(pools, soft, self.cfg.cluster.address),
            )
        if hard:
            raise ClusterError(
                f"the Ray cluster at {where} holds no resource for pools {hard}. Each pool is a Ray custom "
                f"resource named pool_<name>, declared on the nodes that should host it; start such a node "
                f"with:\n  {declare_hint(pools, hard, self.cfg.cluster.address)}"
            )


def embedded_start_failed(exc: BaseException, cl: ClusterConfig) -> str:
    """What to say when the embedded Ray does not start: Ray's error and where Ray's logs are; for a start-up
    that timed out (Ray raises a bare Exception or a RuntimeError), how busy the machine is and what to try; for
    arguments Ray refused (ValueError, TypeError), the settings they came from."""
    logs = os.path.join(get_default_ray_temp_dir(), "session_latest", "logs")  # RAY_TMPDIR, TMPDIR or /tmp
    said = f"the embedded Ray did not start: {str(exc).rstrip('. ')}. Ray's own logs: {logs}. "
    if isinstance(exc, (ValueError, TypeError)):
        return said + (f"Ray refused the settings it was started with: cluster.num_cpus={cl.num_cpus}, "
                       f"cluster.object_store_mb={cl.object_store_mb} and the pools' capacities (pools.*.capacity): "
                       f"correct the one Ray's message names")
    return said + (f"This machine's 1-minute load average is {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: a "
                   f"busy machine can keep Ray's GCS from answering in time — run again when it is quieter, or join "
                   f"a running cluster with cluster.address")


def address_host(address: str) -> str:
    """The host of a `host:port`, `[v6]:port` or `ray://host:port` cluster address."""
    rest = address.split("://", 1)[-1]
    if rest.startswith("["):
        return rest[1:].split("]", 1)[0]
    return rest.rsplit(":", 1)[0] if rest.count(":") == 1 else rest


def keep_token_auth(cl: ClusterConfig) -> None:
    """Joining a cluster at a non-loopback address keeps Ray's token auth on: rollart's own loopback default
    (RAY_AUTH_MODE=disabled, set when `rollart.resources` is imported) is switched back to token auth (the
    token comes from RAY_AUTH_TOKEN or ~/.ray/auth_token); an operator's explicit RAY_AUTH_MODE=disabled is
    refused unless `cluster.allow_unauthenticated`. `auto` and loopback addresses are left as they are."""
    if cl.address == "auto" or is_loopback_host(address_host(cl.address)) or cl.allow_unauthenticated:
        return
    mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if mode == "token":
        return
    if mode == "disabled" and not AUTH_MODE_DEFAULTED:
        raise ClusterError(
            f"cluster.address={cl.address} is not a loopback address but RAY_AUTH_MODE=disabled: without token "
            "auth anyone who can reach the cluster can run code on it. Unset RAY_AUTH_MODE (Ray's token auth, "
            "token in RAY_AUTH_TOKEN or ~/.ray/auth_token), or set cluster.allow_unauthenticated=true"
        )
    # Ray reads the mode when it is imported: its own switch sets the variable and refreshes its config
    from ray._private.authentication.authentication_token_setup import _enable_token_auth

    _enable_token_auth()
    log.info("cluster.address %s is not loopback: Ray token auth is on", cl.address)


def _check_reachable(address: str, timeout_s: float = _CONNECT_TIMEOUT_S) -> None:
    """Fail fast when nothing listens at a `host:port` address: Ray's own join retries for many minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto" or a ray:// client address: Ray resolves those itself, and fails fast
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(
            f"nothing answers at {address} (cluster.address) within {timeout_s:g} s ({exc}); start the head "
            f"with `ray start --head --port={port}` there, or leave cluster.address empty for an embedded Ray"
        ) from None


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _forget_serve_client() -> None:
    """Drop this process's cached Ray Serve client, which outlives `ray.shutdown()`. Serve tells a stale one
    by its Ray job id, but an embedded Ray started again in this process reuses job id 01000000: the next
    job's `serve.start` took the dead instance's client for its own, kept its options ("New http_options
    will not be applied") and its proxy bound Serve's default :8000, not the configured port — every
    serverless reward of the second job failed. `_disconnect` forgets the client and shuts nothing down
    (ray 2.60, `ray.serve.context`); a process that never imported Serve has nothing to forget."""
    context = sys.modules.get("ray.serve.context")
    if context is not None:
        context._disconnect()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
