"""Which rows of a tensor each of W ranks holds: FSDP2's dim-0 chunks, the one split every rank and the weight
transfer agree on.

In: a tensor's row count (its dim 0; a 0-d tensor is one row), a rank and the world size. Out: the rows
[start, stop) of that rank — rank r of W holds [r·c, min((r+1)·c, n)), c = ⌈n / W⌉ (the last ranks may hold
fewer rows, or none). `torch.distributed.fsdp.fully_shard` splits parameters exactly so
(`rollart/trainer/fsdp2.py` checks each shard against it); the collective weight transfer
(`rollart/weights/shard_plan.py`) has each trainer rank send those rows.
"""

from __future__ import annotations


def row_range(rows: int, rank: int, world: int) -> tuple[int, int]:
    """Rows [start, stop) of `rank` out of `world`."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of {world} ranks")
    per = -(-rows // world)
    start = min(rank * per, rows)
    return start, min(start + per, rows)
