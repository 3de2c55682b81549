"""Network building blocks shared by the policies, and their mixed-precision rules.

Precision: a policy's weights may be bf16 (``precision: bf16``, or ``auto`` on CUDA): the
inference actor casts its copy, DeepSpeed casts the trainer's. Inputs are therefore cast to
the weights' dtype on the way in (``cast_inputs``) and every statistic a policy returns
(log-probs, entropies, values, distribution parameters) is computed and returned in float32
(``.float()`` on the head's output, which keeps gradients), so losses, advantages and the
wire never see bf16.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn


def check_log_std_range(min_log_std: float, max_log_std: float) -> None:
    """A Gaussian head's log-std clamp is a range. (An initial or loaded log-std outside it is allowed: the clamp
    then holds the std at its bound, which configs use to cap exploration noise.)"""
    if min_log_std > max_log_std:
        raise ValueError(f"min_log_std {min_log_std} > max_log_std {max_log_std}; the log-std is clamped to "
                         "[min_log_std, max_log_std]: set min_log_std at most max_log_std")


def mlp(sizes: Sequence[int], out_gain: float) -> nn.Sequential:
    """Tanh MLP ``sizes[0] -> ... -> sizes[-1]``: orthogonal init (gain sqrt 2, ``out_gain`` on the
    last layer), zero biases, no activation after the last layer."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = nn.Linear(n_in, n_out)
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, gain=out_gain if last else np.sqrt(2.0))
        nn.init.zeros_(linear.bias)
        layers += [linear] if last else [linear, nn.Tanh()]
    return nn.Sequential(*layers)


def weight_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of ``module``'s first floating-point parameter (float32 if it has none)."""
    for param in module.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def cast_inputs(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """A floating-point input in ``module``'s weight dtype (integer inputs, e.g. token ids, unchanged)."""
    return x.to(weight_dtype(module)) if x.is_floating_point() else x



def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``module`` with its floating-point parameters in ``dtype`` and its buffers untouched, as
    DeepSpeed casts a bf16 model (float32 buffers such as rotary ``inv_freq`` or BART's
    ``final_logits_bias`` stay float32): an inference copy cast this way matches the trainers'."""
    for param in module.parameters():
        if param.is_floating_point():
            param.data = param.data.to(dtype)
    return module
