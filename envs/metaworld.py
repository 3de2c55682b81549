"""MetaWorld MT1 / MT10 / MT50 (state observations; frames rendered only for episode videos).

The benchmark object (``metaworld.MT10()`` etc.) is built once, in the driver, by
``metaworld_task_set``; the resulting ``MetaWorldTaskSet`` keeps only plain data (task names and
each task's pickled goal data), so it pickles small and fast and unpickles without importing
metaworld. A task index is one environment class (e.g. ``reach-v3``); every ``reset`` of an env
samples one of that class's goal variations with the env's own seeded RNG.

``metaworld`` is imported lazily (in the factory and in ``make_env``) so that ``import envs``
never needs it.
"""
from __future__ import annotations

import difflib
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

import numpy as np
import pydantic

from async_rl.errors import ConfigError
from async_rl.validation import ConfigSection
from envs import register_env

OBS_DIM = 39
ACTION_DIM = 4
BENCHMARKS = ("MT1", "MT10", "MT50")
_DEFAULT_TASK = "reach-v3"
_INSTALL_HINT = "run: pip install -e '.[metaworld]'"


def _import_metaworld() -> Any:
    # Headless rendering for episode videos (render_frame): mujoco picks its GL backend when it is
    # first imported, so it must be set before; a state-only env never creates a renderer.
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    try:
        import metaworld  # optional dependency, imported lazily on purpose
    except ImportError as exc:
        raise ConfigError(f"MetaWorld is not installed ({exc}); {_INSTALL_HINT}") from None
    return metaworld


