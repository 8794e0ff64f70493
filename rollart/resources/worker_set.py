"""A `WorkerSet`: same-role Ray actors placed by the resource plane, called as one and kept whole.

In: the members made by `Resources.place` (one per slot: its placement, actor and Ray placement group), a
`Placer` that can place one more worker of the same kind (same class, arguments and pool chain), and the
policy chosen at placement: `replace_dead` (a dead worker is replaced) and `elastic` (the worker set grows
when a node joins with room on its pool, if that pool is `elastic`). Out: calls (`call_all`, `call_one`
return Ray ObjectRefs, awaitable in asyncio; `gather` waits for them), the membership view
(`members()`, `names`, `actors`, `len`), membership events to listeners (`on_change`), `shutdown`.

Membership: each worker sits in a numbered slot. A death is learnt from whichever comes first — a caller
that saw a call fail (`report_dead`, or `gather` itself) or the resource plane's health check (`check`,
every `cluster.health_interval_s`) — and is handled once: the member leaves the view at once, the death is
counted against its pool (`pools/<pool>/worker_deaths`), listeners get a `died` event, and with
`replace_dead` a replacement is placed in the background in the same slot — on the first pool of the
chain with room, so a fallback is logged and counted like any fallback — and counted
(`pools/<pool>/replacements`, the dead worker's pool). Once it has started, listeners get a `joined`
event; the owner makes it ready for traffic (e.g. the LLM proxy has an inference worker pull the current
weights before routing to it). A replacement that cannot be placed now is tried again at every health
check. Elastic growth adds slots the same way (`joined` events), on the preferred pool only.

Guarantees: every wait is bounded (`timeout_s`, default `call_timeout_s`): a call not done in time raises
`TimeoutError` naming the pending workers; a call that a worker's death ended raises `WorkerDied` naming
the worker at once (fail fast: `gather` does not wait for the others first). Listeners are called outside
the worker set's lock, on the thread that learnt the news: they must be quick and thread-safe. `shutdown`
stops replacing, kills the workers and gives their pool slots back exactly once; the WorkerSet is a context
manager.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Protocol, Sequence

import ray

from rollart.base.interrupts import interrupted

from rollart.resources.errors import WorkerDied
from rollart.resources.health import ActorState, death_cause, is_worker_death
from rollart.resources.accounts import Placement

log = logging.getLogger("rollart.resources")


@dataclass
class Member:
    """One worker of a worker set: its slot, where it runs, its actor and its Ray placement group."""

    slot: int
    placement: Placement
    actor: ray.actor.ActorHandle
    group: Any = None
    alive: bool = True
    released: bool = False

    @property
    def worker(self) -> str:
        return self.placement.worker

    @property
    def actor_id(self) -> str:
        return self.actor._actor_id.hex()


@dataclass(frozen=True)
class MemberEvent:
    """A change of a worker set's membership: `died` (with `cause`), `joined`, or `unplaced` (a dead worker's
    replacement could not be placed — `cause` says why; it is tried again at every health check); `actor`
    is the worker's actor handle (the dead one, or the one that joined)."""

    kind: Literal["died", "joined", "unplaced"]
    role: str
    slot: int
    worker: str
    pool: str
    actor: Any = None
    cause: str = ""


class Placer(Protocol):
    """What a WorkerSet needs of the resource plane to keep itself whole (placement.py implements it)."""

    def spawn(self, slot: int, growing: bool = False) -> Member: ...

    def release(self, members: Sequence[Member]) -> None: ...

    def record_death(self, member: Member) -> None: ...

    def record_replacement(self, pool: str) -> None: ...

    def room(self, pool: str) -> float: ...

    def submit(self, fn: Callable[[], None]) -> None: ...

    def forget(self, worker_set: WorkerSet) -> None: ...


