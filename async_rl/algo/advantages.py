"""Advantage estimators and value targets: GAE, V-trace, group-relative baselines."""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor


@torch.no_grad()
def gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    bootstrap_value: Tensor | float,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation, time-major (``[T]`` or ``[T, B]``).

    ``dones[t] = 1`` means the episode ended at step t: nothing is bootstrapped past it.
    ``bootstrap_value`` is V of the state after the last step. Returns (advantages, returns)
    with returns = advantages + values.
    """
    values = values.detach()
    rewards = rewards.to(values.dtype)
    not_done = 1.0 - dones.to(values.dtype)
    next_value = torch.as_tensor(bootstrap_value, dtype=values.dtype, device=values.device).expand_as(values[0])
    advantages = torch.empty_like(values)
    running = torch.zeros_like(values[0])
    for t in range(values.shape[0] - 1, -1, -1):
        delta = rewards[t] + gamma * next_value * not_done[t] - values[t]
        running = delta + gamma * lam * not_done[t] * running
        advantages[t] = running
        next_value = values[t]
    return advantages, advantages + values


@torch.no_grad()
def vtrace(
    log_rhos: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
) -> tuple[Tensor, Tensor]:
    """IMPALA V-trace targets (Espeholt et al. 2018), time-major ``[T, B]``.

    ``log_rhos = log pi - log mu``; ``discounts = gamma * (1 - done)``; a threshold of
    None disables that clip. Returns (vs, pg_advantages) with
    ``pg_advantages = min(rho_pg, rho) * (r + discount * vs_{s+1} - V(x_s))``.
    """
    values = values.detach()
    dtype = values.dtype
    rhos = torch.exp(log_rhos.detach().to(dtype))
    discounts = discounts.to(dtype)
    rewards = rewards.to(dtype)
    bootstrap_value = bootstrap_value.detach().to(dtype)

    def clip(x: Tensor, threshold: Optional[float]) -> Tensor:
        return x if threshold is None else x.clamp(max=threshold)

    clipped_rhos, cs = clip(rhos, clip_rho_threshold), clip(rhos, clip_c_threshold)
    values_next = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_next - values)
    vs_minus_v = torch.empty_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values
    vs_next = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_advantages = clip(rhos, clip_pg_rho_threshold) * (rewards + discounts * vs_next - values)
    return vs, pg_advantages


@torch.no_grad()
def grpo_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """Group-normalised advantages for rewards ``[G, n]``: (r - mean) / (unbiased std + eps)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"grpo_advantages needs rewards of shape [G, n] with n >= 2, got {tuple(rewards.shape)}")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=True, keepdim=True)
    return (rewards - mean) / (std + eps)


@torch.no_grad()
def rloo_advantages(rewards: Tensor) -> Tensor:
    """Leave-one-out baseline for rewards ``[G, n]``: r_i - mean_{j != i} r_j."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rloo_advantages needs rewards of shape [G, n] with n >= 2, got {tuple(rewards.shape)}")
    n = rewards.shape[1]
    others_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (n - 1)
    return rewards - others_mean