class MetaWorldOptions(ConfigSection):
    """MetaWorld's multi-task benchmarks, state observations."""

    benchmark: Literal[BENCHMARKS] = "MT1"  # type: ignore[valid-type]  # a Literal of a constant's values: pydantic reads them, mypy does not
    """MT1 (one task, named by task), MT10 or MT50 (task left at its default or null)"""
    task: Optional[str] = _DEFAULT_TASK
    """MT1's task, e.g. reach-v3, push-v3"""
    seed: int = 0
    """seeds MetaWorld's goal generation (the 50 goal variations per task)"""
    max_episode_steps: pydantic.PositiveInt = 500
    """episodes are truncated after this many steps (MetaWorld's own limit is 500; larger values lift it)"""
    reward_scale: float = 1.0
    """multiplies every reward"""

    @pydantic.field_validator("benchmark", mode="before")
    @classmethod
    def _upper_case(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @pydantic.model_validator(mode="after")
    def _task_fits_benchmark(self) -> "MetaWorldOptions":
        if self.benchmark != "MT1" and self.task not in (None, _DEFAULT_TASK):
            raise ValueError(f"metaworld task '{self.task}' only applies to benchmark MT1, not {self.benchmark}; "
                             "use benchmark: MT1 or set task: null")
        if self.benchmark == "MT1" and self.task is None:
            raise ValueError(f"metaworld benchmark MT1 needs a task, e.g. task: {_DEFAULT_TASK}")
        return self


@register_env("metaworld", options=MetaWorldOptions)
def metaworld_task_set(options: MetaWorldOptions) -> MetaWorldTaskSet:
    """Build a MetaWorld TaskSet (the benchmark object is built here, once; the task set keeps plain data)."""
    bench, task, seed = options.benchmark, options.task, options.seed
    metaworld = _import_metaworld()
    if bench == "MT1":
        valid = metaworld.env_dict.ALL_V3_ENVIRONMENTS
        if task not in valid:
            close = difflib.get_close_matches(str(task), list(valid), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown MetaWorld task '{task}'{hint}; valid tasks: {', '.join(sorted(valid))}")
        bm = metaworld.MT1(task, seed=seed)
    elif bench == "MT10":
        bm = metaworld.MT10(seed=seed)
    else:
        bm = metaworld.MT50(seed=seed)

    task_names = list(bm.train_classes.keys())
    by_name: dict[str, list[bytes]] = {name: [] for name in task_names}
    for t in bm.train_tasks:
        by_name[t.env_name].append(t.data)
    return MetaWorldTaskSet(options, task_names, [by_name[name] for name in task_names])


@dataclass
class MetaWorldTaskSet:
    """Picklable MetaWorld TaskSet: plain data only (no env classes, no benchmark object); the options it was
    built from, and the goal data they chose."""

    options: MetaWorldOptions
    task_names: list[str]
    task_data: list[list[bytes]]  # task_data[i]: the pickled goal variations of task_names[i]
    obs_dim: int = field(default=OBS_DIM)
    action_dim: int = field(default=ACTION_DIM)
    success_rule: ClassVar[str] = "any"  # a task once solved counts (MetaWorld's success is per step)

    def __len__(self) -> int:
        return len(self.task_names)

    @property
    def max_episode_steps(self) -> int:
        return self.options.max_episode_steps

    def make_env(self, task_index: int, seed: int) -> MetaWorldTaskEnv:
        if not 0 <= task_index < len(self.task_names):
            raise IndexError(f"task_index {task_index} out of range for {len(self.task_names)} MetaWorld tasks")
        return MetaWorldTaskEnv(
            task_name=self.task_names[task_index],
            task_data=self.task_data[task_index],
            seed=seed,
            max_episode_steps=self.max_episode_steps,
            reward_scale=self.options.reward_scale,
        )


class MetaWorldTaskEnv:
    """One MetaWorld env for one task; samples a goal variation per reset; state obs only."""

    def __init__(
        self,
        task_name: str,
        task_data: list[bytes],
        seed: int,
        max_episode_steps: int,
        reward_scale: float = 1.0,
    ) -> None:
        metaworld = _import_metaworld()
        from metaworld.types import Task

        self.task_name = task_name
        self.max_episode_steps = int(max_episode_steps)
        self.reward_scale = float(reward_scale)
        self._tasks = [Task(env_name=task_name, data=d) for d in task_data]
        self._rng = np.random.default_rng(seed)
        env_cls = metaworld.env_dict.ALL_V3_ENVIRONMENTS[task_name]
        self._env = env_cls(render_mode=None)  # state only: no renderer is ever created
        # MetaWorld raises on steps past its own max_path_length (500); make its limit ours.
        self._env.max_path_length = self.max_episode_steps
        self._env.set_task(self._tasks[0])  # seed() needs the task's spaces
        self._env.seed(int(seed) % 2**32)
        self._t = 0
        self._needs_reset = True
        self.goal_index = -1
        self._renderer: Any = None

    def render_frame(self, size: int = 128) -> np.ndarray:
        """The scene from the 'corner2' camera as uint8 [size, size, 3] (episode videos). The renderer
        is made on first use with MSAA, shadows and reflections off: ~10 ms a frame on llvmpipe."""
        import mujoco

        if self._renderer is None:
            self._env.model.vis.quality.offsamples = 0
            self._renderer = mujoco.Renderer(self._env.model, size, size)
            self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
            # Freed at interpreter exit while EGL still works (a later __del__ prints EGL errors).
            self._free_renderer = weakref.finalize(self, self._renderer.close)
        self._renderer.update_scene(self._env.data, camera="corner2")
        return np.ascontiguousarray(self._renderer.render()[::-1])  # the GL image is bottom-up

    def reset(self, start: Optional[int] = None) -> np.ndarray:
        """A goal variation drawn by the env's RNG; with ``start`` (group rollouts), variation ``start``
        modulo their number and the env seeded with ``start``: the same start, the same initial state."""
        self.goal_index = int(self._rng.integers(len(self._tasks))) if start is None else start % len(self._tasks)
        self._env.set_task(self._tasks[self.goal_index])
        obs, _ = self._env.reset(seed=None if start is None else int(start))
        self._t = 0
        self._needs_reset = False
        return np.asarray(obs, dtype=np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError(f"MetaWorld env '{self.task_name}': call reset() before step() (episode ended)")
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0)
        if a.shape != (ACTION_DIM,):
            raise ValueError(f"MetaWorld action must have {ACTION_DIM} values, got shape {np.shape(action)}")
        obs, reward, terminated, truncated, info = self._env.step(a)
        self._t += 1
        truncated = bool(truncated) or self._t >= self.max_episode_steps
        terminated = bool(terminated)
        info = dict(info)
        info["success"] = bool(info.get("success", 0.0) > 0.5)
        if terminated or truncated:
            self._needs_reset = True
        return np.asarray(obs, dtype=np.float32), float(reward) * self.reward_scale, terminated, truncated, info

    def close(self) -> None:
        if self._renderer is not None:
            self._free_renderer()
            self._renderer = None
        self._env.close()
