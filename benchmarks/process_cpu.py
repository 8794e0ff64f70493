"""CPU seconds by role, from the processes' own accounting: what each part of a run costs.

In: a root process (the benchmark's own, which starts Ray and with it every worker) and a time window. Out:
`CpuSampler` polls `/proc` (psutil) for the root and every descendant every `interval_s` — user + system
seconds of each process (its threads included, its children not) — and `by_role(start, end)` sums each
process's growth over the window into a role, named from the process title Ray gives an actor's worker
(`ray::ClassName…`, see `ROLES`). A process without a title of its own (a `multiprocessing` pool worker, a
sandboxed child) counts for the nearest ancestor that has one: math-verify's pool in an env worker is that
env worker's, in a Serve replica that replica's. Ray's own daemons (GCS, raylet, the idle workers it keeps
warm) are `ray`. An actor's role, once its title has shown it, stays the process's (`settled_role`). The
sampler's own thread is charged to nobody: its CPU time is taken off the root's.

Why polling and not `RUSAGE_CHILDREN`: Ray's workers are grandchildren (of the raylet) and outlive nothing
the root waits on, so only a live look at each process sees them. A process that starts and ends between
two polls is missed (nothing in a run does: pools and actors live for the run).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil

# (prefix of the process title, role); the first that matches wins
ROLES: tuple[tuple[str, str], ...] = (
    ("ray::InferenceWorker", "engine"),
    ("ray::LLMProxy", "llm_proxy"),
    ("ray::EnvWorker", "env_worker"),
    ("ray::TrainerWorker", "trainer"),
    ("ray::ServeReplica", "reward_replicas"),
    ("ray::ProxyActor", "serve_proxy"),
    ("ray::ServeController", "serve_controller"),
    ("ray::SharedClaimBook", "claim_book"),
    ("ray::WeightStoreActor", "weight_store"),
    ("ray::ResourceManager", "resources"),
    ("ray::", "ray_other_actors"),  # any other actor (the idle workers Ray keeps warm included)
)
DRIVER = "driver"
RAY = "ray"  # gcs_server, raylet, the dashboard agent, log monitor …
_RAY_DAEMONS = ("gcs_server", "raylet", "dashboard", "log_monitor", "monitor.py", "runtime_env", "ray_client")


def role_of(cmdline: list[str]) -> str | None:
    """The role of a process from its title (Ray sets `ray::Class.method` as argv[0]); None = not known."""
    title = " ".join(cmdline)
    for prefix, role in ROLES:
        if title.startswith(prefix):
            return role
    if any(d in title for d in _RAY_DAEMONS):
        return RAY
    return None


GENERIC = frozenset({RAY, "ray_other_actors", "other", ""})  # roles a worker has before (or between) actors


def settled_role(known: str, title_role: str | None) -> str:
    """A process's role after one more look at its title: an actor's role, once seen, stays — the same worker
    process also shows Ray's generic titles (its `default_worker.py` command line before the actor is made,
    `ray::IDLE`), and a sample taken then must not move the whole process's CPU to `ray`."""
    if title_role is None:
        return known
    if known and known not in GENERIC and title_role in GENERIC:
        return known
    return title_role


@dataclass
class _Seen:
    role: str
    cpu_s: list[tuple[float, float]] = field(default_factory=list)  # (time, user + system seconds)
    title: str = ""  # the process title last seen (which actor an `ray_other_actors` process is)


class CpuSampler:
    """Polls the process tree under `root_pid` on a daemon thread; `stop()` then `by_role(start, end)`."""

    def __init__(self, root_pid: int | None = None, interval_s: float = 0.5) -> None:
        self.root = psutil.Process(root_pid or os.getpid())
        self.interval_s = interval_s
        self.seen: dict[tuple[int, float], _Seen] = {}  # (pid, create time) → role and samples
        self.own_cpu_s: list[tuple[float, float]] = []  # (time, the sampler thread's CPU seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)
        self.sample()

    def sample(self) -> None:
        now = time.time()
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        roles: dict[int, str | None] = {}
        parents: dict[int, int] = {}
        for proc in procs:
            try:
                with proc.oneshot():
                    cmdline = proc.cmdline()
                    roles[proc.pid] = DRIVER if proc.pid == self.root.pid else role_of(cmdline)
                    parents[proc.pid] = proc.ppid()
                    cpu = proc.cpu_times()
                    key = (proc.pid, proc.create_time())
            except psutil.Error:
                continue
            seen = self.seen.setdefault(key, _Seen(""))
            seen.cpu_s.append((now, cpu.user + cpu.system))
            seen.title = " ".join(cmdline)[:80]
            seen.role = settled_role(seen.role, roles[proc.pid])
        for (pid, _), seen in self.seen.items():  # untitled processes: the nearest titled ancestor's role
            if pid in roles and roles[pid] is None:
                ancestor = parents.get(pid)
                while ancestor is not None and roles.get(ancestor) is None and ancestor in parents:
                    ancestor = parents[ancestor]
                seen.role = roles.get(ancestor) or seen.role or "other"
        self.own_cpu_s.append((now, time.thread_time()))

    def by_title(self, start: float, end: float, role: str) -> dict[str, float]:
        """CPU seconds of the processes of one role between `start` and `end`, by process title."""
        out: dict[str, float] = {}
        for seen in self.seen.values():
            used = _at(seen.cpu_s, end) - _at(seen.cpu_s, start)
            if seen.role == role and used > 0:
                out[seen.title] = out.get(seen.title, 0.0) + used
        return out

    def by_role(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each role used between `start` and `end` (unix times), the sampler's own off the driver."""
        out: dict[str, float] = {}
        for seen in self.seen.values():
            used = _at(seen.cpu_s, end) - _at(seen.cpu_s, start)
            if used > 0:
                out[seen.role or "other"] = out.get(seen.role or "other", 0.0) + used
        if DRIVER in out:
            out[DRIVER] -= _at(self.own_cpu_s, end) - _at(self.own_cpu_s, start)
        return out


def _at(samples: list[tuple[float, float]], t: float) -> float:
    """A cumulative counter at time `t`: its last sample at or before `t` (0 before the first: the process
    started later)."""
    value = 0.0
    for when, counted in samples:
        if when > t:
            break
        value = counted
    return value
