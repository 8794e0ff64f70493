"""Sampling contract: parameter validation, top-k/top-p filtering, logprob definition, per-row generators."""

from __future__ import annotations

import math

import pytest
import torch

from rollart.inference.sampling import choose_tokens, sampling_logprobs, validate_sampling
from rollart.types import SamplingParams


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("temperature", -0.5, ">= 0"),
        ("temperature", float("nan"), "finite"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_k", -1, ">= 0"),
        ("top_k", 2.5, "integer"),
        ("max_new_tokens", 0, ">= 1"),
        ("stop_token_ids", (5, 5000), "[0, 1024)"),
        ("stop_strings", ("",), "non-empty"),
        ("seed", -3, "None or an integer"),
    ],
)
def test_bad_sampling_params_name_field_value_and_range(field, value, fragment):
    params = SamplingParams(**{field: value})
    with pytest.raises(ValueError) as err:
        validate_sampling(params, vocab_size=1024, can_decode=True)
    msg = str(err.value)
    assert f"sampling.{field}=" in msg and repr(value) in msg and fragment in msg


def test_stop_strings_need_a_tokenizer():
    with pytest.raises(ValueError, match="stop_strings.*tokenizer"):
        validate_sampling(SamplingParams(stop_strings=("x",)), vocab_size=10, can_decode=False)


def test_good_params_pass():
    validate_sampling(
        SamplingParams(temperature=0.7, top_p=0.9, top_k=40, max_new_tokens=8, stop_token_ids=(2,), seed=3),
        vocab_size=1024,
        can_decode=False,
    )


def test_greedy_logprob_is_log_softmax_at_temperature_one():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    lp = sampling_logprobs(logits, [SamplingParams(temperature=0.0, top_k=1, top_p=0.1)])
    assert torch.allclose(lp, torch.log_softmax(logits, -1))
    tokens, picked = choose_tokens(lp, [SamplingParams(temperature=0.0)], [None])
    assert tokens == [0] and math.isclose(picked[0], torch.log_softmax(logits, -1)[0, 0].item(), rel_tol=1e-6)


def test_top_k_then_top_p_renormalise_after_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    # T=1, top_k=4 keeps 0.5,0.2,0.15,0.1 (mass 0.95); top_p=0.7 then keeps the smallest head reaching 0.7
    # of the renormalised distribution: 0.5/0.95=0.526 < 0.7, +0.2/0.95 = 0.737 ≥ 0.7 → two tokens.
    lp = sampling_logprobs(logits, [SamplingParams(temperature=1.0, top_k=4, top_p=0.7)])
    probs = lp.exp()[0]
    assert torch.isinf(lp[0, 2:]).all()
    assert torch.allclose(probs[:2], torch.tensor([0.5, 0.2]) / 0.7, atol=1e-6)
    # temperature is applied before the filters
    lp_t = sampling_logprobs(logits, [SamplingParams(temperature=0.5, top_k=2)])
    expected = torch.log_softmax(logits[0, :2] / 0.5, -1)
    assert torch.allclose(lp_t[0, :2], expected, atol=1e-6) and torch.isinf(lp_t[0, 2:]).all()


def test_rows_use_their_own_settings_and_generators():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=3), SamplingParams(top_p=0.5)]
    lp = sampling_logprobs(logits, params)
    assert torch.isfinite(lp[0]).all()
    assert torch.isfinite(lp[1]).sum() == 3
    # a row's draw depends only on its own generator: drawing with other rows present changes nothing
    solo = choose_tokens(lp[1:2], params[1:2], [torch.Generator().manual_seed(7)])
    batched = choose_tokens(lp, params, [None, torch.Generator().manual_seed(7), torch.Generator().manual_seed(9)])
    assert solo[0][0] == batched[0][1] and solo[1][0] == pytest.approx(batched[1][1])
    assert batched[0][0] == int(logits[0].argmax())


def test_draws_follow_the_distribution_and_never_pick_a_filtered_token():
    """Inverse-CDF draws, many rows at once: frequencies within 4 standard errors of the probabilities, and a
    token top-k removed never drawn (20,000 rows of one distribution, each with its own generator)."""
    logits = torch.log(torch.tensor([[0.05, 0.4, 0.0001, 0.25, 0.2999, 0.0]]))
    params = [SamplingParams(temperature=1.0, top_k=4)] * 20_000
    lp = sampling_logprobs(logits.expand(len(params), -1), params)
    gens = [torch.Generator().manual_seed(i) for i in range(len(params))]
    tokens, picked = choose_tokens(lp, params, gens)
    probs = lp[0].exp()
    counts = torch.bincount(torch.tensor(tokens), minlength=6).double() / len(tokens)
    stderr = (probs.double() * (1 - probs.double()) / len(tokens)).sqrt()
    assert probs[2] == 0 and probs[5] == 0 and counts[2] == 0 and counts[5] == 0
    assert ((counts - probs.double()).abs() <= 4 * stderr + 1e-12).all(), (counts, probs)
    assert picked[0] == pytest.approx(float(lp[0, tokens[0]]))
