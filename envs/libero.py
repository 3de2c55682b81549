"""LIBERO (libero_spatial / libero_object / libero_goal / libero_10 / libero_90) with camera images.

Observation of every ``reset`` / ``step`` (keys are stable; ``LiberoTaskSet.obs_spec`` describes them)::

    {"agentview":   uint8 [H, W, 3],   # third-person camera, H = W = image_size
     "wrist":       uint8 [H, W, 3],   # eye-in-hand camera
     "proprio":     float32 [8],       # eef position (3), eef axis-angle (3), gripper finger qpos (2)
     "instruction": str}               # the task's language instruction

Images are rotated by 180 degrees against robosuite's raw OpenGL frames, which is what OpenVLA does
(``img[::-1, ::-1]`` in its LIBERO eval) so that pictures are upright and match its training data.
``proprio`` is OpenVLA-OFT's 8-dim LIBERO state. A camera left out of ``cameras`` is absent from the
dict; ``cameras: []`` gives a physics-only env (no renderer is created).

Actions are 7 values in [-1, 1] (clipped): delta eef position (3), delta rotation (3), gripper
(-1 open, +1 close), for LIBERO's OSC_POSE controller. Reward is LIBERO's sparse 1.0 on success
(times ``reward_scale``); an episode terminates on success (the env's own ``_check_success``)
and is truncated after ``max_episode_steps`` policy steps.

Each ``reset`` restores one of the task's fixed initial states (the suite's ``.pruned_init``
file, 50 per task; ``init_states`` may restrict them to a subset, e.g. to hold some out),
cycled from a seed-chosen offset or sampled with the env's seeded RNG, then
lets the scene settle for ``settle_steps`` no-op steps that are not rendered and not part of the
episode (OpenVLA waits 10 steps). Resets never rebuild the scene (robosuite ``hard_reset=False``,
~20x faster than a rebuild): the initial state overwrites the simulator state, the gripper's
smoothed command is zeroed as a rebuild would, and the poses LIBERO re-samples for fixtures
(cabinets, stoves; not in the init-state files) are drawn from a seed of (env seed, init state),
so an episode's start depends only on those two. Several envs may live in one process (a worker's
EnvPool): each makes its own GL context current before it renders or frees its renderer.

Rendering is headless. ``render_backend`` "auto" keeps a ``MUJOCO_GL`` already set in the
environment, else uses EGL (a GPU's EGL where there is one, Mesa's llvmpipe on a CPU); "egl" or
"osmesa" force one. It is applied in ``make_env`` (the rollout worker process) before robosuite
is imported. ``fast_render`` (MSAA off, no shadows, no reflections; ~3x faster in software) is on
by default when the GL renderer is a software one.

The TaskSet is plain data (its options, task indices, names, instructions, paths relative to LIBERO's
bddl / init-state folders) built in the driver without importing robosuite or mujoco; init states
are read lazily in the worker with ``torch.load(weights_only=True)`` (numpy arrays, allow-listed).
LIBERO asks interactively where its data lives unless ``$LIBERO_CONFIG_PATH/config.yaml`` exists,
so ``envs/libero_setup.py`` writes its own config (``ensure_libero_config``) before importing libero,
checks the installation and picks the GL backend. ``LiberoTaskEnv.sim_state()`` is the simulator's
flattened state, which demonstration replays compare.
"""
from __future__ import annotations

import contextlib
import difflib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Optional, Sequence, Union

import numpy as np
import pydantic

from async_rl.errors import ConfigError
from async_rl.validation import ConfigSection, checked_folder
from envs import register_env
from envs.libero_evaluation import held_out_evaluation
from envs.libero_setup import (
    INSTALL_HINT,
    SOFTWARE_GL,
    configure_rendering,
    ensure_libero_config,
    fast_render_settings,
    gl_renderer_name,
    import_benchmark,
    import_libero,
    libero_package_dir,
    switch_to_fast_render,
)