class WorkerSet:
    def __init__(
        self,
        role: str,
        members: Sequence[Member],
        placer: Placer,
        call_timeout_s: float = 300.0,
        *,
        chain: Sequence[str] = (),
        slots: float = 1.0,
        replace_dead: bool = False,
        elastic: bool = False,
    ) -> None:
        self.role = role
        self.call_timeout_s = call_timeout_s
        self.chain = tuple(chain)
        self.slots = slots
        self.replace_dead = replace_dead
        self.elastic = elastic
        self._placer = placer
        self._members: dict[int, Member] = {m.slot: m for m in members}
        self._lock = threading.RLock()
        self._listeners: list[Callable[[MemberEvent], None]] = []
        self._replacing: set[int] = set()  # slots whose replacement is under way
        self._unplaced: set[int] = set()  # dead slots a replacement could not be placed for yet
        self._growing = False
        self._closed = False

    # --- the membership view ---------------------------------------------------------------------
    def members(self) -> list[Member]:
        """The alive members, in slot order (a snapshot)."""
        with self._lock:
            return [m for _, m in sorted(self._members.items()) if m.alive]

    @property
    def names(self) -> list[str]:
        """Alive workers' names, `<role>/<pool>/<index>`, in slot order."""
        return [m.worker for m in self.members()]

    @property
    def pools(self) -> list[str]:
        return [m.placement.pool for m in self.members()]

    @property
    def placements(self) -> tuple[Placement, ...]:
        return tuple(m.placement for m in self.members())

    @property
    def actors(self) -> tuple[ray.actor.ActorHandle, ...]:
        return tuple(m.actor for m in self.members())

    def __len__(self) -> int:
        return len(self.members())

    def __iter__(self) -> Iterator[tuple[Placement, ray.actor.ActorHandle]]:
        return iter([(m.placement, m.actor) for m in self.members()])

    def __repr__(self) -> str:
        return f"WorkerSet(role={self.role!r}, workers={self.names})"

    def on_change(self, listener: Callable[[MemberEvent], None]) -> None:
        """Call `listener(event)` at every death and every join (see the module doc)."""
        with self._lock:
            self._listeners.append(listener)

    # --- calling ---------------------------------------------------------------------------------
    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """Call `method` on every alive worker; one ObjectRef per worker, in slot order."""
        return [self._method(m, method).remote(*args, **kwargs) for m in self.members()]

    def call_one(self, index: int, method: str, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Call `method` on alive worker number `index` (0 ≤ index < len(worker_set), slot order)."""
        members = self.members()
        if not 0 <= index < len(members):
            raise IndexError(f"worker set '{self.role}' has {len(members)} workers; no worker {index}")
        return self._method(members[index], method).remote(*args, **kwargs)

    def gather(self, refs: Sequence[ray.ObjectRef], timeout_s: float | None = None) -> list[Any]:
        """Wait for `refs` (e.g. from `call_all`) and return their values in order.

        Fails fast: the first worker exception is raised as soon as it is known (`WorkerDied` for a dead
        worker, which is also reported); refs not done within the timeout raise `TimeoutError`.
        """
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        refs = list(refs)
        pending = list(refs)
        deadline = _now() + timeout
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - _now()))
            if not done:
                waiting = {r.hex() for r in pending}
                raise TimeoutError(self._timeout_message([i for i, r in enumerate(refs) if r.hex() in waiting],
                                                         len(refs), timeout))
            for ref in done:
                self._check(ref)
        return ray.get(refs)

    def report_dead(self, actor: ray.actor.ActorHandle | str, cause: str) -> bool:
        """A caller saw `actor` (a handle or its hex id) die: handle the death now (idempotent; True if
        this call was the first to report it, False for an unknown or already-dead actor)."""
        actor_id = actor if isinstance(actor, str) else actor._actor_id.hex()
        with self._lock:
            member = next((m for m in self._members.values() if m.alive and m.actor_id == actor_id), None)
            if member is None or self._closed:
                return False
            member.alive = False
            listeners = list(self._listeners)
        stopping = interrupted()  # the job's Ctrl-C reached its workers too: an end, not a failure to mend
        (log.debug if stopping else log.warning)("worker %s died: %s%s", member.worker, cause,
                                                 "; placing a replacement" if self.replace_dead and not stopping else "")
        self._placer.record_death(member)
        _notify(listeners, MemberEvent("died", self.role, member.slot, member.worker, member.placement.pool,
                                       actor=member.actor, cause=cause))
        if self.replace_dead and not stopping:
            self._schedule_replacement(member.slot)
        return True

    def watched(self) -> list[Member]:
        """Members the health check should look at."""
        return [] if self._closed else self.members()

    def check(self, states: dict[str, ActorState]) -> None:
        """The health check's findings (actor id → Ray's state): report the dead, retry unplaced slots."""
        for member in self.watched():
            state = states.get(member.actor_id)
            if state is not None and state.dead:
                self.report_dead(member.actor, state.cause)
        with self._lock:
            retry = sorted(self._unplaced - self._replacing) if not self._closed else []
        for slot in retry:
            self._schedule_replacement(slot)

    def grow(self) -> None:
        """Elastic: add workers on the preferred pool while it has room (in the background)."""
        with self._lock:
            if self._closed or self._growing or not self.elastic:
                return
            self._growing = True
        self._placer.submit(self._grow)

    def _grow(self) -> None:
        try:
            while not self._closed and self._placer.room(self.chain[0]) >= self.slots:
                with self._lock:
                    slot = max(self._members, default=-1) + 1
                try:
                    member = self._placer.spawn(slot, growing=True)
                except Exception as exc:  # noqa: BLE001 — no room after all (a race): the next node change retries
                    log.warning("elastic pool %s: could not add a %s worker: %s", self.chain[0], self.role, exc)
                    return
                if not self._install(member):
                    return
                log.info("elastic pool %s grew: %s joined worker set '%s'", member.placement.pool, member.worker,
                         self.role)
        finally:
            with self._lock:
                self._growing = False

    def _schedule_replacement(self, slot: int) -> None:
        with self._lock:
            if self._closed or slot in self._replacing:
                return
            self._replacing.add(slot)
        self._placer.submit(lambda: self._replace(slot))

    def _replace(self, slot: int) -> None:
        try:
            with self._lock:
                dead = self._members.get(slot)
                if dead is None or dead.alive or self._closed:
                    return
            self._placer.release([dead])  # its slot in the pool accounts is free again: the replacement may take it
            try:
                member = self._placer.spawn(slot)
            except Exception as exc:  # noqa: BLE001 — no room now (a node left): retried at the next check
                with self._lock:
                    first = slot not in self._unplaced
                    self._unplaced.add(slot)
                    listeners = list(self._listeners)
                if first:
                    log.error("cannot replace worker %s of worker set '%s' yet (retrying at every health check): %s",
                              dead.worker, self.role, exc)
                    _notify(listeners, MemberEvent("unplaced", self.role, slot, dead.worker, dead.placement.pool,
                                                   cause=str(exc)))
                return
            with self._lock:
                self._unplaced.discard(slot)
            if self._install(member):
                self._placer.record_replacement(dead.placement.pool)
                fell_back = member.placement.pool != dead.placement.pool
                log.warning("worker %s replaced by %s%s", dead.worker, member.worker,
                            f" (fallback from pool {dead.placement.pool})" if fell_back else "")
        finally:
            with self._lock:
                self._replacing.discard(slot)

    def _install(self, member: Member) -> bool:
        """Put a started worker in its slot and announce it; False (and the worker released) if closed."""
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._members[member.slot] = member
                listeners = list(self._listeners)
        if closed:
            self._placer.release([member])
            return False
        _notify(listeners, MemberEvent("joined", self.role, member.slot, member.worker, member.placement.pool,
                                       actor=member.actor))
        return True

    # --- ending ----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop replacing, kill the workers and give their pool slots back (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            members = list(self._members.values())
        self._placer.forget(self)
        self._placer.release(members)

    def __enter__(self) -> WorkerSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- helpers ---------------------------------------------------------------------------------
    def _method(self, member: Member, method: str) -> Any:
        if self._closed:
            raise RuntimeError(f"worker set '{self.role}' is shut down")
        try:
            return getattr(member.actor, method)
        except AttributeError:
            raise AttributeError(f"workers of worker set '{self.role}' have no method '{method}'") from None

    def _check(self, ref: ray.ObjectRef) -> None:
        """Raise the exception a finished ref holds (a dead worker's as `WorkerDied`, reported)."""
        try:
            ray.get(ref, timeout=0)
        except Exception as exc:
            translated = self._translate(exc)
            if translated is exc:
                raise
            raise translated from exc

    def _translate(self, exc: BaseException) -> BaseException:
        """A worker-death exception becomes `WorkerDied` naming the worker (and the death is reported)."""
        if not is_worker_death(exc):
            return exc
        actor_id = getattr(exc, "actor_id", None) or ""
        with self._lock:
            member = next((m for m in self._members.values() if m.actor_id == actor_id), None)
        cause = death_cause(exc)
        if member is None:
            return WorkerDied(f"{self.role}/? (actor {actor_id[:8]})", cause)
        self.report_dead(member.actor, cause)
        return WorkerDied(member.worker, cause)

    def _timeout_message(self, pending: list[int], total: int, timeout: float) -> str:
        # refs from call_all are in slot order, so positions name workers then
        names = self.names
        who = [names[i] for i in pending] if total == len(names) else [f"#{i}" for i in pending]
        return (
            f"worker set '{self.role}': {len(pending)} of {total} calls not done after {timeout:g} s "
            f"(pending: {', '.join(who)})"
        )


def _notify(listeners: Sequence[Callable[[MemberEvent], None]], event: MemberEvent) -> None:
    for listener in listeners:
        try:
            listener(event)
        except Exception:  # one broken listener must not keep the news from the others
            log.exception("membership listener failed on %s", event)


def _now() -> float:
    return time.monotonic()
