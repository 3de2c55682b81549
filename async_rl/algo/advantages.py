"""Advantage estimators and value targets: GAE, V-trace, group-relative baselines."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
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
    # The backward recursion runs over float64 numpy rows: a loop of torch ops on scalars costs
    # ~30x more per step, and this runs on the rollout workers for every piece they push.
    v = values.cpu().double().numpy()
    r = rewards.detach().cpu().double().numpy()
    not_done = 1.0 - dones.detach().cpu().double().numpy()
    next_value = np.broadcast_to(np.asarray(torch.as_tensor(bootstrap_value).detach().cpu(), np.float64), v.shape[1:])
    advantages = np.empty_like(v)
    running = np.zeros(v.shape[1:])
    for t in range(v.shape[0] - 1, -1, -1):
        delta = r[t] + gamma * next_value * not_done[t] - v[t]
        running = delta + gamma * lam * not_done[t] * running
        advantages[t] = running
        next_value = v[t]
    adv = torch.from_numpy(advantages).to(dtype=values.dtype, device=values.device)
    return adv, adv + values


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


GROUP_METHODS = ("grpo", "rloo", "naive")


def group_relative(values: Tensor, group_id: Tensor, method: str, *, scale_by_std: bool = True, eps: float = 1e-6,
                   valid: Optional[Tensor] = None) -> Tensor:
    """Each value against the others of its group, for groups of any size in any order (differentiable).

    ``values`` and ``group_id`` ``[N]``; members of a group share a ``group_id``; ``valid`` ``[N]``
    (bool) leaves elements out of every group's statistics. ``method``:

    - ``grpo``: (v - group mean) / (unbiased group std + eps); ``scale_by_std=False`` keeps only the
      centring (Dr. GRPO).
    - ``rloo``: v - mean of the other members.
    - ``naive``: v itself (no baseline).

    A group with a single (valid) member has no one to compare with: it keeps its own value. Invalid
    elements come back as 0.
    """
    if method not in GROUP_METHODS:
        raise ValueError(f"unknown group method '{method}'; valid: {', '.join(GROUP_METHODS)}")
    if values.shape != group_id.shape or values.dim() != 1:
        raise ValueError(f"values {tuple(values.shape)} and group_id {tuple(group_id.shape)} must both be [N]")
    valid = torch.ones_like(values, dtype=torch.bool) if valid is None else valid.bool()
    v = torch.where(valid, values, torch.zeros_like(values))  # a masked-out NaN must not reach a group's sums
    if method == "naive":
        return v
    # The statistics run in float64: there the sum of n equal float32 values is exact and so is its mean, so a
    # group of tied values centres to exactly 0. In float32 the mean can be an ulp off, and grpo divided that
    # ulp by a std made of the same ulp, giving every member of a tied group the same advantage near +-0.93.
    dtype, v = v.dtype, v.to(torch.float64)

    def per_group(x: Tensor) -> Tensor:
        return group_sum(x, group_id)

    count = per_group(valid.to(torch.float64))
    total = per_group(v)
    if method == "rloo":
        out = v - (total - v) / (count - 1.0).clamp_min(1.0)
    else:
        centred = v - total / count.clamp_min(1.0)
        out = centred
        if scale_by_std:
            var = per_group(torch.where(valid, centred, 0.0) ** 2) / (count - 1.0).clamp_min(1.0)
            # sqrt has an infinite slope at 0 (a group of equal values): keep its gradient finite.
            positive = var > 0
            std = torch.where(positive, torch.sqrt(torch.where(positive, var, 1.0)), 0.0)
            out = centred / (std + eps)
    return torch.where(valid & (count > 1.0), out, v).to(dtype)


def group_sum(x: Tensor, group_id: Tensor) -> Tensor:
    """For each element of ``x`` ``[N]``, the sum of ``x`` over its group (same ``group_id``)."""
    _, index = torch.unique(group_id, return_inverse=True)
    return torch.zeros(x.shape[0], dtype=x.dtype, device=x.device).index_add(0, index, x)[index]


def _by_rows(rewards: Tensor, method: str, min_n: int = 2, **kwargs: Any) -> Tensor:
    """``group_relative`` over rows: rewards ``[G, n]``, one group per row."""
    if rewards.dim() != 2 or rewards.shape[1] < min_n:
        raise ValueError(f"{method} advantages need rewards of shape [G, n] with n >= {min_n}, got {tuple(rewards.shape)}")
    g, n = rewards.shape
    ids = torch.arange(g, device=rewards.device).repeat_interleave(n)
    return group_relative(rewards.reshape(-1), ids, method, **kwargs).reshape(g, n)


@torch.no_grad()
def grpo_advantages(rewards: Tensor, eps: float = 1e-6, scale_by_std: bool = True) -> Tensor:
    """Group-normalised advantages for rewards ``[G, n]``: (r - mean) / (unbiased std + eps);
    ``scale_by_std=False``: r - mean (Dr. GRPO)."""
    return _by_rows(rewards, "grpo", eps=eps, scale_by_std=scale_by_std)


@torch.no_grad()
def rloo_advantages(rewards: Tensor) -> Tensor:
    """Leave-one-out baseline for rewards ``[G, n]``: r_i - mean_{j != i} r_j."""
    return _by_rows(rewards, "rloo")


@torch.no_grad()
def naive_advantages(rewards: Tensor) -> Tensor:
    """No baseline: the advantage is the raw outcome, rewards ``[G, n]`` (any n)."""
    return _by_rows(rewards, "naive", min_n=1)
