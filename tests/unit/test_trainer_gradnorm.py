"""`squared_sum` is Σ t² in float64 (what a whole float64 copy would give, to float64 rounding) while never
holding a float64 copy of more than one block."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rollart.trainer.gradnorm as gradnorm


def test_blocked_float64_sum_of_squares(monkeypatch) -> None:
    monkeypatch.setattr(gradnorm, "NORM_BLOCK", 1000)
    t = torch.randn(37, 101, generator=torch.Generator().manual_seed(0)) * 3
    biggest = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float64:
                biggest.append(out.numel())
            return out

    with Watch():
        got = gradnorm.squared_sum(t)
    expected = torch.linalg.vector_norm(t.double()) ** 2
    assert got.dtype == torch.float64 and got.dim() == 0
    assert abs(float(got) - float(expected)) <= 1e-12 * float(expected)
    assert max(biggest) == 1000  # one block at a time (the tensor has 3,737 elements)
    assert float(gradnorm.squared_sum(torch.zeros(0))) == 0.0
