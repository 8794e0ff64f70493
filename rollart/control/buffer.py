"""SampleBuffer: scored GRPO groups wait here until the trainer takes a batch.

In: complete groups (`ReadyGroup`: `group_size` scored, trainable trajectories sharing a seed) from the
scheduler. Out: `take_groups(num_groups, train_version)` → the groups of one train batch.

Guarantees:
- Exactly-once: a trajectory id is accepted once; a second insertion is refused and counted.
- Whole groups only; every trajectory handed out is fresh for `train_version` under the staleness policy.
  A ready group that has become stale is dropped (counted, reported to `on_drop`) the moment it is seen.
- `selection=first` takes groups in completion order (fast, short trajectories come first: that bias is
  measured by the domain mix the scheduler reports); `stratified` fills per-domain quotas that follow the
  configured domain weights, in completion order within a domain.
- `take_groups` never waits forever: past `timeout_s` it raises `BatchTimeout` saying what it waits for.
- The batch is returned in admission order (group sequence number), so equal inputs give equal batches
  whatever the completion timing — what makes α = 0 reproduce the synchronous loop exactly.
- Adaptive batch (`take_groups(..., min_groups=k, partial_ok=f)`): while the full batch is not ready and `f()`
  holds (the scheduler's condition: the trainer is idle and no running work would be made stale), a batch of
  k or more whole groups is taken as it stands — `first`: every ready group up to `num_groups`; `stratified`:
  the largest batch whose quotas (the same largest-remainder split, of fewer groups) are all ready, so the
  domain mix is kept. Its composition then depends on timing.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Literal, Mapping

from rollart.control.staleness import StalenessPolicy
from rollart.types import Span, Trajectory


class BatchTimeout(TimeoutError):
    """`take_groups` waited longer than its timeout; the message says what was missing."""


@dataclass(frozen=True)
class ReadyGroup:
    group_id: str
    seq: int  # admission order
    domain: str
    trajectories: tuple[Trajectory, ...]
    ready_at: float = 0.0


def domain_quotas(weights: Mapping[str, float], num_groups: int) -> dict[str, int]:
    """Largest-remainder split of `num_groups` groups over domains by weight (ties broken by name)."""
    total = sum(w for w in weights.values() if w > 0)
    shares = {d: num_groups * w / total for d, w in sorted(weights.items()) if w > 0}
    quotas = {d: int(s) for d, s in shares.items()}
    leftover = num_groups - sum(quotas.values())
    for d in sorted(shares, key=lambda d: (-(shares[d] - quotas[d]), d))[:leftover]:
        quotas[d] += 1
    return quotas


class SampleBuffer:
    def __init__(
        self,
        policy: StalenessPolicy,
        selection: Literal["first", "stratified"] = "first",
        domain_weights: Mapping[str, float] | None = None,
        on_drop: Callable[[ReadyGroup, str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if selection == "stratified" and not domain_weights:
            raise ValueError("stratified selection needs the domain weights")
        self.policy = policy
        self.selection = selection
        self.domain_weights = dict(domain_weights or {})
        self.on_drop = on_drop
        self.clock = clock
        self._ready: list[ReadyGroup] = []
        self._ready_by_domain: Counter[str] = Counter()
        # the last version each ready group may still train at (inf: never stale), and their minimum, so that
        # looking for stale groups costs O(1) until one of them can really have become stale
        self._fresh_until: dict[str, float] = {}
        self._min_fresh_until = float("inf")
        self._seen: set[str] = set()
        self._changed = asyncio.Event()
        self.duplicates_refused = 0

    # --- in ------------------------------------------------------------------------------------------
    def put(self, group: ReadyGroup) -> bool:
        """Accept a complete group; refuse it (False) if any of its trajectories was inserted before."""
        ids = [t.trajectory_id for t in group.trajectories]
        if any(i in self._seen for i in ids) or len(set(ids)) != len(ids):
            self.duplicates_refused += 1
            return False
        self._seen.update(ids)
        self._ready.append(replace(group, ready_at=self.clock()))
        self._ready_by_domain[group.domain] += 1
        until = self._last_fresh_version(group)
        self._fresh_until[group.group_id] = until
        self._min_fresh_until = min(self._min_fresh_until, until)
        self._changed.set()
        return True

    def _last_fresh_version(self, group: ReadyGroup) -> float:
        versions = [self.policy.behaviour_version(t) for t in group.trajectories]
        known = [v for v in versions if v is not None]
        return min(known) + self.policy.alpha if known else float("inf")

    def _remove(self, taken: set[str]) -> None:
        kept = []
        for g in self._ready:
            if g.group_id in taken:
                self._ready_by_domain[g.domain] -= 1
                del self._fresh_until[g.group_id]
            else:
                kept.append(g)
        self._ready = kept
        self._min_fresh_until = min(self._fresh_until.values(), default=float("inf"))

    # --- out -----------------------------------------------------------------------------------------
    @property
    def ready_groups(self) -> list[ReadyGroup]:
        return list(self._ready)

    def ready_in(self, domain: str) -> int:
        """Ready groups of `domain` (O(1))."""
        return self._ready_by_domain.get(domain, 0)

    def ready_count(self) -> int:
        """Ready groups of every domain (O(1))."""
        return len(self._ready)

    def ready_trajectories(self) -> int:
        return sum(len(g.trajectories) for g in self._ready)

    def drop_stale(self, next_train_version: int) -> list[ReadyGroup]:
        """Drop ready groups that can no longer serve batch `next_train_version` or later."""
        if next_train_version <= self._min_fresh_until:
            return []
        dropped = [g for g in self._ready if self._fresh_until[g.group_id] < next_train_version]
        self._remove({g.group_id for g in dropped})
        for g in dropped:
            if self.on_drop:
                self.on_drop(g, f"stale: trained at version {next_train_version} > behaviour version + α")
        return dropped

    def wake(self) -> None:
        """Look again now (a waiting `take_groups` may take a partial batch: the trainer became idle)."""
        self._changed.set()

    def partial_size(self, num_groups: int, min_groups: int) -> int:
        """The most groups (< `num_groups`, ≥ `min_groups`) a batch taken now could hold, or 0 if fewer than
        `min_groups` fit (`stratified`: every domain's quota of that many groups ready)."""
        if self.selection == "first":
            n = min(len(self._ready), num_groups - 1)
            return n if n >= min_groups else 0
        # The largest k whose quotas are all ready. Start from the most each domain's ready groups alone
        # allow (its share of k ≤ its ready groups), then step down: largest-remainder rounding is not
        # monotone in k, so a few k's are tried — O(domains) each.
        total = sum(w for w in self.domain_weights.values() if w > 0)
        bound = min((int(self._ready_by_domain[d] * total / w) + 1 for d, w in self.domain_weights.items() if w > 0),
                    default=0)
        for k in range(min(bound, num_groups - 1), min_groups - 1, -1):
            quotas = domain_quotas(self.domain_weights, k)
            if all(self._ready_by_domain[d] >= q for d, q in quotas.items()):
                return k
        return 0

    def try_take(self, num_groups: int, train_version: int, min_groups: int | None = None,
                 partial_ok: Callable[[], bool] = lambda: True) -> list[ReadyGroup] | None:
        """The batch for `train_version` if the buffer holds it now — the full `num_groups`, or with
        `min_groups` the most groups ≥ it that are ready, if `partial_ok()` (asked only then: the adaptive
        batch) — else None (then only stale groups have been removed)."""
        self.drop_stale(train_version)
        size = num_groups
        if min_groups is not None and min_groups < num_groups and not self._full_ready(num_groups):
            size = self.partial_size(num_groups, min_groups)
            if size == 0 or not partial_ok():
                return None
        if self.selection == "first":
            chosen = self._ready[:size] if len(self._ready) >= size else None
        else:
            quotas = domain_quotas(self.domain_weights, size)
            if any(self._ready_by_domain[d] < q for d, q in quotas.items()):
                return None  # O(domains) per look while a quota is short
            picked: list[ReadyGroup] = []
            used: Counter[str] = Counter()
            for g in self._ready:
                if used[g.domain] < quotas.get(g.domain, 0):
                    picked.append(g)
                    used[g.domain] += 1
            chosen = picked if len(picked) == size else None
        if chosen is None:
            return None
        self._remove({g.group_id for g in chosen})
        now = self.clock()
        out = []
        for g in sorted(chosen, key=lambda g: g.seq):
            wait = Span("buffer.wait", g.ready_at, now, worker="control/buffer/0")
            trajs = tuple(replace(t, spans=t.spans + (wait,)) for t in g.trajectories)
            out.append(replace(g, trajectories=trajs))
        return out

    def _full_ready(self, num_groups: int) -> bool:
        if self.selection == "first":
            return len(self._ready) >= num_groups
        return all(self._ready_by_domain[d] >= q for d, q in domain_quotas(self.domain_weights, num_groups).items())

    def missing(self, num_groups: int) -> str:
        """Plain words on what a batch of `num_groups` groups still lacks."""
        have = Counter(g.domain for g in self._ready)
        if self.selection == "first":
            return f"{len(self._ready)}/{num_groups} groups ready ({dict(have) or 'none'})"
        quotas = domain_quotas(self.domain_weights, num_groups)
        lacking = {d: q - have.get(d, 0) for d, q in quotas.items() if have.get(d, 0) < q}
        return f"stratified quotas {quotas}; ready {dict(have) or 'none'}; still lacking {lacking}"

    async def take_groups(
        self,
        num_groups: int,
        train_version: int,
        timeout_s: float,
        describe: Callable[[], str] = lambda: "",
        min_groups: int | None = None,
        partial_ok: Callable[[], bool] = lambda: False,
    ) -> list[ReadyGroup]:
        """Block until `num_groups` fresh groups are ready (stratified: in quota), then take them — or, while
        `partial_ok()` holds, at least `min_groups` of them (the adaptive batch; `wake()` when it may have turned
        true)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            batch = self.try_take(num_groups, train_version, min_groups, partial_ok)
            if batch is not None:
                return batch
            self._changed.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise BatchTimeout(
                    f"get_batch for version {train_version} waited {timeout_s:.0f}s: "
                    f"{self.missing(num_groups)}. {describe()} "
                    "(raise rollout.get_batch_timeout_s if rollout is just slow)"
                )
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 1.0))
            except asyncio.TimeoutError:
                pass
