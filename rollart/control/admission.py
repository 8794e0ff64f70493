"""Admission: which group starts next, and whether one may start now (the α window).

In: the rollout and domain config, the admitted `Groups`, the `SampleBuffer` (its ready groups count as
pending), the `StalenessPolicy`, the run seed, and from the scheduler the versions (`inference_version` the
engines serve, `next_train_version` the next batch trains at). Out: `next_group()` → (domain, seq, seed) of the
group to admit now, or None when admission must wait; `forecast()` → the group it would admit next (a guess,
nothing drawn); the counters a checkpoint keeps (`next_seq`, `rng`, `ordinals`, `replay`).

- A task domain is sampled per group (by `domains.<d>.weight`; `stratified` keeps the pending mix on target)
  and the group gets a seed — a dataset domain's groups take its rows in order, so their seed is the domain's
  ordinal (0, 1, 2 …: the env maps it to a row of the epoch's shuffle), any other domain's is one per
  sequence number.
- The bound (staleness.py (2)): pending groups (held or ready) ≤ window × (groups per batch incl.
  `redundancy.extra_groups`), so pending trajectories ≤ (α + 1) × (batch size + redundancy) and nothing
  is started that could only ever be stale. Under `stratified` each domain has its own allowance, window ×
  its share of a batch.
- After a resume the groups that were running are admitted again first, in order, with their seeds.
- Pacing (`rollout.pacing=measured`, pacing.py): under the bound, a domain whose measured group latency does
  not fit in the time its window has left is not drawn now; its group waits for the next weights. Off: the
  draws are exactly those of the bound alone.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Callable, Mapping

from rollart.config import DomainConfig, RolloutConfig
from rollart.control.buffer import SampleBuffer, domain_quotas
from rollart.control.groups import Groups
from rollart.control.pacing import Pacer
from rollart.control.staleness import StalenessPolicy

Admit = tuple[str, int, int]  # (domain, seq, seed)


class Admission:
    def __init__(self, rollout: RolloutConfig, domains: Mapping[str, DomainConfig], groups: Groups,
                 buffer: SampleBuffer, policy: StalenessPolicy, end_version: int, first_version: int,
                 seed: int, pacer: Pacer | None = None, clock: Callable[[], float] | None = None) -> None:
        """`pacer`: admission pacing (None: the bound alone); `clock`: its time (needed with a pacer)."""
        self.cfg = rollout
        self.pacer, self.clock = pacer, clock
        self.domains = {d: c for d, c in domains.items() if c.weight > 0}
        self.weights = {d: c.weight for d, c in self.domains.items()}
        self.groups, self.buffer, self.policy = groups, buffer, policy
        self.end_version = end_version  # the last batch trains at end_version - 1
        self.inference_version = first_version
        self.next_train_version = first_version  # batches are named by the version they train at
        self.seed = seed
        self.rng = random.Random(seed)
        self.groups_per_batch = rollout.batch_size // rollout.group_size + rollout.redundancy.extra_groups
        # per-domain groups per batch (stratified admission): the batch's quota plus a share of the extras
        batch_q = domain_quotas(self.weights, rollout.batch_size // rollout.group_size)
        extra_q = domain_quotas(self.weights, rollout.redundancy.extra_groups)
        self.quotas = {d: batch_q.get(d, 0) + extra_q.get(d, 0) for d in self.weights}
        self.next_seq = 0
        self.ordinals: Counter[str] = Counter()  # per dataset domain: groups drawn so far (its next row)
        self.replay: list[Admit] = []  # groups to admit again after a resume

    # --- the bound -----------------------------------------------------------------------------------
    def pending_by_domain(self) -> dict[str, int]:
        """Groups held (open, or closed with a straggler winding down) plus groups ready in the buffer, for each
        domain admission draws from. (Read from the counts `Groups` and the buffer keep up to date: admission
        asks on every check, ~2 per trajectory, so nothing is recounted or copied here.)"""
        held, ready = self.groups.held_by_domain, self.buffer.ready_in
        return {d: held.get(d, 0) + ready(d) for d in self.quotas}

    def pending_groups(self) -> int:
        """Every pending group, of any domain (one a resume admitted under other weights included)."""
        return len(self.groups.by_id) + self.buffer.ready_count()

    def window(self) -> int:
        return self.policy.admission_window(
            self.inference_version, self.next_train_version, self.end_version - self.next_train_version
        )

    def allowed_groups(self) -> int:
        return self.window() * self.groups_per_batch

    def below_total_bound(self) -> bool:
        return self.pending_groups() < self.allowed_groups()

    # --- what to admit -------------------------------------------------------------------------------
    def next_group(self) -> Admit | None:
        """The group to admit now, or None when admission must wait: first the groups a resumed run replays
        (under the total bound), then new ones of the domain `select_domain` picks."""
        if self.replay:
            return self.replay.pop(0) if self.below_total_bound() else None
        domain = self.select_domain()
        if domain is None:
            return None
        self.next_seq += 1
        seq = self.next_seq - 1
        seed = self.seed_of(domain, seq)
        if self.domains[domain].data is not None:
            self.ordinals[domain] += 1
        return domain, seq, seed

    def seed_of(self, domain: str, seq: int) -> int:
        """The seed of the next group of `domain` at sequence number `seq`: a dataset domain's next ordinal (its
        rows in order), else one per sequence number."""
        if self.domains[domain].data is not None:
            return self.ordinals[domain]
        return self.seed * 1_000_003 + seq

    def select_domain(self) -> str | None:
        """The domain of the next new group, or None when admission must wait.

        `first`: any domain, drawn by weight, while the total bound holds. `stratified`: each domain has
        its own allowance, window × its share of a batch (redundancy included) — so ready groups of one
        domain, over its quota, can never use up the room another domain's quota needs.
        """
        domains = sorted(self.weights)
        if self.cfg.redundancy.selection == "first":
            if not self.below_total_bound():
                return None
            domains = self.paced(domains, self.window())
            if not domains:
                return None
            return self.rng.choices(domains, weights=[self.weights[d] for d in domains])[0]
        # No total check here: a domain still over its allowance (admitted under a wider window) must not
        # block the others; each allowance is ≤ (α + 1) × its quota, so the sum keeps the total bound.
        pending = self.pending_by_domain()
        window = self.window()
        room = {d: window * q - pending[d] for d, q in self.quotas.items()}
        domains = self.paced([d for d in domains if room[d] > 0], window)
        if not domains:
            return None
        return max(domains, key=lambda d: (room[d], -domains.index(d)))

    def paced(self, domains: list[str], window: int) -> list[str]:
        """Those of `domains` the pacer lets start a group now (all of them without a pacer). Nothing is held
        unless newer weights are on their way — the next batch's train version is not served yet, so the train
        step before it is running or landing: a held group then starts under those weights. Otherwise the next
        batch may need the held group to form at all (and the next weights need that batch)."""
        if self.pacer is None or window <= 0 or self.inference_version >= self.next_train_version:
            return domains
        assert self.clock is not None
        now = self.clock()
        return [d for d in domains if self.pacer.admits(d, window, now)]

    def upcoming_seq(self) -> int:
        """The sequence number of the group `next_group` admits next (what `forecast` would name, cheaply)."""
        return self.replay[0][1] if self.replay else self.next_seq

    def forecast(self) -> Admit | None:
        """(domain, seq, seed) of the group `next_group` would admit next if nothing changed meanwhile — a
        guess (with several domains, another may have room first); nothing is drawn or counted."""
        if self.replay:
            return self.replay[0]
        domains = sorted(self.weights)
        if not domains:
            return None
        if self.cfg.redundancy.selection == "first":
            rng = random.Random()
            rng.setstate(self.rng.getstate())  # the draw `select_domain` will make, on a copy
            domain = rng.choices(domains, weights=[self.weights[d] for d in domains])[0]
        else:
            pending, window = self.pending_by_domain(), self.window()
            domain = max(domains, key=lambda d: (window * self.quotas[d] - pending[d], -domains.index(d)))
        return domain, self.next_seq, self.seed_of(domain, self.next_seq)
