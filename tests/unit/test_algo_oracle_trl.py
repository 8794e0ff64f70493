"""rollart's losses against a peer's implementation: TRL 1.16, on identical random tensors, loss AND gradient
∂loss/∂log π_θ within 1e-6.

The reference is TRL's own code, run as it is: `trl.GRPOTrainer._compute_loss` and
`trl.RLOOTrainer._compute_loss` (methods, not free functions) are called unbound on a stand-in `self` that
carries exactly the attributes they read, with a real `accelerate.Accelerator` on the CPU; the one method
they call on the model, `_get_per_token_logps_and_entropies`, returns our leaf tensor of log-probabilities.
What maps to what:

    TRL old_per_token_logps         = rollart's proximal log-probabilities (π_prox)
    TRL sampling logps (vLLM)       = rollart's behaviour log-probabilities (μ)
    TRL epsilon / epsilon_high      = train.clip_low / clip_high   (cispo: epsilon_high = 1 + clip_high)
    loss_type grpo | bnpo, dapo | dr_grpo | cispo      = aggregation seq_mean | token_mean | seq_sum_norm (L =
                                      max_completion_length) | cispo's surrogate with token_mean
    importance_sampling_level="sequence"                = gspo's surrogate
    vllm_importance_sampling_mode token_truncate | token_mask | sequence_truncate | sequence_mask, clip_min/max
                                    = train.correction token_tis | token_mis | seq_tis | seq_mis, tis_floor/tis_cap

TRL computes the importance-sampling ratio itself in `_generate_and_score_completions`, which cannot run
alone (it generates); `trl_is_ratio` below transcribes those lines (grpo_trainer.py, "Compute the importance
sampling ratio when using vLLM") and the ratio enters TRL's `_compute_loss` as its input. The KL term is
compared with `use_bias_correction_kl=False` (TRL's default multiplies it by the ratio; rollart does not).
RLOO: TRL clips the *sequence* ratio exp(Σ_t Δ_t); rollart's rloo clips per token and sums per sequence —
both are the paper's REINFORCE gradient A·∇log π(y) at the proximal point (r = 1, what one optimizer step per
batch trains), where the gradients are compared; their loss *values* differ by construction (A vs A·|y|).
"""

from __future__ import annotations

import math
import types
from collections import defaultdict

import pytest
import torch
from accelerate import Accelerator
from trl import GRPOTrainer, RLOOTrainer

from rollart.algo import cispo, grpo, gspo
from rollart.algo.losses import aggregation_weights, policy_loss

ACCELERATOR = Accelerator(cpu=True)
TOL = dict(atol=1e-6, rtol=1e-6)


def stand_in(logp, **attrs):
    """A `self` for TRL's `_compute_loss`: the attributes it reads, its model call answering with `logp`."""
    ns = types.SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=0.0,
        loss_type="grpo", epsilon_low=0.2, epsilon_high=0.28,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        use_vllm=False, vllm_importance_sampling_correction=False, model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=logp.shape[1], accelerator=ACCELERATOR,
        _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics={"train": defaultdict(list)},
    )
    ns.__dict__.update(attrs)
    ns._get_per_token_logps_and_entropies = lambda model, *a, **k: (logp, torch.zeros_like(logp), None)
    return ns


def trl_grpo(logp, old, adv, mask, *, is_ratio=None, ref=None, **attrs):
    b, t = logp.shape
    inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": mask.sum().float()}
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
        attrs |= {"use_vllm": True, "vllm_importance_sampling_correction": True}
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    return GRPOTrainer._compute_loss(stand_in(logp, **attrs), None, inputs)


