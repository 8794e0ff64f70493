"""Train and validation splits as disjoint seed ranges.

In: a `Task` (its `seed` and `split`). Out: the seed passed to `env.reset`, and each turn's sampling seed.
Guarantee: train episodes use seeds in [0, SPLIT_SIZE) and validation episodes seeds in
[VAL_OFFSET, VAL_OFFSET + SPLIT_SIZE), so no validation puzzle is ever a training puzzle — for every
domain, built-in or not, with no list of held-out tasks to keep. Both ranges fit numpy's 32-bit seeds.
"""

from __future__ import annotations

import zlib

from rollart.types import Task

SPLIT_SIZE = 1_000_000_000
VAL_OFFSET = 2_000_000_000


def episode_seed(task: Task) -> int:
    """The reset seed of a task: its seed folded into its split's range."""
    base = task.seed % SPLIT_SIZE
    return VAL_OFFSET + base if task.split == "val" else base


def request_seed(task: Task, turn_index: int) -> int:
    """The sampling seed of one turn's generation: a stable hash of the episode and the turn (not
    Python's `hash`, which differs between processes), so a task samples the same tokens in every run."""
    return zlib.crc32(f"{task.trajectory_id}|{task.seed}|{task.split}|{turn_index}".encode())
