"""Loss pieces around the policy loss: value loss, entropies, KL, whitening, guards."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

Tensor = torch.Tensor

_LOG_2PI_E = math.log(2.0 * math.pi * math.e)


def masked_mean(x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Mean over elements where ``mask`` is true (plain mean when no mask)."""
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def masked_whiten(x: Tensor, mask: Optional[Tensor] = None, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / std over valid elements (population std); keeps the mean if not ``shift_mean``."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    return whitened if shift_mean else whitened + mean


def value_loss(
    values: Tensor,
    values_old: Tensor,
    returns: Tensor,
    clip_eps: Optional[float] = None,
    mask: Optional[Tensor] = None,
) -> Tensor:
    """0.5 * max((v - R)^2, (clip(v, v_old +- eps) - R)^2), masked mean; unclipped if eps is None."""
    returns = returns.detach()
    loss = (values - returns) ** 2
    if clip_eps is not None:
        values_old = values_old.detach()
        clipped = values_old + (values - values_old).clamp(-clip_eps, clip_eps)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    return 0.5 * masked_mean(loss, mask)


def categorical_entropy(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dimension."""
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    # p log p = 0 where p = 0 (a -inf logit): the clamp keeps 0 * -inf (NaN) out of both passes.
    return -(logp.exp() * logp.clamp_min(torch.finfo(logp.dtype).min)).sum(dim=-1).to(logits.dtype)


def tanh_gaussian_log_prob(mu: Tensor, log_std: Tensor, action: Tensor, eps: float = 1e-6) -> Tensor:
    """Per-dimension log-density of ``action = tanh(u)``, ``u ~ N(mu, exp(log_std))``; at least float32."""
    # In bf16, 1 - eps rounds to 1 and atanh(1) is inf: clamp and compute in (at least) float32.
    dtype = torch.promote_types(torch.promote_types(mu.dtype, log_std.dtype), torch.float32)
    mu, log_std = mu.to(dtype), log_std.to(dtype)
    action = action.to(dtype).clamp(-1.0 + eps, 1.0 - eps)
    pre_tanh = torch.atanh(action)
    normal_logp = -0.5 * ((pre_tanh - mu) * torch.exp(-log_std)) ** 2 - log_std - 0.5 * math.log(2.0 * math.pi)
    # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)): exact, unlike log1p(-a^2 + eps).
    log_det = 2.0 * (math.log(2.0) - pre_tanh - torch.nn.functional.softplus(-2.0 * pre_tanh))
    return normal_logp - log_det


def tanh_gaussian_entropy(mu: Tensor, log_std: Tensor, num_samples: int = 1) -> Tensor:
    """Per-dimension entropy of tanh(N(mu, std)), estimated with reparameterised samples.

    H = H_gauss + E[log(1 - tanh(u)^2)]; the Gaussian part is exact, the correction is a
    Monte-Carlo mean over ``num_samples`` draws and carries gradients.
    """
    std = torch.exp(log_std)
    noise = torch.randn((num_samples, *mu.shape), dtype=mu.dtype, device=mu.device)
    pre_tanh = mu + std * noise
    # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|.
    log_det = 2.0 * (math.log(2.0) - pre_tanh - torch.nn.functional.softplus(-2.0 * pre_tanh))
    return 0.5 * _LOG_2PI_E + log_std + log_det.mean(dim=0)


KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logp: Tensor, logp_ref: Tensor, kind: str = "k3") -> Tensor:
    """Per-element estimate of KL(pi || pi_ref) from samples of pi (Schulman's approximations).

    With log r = logp_ref - logp: ``k1`` = -log r (unbiased, can be negative), ``k2`` = (log r)^2 / 2
    (biased, low variance, >= 0), ``k3`` = (r - 1) - log r (unbiased, >= 0). Gradients flow through both.
    """
    log_ratio = logp_ref - logp
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator '{kind}'; valid: {', '.join(KL_ESTIMATORS)}")


@torch.no_grad()
def kl_reward_penalty(reward: Tensor, logp: Tensor, logp_ref: Tensor, coef: float, kind: str = "k1") -> Tensor:
    """KL to the reference as a per-step reward penalty: ``reward - coef * kl``.

    ``reward`` ``[...]``; ``logp`` (behaviour) and ``logp_ref`` ``[..., A]``, log-probs of the taken
    action per dimension / token: the step's KL is the sum over the action's elements.
    """
    dtype = torch.promote_types(torch.promote_types(logp.dtype, reward.dtype), torch.float32)  # bf16 log-probs
    kl = kl_penalty(logp.to(dtype), logp_ref.to(dtype), kind).sum(-1)
    return (reward.to(dtype) - coef * kl).to(reward.dtype)


def ratio_guard(ratio_mean: float, threshold: Optional[float]) -> bool:
    """Whether an update whose mean ratio is ``ratio_mean`` is skipped (above ``threshold``; None: never).

    A skipped update must not reach the optimiser at all: a zeroed loss still steps it (AdamW's
    decoupled weight decay and its momentum move the weights)."""
    return threshold is not None and ratio_mean > threshold


@torch.no_grad()
def distributed_normalize(
    x: Tensor,
    mask: Optional[Tensor] = None,
    group: Optional["dist.ProcessGroup"] = None,
    eps: float = 1e-8,
    center: bool = True,
) -> Tensor:
    """Whiten ``x`` with mean and std over every rank's valid, finite elements (``center`` false:
    only divide by the root mean square, the mean stays where it was relative to 0).

    All-reduces (sum, sum of squares, count); with torch.distributed not initialised it is
    the local whitening. A non-finite element stays non-finite but does not poison the others
    (nor, through the all-reduce, the other ranks): only its own minibatch is then skipped.
    """
    valid = torch.isfinite(x) if mask is None else mask.bool() & torch.isfinite(x)
    x64 = torch.where(valid, x.to(torch.float64), 0.0)
    totals = torch.stack([x64.sum(), (x64**2).sum(), valid.sum().to(torch.float64)])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=group)
    total, total_sq, count = map(float, totals.tolist())
    count = max(count, 1.0)
    mean = total / count
    if center:
        var = max(total_sq / count - mean * mean, 0.0)
        return ((x.to(torch.float64) - mean) / (math.sqrt(var) + eps)).to(x.dtype)
    # Uncentred values are scaled by their RMS, not their std: the std measures the spread around a mean
    # that is kept, so a batch of equal non-zero values (naive advantages of equal returns) has std 0 and
    # would be multiplied by 1/eps. The RMS is 0 only if every value is 0, and equals the std at mean 0.
    return (x.to(torch.float64) / (math.sqrt(total_sq / count) + eps)).to(x.dtype)


@torch.no_grad()
def distributed_normalize_by(x: Tensor, index: Tensor, group: Optional["dist.ProcessGroup"] = None,
                             eps: float = 1e-8, center: bool = True) -> Tensor:
    """``distributed_normalize`` within each value of ``index`` (e.g. the task of each step): every
    element is whitened with the mean and std of the finite elements sharing its index, over every
    rank. Two all-reduces (the largest index, then sum, sum of squares and count per index): every
    rank calls it, also one that holds no element of some index. An index with one element gives 0."""
    index = index.long().reshape(x.shape)
    valid = torch.isfinite(x)
    groups = torch.tensor([float(index.max()) if index.numel() else -1.0], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(groups, op=dist.ReduceOp.MAX, group=group)
    n = int(groups.item()) + 1
    x64 = torch.where(valid, x.to(torch.float64), 0.0)
    totals = torch.zeros(3, max(n, 1), dtype=torch.float64)
    for row, values in enumerate((x64, x64**2, valid.to(torch.float64))):
        totals[row].index_add_(0, index.reshape(-1), values.reshape(-1))
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=group)
    total, total_sq, count = totals.unbind(0)
    count = count.clamp_min(1.0)
    mean = total / count
    if center:
        scale = (total_sq / count - mean * mean).clamp_min(0.0).sqrt() + eps
        return ((x.to(torch.float64) - mean[index]) / scale[index]).to(x.dtype)
    return (x.to(torch.float64) / ((total_sq / count).sqrt() + eps)[index]).to(x.dtype)


def per_action(x: Tensor, mask: Optional[Tensor], how: str) -> Tensor:
    """Sum (``how="sum"``) or mean (``"mean"``) of the valid elements of each action (last dim), as ``[..., 1]``."""
    if mask is not None:
        x = torch.where(mask.bool(), x, torch.zeros_like(x))  # a masked-out NaN must not reach the sum
    total = x.sum(-1, keepdim=True)
    if how == "sum":
        return total
    count = x.shape[-1] if mask is None else mask.bool().sum(-1, keepdim=True).clamp_min(1).to(x.dtype)
    return total / count


# --loss-agg modes, each named for what a response's per-token terms are divided by.
LOSS_AGGREGATIONS = ("global-token-mean", "minibatch-token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# Earlier names, still accepted: "token-mean" normalised inside each micro-batch (TRL's "bnpo").
LOSS_AGGREGATION_ALIASES = {"token-mean": "minibatch-token-mean"}


def loss_aggregation(mode: str) -> str:
    """The mode ``mode`` names (an alias resolved); ValueError naming the valid ones."""
    mode = LOSS_AGGREGATION_ALIASES.get(mode, mode)
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss aggregation '{mode}': valid {', '.join(LOSS_AGGREGATIONS + tuple(LOSS_AGGREGATION_ALIASES))}")
    return mode


@dataclass(frozen=True)
class StepCounts:
    """What ``global-token-mean`` divides a micro-batch's sums by: the real tokens (and actions) of the whole
    optimiser step the micro-batch belongs to, over every accumulation step and every rank, divided by
    (accumulation steps x ranks), since DeepSpeed averages the micro-batches' gradients over both. The trainer
    counts them from the super-batch before its micro-batches run (``actors/trainer.py``)."""

    tokens: float
    actions: float


def optimiser_step_counts(real: Tensor, order: Tensor, micro_batch: int, accumulation_steps: int, ranks: int,
                          group: Optional["dist.ProcessGroup"] = None) -> list[StepCounts]:
    """``StepCounts`` of each optimiser step of one pass: ``real`` ``[N, ...]`` marks the real elements of the N rows
    (actions ``[N, A]``, or segments ``[N, T, A]``), ``order`` is the pass's row order, cut into micro-batches of
    ``micro_batch`` rows, ``accumulation_steps`` per optimiser step. The counts are summed over every rank (an
    all-reduce that each rank makes, once, before its micro-batches) and divided by accumulation steps x ranks."""
    rows = real.shape[0]
    flat = real.reshape(rows, -1, real.shape[-1]).bool()
    per_row = torch.stack([flat.sum((1, 2)), flat.any(-1).sum(-1)], dim=1).to(torch.float64)  # tokens, actions
    totals = per_row[order].reshape(-1, micro_batch * accumulation_steps, 2).sum(1)  # [optimiser steps, 2]
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=group)
    shares = (totals / (accumulation_steps * ranks)).clamp_min(1e-12).tolist()  # an all-padding step divides by ~0
    return [StepCounts(tokens, actions) for tokens, actions in shares]


def aggregate(x: Tensor, mask: Optional[Tensor], mode: str = "minibatch-token-mean",
              divisor: Optional[float] = None) -> Tensor:
    """One scalar from per-element terms ``x`` ``[B, T]`` of variable-length actions (``mask``: the real
    elements). Each mode is named for what it divides by:

    - ``global-token-mean`` (verl's and DAPO's token mean): the sum over the micro-batch's real tokens divided by
      ``divisor`` (``StepCounts``), so that after DeepSpeed's average over accumulation steps and ranks every
      real token of the optimiser step weighs the same, however the tokens fall into micro-batches;
    - ``minibatch-token-mean`` (``token-mean`` before; TRL's ``bnpo``): divided by the micro-batch's own real
      tokens, so a token of a micro-batch of short responses weighs more than one of long responses;
    - ``seq-mean-token-mean``: each sequence's token mean, then the mean over sequences (every response
      weighs the same);
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): each sequence's token sum divided by the constant T, then the
      mean, which removes the length bias of dividing by a response's own length.

    Without a mask every element is real (and micro-batches of equal size make both token means one)."""
    mode = loss_aggregation(mode)
    if mode == "global-token-mean" and mask is not None:
        if divisor is None:
            raise ValueError("loss aggregation 'global-token-mean' needs the optimiser step's token count (StepCounts, "
                             "which the trainer computes); use 'minibatch-token-mean' outside the trainer")
        return torch.where(mask.bool(), x, torch.zeros_like(x)).sum() / divisor
    if mask is None:
        mask = torch.ones_like(x, dtype=torch.bool)
    if x.dim() < 2 or mode in ("global-token-mean", "minibatch-token-mean"):
        # A masked-out NaN must not reach the sum.
        return masked_mean(torch.where(mask.bool(), x, torch.zeros_like(x)), mask)
    if mode == "seq-mean-token-mean":
        return per_action(x, mask, "mean").mean()
    return (per_action(x, mask, "sum") / x.shape[-1]).mean()
