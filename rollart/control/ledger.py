"""The rollout ledger: where every started trajectory stands, so each ends exactly once.

In: the moves the scheduler makes (a trajectory, or the task it starts from; the fate it moves to; the fate
it must come from) and a `LedgerSink` to write them to (the run's ledger file; None: nothing is built — the
cluster twin, the rollout benchmark). Out: `fate` (trajectory id → `Fate`), `check()` (the violations: none,
in every test) and one JSON entry per move written to the sink as it happens: time, id, group, domain, fate,
reason, the digest of what was generated (ready, trained) and the batch (trained).

The moves: a fate is written once when a trajectory starts (RUNNING) and moves only forward — RUNNING →
READY → TRAINED, RUNNING → ABORTED | FAILED | STALE | FILTERED, READY → STALE. A move from any other fate is
a violation. FILTERED is a group the algorithm's filter dropped (DAPO's dynamic sampling: its rewards carry
no gradient); it ends there, counted, never trained.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any, Callable

from rollart.types import LedgerSink, Status, Task, Trajectory


def trajectory_digest(traj: Trajectory) -> str:
    """A short hash of what a trajectory generated and scored (tokens, logprobs, versions, reward): equal
    for the same trajectory restored from a checkpoint, different for one generated again."""
    content = [[t.prompt_token_ids, t.response_token_ids, t.logprobs, t.versions] for t in traj.turns]
    return hashlib.sha256(json.dumps([content, traj.reward]).encode()).hexdigest()[:16]


class Fate(str, enum.Enum):
    """Where a started trajectory stands in the ledger (see the module docstring for the moves)."""

    RUNNING = "running"  # started, no outcome yet (a scored member waits here for its group to fill)
    READY = "ready"  # in a complete group in the buffer
    TRAINED = "trained"  # taken into a batch
    ABORTED = "aborted"
    FAILED = "failed"
    STALE = "stale"
    FILTERED = "filtered"  # its complete group was dropped by the algorithm's group filter

    @classmethod
    def untrained(cls, status: Status) -> Fate:
        """The fate of a trajectory that ended with `status` without being trained."""
        return {Status.ABORTED: cls.ABORTED, Status.FAILED: cls.FAILED, Status.STALE: cls.STALE}[status]


class Ledger:
    def __init__(self, sink: LedgerSink | None, clock: Callable[[], float]) -> None:
        self.sink, self.clock = sink, clock
        self.fate: dict[str, Fate] = {}  # trajectory id → where it stands (every trajectory ever started)
        self.violations: list[str] = []

    def move(self, record: Trajectory | Task, fate: Fate, expect: Fate | None, reason: str = "",
             batch: int | None = None) -> None:
        """Move a trajectory (or the task it starts from) in the ledger, and write the move to the sink."""
        trajectory_id = record.trajectory_id
        current = self.fate.get(trajectory_id)
        if current != expect:
            self.violations.append(
                f"{trajectory_id}: {current and current.value} → {fate.value} (expected from {expect and expect.value})"
            )
        self.fate[trajectory_id] = fate
        if self.sink is None:
            return
        task = record.task if isinstance(record, Trajectory) else record
        entry: dict[str, Any] = {"time": self.clock(), "id": trajectory_id, "group": task.group_id,
                                 "domain": task.domain, "fate": fate.value}
        if reason:
            entry["reason"] = reason
        if fate in (Fate.READY, Fate.TRAINED):
            entry["digest"] = trajectory_digest(record)  # type: ignore[arg-type]
        if batch is not None:
            entry["batch"] = batch
        self.sink.write(entry)

    def restore_ready(self, trajectory_id: str) -> None:
        """A scored trajectory a resumed run puts back in the buffer (the run that scored it wrote its move)."""
        self.fate[trajectory_id] = Fate.READY

    def check(self) -> list[str]:
        """Violations of 'every trajectory ends exactly once': a fate set twice, or out of order."""
        return list(self.violations)
