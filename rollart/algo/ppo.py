"""PPO with a critic (Schulman et al. 2017) and GAE (Schulman et al. 2016), over the model's own tokens.

In: per sample, the critic's values V_t [T] and the rewards [T] at the model tokens (the trajectory's reward
at its last model token, 0 elsewhere), the loss mask (1 on model tokens; prompt and observation tokens are
0). Out: per-token advantages and returns (`gae`), and the critic's clipped value loss (`value_loss`).

GAE(γ, λ) runs backwards over the *model tokens only*: the "next state" of a model token is the next model
token, so observation tokens between two turns are skipped — the next value and the running sum are carried
across them (turn-level credit for a multi-turn trajectory: an action is judged by the value of the state
after the env's answer):

    δ_t = r_t + γ·V_{t'} − V_t        t' = the next model token (V = 0 after the last)
    A_t = δ_t + γλ·A_{t'}             R_t = A_t + V_t (the value target)

Advantages are then whitened over the batch's model tokens (`train.normalize_std`, the trainer computes the
moments over all ranks). The policy loss is the token clip (grpo.py) with these per-token advantages; the
critic minimises

    L_V = ½ · max((V − R)², (V_old + clip(V − V_old, −c, c) − R)²)      (c = train.critic.value_clip; 0: off)

token-averaged over each mini-batch, with its own optimizer. No group is needed: `advantages` is None (the
trainer asks the critic), and dynamic sampling has nothing to drop (a constant-reward group still trains
its critic and gets non-zero advantages from the value error).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rollart.algo import grpo
from rollart.algo.algorithm import Algorithm
from rollart.algo.filters import reward_variance


def gae(values: Tensor, rewards: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """(advantages, returns) [B, T], 0 off the mask; observation/prompt tokens are skipped (module docstring)."""
    v, r = values.to(torch.float64), rewards.to(torch.float64)
    on = mask.bool()
    b, t_len = v.shape
    advantages = torch.zeros_like(v)
    next_value = torch.zeros(b, dtype=torch.float64)
    running = torch.zeros(b, dtype=torch.float64)
    for t in reversed(range(t_len)):
        delta = r[:, t] + gamma * next_value - v[:, t]
        here = delta + gamma * lam * running
        advantages[:, t] = torch.where(on[:, t], here, torch.zeros_like(here))
        running = torch.where(on[:, t], here, running)
        next_value = torch.where(on[:, t], v[:, t], next_value)
    returns = torch.where(on, advantages + v, torch.zeros_like(v))
    return advantages.to(values.dtype), returns.to(values.dtype)


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, weights: Tensor,
               clip: float) -> tuple[Tensor, dict[str, Tensor]]:
    """L_V = Σ ω·m·½·max((V − R)², (clip(V) − R)²) and its summed statistics (module docstring)."""
    m = mask.to(values.dtype)
    err = (values - returns) ** 2
    if clip > 0:
        clipped_v = old_values + torch.clamp(values - old_values, -clip, clip)
        err_clipped = (clipped_v - returns) ** 2
        per_token = 0.5 * torch.maximum(err, err_clipped)
        was_clipped = (err_clipped > err).to(m.dtype)
    else:
        per_token = 0.5 * err
        was_clipped = torch.zeros_like(m)
    loss = (weights * m * per_token).sum()
    stats = {
        "value_loss": loss.detach(),
        "value_clipped": (was_clipped * m).sum().detach(),
        "value_sum": (values.detach() * m).sum(),
        "value_error_sum": (err.detach() * m).sum(),
    }
    return loss, stats


ALGORITHM = Algorithm("ppo", None, grpo.token_clip, reward_variance, critic=True)
