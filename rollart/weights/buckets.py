"""Split named tensors into size-bounded buckets of raw numpy bytes, and put them back together.

In: `{name: torch.Tensor}` (any dtype, any device) and a bucket size in bytes. Out: `Bucket`s — a list of
flat uint8 numpy arrays plus a `TensorMeta` per name — and, from `unpack`, `{name: torch.Tensor}` on CPU.

Why numpy bytes: the Ray object store serialises numpy arrays out of band (one copy into shared memory,
zero-copy reads), while torch tensors are pickled (measured on a 2-core machine: ~600 ms per 100 MB,
against 50–200 ms to put a numpy array of that size and 0.3 ms to get it). Bytes also carry dtypes numpy
lacks (bfloat16) unchanged.

Guarantees: `unpack(pack(t))` is bit-identical to `t`; names that share storage (tied embeddings) are
stored once and come back as one tensor under both names; a tensor larger than the bucket size gets a
bucket of its own (buckets hold whole tensors); buckets keep the order of the input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class TensorMeta:
    """Where one named tensor lives: bucket index, array index inside the bucket, dtype and shape."""

    name: str
    bucket: int
    index: int
    dtype: str  # torch dtype name, e.g. "float32", "bfloat16"
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Bucket:
    """One object-store object's worth of weights: flat byte arrays, one per distinct tensor."""

    arrays: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


def _as_bytes(t: torch.Tensor) -> np.ndarray:
    """A flat uint8 view of the tensor's data (a copy only when it is not on CPU or not contiguous)."""
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()


def pack(named_tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> tuple[list[Bucket], list[TensorMeta]]:
    """Group tensors, in order, into buckets of at most `bucket_bytes` (one oversized tensor per bucket)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be > 0 bytes, got {bucket_bytes}")
    buckets: list[list[np.ndarray]] = []
    metas: list[TensorMeta] = []
    seen: dict[tuple, tuple[int, int]] = {}
    size = 0
    for name, t in named_tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"weight '{name}' is a {type(t).__name__}, not a torch.Tensor")
        dtype = str(t.dtype).removeprefix("torch.")
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        if key in seen and t.numel():
            b, i = seen[key]
        else:
            arr = _as_bytes(t)
            if not buckets or (buckets[-1] and size + arr.nbytes > bucket_bytes):
                buckets.append([])
                size = 0
            buckets[-1].append(arr)
            size += arr.nbytes
            b, i = len(buckets) - 1, len(buckets[-1]) - 1
            seen[key] = (b, i)
        metas.append(TensorMeta(name, b, i, dtype, tuple(t.shape)))
    return [Bucket(tuple(arrs)) for arrs in buckets], metas


def unpack(buckets: Sequence[Bucket], metas: Sequence[TensorMeta]) -> dict[str, torch.Tensor]:
    """Rebuild `{name: tensor}` (CPU, writable, owned: the read-only store buffers are copied once)."""
    made: dict[tuple[int, int], torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for m in metas:
        key = (m.bucket, m.index)
        if key not in made:
            raw = np.array(buckets[m.bucket].arrays[m.index], copy=True)
            made[key] = torch.from_numpy(raw).view(getattr(torch, m.dtype)).reshape(m.shape)
        out[m.name] = made[key]
    return out
