"""Admission pacing: admit a group only if it can, by what rollout measured, end in time to be trained.

In: from the scheduler, with its clock's `now`: each group admitted (`admitted`) and completed (`completed`),
each batch taken (`batch_taken`, then `prune`: the groups still held); from admission, when it would admit a group of
a domain, the window (how many batches a group admitted now could serve, staleness.py (2)). Out:
`admits(domain, window, now)`; `metrics()` (what it measured).

Why: under the α bound alone admission starts every group the window has room for, the moment it has room.
A group started late in its window, and slower than the time the window has left, can only end STALE — its
tokens and env time wasted on the generation pools (tinker-cookbook's argument: pace admission rather than
discard stale work). Pacing holds such a group back until the next weights are served: it then starts
under a newer version, with a whole window ahead of it.

The rule, from two measurements:
- `interval_s`: the time between batches taken (exponentially weighted) — the measured rollout throughput,
  one batch per interval;
- `latency_s[domain]`: the time from a group's admission to its completion, per domain — the 90th percentile
  of its last 128 completed groups (the tail is what ends stale).
A group admitted now can serve the next `window` batches; the last of them is expected to be taken at
`last_take + window × interval_s`. It is admitted if `latency_s[domain] ≤ that − now`.

Guarantees: pacing only ever admits less than the α bound (the bound is checked first, by admission); with
nothing measured yet — the pipeline's first fill, a domain with no completed group — it admits (no guess);
and it never stops rollout: admission asks it only while newer weights are on their way (the next batch's
train version is not served yet), so a held group starts under those weights, with a longer time left; the
batch that must form before any newer weights can come is never held up (admission.py `paced`). The
measurements are soft state, not checkpointed: a resumed run measures again over its first batches.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Container

SMOOTHING_BATCHES = 0.5  # weight of the newest batch interval (batches are few; the rate drifts)
RECENT_GROUPS = 128  # completed groups per domain whose latency is kept
QUANTILE = 0.9  # the latency a group is assumed to take: this quantile of its domain's recent groups (the tail is
# what ends stale; the mean would admit half of the slow groups too late)


def ewma(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new


@dataclass
class Pacer:
    interval_s: float | None = None
    latency_s: dict[str, float] = field(default_factory=dict)
    last_take: float | None = None
    started: dict[str, float] = field(default_factory=dict)  # group id → admission time
    _recent: dict[str, deque[float]] = field(default_factory=dict)
    held_back: int = 0  # times a group was held back (counted once per window it was held in)
    _held: set[tuple[str, int]] = field(default_factory=set)

    # --- what is measured ----------------------------------------------------------------------------
    def admitted(self, group_id: str, now: float) -> None:
        self.started[group_id] = now

    def completed(self, group_id: str, domain: str, now: float) -> None:
        began = self.started.pop(group_id, None)
        if began is not None:
            recent = self._recent.setdefault(domain, deque(maxlen=RECENT_GROUPS))
            recent.append(now - began)
            ordered = sorted(recent)
            self.latency_s[domain] = ordered[min(len(ordered) - 1, int(QUANTILE * len(ordered)))]

    def prune(self, held: Container[str]) -> None:
        """Forget the groups no longer `held` that never completed (cancelled, dropped, filtered)."""
        for group_id in [g for g in self.started if g not in held]:
            del self.started[group_id]

    def batch_taken(self, now: float) -> None:
        if self.last_take is not None:
            self.interval_s = ewma(self.interval_s, now - self.last_take, SMOOTHING_BATCHES)
        self.last_take = now

    # --- the rule ------------------------------------------------------------------------------------
    def time_left(self, window: int, now: float) -> float | None:
        """Seconds until the last batch a group admitted now could serve is expected to be taken (None:
        not measured yet)."""
        if self.interval_s is None or self.last_take is None:
            return None
        return self.last_take + window * self.interval_s - now

    def admits(self, domain: str, window: int, now: float) -> bool:
        """May a group of `domain` start now (the α bound already holds)? See the module docstring."""
        latency = self.latency_s.get(domain)
        left = self.time_left(window, now)
        if latency is None or left is None:
            return True  # nothing measured yet: no guess
        if latency <= left:
            return True
        if (domain, window) not in self._held:
            self._held.add((domain, window))
            self.held_back += 1
        return False

    def window_reopened(self) -> None:
        """New weights are served or a batch was taken: a held domain is counted again when next held."""
        self._held.clear()

    def metrics(self) -> dict[str, float]:
        out = {"rollout/pacing_held_back": float(self.held_back)}
        if self.interval_s is not None:
            out["rollout/pacing_interval_s"] = self.interval_s
        for domain, latency in sorted(self.latency_s.items()):
            out[f"rollout/pacing_latency_s/{domain}"] = latency
        return out
