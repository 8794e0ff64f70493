"""Which LLM-proxy shard a generation turn goes to: the one choice the real sharded proxy and the twin share.

In: a trajectory id (`<group id>/<member>`, as the rollout scheduler names them; an id without a `/` is its own
group) and the number of shards N ≥ 1. Out: a shard in [0, N).

Guarantees: stable — the same id gives the same shard in every process and every run (CRC-32, not Python's
salted `hash`), so every turn and every abort of a trajectory reach the shard that holds its sticky routing; by
group — every member of a group goes to one shard, so the group's shared prompt prefix is routed by one proxy;
balanced — group ids spread evenly over the shards (tests/unit/test_proxy_shard.py holds it to ±10% of the mean
over 10,000 groups).
"""

from __future__ import annotations

import zlib


def proxy_shard(trajectory_id: str, shards: int) -> int:
    """The shard of `trajectory_id`'s group among `shards` proxy processes."""
    if shards < 1:
        raise ValueError(f"proxy shards must be ≥ 1, not {shards}")
    if shards == 1:
        return 0
    group = trajectory_id.rsplit("/", 1)[0]
    return zlib.crc32(group.encode()) % shards
