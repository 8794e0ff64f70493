"""`rollart bench trainer`'s bf16-through-float32 kernels (benchmarks/cpu_bf16.py): same dtypes and shapes as
torch's bf16 ops, float32 accumulation, one rounding — and the gradients of a bf16 block agree with torch's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.cpu_bf16 import BLOCK, Bf16ViaFloat32


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).bfloat16()


def test_matrix_products_are_float32_accumulations_rounded_once() -> None:
    torch.manual_seed(0)
    a, b, bias = _bf16(300, 200), _bf16(200, 150), _bf16(150)
    with Bf16ViaFloat32():
        mm, addmm = a @ b, torch.addmm(bias, a, b, beta=0.5, alpha=2.0)
        bmm = torch.bmm(a[None].expand(2, -1, -1), b[None].expand(2, -1, -1))
        linear = F.linear(a, b.t().contiguous(), bias)
    exact = a.float() @ b.float()
    assert mm.dtype == addmm.dtype == bmm.dtype == linear.dtype == torch.bfloat16
    assert torch.equal(mm, exact.bfloat16())
    assert torch.equal(addmm, (2.0 * exact + 0.5 * bias.float()).bfloat16())
    assert torch.equal(bmm, torch.stack([exact.bfloat16()] * 2))
    assert torch.equal(linear, (exact + bias.float()).bfloat16())


def test_blocks_along_the_inner_dimension_stay_within_one_rounding() -> None:
    torch.manual_seed(1)
    a, b = _bf16(64, 2 * BLOCK + 5), _bf16(2 * BLOCK + 5, 3 * BLOCK // 2)  # blocks along k and n
    with Bf16ViaFloat32():
        out = a @ b
    exact = (a.double() @ b.double())
    assert out.shape == (64, 3 * BLOCK // 2)
    assert ((out.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-3).all()


def test_gradients_of_a_bf16_attention_block_match_torchs_bf16() -> None:
    torch.manual_seed(2)
    x = _bf16(1, 96, 64).requires_grad_()
    w = _bf16(3 * 64, 64).requires_grad_()

    def block() -> tuple[torch.Tensor, ...]:
        q, k, v = F.linear(x, w).view(1, 96, 3, 4, 16).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (out.float().square().sum(), *torch.autograd.grad(out.float().square().sum(), (x, w)))

    native = block()
    with Bf16ViaFloat32():
        through = block()
    for n, t in zip(native, through):
        assert t.dtype == n.dtype
        assert torch.allclose(t.float(), n.float(), rtol=0.05, atol=0.05 * n.float().abs().max().item())
