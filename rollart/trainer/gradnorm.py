"""Σ t² of a gradient in float64 without a float64 copy of it: what both strategies' `squared_norm` sums.

In: a tensor (a gradient or this rank's rows of one), any float dtype, any device. Out: a 0-d float64 tensor on
that device. Guarantee: the float64 copies alive at once cover `NORM_BLOCK` elements (8 MB), whatever the
tensor's size.
"""

from __future__ import annotations

import torch

NORM_BLOCK = 1 << 20  # elements per float64 block of `squared_sum`: 8 MB


def squared_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ t² in float64 (a 0-d tensor on t's device), block by block: a float64 copy of the whole tensor would
    cost twice its float32 bytes (82 MB for a 32 K × 640 embedding's gradient shard) at the end of every
    step; this holds one block of `NORM_BLOCK` elements at a time."""
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    for block in t.reshape(-1).split(NORM_BLOCK):
        b = block.double()
        total += torch.dot(b, b)
    return total
