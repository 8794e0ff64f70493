"""The per-domain circuit breaker: a domain whose own code keeps failing stops rollout within seconds.

In: `rollout.circuit_breaker` (`consecutive_failures`, `failure_rate`, `window`) and, from the scheduler,
each trajectory of a domain as it ends (`record`). Out: None while the domain is healthy, else a `Trip`
— the domain, how many of its trajectories failed, and the first `Fault` (what raised, its error and
traceback) — once, the moment either bound is crossed:
- `consecutive_failures` of its trajectories in a row failed by a fault of the domain's own code, or
- of its last `window` trajectories that counted, at least `failure_rate` failed so (only once `window`
  have ended, so a short unlucky start never trips it).

What counts: a trajectory that ended FAILED with a `Fault` (its env raised in reset or step, its agent
raised, returned nothing usable or called no model, its reward function raised or returned no score) is a
failure; a scored trajectory (COMPLETED or
TRUNCATED) a success. Everything else — ABORTED and STALE trajectories, and FAILED ones without a fault
(a worker that died, generation or a reward service out, a timeout: the infrastructure's, or slow rather
than broken) — does not count either way. `consecutive_failures=0` turns the breaker off.

Pure bookkeeping, no asyncio: the scheduler feeds it and stops rollout on a trip (scheduler.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rollart.config import CircuitBreakerConfig
from rollart.types import Fault, Status, Trajectory


@dataclass(frozen=True)
class Trip:
    """Why a domain's breaker opened."""

    domain: str
    failed: int  # trajectories of the domain failed by its own code so far
    counted: int  # trajectories of the domain that counted (failures and successes) so far
    consecutive: int  # failures in a row when it tripped
    first: Fault  # the domain's first fault (the run's earliest evidence of the bug)
    first_reason: str  # that trajectory's status reason

    def message(self) -> str:
        rate = f"{self.failed} of its {self.counted} trajectories" if self.counted != self.failed else \
            f"all {self.failed} of its trajectories"
        trace = f"\n{self.first.traceback}" if self.first.traceback else ""
        return (f"domain '{self.domain}' is broken: {rate} failed in its own code ({self.consecutive} in a row), "
                f"so rollout stopped. The first failure, in {self.first.where}: {self.first_reason}{trace}\n"
                f"Fix {self._what()}, then start the run again; nothing of this run needs resuming. "
                "(rollout.circuit_breaker sets when a domain counts as broken.)")

    def _what(self) -> str:
        if self.first.where == "reward":
            return (f"the reward function domains.{self.domain}.reward.fn (rollart calls f(trajectory), f(response, "
                    "row), TRL's f(completions, **kwargs) with the row's columns by name, or verl's "
                    "compute_score(data_source, solution_str, ground_truth, extra_info); a function of a dataset "
                    f"row sees the row as `rollart data preview {self.domain}` shows it)")
        what = "agent" if self.first.where == "agent" else "environment"
        return f"the {what} of domains.{self.domain} (try one episode with `rollart env play`)"


class DomainBreaker:
    """One breaker per domain (see the module docstring)."""

    def __init__(self, cfg: CircuitBreakerConfig) -> None:
        self.cfg = cfg
        self._recent: dict[str, deque[bool]] = {}  # per domain: the last `window` counted outcomes (True: failed)
        self._run: dict[str, int] = {}
        self._failed: dict[str, int] = {}
        self._counted: dict[str, int] = {}
        self._first: dict[str, tuple[Fault, str]] = {}
        self.tripped: Trip | None = None

    def record(self, traj: Trajectory) -> Trip | None:
        """Count how `traj` ended; the `Trip` the moment its domain's breaker opens (then None again)."""
        if self.cfg.consecutive_failures == 0 or self.tripped is not None:
            return None
        failed = traj.status is Status.FAILED and traj.fault is not None
        if not failed and not (traj.status is not None and traj.status.trainable and traj.reward is not None):
            return None  # aborted, stale, or an infrastructure failure: neither way
        domain = traj.domain
        recent = self._recent.setdefault(domain, deque(maxlen=self.cfg.window))
        recent.append(failed)
        self._counted[domain] = self._counted.get(domain, 0) + 1
        if not failed:
            self._run[domain] = 0
            return None
        assert traj.fault is not None
        self._first.setdefault(domain, (traj.fault, traj.status_reason))
        self._failed[domain] = self._failed.get(domain, 0) + 1
        self._run[domain] = run = self._run.get(domain, 0) + 1
        full = len(recent) == self.cfg.window
        if run >= self.cfg.consecutive_failures or (full and sum(recent) >= self.cfg.failure_rate * len(recent)):
            fault, reason = self._first[domain]
            self.tripped = Trip(domain, self._failed[domain], self._counted[domain], run, fault, reason)
            return self.tripped
        return None