# Episode step limits of OpenVLA's LIBERO eval (openvla/openvla,
# experiments/robot/libero/run_libero_eval.py: "max_steps = 220  # longest training demo has 193
# steps", ...): a little above the longest human demonstration of each suite.
SUITE_MAX_STEPS = {
    "libero_spatial": 220,  # longest demo 193 steps
    "libero_object": 280,  # 254
    "libero_goal": 300,  # 270
    "libero_10": 520,  # 505
    "libero_90": 400,  # 373
}
SUITES = tuple(SUITE_MAX_STEPS)
CAMERAS = {"agentview": "agentview", "wrist": "robot0_eye_in_hand"}  # our key -> robosuite camera
PROPRIO_DIM = 8
ACTION_DIM = 7
RENDER_BACKENDS = ("auto", "egl", "osmesa")
INIT_STATE_ORDERS = ("cycle", "sample")
# OpenVLA's no-op while objects settle: no motion, gripper open.
SETTLE_ACTION = np.array([0.0] * 6 + [-1.0])


# ---- the TaskSet (built in the driver) --------------------------------------------------
TaskSpec = Union[int, str]


def _resolve_tasks(suite: str, all_names: list[str], tasks: Union[str, Sequence[TaskSpec]]) -> list[int]:
    """Task indices of the suite's standard order (``tasks`` as LiberoOptions left it: "all" or a list, no item
    twice); an index past the suite, an unknown name or a task given by index and by name (which the options
    cannot know without the suite) is a one-line ConfigError."""
    if tasks == "all":
        return list(range(len(all_names)))
    indices: list[int] = []
    for item in tasks:
        if item not in range(len(all_names)) and item not in all_names:  # an index past the suite or an unknown name
            close = difflib.get_close_matches(str(item), all_names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown {suite} task {item!r}{hint}; give an index 0..{len(all_names) - 1} or one of "
                              f"its task names")
        index = all_names.index(item) if item in all_names else int(item)
        if index in indices:
            raise ConfigError(f"libero tasks {list(tasks)} give task {index} ({all_names[index]}) by its index and by "
                              "its name; list each task once")
        indices.append(index)
    return indices


_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_init_states(spec: Union[str, Sequence[int]], option: str = "init_states") -> Optional[list[int]]:
    """``init_states`` (or the ``option`` named) as sorted distinct indices, or None for "all"; bad input is a
    one-line ValueError."""
    hint = 'give "all", a list of indices or an inclusive range such as "0-39"'
    if isinstance(spec, str):
        if spec == "all":
            return None
        match = _RANGE.match(spec)
        if not match:
            raise ValueError(f"libero {option} {spec!r} is not a range; {hint}")
        first, last = int(match.group(1)), int(match.group(2))
        if first > last:
            raise ValueError(f"libero {option} range {spec!r} is empty (its start is past its end); {hint}")
        return list(range(first, last + 1))
    if not spec:
        raise ValueError(f"libero {option} must not be {spec!r}; {hint}")
    if any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in spec):
        raise ValueError(f"libero {option} {spec!r} must be non-negative integers; {hint}")
    if len(set(spec)) != len(spec):
        raise ValueError(f"libero {option} lists an index twice: {list(spec)}")
    return sorted(spec)