def trl_is_ratio(old, sampling, mask, mode, clip_min, clip_max):
    """Transcribed from `GRPOTrainer._generate_and_score_completions` (TRL 1.16), which cannot run alone."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    diff = diff.sum(dim=-1, keepdim=True) if mode.startswith("sequence") else diff
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    hi = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)


def tensors(seed, b=5, t=9, spread=0.15, gap=0.3):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, t, generator=g) > 0.25).long()
    mask[:, 0] = 1  # every sequence has a model token
    behaviour = torch.randn(b, t, generator=g) * 0.4 - 1.2
    old = behaviour + torch.randn(b, t, generator=g) * gap  # π_prox vs μ: ratios from ~0.4 to ~2.5 (gap 0.3)
    old[0, 0] += 2.0  # one token (and its sequence) far above any cap, one far below any floor
    old[1, 0] -= 2.0
    logp = old + torch.randn(b, t, generator=g) * spread
    ref = old + torch.randn(b, t, generator=g) * 0.1
    adv = torch.randn(b, generator=g)
    return logp, old, behaviour, ref, adv, mask


def compare(seed, trl_kwargs, rollart_kwargs, aggregation, norm_length=1.0, with_is=None, with_ref=False, **shape):
    logp, old, behaviour, ref, adv, mask = tensors(seed, **shape)
    a = logp.clone().requires_grad_()
    is_ratio = trl_is_ratio(old, behaviour, mask, *with_is) if with_is else None
    theirs = trl_grpo(a, old, adv, mask, is_ratio=is_ratio, ref=ref if with_ref else None, **trl_kwargs)
    (g_theirs,) = torch.autograd.grad(theirs, a)
    b = logp.clone().requires_grad_()
    weights = aggregation_weights(mask, aggregation, norm_length=norm_length)
    ours, stats = policy_loss(b, behaviour, adv, mask, weights, proximal_logprobs=old,
                              ref_logprobs=ref if with_ref else None, **rollart_kwargs)
    (g_ours,) = torch.autograd.grad(ours, b)
    torch.testing.assert_close(ours.detach(), theirs.detach(), **TOL)
    torch.testing.assert_close(g_ours, g_theirs, **TOL)
    assert float(g_ours.abs().sum()) > 0
    return g_ours, stats


NO_IS = dict(correction="none", tis_cap=2.0)
CLIP = dict(clip_low=0.2, clip_high=0.28)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("loss_type,aggregation", [("grpo", "seq_mean"), ("bnpo", "token_mean"),
                                                   ("dapo", "token_mean"), ("dr_grpo", "seq_sum_norm")])
def test_grpo_family_losses_equal_trl(seed, loss_type, aggregation):
    _, stats = compare(seed, dict(loss_type=loss_type), dict(surrogate=grpo.token_clip, **CLIP, **NO_IS), aggregation,
                       norm_length=9, spread=0.3)
    assert stats["clipped"] > 0  # both branches of the clip are compared


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.2, 0.28)])
def test_gspo_equals_trl_sequence_level_importance_sampling(seed, eps):
    g, _ = compare(seed, dict(importance_sampling_level="sequence", epsilon_low=eps[0], epsilon_high=eps[1]),
                dict(surrogate=gspo.sequence_clip, clip_low=eps[0], clip_high=eps[1], **NO_IS), "seq_mean")
    logp, _, _, _, _, mask = tensors(seed)
    assert float(g[mask == 0].abs().sum()) == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_cispo_equals_trl(seed):
    _, stats = compare(seed, dict(loss_type="cispo", epsilon_high=1.0 + 0.3), dict(surrogate=cispo.clipped_weight,
            clip_low=1.0, clip_high=0.3, **NO_IS), "token_mean", spread=0.4)
    assert stats["clipped"] > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode,correction,clip_min,clip_max,gap", [
    ("token_truncate", "token_tis", None, 2.0, 0.5),
    ("token_mask", "token_mis", None, 2.0, 0.5),
    ("token_mask", "token_mis", 0.5, 2.0, 0.5),  # two-sided (icepop)
    ("token_truncate", "token_tis", 0.5, 1.5, 0.5),
    ("sequence_truncate", "seq_tis", None, 1.5, 0.05),
    ("sequence_mask", "seq_mis", 0.7, 1.4, 0.05),
])
def test_mismatch_corrections_equal_trl(seed, mode, correction, clip_min, clip_max, gap):
    _, stats = compare(seed, dict(loss_type="grpo"), dict(surrogate=grpo.token_clip, correction=correction, tis_cap=clip_max,
                                              tis_floor=clip_min or 0.0, **CLIP),
            "seq_mean", with_is=(mode, clip_min, clip_max), gap=gap)
    assert stats["iw_truncated" if correction.endswith("tis") else "iw_masked"] > 0  # the bounds acted


@pytest.mark.parametrize("seed", range(3))
def test_gspo_and_cispo_with_the_behaviour_correction_equal_trl(seed):
    compare(seed, dict(importance_sampling_level="sequence", epsilon_low=3e-4, epsilon_high=4e-4),
            dict(surrogate=gspo.sequence_clip, clip_low=3e-4, clip_high=4e-4, correction="token_tis", tis_cap=2.0),
            "seq_mean", with_is=("token_truncate", None, 2.0))
    compare(seed, dict(loss_type="cispo", epsilon_high=5.0), dict(surrogate=cispo.clipped_weight, clip_low=1.0,
            clip_high=4.0, correction="token_tis", tis_cap=2.0), "token_mean", with_is=("token_truncate", None, 2.0))


@pytest.mark.parametrize("seed", range(3))
def test_k3_kl_term_equals_trl(seed):
    compare(seed, dict(beta=0.07), dict(surrogate=grpo.token_clip, kl_coef=0.07, kl_estimator="k3", **CLIP,
                                        **NO_IS), "seq_mean", with_ref=True)


@pytest.mark.parametrize("seed", range(3))
def test_rloo_gradient_equals_trl_rloo_at_the_proximal_point(seed):
    logp, _, behaviour, _, adv, mask = tensors(seed)
    a = logp.clone().requires_grad_()
    old_logps = (logp * mask).sum(1)  # TRL's per-sequence old logps at the proximal point
    ns = stand_in(a)
    b, t = logp.shape
    inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_logps": old_logps}
    theirs = RLOOTrainer._compute_loss(ns, None, inputs)
    (g_theirs,) = torch.autograd.grad(theirs, a)
    c = logp.clone().requires_grad_()
    ours, _ = policy_loss(c, behaviour, adv, mask, aggregation_weights(mask, "seq_sum"), surrogate=grpo.token_clip,
                          proximal_logprobs=None, **CLIP, **NO_IS)
    (g_ours,) = torch.autograd.grad(ours, c)
    torch.testing.assert_close(g_ours, g_theirs, **TOL)
    assert float(theirs.detach()) == pytest.approx(-float(adv.mean()), abs=1e-6)  # TRL: −mean A (ratio 1 per sequence)
