"""Behaviour cloning: the loss of supervised fine-tuning on demonstrations.

Maximum likelihood of the demonstrated actions under the policy's own ``evaluate`` (an action-token
head learns its token distribution with no head-specific code), or, for a Gaussian head, regression
of its mean onto the demonstrated action (``gaussian_mean_loss``): with a learned spread the
likelihood of saturated, noisy labels lets the log-std absorb the error instead of the mean
learning it (measured: the mean stayed at a third of the label), and it spiked as the spread shrank.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from tensordict import TensorDict

Tensor = torch.Tensor


def behaviour_cloning_loss(evaluate: Callable[[TensorDict, Tensor], tuple[Tensor, Tensor, Any]], obs: TensorDict,
                           action: Tensor) -> tuple[Tensor, dict[str, float]]:
    """(mean negative log-likelihood of ``action`` per sample, its logged terms). ``evaluate(obs,
    action)`` returns (log-prob per action element ``[B, ...]``, entropy, value), as a policy's does."""
    logp, entropy, _ = evaluate(obs, action)
    nll = -logp.reshape(logp.shape[0], -1).sum(-1).mean()
    return nll, {"bc/loss": float(nll.detach()), "bc/entropy": float(entropy.detach().float().mean())}


def gaussian_mean_loss(mean_action: Tensor, action: Tensor) -> tuple[Tensor, dict[str, float]]:
    """(squared error of the policy's mean action against the demonstrated one, summed over the
    action's elements and averaged over samples, its logged terms); both in the policy's action space."""
    error = (mean_action.float() - action.float()) ** 2
    loss = error.reshape(error.shape[0], -1).sum(-1).mean()
    return loss, {"bc/loss": float(loss.detach()), "bc/mean_abs_error": float(error.detach().sqrt().mean())}
