"""Worker-side observation features shared by several policies (no model weights here).

- ``StatePreprocessor``: a flat float32 state vector (MetaWorld).
- ``compiler_features`` / ``AutophasePreprocessor``: CompilerGym's Autophase vector normalised by
  the program's instruction count, plus the log count and the episode's progress (read by the
  categorical MLP and by the Passformer's feature token).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from async_rl.policies.base import ObsSpec

EXTRA_FEATURES = 2  # log instruction count, episode progress


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
    """Autophase / instruction count, log1p(count) / 10 and step / max_steps, float32."""
    autophase = np.asarray(obs["autophase"], dtype=np.float32)
    if autophase.shape != (int(obs_spec["autophase_dim"]),):
        raise ValueError(f"Autophase of shape {autophase.shape}, expected ({obs_spec['autophase_dim']},)")
    count = float(obs["ir_count"])
    progress = float(obs.get("step", 0.0)) / max(float(obs_spec.get("max_steps", 1)), 1.0)
    extra = np.array([np.log1p(count) / 10.0, progress], dtype=np.float32)
    return torch.from_numpy(np.concatenate([autophase / max(count, 1.0), extra]))


def feature_dim(obs_spec: ObsSpec) -> int:
    """Length of ``compiler_features`` for this env."""
    return int(obs_spec["autophase_dim"]) + EXTRA_FEATURES


class AutophasePreprocessor:
    """CompilerGym observation -> ``{"features": float32 [autophase_dim + 2]}``."""

    def __init__(self, obs_spec: ObsSpec, **_policy_kwargs: Any) -> None:
        self.obs_spec = dict(obs_spec)

    def __call__(self, obs: Any, task_name: str) -> TensorDict:
        return TensorDict({"features": compiler_features(obs, self.obs_spec)}, batch_size=[])
