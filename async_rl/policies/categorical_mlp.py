"""MLP actor-critic over a discrete action space: the per-step CompilerGym baseline.

Observations are CompilerGym dicts; the preprocessor reads their ``features`` vector (normalised
Autophase, sizes, steps left and action history, built by the env). The policy is a Categorical over ``obs_spec["num_actions"]`` passes; the
action is the pass index, shaped ``[B, 1]`` like its log-prob and entropy. Where the observation
carries ``action_mask`` (the env's ``mask_noops``), passes it rules out are never sampled nor chosen.
"""
from __future__ import annotations

from typing import Sequence

import pydantic
import torch
from tensordict import TensorDict
from torch import nn

from async_rl.algo import categorical_entropy
from async_rl.policies import register_policy
from async_rl.policies.base import ActorCritic, ObsSpec
from async_rl.policies.features import AutophasePreprocessor, feature_dim
from async_rl.policies.nets import cast_inputs, mlp
from async_rl.validation import ConfigSection

MASKED_LOGIT = -1e9


class CategoricalMLPOptions(ConfigSection):
    """The categorical MLP policy's options."""

    hidden_sizes: list[pydantic.PositiveInt] = [128, 128]
    """widths of the hidden layers of the policy and value MLPs"""


class CategoricalMLPActorCritic(ActorCritic):
    """Separate policy (logits) and value MLPs over the normalised features."""

    def __init__(self, obs_spec: ObsSpec, action_dim: int = 1, hidden_sizes: Sequence[int] = (128, 128)) -> None:
        super().__init__()
        if action_dim != 1:
            raise ValueError(f"a categorical policy picks one action per step, got action_dim={action_dim}")
        n_in, n_actions = feature_dim(obs_spec), int(obs_spec["num_actions"])
        self.policy_net = mlp([n_in, *hidden_sizes, n_actions], out_gain=0.01)
        self.value_net = mlp([n_in, *hidden_sizes, 1], out_gain=1.0)

    def _logits(self, obs: TensorDict) -> torch.Tensor:
        logits = self.policy_net(cast_inputs(obs["features"], self)).float()
        if "action_mask" in obs.keys():  # passes the env rules out get probability 0 (finite: no NaN in entropy)
            logits = logits.masked_fill(~obs["action_mask"].bool(), MASKED_LOGIT)
        return logits

    def act(self, obs: TensorDict, deterministic: bool | torch.Tensor = False) -> TensorDict:
        logits = self._logits(obs)
        sample = torch.distributions.Categorical(logits=logits).sample()
        greedy = torch.as_tensor(deterministic, device=logits.device).reshape(-1)
        action = torch.where(greedy, logits.argmax(-1), sample).unsqueeze(-1)
        logp = torch.log_softmax(logits, -1).gather(-1, action)
        return TensorDict({"action": action, "env_action": action, "logp": logp, "value": self.value(obs),
                           "logits": logits}, batch_size=logits.shape[:1])

    def evaluate(self, obs: TensorDict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self._logits(obs)
        logp = torch.log_softmax(logits, -1).gather(-1, action.long().reshape(-1, 1))
        return logp, categorical_entropy(logits).reshape(-1, 1), self.value(obs)

    def value(self, obs: TensorDict) -> torch.Tensor:
        return self.value_net(cast_inputs(obs["features"], self)).squeeze(-1).float()

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value_net.parameters())


register_policy("categorical_mlp", preprocessor=AutophasePreprocessor, options=CategoricalMLPOptions)(CategoricalMLPActorCritic)
