"""`@affinity(pool, fallback=[...], role=...)`: where a worker class wants to run. Pure metadata, no Ray.

In: a class to decorate; later, the run's pools and `roles.<role>` config plus any explicit arguments of
the placement call. Out: the class itself, carrying a `rollart.types.Affinity` and a role name; and,
from `resolve_request`, the role, the ordered pool chain and the replica count to place.

Precedence (most specific first), each field on its own:
- pool:     explicit argument > `roles.<role>.pool` > `@affinity(pool)`
- fallback: explicit argument > `roles.<role>.fallback` > `@affinity(fallback=...)` (only while the pool
            is the decorator's own; a fallback list is relative to its pool) > `pools.<pool>.fallback`
- replicas: explicit argument > `roles.<role>.replicas` > 1
Guaranteed: the chain starts with the chosen pool, holds each pool once, and every pool in it is
declared — otherwise a `PlacementError` says which pool, where it came from and what is declared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TypeVar

from rollart.config import PoolConfig, RoleConfig
from rollart.resources.errors import PlacementError
from rollart.types import Affinity

T = TypeVar("T", bound=type)

_AFFINITY_ATTR = "__rollart_affinity__"
_ROLE_ATTR = "__rollart_role__"


def affinity(pool: str, fallback: Sequence[str] = (), role: str | None = None) -> Callable[[T], T]:
    """Declare the pool a worker class prefers, its fallbacks in order, and its role name.

    >>> @affinity("gen_decode", fallback=["gen_prefill"], role="inference")
    ... class InferenceWorker: ...
    """
    if not isinstance(pool, str) or not pool:
        raise TypeError(f"@affinity: pool must be a pool name, got {pool!r}")
    if isinstance(fallback, str):
        raise TypeError(f"@affinity: fallback is a list of pool names, e.g. fallback=[{fallback!r}]")
    declared = Affinity(pool=pool, fallback=tuple(fallback))

    def decorate(cls: T) -> T:
        if not isinstance(cls, type):
            raise TypeError(f"@affinity decorates a worker class, not {cls!r}")
        setattr(cls, _AFFINITY_ATTR, declared)
        setattr(cls, _ROLE_ATTR, role or _snake(cls.__name__))
        return cls

    return decorate


def affinity_of(cls: type) -> Affinity | None:
    """The `Affinity` declared on a class (or inherited from a decorated base), else None."""
    return getattr(cls, _AFFINITY_ATTR, None)


def role_of(cls: type) -> str:
    """The role declared with `@affinity(role=...)`, else the class name in snake_case."""
    return getattr(cls, _ROLE_ATTR, None) or _snake(cls.__name__)


@dataclass(frozen=True)
class PlacementRequest:
    """What to place: `replicas` workers of `role`, each on the first pool of `chain` with room."""

    role: str
    chain: tuple[str, ...]
    replicas: int


def resolve_request(
    cls: type,
    pools: Mapping[str, PoolConfig],
    roles: Mapping[str, RoleConfig],
    *,
    role: str | None = None,
    pool: str | None = None,
    fallback: Sequence[str] | None = None,
    replicas: int | None = None,
) -> PlacementRequest:
    """Combine explicit arguments, `roles.<role>` config and the class's `@affinity` (see module doc)."""
    role = role or role_of(cls)
    rc = roles.get(role, RoleConfig())
    declared = affinity_of(cls)

    if pool is not None:
        chosen, source = pool, "the placement call"
    elif rc.pool is not None:
        chosen, source = rc.pool, f"roles.{role}.pool"
    elif declared is not None:
        chosen, source = declared.pool, f"@affinity on {cls.__name__}"
    else:
        raise PlacementError(
            f"role '{role}': class {cls.__name__} has no @affinity and no pool was given; decorate it "
            f"with @affinity('<pool>') or set roles.{role}.pool (declared pools: {sorted(pools)})"
        )
    _check_declared(chosen, source, role, pools)

    if fallback is not None:
        fb, fb_source = list(fallback), "the placement call"
    elif rc.fallback is not None:
        fb, fb_source = list(rc.fallback), f"roles.{role}.fallback"
    elif declared is not None and declared.pool == chosen and declared.fallback:
        fb, fb_source = list(declared.fallback), f"@affinity on {cls.__name__}"
    else:
        fb, fb_source = list(pools[chosen].fallback), f"pools.{chosen}.fallback"
    for name in fb:
        _check_declared(name, fb_source, role, pools)

    n = replicas if replicas is not None else (rc.replicas if rc.replicas is not None else 1)
    if n < 1:
        raise PlacementError(f"role '{role}': replicas must be ≥ 1, got {n}")
    chain = tuple(dict.fromkeys([chosen, *fb]))  # ordered, each pool once
    return PlacementRequest(role=role, chain=chain, replicas=n)


def _check_declared(pool: str, source: str, role: str, pools: Mapping[str, PoolConfig]) -> None:
    if pool not in pools:
        raise PlacementError(
            f"role '{role}': pool '{pool}' (from {source}) is not declared; declared pools: {sorted(pools)}. "
            f"Declare pools.{pool} in the run file or set roles.{role}.pool."
        )


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
