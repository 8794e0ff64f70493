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
