"""Behaviour cloning as maximum likelihood: the loss of supervised fine-tuning on demonstrations.

The policy's own ``evaluate`` scores the demonstrated actions, so the Gaussian head learns its mean
and its spread (the log-std settles at the residual error, which is the exploration RL then starts
from) and the action-token head its token distribution, with no head-specific loss.
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
    terms = {"bc/nll": float(nll.detach()), "bc/entropy": float(entropy.detach().float().mean())}
    return nll, terms
