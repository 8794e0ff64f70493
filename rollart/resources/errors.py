"""Errors of the resource plane; their messages are meant for the user as-is.

`PlacementError`: a worker cannot be placed (no pool with room, an undeclared pool, Ray could not
schedule it in time, or it did not start in time). `ClusterError`: the Ray cluster does not match the
config (a declared pool has no resource on the joined cluster). `WorkerDied`: a placed worker's process
is gone (killed, crashed, its node left) — raised to a caller whose call it ended. None is ever raised
after waiting without a bound.
"""

from __future__ import annotations


class ResourceError(RuntimeError):
    """Base of the resource plane's errors (the CLI prints the message and exits 1)."""


class PlacementError(ResourceError):
    """A worker cannot be placed; the message names it, the pools tried and their free capacity."""


class ClusterError(ResourceError):
    """The Ray cluster cannot run this config (e.g. a declared pool has no resource on it)."""


class WorkerDied(ResourceError):
    """A placed worker died (its actor is gone); `worker` names it (`<role>/<pool>/<index>`), `cause` says
    what Ray reported."""

    def __init__(self, worker: str, cause: str) -> None:
        super().__init__(f"worker {worker} died: {cause}")
        self.worker = worker
        self.cause = cause

    def __reduce__(self) -> tuple:  # picklable across Ray processes despite the two-argument constructor
        return (WorkerDied, (self.worker, self.cause))
