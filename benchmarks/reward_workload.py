"""What the reward benchmarks share (`reward.py`: one job; `reward_multijob.py`: N jobs on one service): the
synthetic generation stand-in and the process controls its rollout processes run under.

In: CPU milliseconds to burn, cores to pin to, a niceness. Out: a fixed amount of work per call whatever
else the machine runs (`time.thread_time`), and the replica-count peak of a timeline window.
"""

from __future__ import annotations

import os
import time

NICE = 10  # rollout priority where reward work must run the moment it arrives (reward.py's docstring)


def burn_cpu(ms: float) -> int:
    """Spend `ms` milliseconds of this thread's CPU time (a fixed amount of work under any load)."""
    end = time.thread_time() + ms / 1000.0
    x = 1
    while time.thread_time() < end:
        for _ in range(2000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


def pin(cores: tuple[int, ...]) -> None:
    os.sched_setaffinity(0, cores)


def set_niceness(level: int) -> None:
    """Rollout process priority (pool initializer): 0 = normal, > 0 = yields the CPU to reward work."""
    os.setpriority(os.PRIO_PROCESS, 0, level)


def generate(i: int, turns: int, gen_ms: float, cores: tuple[int, ...]) -> str:
    """One trajectory's generation stand-in, in a rollout process pinned to `cores`."""
    pin(cores)
    for _ in range(turns):
        burn_cpu(gen_ms)
    return f"\\boxed{{{i % 10}}}"


def window_max(points: list[tuple[float, float]], t0: float, t1: float) -> float:
    """The highest value of a (time, value) step timeline over (t0, t1], the value in force at t0 included."""
    before = [v for t, v in points if t <= t0]
    inside = [v for t, v in points if t0 < t <= t1]
    return max(([before[-1]] if before else []) + inside, default=0.0)
