"""Which rows of which tensor each trainer rank sends, in which bucket: the plan both ends of a collective
weight transfer compute alike. Pure functions, no torch collectives.

In: the model's tensors as `TensorSpec`s (checkpoint names — tied names share one tensor —, dtype, shape), the
number of senders (trainer ranks) and the bucket size in bytes. Out: per sender, its buckets, each a list of
`Piece`s (tensor index, rows [start, stop), byte offset in the bucket, bytes), and the specs as JSON for the
rendezvous store (`specs_to_json` / `specs_from_json`, which checks everything it reads: dtype on a fixed
list, shapes of non-negative ints, at most `MAX_TENSORS` tensors and `MAX_BYTES` in all).

Rows: sender r of W owns rows [r·c, min((r+1)·c, n)) of a tensor of n rows along dim 0, c = ⌈n / W⌉ —
`rollart.base.shards.row_range`, exactly FSDP2's `Shard(0)` chunks (rollart/trainer/fsdp2.py), so a rank of a
sharded trainer sends its local shard as it holds it, and a rank of a replicated one (ddp) sends that slice of its full copy: every
rank sends ~1/W of the model, none gathers anything. A 0-d tensor is one row, owned by sender 0. Buckets:
a sender's pieces in tensor order, a new bucket when the next piece would pass `bucket_bytes` (a piece
larger than that gets a bucket of its own) — so a sender holds at most one bucket beside its shard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from math import prod
from typing import Sequence

from rollart.base.shards import row_range

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int8": 1,
               "uint8": 1, "bool": 1}
MAX_TENSORS = 1_000_000
MAX_BYTES = 2**44  # 16 TiB: far above any model; a spec claiming more is refused


@dataclass(frozen=True)
class TensorSpec:
    names: tuple[str, ...]  # checkpoint names; several when tied (one tensor)
    dtype: str  # torch dtype name, a key of DTYPE_BYTES
    shape: tuple[int, ...]

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return prod(self.shape[1:]) * DTYPE_BYTES[self.dtype] if self.shape else DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class Piece:
    tensor: int  # index into the specs
    start: int  # first row
    stop: int  # one past the last row
    offset: int  # byte offset in its bucket
    nbytes: int


def plan_buckets(specs: Sequence[TensorSpec], rank: int, world: int, bucket_bytes: int) -> list[list[Piece]]:
    """Sender `rank`'s buckets: its non-empty pieces in tensor order, each bucket ≤ `bucket_bytes` unless one
    piece alone is larger."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be > 0 bytes, got {bucket_bytes}")
    if not 0 <= rank < world:
        raise ValueError(f"sender rank {rank} is not in 0..{world - 1}")
    buckets: list[list[Piece]] = []
    current: list[Piece] = []
    size = 0
    for index, spec in enumerate(specs):
        start, stop = row_range(spec.rows, rank, world)
        nbytes = (stop - start) * spec.row_bytes
        if nbytes == 0:
            continue
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(Piece(index, start, stop, size, nbytes))
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def bucket_sizes(buckets: Sequence[Sequence[Piece]]) -> list[int]:
    return [sum(p.nbytes for p in bucket) for bucket in buckets]


def specs_to_json(specs: Sequence[TensorSpec]) -> str:
    return json.dumps([{"names": list(s.names), "dtype": s.dtype, "shape": list(s.shape)} for s in specs])


def specs_from_json(text: str | bytes) -> list[TensorSpec]:
    """The specs a sender wrote, checked field by field (the rendezvous store is shared: read it as input)."""
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"weight transfer plan: not JSON ({exc})") from None
    if not isinstance(raw, list) or len(raw) > MAX_TENSORS:
        raise ValueError(f"weight transfer plan: a list of at most {MAX_TENSORS} tensors is expected")
    specs, total = [], 0
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != {"names", "dtype", "shape"}:
            raise ValueError(f"weight transfer plan: tensor {i} must have exactly names, dtype and shape")
        names, dtype, shape = item["names"], item["dtype"], item["shape"]
        if not (isinstance(names, list) and names and all(isinstance(n, str) and 0 < len(n) <= 1024 for n in names)):
            raise ValueError(f"weight transfer plan: tensor {i}: names must be a non-empty list of names")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"weight transfer plan: tensor {i} ({names[0]}): dtype {dtype!r} is not one of "
                             f"{sorted(DTYPE_BYTES)}")
        if not (isinstance(shape, list) and len(shape) <= 8
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise ValueError(f"weight transfer plan: tensor {i} ({names[0]}): shape must be ≤ 8 non-negative ints")
        spec = TensorSpec(tuple(names), dtype, tuple(shape))
        total += spec.nbytes
        if total > MAX_BYTES:
            raise ValueError(f"weight transfer plan: more than {MAX_BYTES} bytes in all")
        specs.append(spec)
    return specs