class LiberoOptions(ConfigSection):
    """LIBERO's suites with camera images; see the module's docstring for what an episode is."""

    suite: Literal[SUITES] = "libero_spatial"  # type: ignore[valid-type]  # a Literal of a constant's values: pydantic reads them, mypy does not
    """the LIBERO suite; its tasks' episode limits are OpenVLA's"""
    tasks: Union[Literal["all"], pydantic.NonNegativeInt, str, list[Union[pydantic.NonNegativeInt, str]]] = "all"
    """all, or task indices / names of the suite (its standard order)"""
    image_size: int = pydantic.Field(128, ge=8, le=1024)
    """square camera resolution"""
    cameras: list[Literal[tuple(CAMERAS)]] = list(CAMERAS)  # type: ignore[valid-type]  # a Literal of a constant's values: pydantic reads them, mypy does not
    """the cameras rendered; [] = physics only (no renderer)"""
    max_episode_steps: Optional[pydantic.PositiveInt] = None
    """null = the suite's OpenVLA limit (SUITE_MAX_STEPS)"""
    init_state_order: Literal[INIT_STATE_ORDERS] = "cycle"  # type: ignore[valid-type]  # a Literal of a constant's values: pydantic reads them, mypy does not
    """cycle through the task's fixed initial states from a seed-chosen offset, or sample them"""
    settle_steps: pydantic.NonNegativeInt = 10
    """unrendered no-op steps after each reset while objects settle"""
    fast_render: Optional[bool] = None
    """MSAA, shadows and reflections off; null = on for a software renderer"""
    render_backend: Literal[RENDER_BACKENDS] = "auto"  # type: ignore[valid-type]  # a Literal of a constant's values: pydantic reads them, mypy does not
    """auto keeps a MUJOCO_GL already set, else EGL"""
    reward_scale: float = 1.0
    """multiplies LIBERO's sparse success reward"""
    init_states: Union[str, list[pydantic.NonNegativeInt]] = "all"
    """the initial states the reset schedule uses: all, a list of indices or an inclusive range "a-b" (e.g.
    "0-39" for training, leaving 40-49 held out)"""
    heldout_init_states: Optional[Union[str, list[pydantic.NonNegativeInt]]] = None
    """initial states outside init_states that every task is scored from, deterministically, before and after
    training (the report's eval/heldout_success_rate), e.g. "40-49"; null = no held-out evaluation. Each is one
    episode of up to max_episode_steps per task: long on a CPU"""

    @pydantic.field_validator("tasks")
    @classmethod
    def _task_list(cls, tasks: Any) -> Any:
        """"all", or the tasks as a list (one given alone is a list of one), none empty, none twice."""
        if tasks == "all":
            return tasks
        listed = tasks if isinstance(tasks, list) else [tasks]
        if not listed:
            raise ValueError('tasks is empty; give task indices, task names or "all"')
        if len(set(listed)) != len(listed):
            raise ValueError(f"tasks names a task twice: {listed}; list each once")
        return listed

    @pydantic.field_validator("cameras")
    @classmethod
    def _distinct_cameras(cls, cameras: list[str]) -> list[str]:
        if len(set(cameras)) != len(cameras):
            raise ValueError(f"cameras lists a camera twice: {cameras}")
        return cameras

    @pydantic.field_validator("init_states")
    @classmethod
    def _parsable_init_states(cls, spec: Any) -> Any:
        parse_init_states(spec)
        return spec

    @pydantic.model_validator(mode="after")
    def _held_out_apart_from_training(self) -> "LiberoOptions":
        parse_held_out_init_states(self.heldout_init_states, self.init_states)
        return self


def parse_held_out_init_states(spec: Optional[Union[str, Sequence[int]]], training: Union[str, Sequence[int]]
                               ) -> Optional[list[int]]:
    """``heldout_init_states`` as sorted indices (None: no held-out evaluation asked for); a one-line ValueError
    when they are not indices or share one with ``init_states`` (``training``)."""
    if spec is None:
        return None
    held_out, trained = parse_init_states(spec, "heldout_init_states"), parse_init_states(training)
    if held_out is None or trained is None or set(held_out) & set(trained):
        shared = "all" if held_out is None or trained is None else sorted(set(held_out) & set(trained))
        raise ValueError(f"heldout_init_states {spec!r} and init_states {training!r} share initial states ({shared}): "
                         'held-out ones are those training never resets to; e.g. init_states "0-39" with '
                         'heldout_init_states "40-49"')
    return held_out


