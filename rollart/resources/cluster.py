"""A `Cluster`: N same-role Ray actors placed by the resource plane, called as one.

In: the placements and actor handles made by `Resources.place`, and a release callback that gives their
slots back. Out: `call_all` / `call_one` return Ray ObjectRefs (awaitable in asyncio); `gather` (sync)
and `gather_async` wait for refs with a timeout and name the workers still pending.

Guarantees: every wait is bounded (`timeout_s`, default `call_timeout_s`) and raises `TimeoutError` with
the cluster's role and the pending workers; `shutdown` kills the actors and returns their pool slots to the
ResourceManager exactly once (later calls do nothing); the Cluster is a context manager.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterator, Sequence

import ray

from rollart.resources.ledger import Placement


class Cluster:
    def __init__(
        self,
        role: str,
        placements: Sequence[Placement],
        actors: Sequence[ray.actor.ActorHandle],
        release: Callable[[], None],
        call_timeout_s: float = 300.0,
    ) -> None:
        if len(placements) != len(actors):
            raise ValueError(f"cluster '{role}': {len(placements)} placements for {len(actors)} actors")
        self.role = role
        self.placements: tuple[Placement, ...] = tuple(placements)
        self.actors: tuple[ray.actor.ActorHandle, ...] = tuple(actors)
        self.call_timeout_s = call_timeout_s
        self._release = release
        self._closed = False

    # --- reading ---------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Worker names, `<role>/<pool>/<index>`, in actor order."""
        return [p.worker for p in self.placements]

    @property
    def pools(self) -> list[str]:
        return [p.pool for p in self.placements]

    def __len__(self) -> int:
        return len(self.actors)

    def __iter__(self) -> Iterator[tuple[Placement, ray.actor.ActorHandle]]:
        return iter(zip(self.placements, self.actors))

    def __repr__(self) -> str:
        return f"Cluster(role={self.role!r}, workers={self.names})"

    # --- calling ---------------------------------------------------------------------------------
    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """Call `method` on every worker; one ObjectRef per worker, in worker order."""
        return [self._method(i, method).remote(*args, **kwargs) for i in range(len(self))]

    def call_one(self, index: int, method: str, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Call `method` on worker `index` (0 ≤ index < len(cluster))."""
        if not 0 <= index < len(self):
            raise IndexError(f"cluster '{self.role}' has {len(self)} workers; no worker {index}")
        return self._method(index, method).remote(*args, **kwargs)

    def gather(self, refs: Sequence[ray.ObjectRef], timeout_s: float | None = None) -> list[Any]:
        """Wait for `refs` (e.g. from `call_all`) and return their values in order.

        A worker's exception is re-raised; refs not ready within the timeout raise `TimeoutError`.
        """
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        refs = list(refs)
        if not refs:
            return []
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            waiting = {r.hex() for r in pending}
            raise TimeoutError(self._timeout_message([i for i, r in enumerate(refs) if r.hex() in waiting],
                                                     len(refs), timeout))
        return ray.get(refs)

    async def gather_async(self, refs: Sequence[ray.ObjectRef], timeout_s: float | None = None) -> list[Any]:
        """`gather` for asyncio code: awaits the refs without blocking the event loop."""
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        futures = [asyncio.ensure_future(r) for r in refs]
        _, pending = await asyncio.wait(futures, timeout=timeout) if futures else (set(), set())
        if pending:
            for f in pending:
                f.cancel()
            raise TimeoutError(self._timeout_message([i for i, f in enumerate(futures) if f in pending],
                                                     len(futures), timeout))
        return [f.result() for f in futures]

    # --- ending ----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill the workers and give their pool slots back (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._release()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- helpers ---------------------------------------------------------------------------------
    def _method(self, index: int, method: str) -> Any:
        if self._closed:
            raise RuntimeError(f"cluster '{self.role}' is shut down")
        try:
            return getattr(self.actors[index], method)
        except AttributeError:
            raise AttributeError(f"workers of cluster '{self.role}' have no method '{method}'") from None

    def _timeout_message(self, pending: list[int], total: int, timeout: float) -> str:
        # refs from call_all are in worker order, so positions name workers then
        who = [self.names[i] for i in pending] if total == len(self) else [f"#{i}" for i in pending]
        return (
            f"cluster '{self.role}': {len(pending)} of {total} calls not done after {timeout:g} s "
            f"(pending: {', '.join(who)})"
        )
