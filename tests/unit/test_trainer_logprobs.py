"""Chunked log-probs equal the whole-micro-batch ones (values, entropy, gradients), and the chunks really bound
what is alive: no tensor saved for the backward and no logits computed cover more than one chunk of tokens."""

import pytest
import torch

from rollart.trainer.logprobs import token_logprobs

K, H, V = 37, 16, 300


def setup():
    torch.manual_seed(0)
    hidden = torch.randn(K, H, requires_grad=True)
    head = torch.nn.Linear(H, V, bias=False)
    targets = torch.randint(0, V, (K,))
    return hidden, head, targets


def run(chunk):
    hidden, head, targets = setup()
    logp, entropy = token_logprobs(hidden, head, targets, chunk)
    (logp * torch.linspace(-1, 1, K)).sum().backward()
    return logp.detach(), entropy, hidden.grad, head.weight.grad


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunked_equals_full_values_and_gradients(chunk):
    full, chunked = run(0), run(chunk)
    logits = setup()[1](setup()[0]).double()  # by hand, in float64
    expected = torch.log_softmax(logits, -1).gather(-1, setup()[2][:, None]).squeeze(-1)
    assert torch.allclose(full[0].double(), expected, atol=1e-5)
    for a, b in zip(full, chunked):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    assert full[1].min() > 0 and full[1].max() <= torch.log(torch.tensor(float(V))) + 1e-5  # an entropy


def test_no_grad_returns_the_same_values_without_entropy():
    hidden, head, targets = setup()
    with torch.no_grad():
        logp, entropy = token_logprobs(hidden, head, targets, 8, with_entropy=False)
    assert entropy is None and torch.allclose(logp, run(0)[0], atol=1e-7)


@pytest.mark.parametrize("chunk, bounded", [(8, True), (0, False)])
def test_chunks_bound_the_logits_alive_in_forward_and_backward(chunk, bounded):
    hidden, head, targets = setup()
    calls: list[int] = []
    saved: list[int] = []
    head.register_forward_hook(lambda m, args, out: calls.append(out.shape[0]))

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = token_logprobs(hidden, head, targets, chunk)
    logp.sum().backward()
    biggest_saved = max(n for n in saved if n != head.weight.numel())
    if bounded:  # forward and the backward's recompute: each chunk's logits once, never more than a chunk
        assert max(calls) == chunk and len(calls) == 2 * -(-K // chunk)
        assert biggest_saved < chunk * V
    else:
        assert calls == [K] and biggest_saved >= K * V


def test_bf16_head_chunked_equals_full():
    """The compute-dtype path (bf16 logits kept as they are, float32 per block) gives what plain autograd over
    the float32 copy of the same logits gives."""
    def go(chunk):
        hidden, head, targets = setup()
        head = head.to(torch.bfloat16)
        h = hidden.detach().to(torch.bfloat16).requires_grad_()
        logp, entropy = token_logprobs(h, head, targets, chunk)
        (logp * torch.linspace(-1, 1, K)).sum().backward()
        assert logp.dtype == torch.float32 and h.grad.dtype == torch.bfloat16
        return logp.detach(), entropy, h.grad.float(), head.weight.grad.float()

    full, chunked = go(0), go(8)
    for a, b in zip(full[:3], chunked[:3]):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    # the head's gradient sums one bf16 product per chunk: within bf16's rounding of the whole product
    assert torch.allclose(full[3], chunked[3], rtol=2**-7, atol=2**-7)


def test_float32_copies_cover_a_block_of_rows_and_the_entropy_is_not_recomputed(monkeypatch):
    """Inside a chunk no float32 [n × V] tensor holds more than BLOCK logits (forward, recompute and backward), no
    compute-dtype one more than the chunk, and the softmax of the entropy runs in the forward only."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import rollart.trainer.logprobs as logprobs

    monkeypatch.setattr(logprobs, "BLOCK", 3 * V + V // 2)  # 3 tokens' logits
    chunk = 8
    rows: dict[torch.dtype, int] = {}
    softmaxes = []

    hidden, head, targets = setup()
    head = head.to(torch.bfloat16)
    h = hidden.detach().to(torch.bfloat16).requires_grad_()

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._softmax.default:
                softmaxes.append(out.shape[0])
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[-1] == V and not func.is_view:
                    rows[t.dtype] = max(rows.get(t.dtype, 0), t.shape[0])
            return out

    with Watch():
        logp, entropy = token_logprobs(h, head, targets, chunk)
        logp.sum().backward()
    assert rows[torch.float32] == 3 and rows[torch.bfloat16] == chunk
    assert sum(softmaxes) == K and max(softmaxes) <= 3  # each token's entropy once, a block at a time
    assert entropy.shape == (K,)