@register_env("libero", options=LiberoOptions, final_evaluation=held_out_evaluation)
def libero_task_set(options: LiberoOptions) -> LiberoTaskSet:
    """Build a LIBERO TaskSet: the suite's tasks, their files checked; ``reset(init_state=k)`` still takes any
    initial state, ``init_states`` only restricts the reset schedule."""
    suite = options.suite
    init_state_subset = parse_init_states(options.init_states)
    held_out = parse_held_out_init_states(options.heldout_init_states, options.init_states)
    benchmark = import_benchmark()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints "[info] using task orders ..."
        bench = benchmark.get_benchmark_dict()[suite]()
    all_names = bench.get_task_names()
    indices = _resolve_tasks(suite, all_names, options.tasks)  # type: ignore[arg-type]  # its validator leaves "all" or a list
    root = libero_package_dir()
    specs = [bench.get_task(i) for i in indices]
    bddl = [f"{t.problem_folder}/{t.bddl_file}" for t in specs]
    inits = [f"{t.problem_folder}/{t.init_states_file}" for t in specs]
    for folder, files in (("bddl_files", bddl), ("init_files", inits)):
        checked_folder(root / folder, f"LIBERO's {folder} {root / folder}", INSTALL_HINT, holds=files)
    chosen = {"init_states": init_state_subset, "heldout_init_states": held_out}
    if any(chosen.values()):  # bounds need the files' counts (50 per task in every suite)
        count = min(len(load_init_states(root / "init_files" / rel)) for rel in inits)
        for option, subset in chosen.items():
            if subset is not None and max(subset) >= count:
                raise ConfigError(f"libero {option} {getattr(options, option)!r} goes past the last initial state: "
                                  f"the tasks have {count} (indices 0..{count - 1})")
    return LiberoTaskSet(options, indices, [t.name for t in specs], [t.language for t in specs], bddl, inits,
                         max_episode_steps=options.max_episode_steps or SUITE_MAX_STEPS[suite],
                         init_states=init_state_subset, heldout_init_states=held_out)


@dataclass
class LiberoTaskSet:
    """Picklable LIBERO TaskSet: the options it was built from; the tasks they chose (names, instructions, paths
    relative to LIBERO's data folders); what the options leave to the suite, resolved."""

    options: LiberoOptions  # the camera, rendering, reward and reset-order settings every env of the set shares
    task_indices: list[int]  # indices into the suite's standard task order
    task_names: list[str]
    instructions: list[str]
    bddl_files: list[str]  # relative to LIBERO's bddl_files folder
    init_state_files: list[str]  # relative to LIBERO's init_files folder
    max_episode_steps: int  # the options' limit, else the suite's (OpenVLA's)
    init_states: Optional[list[int]] = None  # the reset schedule's subset of each task's initial states; None: all
    heldout_init_states: Optional[list[int]] = None  # scored before and after training; None: no such evaluation
    action_dim: int = ACTION_DIM
    obs_dim: int = PROPRIO_DIM  # the flat part of the observation (proprio)
    success_rule: ClassVar[str] = "any"  # success terminates the episode: its last step says it either way

    def __len__(self) -> int:
        return len(self.task_names)

    @property
    def final_evaluation_on(self) -> bool:
        """Whether the run evaluates held-out initial states (``envs.final_evaluation_for``)."""
        return self.heldout_init_states is not None

    @property
    def obs_spec(self) -> dict[str, Any]:
        """What a policy / preprocessor needs to know about the observation dict."""
        return {
            "type": "libero",
            "cameras": list(self.options.cameras),
            "image_size": self.options.image_size,
            "image_shape": [self.options.image_size, self.options.image_size, 3],
            "proprio_dim": PROPRIO_DIM,
            "instruction": True,
            "instructions": list(self.instructions),
        }

    def init_state_choices(self, task_index: int) -> list[int]:
        """The initial states a task's reset schedule draws from: ``init_states``, or all of the task's."""
        if self.init_states is not None:
            return list(self.init_states)
        return list(range(len(load_init_states(libero_package_dir() / "init_files" / self.init_state_files[task_index]))))

    def make_env(self, task_index: int, seed: int) -> LiberoTaskEnv:
        if not 0 <= task_index < len(self.task_names):
            raise IndexError(f"task_index {task_index} out of range for {len(self.task_names)} LIBERO tasks")
        return LiberoTaskEnv(self, task_index, seed)


# ---- one env (built in a rollout worker) ------------------------------------------------
def load_init_states(path: Union[str, Path]) -> np.ndarray:
    """A LIBERO init-state file (a torch pickle of one float64 array [n, state_dim]), loaded with
    ``torch.load(weights_only=True)``: only numpy's array reconstruction is allow-listed."""
    import torch

    allowed: list[Any] = [(np._core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),  # type: ignore[attr-defined]  # private: the name the pickles hold
               np.ndarray, np.dtype, np.dtypes.Float64DType]
    with torch.serialization.safe_globals(allowed):
        states = torch.load(path, weights_only=True)
    states = np.asarray(states, dtype=np.float64)
    if states.ndim != 2 or len(states) == 0:
        raise ValueError(f"LIBERO init-state file {path} holds shape {states.shape}, expected [n, state_dim]")
    return states


