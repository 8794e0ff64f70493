"""Worker health: telling a dead worker from a slow one, and a ticker that looks at every placed worker.

In: exceptions from actor calls; Ray actor ids; a tick function and `cluster.health_interval_s`. Out:
`is_worker_death(exc)` (this call failed because the worker is gone), `death_cause(exc)` (one line),
`actor_states(ids)` (what Ray's control store says of each actor: ALIVE, DEAD … and why), `gather_alive`
(await calls to several workers at once, bounded, going on past the dead ones), and `Ticker`, a daemon
thread that calls the tick function every interval and survives its errors.

Why Ray's actor table and not a ping: a synchronous actor busy in a long call (a trainer step, a model
load) cannot answer a ping, yet is healthy; Ray's GCS knows an actor is dead the moment its process or its
node is gone, without asking the actor. `ray._private.state.actors` reads that table without the
dashboard (which rollart does not start): about 2 ms per actor per tick. A worker Ray reports
`ActorUnavailableError` for is treated as dead by callers (killed, then replaced): one that may or may
not come back is worse than a fresh one.

Guarantees: a tick that raises is logged and the next tick still runs; `Ticker.stop()` returns within
one tick's duration plus `join_timeout_s`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Hashable, Iterable, Mapping, TypeVar

import ray

log = logging.getLogger("rollart.resources")
K = TypeVar("K", bound=Hashable)


def is_worker_death(exc: BaseException) -> bool:
    """True when an actor call failed because the actor is gone (died, killed, its node left, unreachable).
    Not when the call ran and raised an actor's death itself (Ray wraps it: `RayTaskError(ActorDiedError)`):
    that is another actor the worker called, e.g. the weight store, and the worker is alive."""
    return isinstance(exc, ray.exceptions.RayActorError) and not isinstance(exc, ray.exceptions.RayTaskError)


def death_cause(exc: BaseException) -> str:
    """The line of Ray's message that says why an actor died (its first line when none says)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    because = [ln for ln in lines if "because" in ln]
    line = because[-1] if because else lines[0] if lines else type(exc).__name__
    return line.split(". ")[0].rstrip(".")[:300]  # Ray goes on with advice after the first sentence


async def gather_alive(calls: Mapping[K, Awaitable[Any]], timeout_s: float,
                       on_dead: Callable[[K, BaseException], Any]) -> dict[K, Any]:
    """Await every call at once, at most `timeout_s` (then `asyncio.TimeoutError`): the results of the
    calls whose worker answered, by key. A call its worker's death ended calls `on_dead(key, exc)` (awaited
    if that returns an awaitable) and is left out; any other error is raised."""
    keys = list(calls)
    async with asyncio.timeout(timeout_s):  # not wait_for: see rollart.job.evaluation (a cancelled gather)
        results = await asyncio.gather(*calls.values(), return_exceptions=True)
    out: dict[K, Any] = {}
    for key, result in zip(keys, results):
        if isinstance(result, BaseException):
            if not is_worker_death(result):
                raise result
            reported = on_dead(key, result)
            if inspect.isawaitable(reported):
                await reported
        else:
            out[key] = result
    return out


@dataclass(frozen=True)
class ActorState:
    state: str  # ALIVE, DEAD, RESTARTING, PENDING_CREATION, DEPENDENCIES_UNREADY, or UNKNOWN
    cause: str = ""

    @property
    def dead(self) -> bool:
        return self.state == "DEAD"


def actor_states(actor_ids: Iterable[str]) -> dict[str, ActorState]:
    """Ray's view of each actor (by hex id); an id Ray does not know is UNKNOWN."""
    from ray._private import state  # the GCS actor table, no dashboard needed (see the module doc)

    out: dict[str, ActorState] = {}
    for actor_id in actor_ids:
        info = state.actors(actor_id=actor_id) or {}
        status = str(info.get("State") or "UNKNOWN")
        out[actor_id] = ActorState(status, _gcs_cause(info.get("DeathCause")) if status == "DEAD" else "")
    return out


def _gcs_cause(cause: object) -> str:
    """The error message in the GCS's death-cause record (a protobuf printed as text)."""
    text = str(cause or "")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("error_message:"):
            return line.split(":", 1)[1].strip().strip('"').split(". ")[0].rstrip(".")[:300]
    return text.strip().splitlines()[0][:300] if text.strip() else "Ray reports the actor dead"


class Ticker:
    """Calls `tick()` every `interval_s` seconds on a daemon thread until `stop()`."""

    def __init__(self, tick: Callable[[], None], interval_s: float, name: str = "rollart-health") -> None:
        self._tick = tick
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._tick()
            except Exception:  # a failed look must not end the looking
                if self._stop.is_set() or not ray.is_initialized():
                    return
                log.exception("health check failed; trying again in %.1f s", self.interval_s)

    def stop(self, join_timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)
