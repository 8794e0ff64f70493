"""bfloat16 matrix products at float32 speed on a CPU without bf16 instructions — `rollart bench trainer`'s
stand-in for a GPU's bf16 kernels.

In: a `with Bf16ViaFloat32():` block around a bf16 forward and backward (a TorchDispatchMode, so it sits
below autograd and FSDP2: it sees the aten ops with plain tensors). Out: the same ops, the same dtypes and
shapes in and out, the same tensors saved for the backward — computed differently for two families:

- matrix products (`mm`, `addmm`, `bmm`, `baddbmm`) with bf16 operands: the exact products of bf16 numbers
  accumulated in float32 by a float32 GEMM, rounded to bf16 once at the end — the arithmetic of a GPU's bf16
  tensor-core GEMM (fp32 accumulation). Computed in blocks of at most 1,024 along every dimension, so the
  float32 copies alive at a time are a few MB, not a whole weight or activation.
- CPU flash attention (`_scaled_dot_product_flash_attention_for_cpu` and its backward) with bf16 q/k/v: run
  in float32 per call (one sequence's q/k/v, a few MB) and rounded back to bf16.

Why: this machine's CPU (AVX2, no AVX512-BF16/AMX) has no bf16 arithmetic, so torch emulates it — measured
here, one thread: a 1024×640×1792 GEMM at 4.2 GFLOP/s in bf16 vs 30 in float32; SDPA forward + backward of a
2,048-token causal sequence 4.5 s vs 0.7 s. At 68 M parameters and 2,048 tokens that puts one bf16 step
at many minutes and the bench far past its time; what the bench reads from a bf16 row is memory (which this
mode leaves as it is, to within a few MB of transient float32 blocks, an overestimate if anything) and a
tokens/s that on this CPU would only measure torch's emulation. Rows run under this mode say so.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

BLOCK = 1024
aten = torch.ops.aten


def _mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, beta: float = 1,
        alpha: float = 1) -> torch.Tensor:
    """alpha · (a @ b) + beta · bias for 2-D bf16 `a` [m, k], `b` [k, n] (bias broadcast to [m, n]): float32
    accumulation block by block, one rounding to bf16 per output block."""
    m, k = a.shape
    n = b.shape[1]
    out = torch.empty(m, n, dtype=torch.bfloat16)
    bias = None if bias is None else bias.expand(m, n)
    for i in range(0, m, BLOCK):
        for j in range(0, n, BLOCK):
            acc = torch.zeros(min(BLOCK, m - i), min(BLOCK, n - j))
            for p in range(0, k, BLOCK):
                acc += a[i:i + BLOCK, p:p + BLOCK].float() @ b[p:p + BLOCK, j:j + BLOCK].float()
            if bias is not None:
                acc.mul_(alpha).add_(bias[i:i + BLOCK, j:j + BLOCK].float(), alpha=beta)
            out[i:i + BLOCK, j:j + BLOCK] = acc
    return out


def _is_bf16(*tensors: Any) -> bool:
    return all(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.device.type == "cpu"
               for t in tensors)


def _float(x: Any) -> Any:
    return x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else x


class Bf16ViaFloat32(TorchDispatchMode):
    """bf16 matrix products and attention computed through float32 kernels (module docstring)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten.mm.default and _is_bf16(*args[:2]) and not kwargs:
            return _mm(args[0], args[1])
        if func is aten.addmm.default and _is_bf16(*args[:3]):
            return _mm(args[1], args[2], args[0], kwargs.get("beta", 1), kwargs.get("alpha", 1))
        if func is aten.bmm.default and _is_bf16(*args[:2]) and not kwargs:
            return torch.stack([_mm(x, y) for x, y in zip(args[0], args[1])])
        if func is aten.baddbmm.default and _is_bf16(*args[:3]):
            bias, a, b = args[:3]
            bias = bias.expand(a.shape[0], a.shape[1], b.shape[2])
            return torch.stack([_mm(x, y, c, kwargs.get("beta", 1), kwargs.get("alpha", 1))
                                for x, y, c in zip(a, b, bias)])
        if func is aten._scaled_dot_product_flash_attention_for_cpu.default and _is_bf16(*args[:3]):
            out, lse = func(*[_float(x) for x in args], **kwargs)
            return out.to(torch.bfloat16), lse
        if func is aten._scaled_dot_product_flash_attention_for_cpu_backward.default and _is_bf16(*args[:5]):
            grads = func(*[_float(x) for x in args], **kwargs)
            return tuple(g.to(torch.bfloat16) for g in grads)
        return func(*args, **kwargs)