class InitStateSchedule:
    """Which of a task's ``n`` fixed initial states each reset uses, reproducible from ``seed``:
    "cycle" walks through all of them (or those in ``subset``) from a seed-chosen offset, "sample"
    draws with replacement."""

    def __init__(self, n: int, order: str, seed: int, subset: Optional[Sequence[int]] = None) -> None:
        if order not in INIT_STATE_ORDERS:
            raise ValueError(f"init-state order must be one of {INIT_STATE_ORDERS}, got {order!r}")
        self.choices = list(range(n)) if subset is None else [int(k) for k in subset]
        if not self.choices or not all(0 <= k < n for k in self.choices):
            raise ValueError(f"init-state subset {subset} must be non-empty indices below {n}")
        self.n, self.order = n, order
        self._rng = np.random.default_rng(seed)
        self._next = int(self._rng.integers(len(self.choices)))

    def next(self) -> int:
        if self.order == "sample":
            return self.choices[int(self._rng.integers(len(self.choices)))]
        position, self._next = self._next, (self._next + 1) % len(self.choices)
        return self.choices[position]


class LiberoTaskEnv:
    """One LIBERO task's env; ``reset`` restores a fixed initial state without rebuilding the scene."""

    def __init__(self, task_set: LiberoTaskSet, task_index: int, seed: int) -> None:
        ts, options = task_set, task_set.options
        self.render_backend = configure_rendering(options.render_backend) if options.cameras else "none"
        root = ensure_libero_config()
        control_env = import_libero("libero.libero.envs.env_wrapper").ControlEnv
        self._quat2axisangle = import_libero("robosuite.utils.transform_utils").quat2axisangle
        self.task_name = ts.task_names[task_index]
        self.instruction = ts.instructions[task_index]
        self.cameras = list(options.cameras)
        self.max_episode_steps = int(ts.max_episode_steps)
        self.settle_steps = options.settle_steps
        self.reward_scale = float(options.reward_scale)
        self._init_states = load_init_states(root / "init_files" / ts.init_state_files[task_index])
        self._schedule = InitStateSchedule(len(self._init_states), options.init_state_order, seed, ts.init_states)
        self._seed = int(seed) % 2**32
        self.init_state_index = -1
        render = bool(self.cameras)
        self._env = control_env(
            bddl_file_name=str(root / "bddl_files" / ts.bddl_files[task_index]),
            use_camera_obs=render,
            has_renderer=False,
            has_offscreen_renderer=render,
            camera_names=[CAMERAS[c] for c in self.cameras],
            camera_heights=options.image_size,
            camera_widths=options.image_size,
            hard_reset=False,  # reset = restore a state; rebuilding the scene costs ~20x more
            ignore_done=True,  # our own step limit; robosuite's horizon would raise past it
        )
        self._image_keys = {c: f"{CAMERAS[c]}_image" for c in self.cameras}
        self.gl_renderer = ""
        self.fast_render = False
        if render:
            self.gl_renderer = gl_renderer_name(self._render_context())
            fast = options.fast_render
            if fast is None:
                fast = any(s in self.gl_renderer.lower() for s in SOFTWARE_GL)
            if fast:
                self._apply_fast_render()
        self._t = 0
        self._needs_reset = True

    # -- rendering settings --
    def _render_context(self) -> Any:
        return self._env.sim._render_context_offscreen

    def _make_gl_current(self) -> None:
        """robosuite renders into whichever GL context is current; with several envs in one
        process (a worker's EnvPool) that must be this env's, or frames come from another's."""
        if self.cameras:
            self._render_context().gl_ctx.make_current()

    def _apply_fast_render(self) -> None:
        switch_to_fast_render(self._env.sim, self._render_context())
        self.fast_render = True

    def render_settings(self) -> dict[str, Any]:
        """The renderer's live settings (for tests and logs); empty for a physics-only env."""
        if not self.cameras:
            return {}
        return {"backend": self.render_backend, "gl_renderer": self.gl_renderer, "fast_render": self.fast_render,
                **fast_render_settings(self._env.sim, self._render_context())}

    # -- episode --
    def _observation(self, raw: dict[str, np.ndarray]) -> dict[str, Any]:
        obs: dict[str, Any] = {c: np.ascontiguousarray(raw[key][::-1, ::-1]) for c, key in self._image_keys.items()}
        obs["proprio"] = np.concatenate([
            raw["robot0_eef_pos"],
            self._quat2axisangle(np.array(raw["robot0_eef_quat"], dtype=np.float64)),  # it clips in place
            raw["robot0_gripper_qpos"],
        ]).astype(np.float32)
        obs["instruction"] = self.instruction
        return obs

    def _set_cameras_enabled(self, enabled: bool) -> None:
        for key in self._image_keys.values():
            self._env.env.modify_observable(key, "enabled", enabled)

    @property
    def num_init_states(self) -> int:
        return len(self._init_states)

    @property
    def init_state_choices(self) -> list[int]:
        """The initial states the reset schedule (and ``start``) draws from: the task set's ``init_states``."""
        return list(self._schedule.choices)

    def sim_state(self) -> np.ndarray:
        """The simulator's flattened state (time, qpos, qvel, ...), float64: what replays compare."""
        return np.array(self._env.sim.get_state().flatten(), dtype=np.float64)

    def reset(self, init_state: Optional[int] = None, start: Optional[int] = None) -> dict[str, Any]:
        """Restore a fixed initial state (the schedule's next one, or index ``init_state``, or with
        ``start`` (group rollouts) the schedule's choice ``start`` modulo their number), let the
        scene settle, and return the first observation."""
        if start is not None:
            choices = self._schedule.choices
            init_state = choices[start % len(choices)]
        if init_state is None:
            self.init_state_index = self._schedule.next()
        elif 0 <= init_state < len(self._init_states):
            self.init_state_index = int(init_state)
        else:
            raise IndexError(f"init_state {init_state} out of range: '{self.task_name}' has {len(self._init_states)}")
        # LIBERO re-places fixtures (cabinets, stoves, ...) at every reset by drawing from numpy's
        # global RNG, and the init-state files do not hold their poses. Seed that draw from (env
        # seed, init state) so an episode's start is a function of both, and leave the process's
        # global RNG as it was.
        outer_rng = np.random.get_state()
        # A group's start (group rollouts) replaces the env seed: its members' envs have different seeds.
        fixture_seed = self._seed if start is None else int(start)
        np.random.seed(np.random.SeedSequence([fixture_seed, self.init_state_index]).generate_state(1)[0])
        self._set_cameras_enabled(False)  # nothing is rendered until the scene has settled
        try:
            self._env.reset()
            for robot in self._env.robots:
                # A soft reset keeps the gripper model, whose smoothed command would carry over
                # from the last episode; a rebuilt model starts from zero.
                robot.gripper.current_action = np.zeros_like(robot.gripper.current_action)
            self._env.set_init_state(self._init_states[self.init_state_index])
            for _ in range(self.settle_steps):
                self._env.step(SETTLE_ACTION)
        finally:
            self._set_cameras_enabled(True)
            np.random.set_state(outer_rng)
        self._make_gl_current()
        raw = self._env.env._get_observations(force_update=True)
        self._t = 0
        self._needs_reset = False
        return self._observation(raw)

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError(f"LIBERO env '{self.task_name}': call reset() before step() (episode ended)")
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0)
        if a.shape != (ACTION_DIM,):
            raise ValueError(f"LIBERO action must have {ACTION_DIM} values, got shape {np.shape(action)}")
        self._make_gl_current()
        raw, reward, success, _ = self._env.step(a)
        self._t += 1
        terminated = bool(success)
        truncated = not terminated and self._t >= self.max_episode_steps
        if terminated or truncated:
            self._needs_reset = True
        info = {"success": terminated, "init_state_index": self.init_state_index}
        return self._observation(raw), float(reward) * self.reward_scale, terminated, truncated, info

    def close(self) -> None:
        """Free the simulator and renderer (with this env's GL context current: GL object names
        are per context, so freeing them under another env's context would delete that env's)."""
        if self._env is not None:
            self._make_gl_current()
            self._env.close()  # robosuite frees the render context here (its gc.collect)
            self._env = None
