"""Success rate of a policy on chosen initial states of a LIBERO-style env, in one process without Ray:
the measure of a supervised or RL-trained policy on held-out initial states (``launch/eval_libero.py``)
and of the checks that an exported policy acts as it did in training."""
from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from async_rl.errors import ConfigError
from async_rl.orchestration.runtime import critic_free, obs_spec_of
from async_rl.policies import build_policy, build_preprocessor
from async_rl.policies.initial_weights import with_initial_weights

if TYPE_CHECKING:
    from async_rl.config.schema import PolicySection


def load_policy(cfg: PolicySection, task_set: Any, init_from: Optional[str] = None, checkpoint: Optional[str] = None) -> tuple[Any, Any]:
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
    from types import SimpleNamespace  # noqa: PLC0415

    from async_rl import checkpoint as ckpt  # noqa: PLC0415
    from async_rl.actors.trainer_setup import training_model  # noqa: PLC0415
    from async_rl.algo import advantage_estimator  # noqa: PLC0415

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
    model = training_model(SimpleNamespace(**config), factory)
    ckpt.load_model(model, directory)
    return model


@torch.inference_mode()
def run_episode(env: Any, policy: Any, preprocess: Any, init_state: int, deterministic: bool = True) -> dict[str, Any]:
    """One episode from ``init_state``; (success, steps)."""
    obs = env.reset(init_state=init_state)
    success, steps = False, 0
    while True:
        out = policy.act(preprocess(obs, env.task_name).unsqueeze(0), deterministic)
        obs, _, terminated, truncated, info = env.step(out["env_action"][0].float().numpy())
        steps += 1
        if terminated or truncated:
            success = bool(info.get("success", terminated))
            return {"success": success, "steps": steps}


def success_rates(task_set: Any, policy: Any, preprocess: Any, init_states: Sequence[int], seed: int = 0,
                  progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Deterministic episodes of every task from each of ``init_states``: the mean success, per task
    and per episode."""
    started = time.monotonic()
    per_task: dict[str, float] = {}
    episodes = []
    for task in range(len(task_set)):
        env = task_set.make_env(task, seed)
        try:
            results = []
            for k in init_states:
                result = {"task": env.task_name, "init_state": int(k), **run_episode(env, policy, preprocess, int(k))}
                results.append(result)
                progress(f"{env.task_name} init state {k}: {'success' if result['success'] else 'failure'} "
                         f"in {result['steps']} steps")
        finally:
            env.close()
        per_task[env.task_name] = sum(r["success"] for r in results) / len(results)
        episodes += results
    return {"success_rate": sum(e["success"] for e in episodes) / len(episodes), "per_task": per_task,
            "episodes": episodes, "init_states": [int(k) for k in init_states],
            "wall_seconds": time.monotonic() - started}
