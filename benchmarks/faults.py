"""Faults injected into a running job from outside, as real failures come: processes killed with SIGKILL.

In: a fault plan (`plan(kinds, steps, seed)`: one fault of each kind, each after a seeded RL step and a
seeded fraction of a step more), the run directory of the job (its metrics.jsonl tells which RL step it is
at) and, for a node fault, a function that kills a whole worker node. Out: `Injector`, a thread that waits
for each fault's moment and injects it; `injector.timeline` — what was killed, when (seconds since the RL
phase began) and its pid.

Victims are found in Ray's actor table by class (`InferenceWorker`, `EnvWorker`, `TrainerWorker`, the Ray
Serve replica of the reward service), alive, one chosen by the plan's seed, and killed with SIGKILL: the
process vanishes without a word, like an OOM kill or a hardware fault — nothing in rollart is told. A
`node` fault kills every process of a loopback worker node (`rollart.resources.loopback`). The injector runs in
the process that drives the job (it needs its Ray connection and this machine's processes).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

log = logging.getLogger("benchmarks")

# fault kind → the Ray actor class whose process it kills, a regular expression (node: a whole worker node
# instead); a job's own reward app is named rollart-reward-<run id prefix>, the shared service's rollart-reward
VICTIM_CLASSES = {
    "inference": "InferenceWorker",
    "env": "EnvWorker",
    "reward": r"ServeReplica:rollart-reward(-[0-9a-f]+)?:RewardDeployment",
    "trainer": "TrainerWorker",
}
KINDS = (*VICTIM_CLASSES, "node")


@dataclass(frozen=True)
class Fault:
    """Kill a `kind` victim once RL step `after_step` is logged, `delay_frac` of a step time later."""

    kind: str
    after_step: int
    delay_frac: float


@dataclass(frozen=True)
class Injected:
    kind: str
    at_s: float  # seconds since the first RL step was logged
    step: int  # the last RL step logged when it was injected
    victim: str  # the actor class (or "node")
    pid: int  # the process killed (0 for a node)


def plan(kinds: Sequence[str], steps: int, seed: int, first_step: int = 1) -> list[Fault]:
    """One fault per kind, at distinct steps spread over [first_step, steps − 2], in a seeded order, each
    after a seeded fraction of a step (a random moment of that step)."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {list(KINDS)}")
    last = steps - 2
    if last - first_step + 1 < len(kinds):
        raise ValueError(f"{len(kinds)} faults need at least {len(kinds) + first_step + 1} RL steps, not {steps}")
    rng = random.Random(seed)
    span = last - first_step + 1
    slots = [first_step + (i * span) // len(kinds) for i in range(len(kinds))]
    order = list(kinds)
    rng.shuffle(order)
    return [Fault(kind, step, rng.random()) for kind, step in zip(order, slots)]


def logged_steps(metrics: Path) -> list[tuple[int, float]]:
    """(step, wall time of its record) of every RL step logged so far in a run's metrics.jsonl."""
    out = []
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        if "time/step" in record:
            out.append((int(record["step"]), float(record.get("time", time.time()))))
    return out


class Injector(threading.Thread):
    def __init__(self, faults: Sequence[Fault], run_dir: str | Path, seed: int,
                 kill_node: Callable[[], None] | None = None, poll_s: float = 0.2, since: float | None = None) -> None:
        """`since`: only actors started after this unix time are victims (default: now — the job's own)."""
        super().__init__(name="rollart-fault-injector", daemon=True)
        if any(f.kind == "node" for f in faults) and kill_node is None:
            raise ValueError("a node fault needs kill_node (a multi-node cluster)")
        self.faults = sorted(faults, key=lambda f: (f.after_step, f.delay_frac))
        self.metrics = Path(run_dir) / "metrics.jsonl"
        self.rng = random.Random(seed)
        self.kill_node = kill_node
        self.poll_s = poll_s
        self.since = time.time() if since is None else since
        self.timeline: list[Injected] = []
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._rl_start: float | None = None

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def run(self) -> None:
        for fault in self.faults:
            moment = self._wait_for(fault)
            if moment is None:
                return
            try:
                self.timeline.append(self._inject(fault, *moment))
            except Exception as exc:  # noqa: BLE001 — a fault that could not be injected is reported, not fatal
                self.errors.append(f"{fault.kind}: {exc}")
                log.error("could not inject a %s fault: %s", fault.kind, exc)

    def _wait_for(self, fault: Fault) -> tuple[int, float] | None:
        """Block until the fault's moment; (last step logged, step time) then, None if stopped."""
        while not self._halt.is_set():
            steps = logged_steps(self.metrics)
            if steps and self._rl_start is None:
                self._rl_start = time.time()
            done = [s for s, _ in steps if s >= fault.after_step]
            if done:
                times = [t for _, t in steps]
                step_s = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 1.0
                if self._halt.wait(fault.delay_frac * step_s):
                    return None
                return steps[-1][0], step_s
            self._halt.wait(self.poll_s)
        return None

    def _inject(self, fault: Fault, step: int, _step_s: float) -> Injected:
        at = time.time() - (self._rl_start or time.time())
        if fault.kind == "node":
            self.kill_node()  # type: ignore[misc]
            log.warning("chaos: killed a worker node after RL step %d", step)
            return Injected("node", at, step, "node", 0)
        pattern = VICTIM_CLASSES[fault.kind]
        victims = sorted((p, c) for c, p in _alive_actors(self.since) if re.fullmatch(pattern, c))
        if not victims:
            raise RuntimeError(f"no alive actor of class {pattern} to kill")
        pid, cls = self.rng.choice(victims)
        os.kill(pid, signal.SIGKILL)
        log.warning("chaos: SIGKILL %s (pid %d) after RL step %d", cls, pid, step)
        return Injected(fault.kind, at, step, cls, pid)


def _alive_actors(since: float) -> list[tuple[str, int]]:
    """(class name, pid) of every alive actor of this Ray cluster started after `since` (unix time)."""
    from ray._private import state  # the GCS actor table (see rollart.resources.health)

    return [(str(a.get("ActorClassName", "")), int(a.get("Pid") or 0)) for a in state.actors().values()
            if a.get("State") == "ALIVE" and a.get("Pid") and float(a.get("StartTime") or 0) / 1000 >= since]
