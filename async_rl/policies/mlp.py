"""MLP actor-critic with a tanh-squashed Gaussian policy (as in the original ds_libero_ppo.py framework)."""
from __future__ import annotations

from typing import Any, Sequence

import pydantic
import torch
from tensordict import TensorDict
from torch import nn

from async_rl.algo import tanh_gaussian_entropy, tanh_gaussian_log_prob
from async_rl.policies import register_policy
from async_rl.policies.base import ActorCritic, ObsSpec
from async_rl.policies.categorical_mlp import CategoricalMLPActorCritic
from async_rl.policies.features import AutophasePreprocessor, StatePreprocessor
from async_rl.policies.nets import cast_inputs, check_log_std_range, mlp
from async_rl.validation import ConfigSection


class MLPActorCritic(ActorCritic):
    """Separate policy and value MLPs; the policy outputs a mean and a state-independent log-std."""

    def __init__(
        self,
        obs_spec: ObsSpec,
        action_dim: int,
        hidden_sizes: Sequence[int] = (256, 256),
        init_log_std: float = -0.5,
        min_log_std: float = -5.0,
        max_log_std: float = 1.0,
    ) -> None:
        super().__init__()
        state_dim = int(obs_spec["state_dim"])
        self.policy_net = mlp([state_dim, *hidden_sizes, action_dim], out_gain=0.01)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))
        self.value_net = mlp([state_dim, *hidden_sizes, 1], out_gain=1.0)
        self.min_log_std, self.max_log_std = min_log_std, max_log_std

    def _dist(self, obs: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        mu = self.policy_net(cast_inputs(obs["state"], self)).float()
        log_std = self.log_std.float().clamp(self.min_log_std, self.max_log_std).expand_as(mu)
        return mu, log_std

    def act(self, obs: TensorDict, deterministic: bool | torch.Tensor = False) -> TensorDict:
        mu, log_std = self._dist(obs)
        sample = mu + torch.exp(log_std) * torch.randn_like(mu)
        pre_tanh = torch.where(torch.as_tensor(deterministic, device=mu.device).reshape(-1, 1), mu, sample)
        action = torch.tanh(pre_tanh)
        value = self.value(obs)
        return TensorDict(
            {
                "action": action,
                "env_action": action,
                "logp": tanh_gaussian_log_prob(mu, log_std, action),
                "value": value,
                "mu": mu,
                "log_std": log_std,
            },
            batch_size=mu.shape[:1],
        )

    def evaluate(self, obs: TensorDict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, log_std = self._dist(obs)
        value = self.value(obs)
        return tanh_gaussian_log_prob(mu, log_std, action), tanh_gaussian_entropy(mu, log_std), value

    def value(self, obs: TensorDict) -> torch.Tensor:
        return self.value_net(cast_inputs(obs["state"], self)).squeeze(-1).float()

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value_net.parameters())


class MLPOptions(ConfigSection):
    """The MLP policy's options (on an env with discrete actions only hidden_sizes applies)."""

    hidden_sizes: list[pydantic.PositiveInt] = [256, 256]
    """widths of the hidden layers of the policy and value MLPs (discrete actions: 128, 128 unless given)"""
    init_log_std: float = -0.5
    """the Gaussian's initial log standard deviation (state-independent, trained)"""
    min_log_std: float = -5.0
    """the log-std is clamped to [min_log_std, max_log_std]"""
    max_log_std: float = 1.0
    """the upper bound of the clamped log-std"""

    @pydantic.model_validator(mode="after")
    def _log_std_range(self) -> "MLPOptions":
        check_log_std_range(self.min_log_std, self.max_log_std)
        return self


def _mlp_policy(obs_spec: ObsSpec, action_dim: int, **kwargs: Any) -> ActorCritic:
    """``mlp``: tanh-Gaussian for continuous actions; Categorical where the env declares ``num_actions``."""
    if "num_actions" in obs_spec:
        return CategoricalMLPActorCritic(obs_spec, action_dim, **kwargs)
    return MLPActorCritic(obs_spec, action_dim, **kwargs)


def _mlp_preprocessor(obs_spec: ObsSpec, **_policy_kwargs: Any) -> Any:
    if "num_actions" in obs_spec:
        return AutophasePreprocessor(obs_spec)
    return StatePreprocessor(obs_spec)


register_policy("mlp", preprocessor=_mlp_preprocessor, options=MLPOptions)(_mlp_policy)
