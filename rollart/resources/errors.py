"""Errors of the resource plane; their messages are meant for the user as-is.

`PlacementError`: a worker cannot be placed (no pool with room, an undeclared pool, Ray could not
schedule it in time, or it did not start in time). `ClusterError`: the Ray cluster does not match the
config (a declared pool has no resource on the joined cluster). Neither is ever raised after waiting
without a bound.
"""

from __future__ import annotations


class ResourceError(RuntimeError):
    """Base of the resource plane's errors (the CLI prints the message and exits 1)."""


class PlacementError(ResourceError):
    """A worker cannot be placed; the message names it, the pools tried and their free capacity."""


class ClusterError(ResourceError):
    """The Ray cluster cannot run this config (e.g. a declared pool has no resource on it)."""
