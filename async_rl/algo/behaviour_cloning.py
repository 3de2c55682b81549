"""Behaviour cloning: the loss of supervised fine-tuning on demonstrations.

Maximum likelihood of the demonstrated actions under the policy's own ``evaluate`` (an action-token
head learns its token distribution with no head-specific code), or, for a Gaussian head, regression
of its mean onto the demonstrated action and a likelihood that trains only the spread
(``gaussian_bc_loss``): with mean and spread learned together, the likelihood of saturated, noisy
labels let the log-std absorb the error instead of the mean learning it (measured: the mean stayed
at a third of the label), and it spiked as the spread shrank.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from tensordict import TensorDict

from async_rl.algo.functional import tanh_gaussian_log_prob

Tensor = torch.Tensor


def behaviour_cloning_loss(evaluate: Callable[[TensorDict, Tensor], tuple[Tensor, Tensor, Any]], obs: TensorDict,
                           action: Tensor) -> tuple[Tensor, dict[str, float]]:
    """(mean negative log-likelihood of ``action`` per sample, its logged terms). ``evaluate(obs,
    action)`` returns (log-prob per action element ``[B, ...]``, entropy, value), as a policy's does."""
    logp, entropy, _ = evaluate(obs, action)
    nll = -logp.reshape(logp.shape[0], -1).sum(-1).mean()
    return nll, {"bc/loss": float(nll.detach()), "bc/entropy": float(entropy.detach().float().mean())}


def token_cloning_loss(evaluate: Callable[[TensorDict, Tensor], tuple[Tensor, Tensor, Any]], obs: TensorDict,
                       action: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, float]]:
    """Supervised fine-tuning of a language model: the mean negative log-likelihood of the demonstrated
    response tokens (``mask`` marks them), every token of the minibatch weighted alike, as usual for SFT
    (a per-sample sum would weight long responses more)."""
    logp, entropy, _ = evaluate(obs, action)
    mask = mask.to(logp.dtype)
    tokens = mask.sum().clamp_min(1.0)
    nll = -(logp * mask).sum() / tokens
    return nll, {"bc/loss": float(nll.detach()), "bc/entropy": float((entropy.detach() * mask).sum() / tokens),
                 "bc/tokens": float(tokens)}


def gaussian_bc_loss(mu: Tensor, log_std: Tensor, action: Tensor, tanh_limit: float = 0.97) -> tuple[Tensor, dict[str, float]]:
    """Behaviour cloning of a tanh-Gaussian head: the squared error of its mean action ``tanh(mu)``
    against the demonstrated ``action`` (in [-1, 1]), plus the likelihood of the action under the
    spread with the mean held fixed (and, at the caller, the features the spread reads: the log-std's
    error gradients, large as the spread shrinks, measurably worsened the mean through them when shared),
    so that the log-std learns the remaining error per element
    (the exploration an RL run then starts from: small where the demonstrations are consistent, as
    for a gripper that must not open mid-carry) without pulling the mean. Summed over the action's
    elements, averaged over samples; the loss is the sum of both."""
    error = (torch.tanh(mu.float()) - action.float()) ** 2
    mean_loss = error.reshape(error.shape[0], -1).sum(-1).mean()
    target = action.float().clamp(-tanh_limit, tanh_limit)  # tanh's density is 0 at +-1
    spread_nll = -tanh_gaussian_log_prob(mu.detach(), log_std, target).reshape(mu.shape[0], -1).sum(-1).mean()
    return mean_loss + spread_nll, {"bc/loss": float(mean_loss.detach()), "bc/spread_nll": float(spread_nll.detach()),
                                    "bc/mean_abs_error": float(error.detach().sqrt().mean()),
                                    "bc/std": float(log_std.detach().float().exp().mean())}
