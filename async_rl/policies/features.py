"""Worker-side observation features shared by several policies (no model weights here).

- ``StatePreprocessor``: a flat float32 state vector (MetaWorld).
- ``compiler_features`` / ``AutophasePreprocessor``: CompilerGym's feature vector (normalised
  Autophase, sizes, steps left, action history; built by the env, ``envs/compilergym/features.py``),
  read by the categorical MLP and by the Passformer's feature token.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from async_rl.policies.base import ObsSpec


class StatePreprocessor:
    """Float32 state vector as ``{"state": tensor}``."""

    def __init__(self, obs_spec: ObsSpec, **_policy_kwargs: Any) -> None:
        self.state_dim = int(obs_spec["state_dim"])

    def __call__(self, obs: Any, task_name: str) -> TensorDict:
        state = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        if state.shape != (self.state_dim,):
            raise ValueError(f"observation of shape {tuple(state.shape)} from task {task_name}, expected ({self.state_dim},)")
        return TensorDict({"state": state}, batch_size=[])


def compiler_features(obs: Any, obs_spec: ObsSpec) -> torch.Tensor:
    """The env's ``features`` vector as float32, checked against ``obs_spec["feature_dim"]``."""
    features = np.asarray(obs["features"], dtype=np.float32)
    if features.shape != (feature_dim(obs_spec),):
        raise ValueError(f"CompilerGym features of shape {features.shape}, expected ({feature_dim(obs_spec)},)")
    return torch.from_numpy(features)


def feature_dim(obs_spec: ObsSpec) -> int:
    """Length of ``compiler_features`` for this env."""
    return int(obs_spec["feature_dim"])


class AutophasePreprocessor:
    """CompilerGym observation -> ``{"features": float32 [feature_dim]}``, plus ``action_mask`` (bool
    per pass, True = allowed) where the env declares one (``obs_spec["action_mask"]``)."""

    def __init__(self, obs_spec: ObsSpec, **_policy_kwargs: Any) -> None:
        self.obs_spec = dict(obs_spec)
        self.masked = bool(self.obs_spec.get("action_mask", False))

    def __call__(self, obs: Any, task_name: str) -> TensorDict:
        out = {"features": compiler_features(obs, self.obs_spec)}
        if self.masked:
            out["action_mask"] = torch.as_tensor(np.asarray(obs["action_mask"], dtype=bool))
        return TensorDict(out, batch_size=[])
