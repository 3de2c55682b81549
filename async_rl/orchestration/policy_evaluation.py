"""A supervised or RL-trained policy in one process without Ray, for measures outside a run: an export's or a
checkpoint's policy (``load_policy``) and its ``act`` callable (``local_act``), which the env's episode loops
take (``launch/eval_libero.py`` scores held-out initial states with ``envs.libero_evaluation``)."""
from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from async_rl import checkpoint as ckpt
from async_rl.actors.trainer_setup import training_model
from async_rl.algo import advantage_estimator
from async_rl.errors import ConfigError
from async_rl.orchestration.runtime import critic_free, obs_spec_of
from async_rl.policies import build_policy, build_preprocessor
from async_rl.policies.initial_weights import with_initial_weights

if TYPE_CHECKING:
    from async_rl.config.schema import PolicySection
    from envs.base import TaskSet


def load_policy(cfg: PolicySection, task_set: TaskSet, init_from: Optional[str] = None,
                checkpoint: Optional[str] = None) -> tuple[Any, Any]:
    """(policy in eval mode, preprocessor) of ``cfg``'s policy: with an export's weights, or an RL run's
    newest checkpoint (rebuilt as its trainers built it, from the run's own config), or as built."""
    obs_spec = obs_spec_of(task_set)
    if checkpoint is not None:
        policy = checkpoint_policy(checkpoint, obs_spec, task_set.action_dim, init_from)
    else:
        policy = with_initial_weights(
            functools.partial(build_policy, cfg.policy, obs_spec, task_set.action_dim, **cfg.policy_kwargs), init_from)()
    return policy.eval().requires_grad_(False), build_preprocessor(cfg.policy, obs_spec, **cfg.policy_kwargs)


def checkpoint_policy(path: str, obs_spec: Any, action_dim: int, init_from: Optional[str] = None) -> Any:
    """An RL run's trained policy from its checkpoint (its LoRA adapters, if any, stay on). The weights
    under the adapters come from the export the run started from: the run's ``init_from`` (an absolute
    path when it ran), or ``init_from`` here where that export has moved."""
    directory = ckpt.resolve_checkpoint(path)
    config = ckpt.read_meta(directory)["config"]
    base = init_from or config.get("init_from")
    if base and not Path(base).exists():
        raise ConfigError(f"{path}: the run started from the export {base}, which is no longer there; pass "
                          f"--init-from with where it is now")
    factory = with_initial_weights(functools.partial(build_policy, config["policy"], obs_spec, action_dim,
                                                     **config["policy_kwargs"]), base)
    if not advantage_estimator(config["advantage"]).needs_critic:  # as the run's trainers built it
        factory = functools.partial(critic_free, factory)
    model = training_model(SimpleNamespace(**config), factory)  # type: ignore[arg-type]  # the saved config: a PolicySection's keys
    ckpt.load_model(model, directory)
    return model


def local_act(policy: Any) -> Callable[[Any, bool], Any]:
    """``policy`` (in this process) as the ``act`` callable the episode loops and final evaluations take:
    observations [B] -> the environment's actions [B, A] as float32 numpy."""
    @torch.inference_mode()
    def act(obs: Any, deterministic: bool) -> Any:
        return policy.act(obs, deterministic)["env_action"].float().numpy()
    return act
