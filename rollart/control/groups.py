"""The admitted groups as plain data: each group's runs, its scored members, and the admission slots held.

In: nothing (records the scheduler's parts fill). Out: `Run` (one trajectory whose runner call has not
returned), `Group` (an admitted group), `Groups` (every group from its admission until it is closed —
complete, dropped, stale, filtered or stopped — AND the last of its trajectories has returned; so a group
holds its admission slot while a cancelled straggler winds down).

Guarantees: a trajectory is running exactly when it has an unsettled run (`Group.running()`); `unsettled`
counts the unsettled runs of every group, open or closed, and `unsettled_peak` is its highest value so far;
`held_by_domain` counts the held groups per domain, so admission checks cost O(domains).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from rollart.types import Status, Task, Trajectory


@dataclass
class Run:
    """One trajectory of a group whose runner call has not returned yet."""

    task: Task
    start_version: int
    handle: asyncio.Task | None = None  # the task running it (None while it joins the turn barrier)
    settled: bool = False  # its outcome is known: scored, or ended untrained


@dataclass
class Group:
    group_id: str
    seq: int
    domain: str
    env: str
    seed: int
    cohort: int
    runs: dict[str, Run] = field(default_factory=dict)  # by trajectory id
    scored: list[Trajectory] = field(default_factory=list)  # members scored while the group was open
    launched: int = 0
    replacements: int = 0
    closed: bool = False
    close_status: Status = Status.ABORTED
    close_reason: str = ""

    def running(self) -> list[str]:
        """Ids of the members still running (outcome not settled)."""
        return [trajectory_id for trajectory_id, run in self.runs.items() if not run.settled]


class Groups:
    def __init__(self) -> None:
        self.by_id: dict[str, Group] = {}  # admitted, until closed and every member returned
        self.held_by_domain: Counter[str] = Counter()
        self.unsettled = self.unsettled_peak = 0

    def hold(self, group: Group) -> None:
        """`group` takes its admission slot, if it holds none yet (every run added to it calls this)."""
        if group.group_id not in self.by_id:
            self.by_id[group.group_id] = group
            self.held_by_domain[group.domain] += 1

    def release(self, group: Group) -> None:
        if self.by_id.pop(group.group_id, None) is not None:
            self.held_by_domain[group.domain] -= 1

    def open(self) -> list[Group]:
        return [g for g in self.by_id.values() if not g.closed]

    def add_run(self, group: Group, run: Run) -> None:
        group.runs[run.task.trajectory_id] = run
        self.unsettled += 1
        self.unsettled_peak = max(self.unsettled_peak, self.unsettled)
        self.hold(group)

    def settle(self, run: Run) -> None:
        if not run.settled:
            run.settled = True
            self.unsettled -= 1

    def close(self, group: Group, status: Status, reason: str) -> None:
        """No member of `group` will be trained past this point (the ready ones are in the buffer); it keeps its
        slot until its last member has returned."""
        group.closed, group.close_status, group.close_reason = True, status, reason
        if not group.runs:
            self.release(group)

    def running_by_domain(self) -> Counter[str]:
        return Counter(g.domain for g in self.open() for _ in g.running())
