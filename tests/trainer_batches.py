"""Hand-made super-batches for tests that drive real trainer ranks: step records of a small MLP policy
(MetaWorld-shaped observations) near its current weights."""
from __future__ import annotations

from typing import Sequence

import torch
from tensordict import TensorDict

from async_rl.policies import build_policy

SPEC, ACTIONS, N = {"state_dim": 39}, 4, 8


def mlp_step_records(weights: dict[str, torch.Tensor], seed: int, logp_shift: float = 0.05,
                     nan_rows: Sequence[int] = ()) -> TensorDict:
    """N step records whose behaviour log-probs are the policy's (``weights``) minus ``logp_shift``;
    ``nan_rows``: rows whose advantage is non-finite (a minibatch the objective skips)."""
    g = torch.Generator().manual_seed(seed)
    policy = build_policy("mlp", SPEC, ACTIONS)
    policy.load_state_dict(weights)
    obs = TensorDict({"state": torch.randn(N, 39, generator=g)}, [N])
    action = torch.tanh(torch.randn(N, ACTIONS, generator=g))
    with torch.no_grad():
        logp = policy.evaluate(obs, action)[0]
    advantage = torch.randn(N, generator=g)
    advantage[list(nan_rows)] = float("nan")
    return TensorDict({"obs": obs, "action": action, "logp": logp - logp_shift, "value": torch.zeros(N),
                       "value_target": torch.randn(N, generator=g), "advantage": advantage,
                       "reward": torch.zeros(N), "done": torch.zeros(N, dtype=torch.bool),
                       "policy_version": torch.zeros(N, dtype=torch.int64)}, [N])


def random_step_records() -> TensorDict:
    """N step records of random numbers (fixed seed): data for a trainer epoch whose values do not matter."""
    g = torch.Generator().manual_seed(0)
    return TensorDict({"obs": TensorDict({"state": torch.randn(N, 39, generator=g)}, [N]),
                       "action": torch.tanh(torch.randn(N, ACTIONS, generator=g)),
                       "logp": torch.randn(N, generator=g) - 3.0, "value": torch.zeros(N),
                       "value_target": torch.randn(N, generator=g), "advantage": torch.randn(N, generator=g),
                       "reward": torch.zeros(N), "done": torch.zeros(N, dtype=torch.bool),
                       "policy_version": torch.zeros(N, dtype=torch.int64)}, [N])
