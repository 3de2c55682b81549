"""Learning speed on MetaWorld MT1: success rate against env steps and wall-clock, this system vs SB3 PPO.

    python benchmarks/bench_learning.py [--quick] [--tasks reach-v3] [--methods clip,soft_clip,sapo,vtrace,sb3]
        [--budget-minutes 9.5 | --minutes-per-run M] [--seed 0 | --seeds 0,1,2] [--out learning.json] [--plot learning.png]

The learning-speed comparison (time to 0.9 success on reach-v3, 3 seeds each, on an idle machine; about an hour):
``--methods clip,sb3 --seeds 0,1,2 --minutes-per-run 10`` (``speedup_vs_sb3`` is then SB3's mean seconds to
0.9 over the seeds / ours; the goal is >= 2).

Methods (one run each per task, one after the other, same seed, same machine):

- ``clip``, ``soft_clip``, ``sapo``: this system, ``configs/metaworld_mt1_ppo.yaml`` (GAE on the workers)
  with ``--clip-mode <method>`` and the loss's default parameters.
- ``vtrace``: this system, ``configs/metaworld_mt1_vtrace.yaml`` (V-trace on the trainers), clip mode ``clip``.
- ``grpo``, ``rloo``: this system, ``configs/metaworld_mt1_ppo.yaml`` with ``--advantage grpo|rloo --group-size 8``
  (critic-free group advantages, clip mode ``clip``).
- ``pacs``: the same with ``--clip-mode pacs --clip-config configs/clip/pacs.yaml`` (PACS: the policy's
  log-ratio to the reference, compared within its group, is the logit of a BCE against the episode's success).
- ``sb3``: Stable-Baselines3 PPO on the same environment (``envs.make_task_set(...).make_env(i, seed + i)``
  behind a small gymnasium adapter), 2 envs.

Each run of this system is ``async_rl.driver.run(cfg)`` with ``--max-minutes <minutes-per-run>`` (its clock
starts at ``run()`` and so includes Ray and DeepSpeed start-up), ``--log-interval-seconds 5``,
``--swanlab-mode disabled`` and ``--log-dir runs/bench_learning/<task>_<method>`` (emptied first); the curve
is read back from TensorBoard: ``rollout/success_rate`` (the fraction of episodes finished since the previous
log point that succeeded at any step), paired with the ``rollout/total_env_steps`` logged with it, at the
events' wall time minus the time ``run()`` was called. SB3 gets the same wall-clock budget, counted from
before its envs are built, and the same kind of curve: a callback marks an episode successful if
``info["success"]`` was true at any step and logs, every 5 s, the success rate of the episodes finished since
the previous point and the env steps so far (``model.num_timesteps``).

SB3 hyperparameters (``--sb3-preset``):

- ``zoo-halfcheetah`` (default): rl-baselines3-zoo's tuned MuJoCo PPO settings, ``hyperparams/ppo.yml``,
  entry ``HalfCheetah-v3`` (read at DLR-RM/rl-baselines3-zoo commit 00128b5d): ``normalize: true``
  (VecNormalize of observations and rewards, reward discount = gamma, as the zoo does), n_steps 512,
  batch_size 64, gamma 0.98, learning_rate 2.0633e-05, ent_coef 0.000401762, clip_range 0.1, n_epochs 20,
  gae_lambda 0.92, max_grad_norm 0.8, vf_coef 0.58096, policy_kwargs ``dict(log_std_init=-2, ortho_init=False,
  activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256]))``. The zoo uses n_envs 1; we use 2 envs
  (n_steps stays per env, so one rollout is 1024 steps).
- ``zoo-mujoco-defaults``: the zoo's untuned MuJoCo entry (``Ant-v3: &mujoco-defaults``): ``normalize: true``
  and SB3's PPO defaults (n_steps 2048, batch_size 64, gamma 0.99, gae_lambda 0.95, n_epochs 10,
  learning_rate 3e-4, clip_range 0.2, ent_coef 0, vf_coef 0.5, max_grad_norm 0.5, 64x64 tanh MLPs).

SB3's vector env: ``--sb3-vec-env`` (``dummy`` or ``subproc``; default ``dummy``) and ``--sb3-torch-threads``
(the main process's torch threads; default 1). On the project's 2-core machine (24 s runs of the
zoo-halfcheetah preset on reach-v3, other jobs loading the machine to a 1-minute load of 5-7) SB3 made
333 env steps/s with DummyVecEnv and 1 torch thread, 113 with DummyVecEnv and 2 threads, 124 with
SubprocVecEnv and 1 thread, 17 with SubprocVecEnv and 2 threads: PPO's update phase (20 epochs of 64-row
minibatches per 1024 steps) runs in the main process either way, and two env processes plus torch threads
only compete with it for the 2 cores.

Figures (flat JSON with ``--out``, a table on stdout, a PNG with ``--plot``, by default next to ``--out``: success rate against env steps (top
row) and against wall-clock (bottom row), one column per task, one line per method; lines are the trailing
mean of the last 3 log points), per task and method: ``<task>_<method>_seconds_to_0.9`` (wall-clock seconds
until the trailing mean of the last 3 logged success rates first reaches 0.9; null if never),
``<task>_<method>_final_success`` (that trailing mean at the last point), ``<task>_<method>_env_steps`` (env
steps of the whole run), ``..._wall_seconds`` (whole run, start-up and shut-down included),
``..._first_log_seconds`` (until the first log point: start-up, warm-up, first episodes),
``..._first_update_seconds`` (until the first policy update was done: this system's first epoch and
broadcast, SB3's first rollout and train()), ``..._best_success`` (the highest trailing mean), for group
runs ``..._groups_opened`` / ``_groups_completed`` / ``_groups_dropped`` (the replay buffer's counters), and
``..._error`` when a run failed (the benchmark goes on with the next one); and ``speedup_vs_sb3`` = SB3's
seconds to 0.9 / the best of this system's on reach-v3 (null if either never reached 0.9).

Run length: ``--minutes-per-run``, or by default ``--budget-minutes`` (9.5; 1.75 with ``--quick``)
shared out over the runs after an allowance for what ``--max-minutes`` does not cover (this system's run
ends after its current epoch and a last evaluation, then Ray shuts down: 25 s per run measured on a
loaded 2-core machine; SB3: 10 s). The default is reach-v3 (the task of ``speedup_vs_sb3``) with all five
methods (about 1.5 minutes each); ``--tasks push-v3`` is a second invocation of the same size. ``--quick``
is reach-v3, ``clip`` and ``sb3`` only. Short runs are what fits 10 minutes on 2 cores: they show the
early learning curve, and ``seconds_to_0.9`` is null for a method that did not get there in its run.
Nothing is asserted. Other load on
the machine slows every method; the 1-minute load average is recorded before and after.
"""
from __future__ import annotations

import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks import common

if TYPE_CHECKING:
    from envs.base import TaskSet

TASKS = ("reach-v3", "push-v3")
OVERHEAD_S = {"system": 25.0, "sb3": 10.0}  # per run, beyond its --max-minutes (see the module docstring)
GROUP_SIZE = 8  # members per group for the critic-free estimators
SYSTEM_METHODS = {  # method -> (launch config, clip mode, extra flags)
    "clip": ("metaworld_mt1_ppo.yaml", "clip", []),
    "soft_clip": ("metaworld_mt1_ppo.yaml", "soft_clip", []),
    "sapo": ("metaworld_mt1_ppo.yaml", "sapo", []),
    "vtrace": ("metaworld_mt1_vtrace.yaml", "clip", []),
    "grpo": ("metaworld_mt1_ppo.yaml", "clip", ["--advantage", "grpo", "--group-size", str(GROUP_SIZE)]),
    "rloo": ("metaworld_mt1_ppo.yaml", "clip", ["--advantage", "rloo", "--group-size", str(GROUP_SIZE)]),
    "pacs": ("metaworld_mt1_ppo.yaml", "pacs", ["--clip-config", str(common.ROOT / "configs" / "clip" / "pacs.yaml"),
                                                "--advantage", "grpo", "--group-size", str(GROUP_SIZE)]),
}
METHODS = (*SYSTEM_METHODS, "sb3")
DEFAULT_METHODS = ("clip", "soft_clip", "sapo", "vtrace", "sb3")
TARGET = 0.9
SMOOTH = 3  # log points in the trailing mean
LOG_INTERVAL_S = common.LOG_INTERVAL_S  # SB3 logs on the same clock as this system
MAX_EPISODE_STEPS = 500
GROUP_COUNTERS = ("groups_opened", "groups_completed", "groups_dropped")


def sb3_preset(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(PPO kwargs, VecNormalize kwargs) of an rl-baselines3-zoo entry (see the module docstring)."""
    import torch.nn as nn

    if name == "zoo-halfcheetah":
        ppo = dict(n_steps=512, batch_size=64, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762,
                   clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096,
                   policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU,
                                      net_arch=dict(pi=[256, 256], vf=[256, 256])))
    elif name == "zoo-mujoco-defaults":
        ppo = {}  # SB3's PPO defaults
    else:
        raise ValueError(f"unknown --sb3-preset {name!r}")
    return ppo, dict(norm_obs=True, norm_reward=True, gamma=ppo.get("gamma", 0.99))


# ---- curves -----------------------------------------------------------------------------

def smoothed(values: list[float], window: int = SMOOTH) -> list[float]:
    """Trailing mean over the last ``window`` points (fewer at the start)."""
    return [float(np.mean(values[max(0, i + 1 - window): i + 1])) for i in range(len(values))]


def seconds_to(curve: dict[str, list[float]], target: float = TARGET) -> Optional[float]:
    """Wall-clock seconds at the first point whose trailing mean over a full window (or over all points,
    if there are fewer) reaches ``target``."""
    smooth = smoothed(curve["success"])
    for i, value in enumerate(smooth):
        if i + 1 >= min(SMOOTH, len(smooth)) and value >= target:
            return float(curve["seconds"][i])
    return None


def summarize(curve: dict[str, Any]) -> dict[str, Any]:
    smooth = smoothed(curve["success"])
    return {
        "seconds_to_0.9": _round(seconds_to(curve)),
        "final_success": _round(smooth[-1]) if smooth else None,
        "env_steps": int(curve["total_steps"]),
        "wall_seconds": _round(curve["wall_seconds"]),
        "first_log_seconds": _round(curve["seconds"][0]) if curve["seconds"] else None,
        "first_update_seconds": _round(curve.get("first_update_seconds")),
        "best_success": _round(max(smooth)) if smooth else None,
        **{name: int(value) for name, value in curve.get("groups", {}).items()},
    }


def _round(x: Optional[float], nd: int = 3) -> Optional[float]:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), nd)


# ---- this system ------------------------------------------------------------------------

def run_system(task: str, method: str, minutes: float, seed: int, log_root: Path) -> dict[str, Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config, clip_mode, extra = SYSTEM_METHODS[method]
    log_dir = log_root / f"{task}_{method}"
    timed = common.timed_run(
        common.ROOT / "configs" / config, log_dir, minutes,
        [*extra, "--clip-mode", clip_mode, "--seed", str(seed),
         "--env-kwargs", f"{{benchmark: MT1, task: {task}, max_episode_steps: {MAX_EPISODE_STEPS}}}"])
    summary, t0 = timed.summary, timed.started
    wall = time.time() - t0

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}).Reload()
    tags = events.Tags()["scalars"]
    success = events.Scalars("rollout/success_rate") if "rollout/success_rate" in tags else []
    totals = events.Scalars("rollout/total_env_steps") if "rollout/total_env_steps" in tags else []
    # success_rate and total_env_steps of one snapshot are written by one logger.log call: pair by wall time
    # (the final snapshot reuses the last epoch's step number, so steps are not unique).
    total_times = np.array([e.wall_time for e in totals])
    curve: dict[str, Any] = {"steps": [], "seconds": [], "success": [], "wall_seconds": summary.get("wall_seconds", wall),
                             "total_steps": totals[-1].value if totals else 0}
    if "sync/policy_version" in tags:  # logged right after the first epoch's weight broadcast
        curve["first_update_seconds"] = events.Scalars("sync/policy_version")[0].wall_time - t0
    # Group runs: how many groups reached the trainers, how many were given up.
    curve["groups"] = {name: events.Scalars(f"replay/{name}")[-1].value for name in GROUP_COUNTERS
                       if f"replay/{name}" in tags}
    for e in success:
        j = int(np.argmin(np.abs(total_times - e.wall_time))) if len(totals) else None
        curve["steps"].append(float(totals[j].value) if j is not None else float("nan"))
        curve["seconds"].append(e.wall_time - t0)
        curve["success"].append(float(e.value))
    return curve


# ---- Stable-Baselines3 ------------------------------------------------------------------

def _gym_env_class():
    import gymnasium as gym

    class MetaWorldGymEnv(gym.Env):
        """gymnasium adapter of one ``TaskEnv`` (seeded when built; ``reset(seed=...)`` is ignored)."""

        metadata = {"render_modes": []}

        def __init__(self, task_set: TaskSet, seed: int) -> None:
            self.env = task_set.make_env(0, seed)
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (task_set.obs_dim,), np.float32)
            self.action_space = gym.spaces.Box(-1.0, 1.0, (task_set.action_dim,), np.float32)

        def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
            return self.env.reset(), {}

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            return obs, reward, terminated, truncated, {"success": bool(info["success"])}

        def close(self) -> None:
            self.env.close()

    return MetaWorldGymEnv


def _make_gym_env(task_set: TaskSet, seed: int):
    return _gym_env_class()(task_set, seed)


def run_sb3(task: str, minutes: float, seed: int, preset: str, vec_env: str, threads: int,
            n_envs: int = 2) -> dict[str, Any]:
    import functools

    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    from envs import make_task_set

    class SuccessCallback(BaseCallback):
        """Per-episode success (any step), logged every LOG_INTERVAL_S; stops learn() at the deadline."""

        def __init__(self, t0: float, deadline: float) -> None:
            super().__init__()
            self.t0, self.deadline, self.last_log = t0, deadline, time.time()
            self.curve: dict[str, Any] = {"steps": [], "seconds": [], "success": []}
            self.pending: list[bool] = []

        def _on_training_start(self) -> None:
            self.flags = np.zeros(self.training_env.num_envs, dtype=bool)
            self.rollouts = 0

        def _on_rollout_start(self) -> None:
            self.rollouts += 1
            if self.rollouts == 2:  # the first train() has finished
                self.curve["first_update_seconds"] = time.time() - self.t0

        def _on_step(self) -> bool:
            for i, (info, done) in enumerate(zip(self.locals["infos"], self.locals["dones"])):
                self.flags[i] |= bool(info.get("success", False))
                if done:
                    self.pending.append(bool(self.flags[i]))
                    self.flags[i] = False
            now = time.time()
            if now - self.last_log >= LOG_INTERVAL_S:
                self.flush(now)
            return now < self.deadline

        def flush(self, now: float) -> None:
            self.last_log = now
            if self.pending:  # like the system's StatsActor: no episodes since the last point, no point
                self.curve["steps"].append(float(self.num_timesteps))
                self.curve["seconds"].append(now - self.t0)
                self.curve["success"].append(float(np.mean(self.pending)))
                self.pending = []

    ppo_kwargs, norm_kwargs = sb3_preset(preset)
    task_set = make_task_set("metaworld", benchmark="MT1", task=task, max_episode_steps=MAX_EPISODE_STEPS)
    torch.set_num_threads(threads)
    t0 = time.time()
    fns = [functools.partial(_make_gym_env, task_set, seed + i) for i in range(n_envs)]
    venv = SubprocVecEnv(fns) if vec_env == "subproc" else DummyVecEnv(fns)
    try:
        venv = VecNormalize(venv, **norm_kwargs)
        model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, **ppo_kwargs)
        callback = SuccessCallback(t0, t0 + 60.0 * minutes)
        model.learn(total_timesteps=10**9, callback=callback)
        callback.flush(time.time())
    finally:
        venv.close()
    curve = callback.curve
    curve["wall_seconds"] = time.time() - t0
    curve["total_steps"] = model.num_timesteps
    return curve


# ---- output -----------------------------------------------------------------------------

def plot(curves: dict[tuple[str, str], dict[str, Any]], tasks: list[str], methods: list[str], path: Path,
         title: str) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(2, len(tasks), figsize=(6 * len(tasks), 8), squeeze=False)
    for col, task in enumerate(tasks):
        for method in methods:
            curve = curves.get((task, method))
            if not curve or not curve["success"]:
                why = "failed" if curve is None else "no log point"
                for ax in axes[:, col]:
                    ax.plot([], [], "-" if method != "sb3" else "--", label=f"{method} ({why})")
                continue
            smooth = smoothed(curve["success"])
            style = "--" if method == "sb3" else "-"
            axes[0, col].plot(curve["steps"], smooth, style, marker=".", label=method)
            axes[1, col].plot(curve["seconds"], smooth, style, marker=".", label=method)
        for row, xlabel in enumerate(("env steps", "wall-clock seconds (from launch)")):
            ax = axes[row, col]
            ax.axhline(TARGET, color="grey", lw=0.8, ls=":")
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlim(left=0)  # wall-clock from launch: start-up shows as the gap before the first point
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"success rate (trailing mean of {SMOOTH} log points)")
            ax.set_title(task)
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left", fontsize=8)
    common.save(fig, path, title)


def best_time(figures: dict[str, Any], labels: list[str]) -> Optional[float]:
    """The best (least) seconds to 0.9 on reach-v3 of this system's runs ``labels`` (None if none got there)."""
    times = [figures.get(f"reach-v3_{m}_seconds_to_0.9") for m in labels if not m.startswith("sb3")]
    times = [t for t in times if t is not None]
    return min(times) if times else None


def speedup(figures: dict[str, Any], labels: list[str], sb3_label: str) -> Optional[float]:
    """SB3's seconds to 0.9 / the best of ours on reach-v3 (None unless both got there)."""
    ours, sb3 = best_time(figures, labels), figures.get(f"reach-v3_{sb3_label}_seconds_to_0.9")
    return round(sb3 / ours, 3) if sb3 is not None and ours else None


def print_table(figures: dict[str, Any], tasks: list[str], methods: list[str]) -> None:
    cols = ("final_success", "seconds_to_0.9", "env_steps", "wall_seconds", "first_update_seconds", "first_log_seconds")
    header = f"{'task':<10} {'method':<10} " + " ".join(f"{c:>20}" for c in cols) + "  steps/s  error"
    print(header)
    print("-" * len(header))
    for task in tasks:
        for method in methods:
            key = f"{task}_{method}"
            vals = [figures.get(f"{key}_{c}") for c in cols]
            steps, wall = figures.get(f"{key}_env_steps"), figures.get(f"{key}_wall_seconds")
            rate = f"{steps / wall:7.0f}" if steps and wall else "      -"
            cells = " ".join(f"{'-' if v is None else v:>20}" for v in vals)
            print(f"{task:<10} {method:<10} {cells}  {rate}  {str(figures.get(f'{key}_error', ''))[:100]}")
    print(f"speedup_vs_sb3 (reach-v3, SB3 seconds to {TARGET} / best of ours): {figures.get('speedup_vs_sb3')}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = common.parser(__doc__, "reach-v3, clip and sb3 only, within 1.75 minutes")
    ap.add_argument("--minutes-per-run", type=float, default=None, help="default: --budget-minutes shared out")
    ap.add_argument("--budget-minutes", type=float, default=None, help="whole benchmark (default 9.5; quick 1.75)")
    ap.add_argument("--tasks", default=TASKS[0], help=f"comma-separated MetaWorld MT1 tasks, e.g. {','.join(TASKS)}")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"comma-separated, from {','.join(METHODS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None, help="comma list: every method runs once per seed, figures get the "
                    "suffix _s<seed>, and speedup_vs_sb3 compares the mean seconds to 0.9 over the seeds "
                    "(e.g. 0,1,2; default: --seed alone, no suffix)")
    ap.add_argument("--sb3-preset", default="zoo-halfcheetah", choices=("zoo-halfcheetah", "zoo-mujoco-defaults"))
    ap.add_argument("--sb3-vec-env", default="dummy", choices=("dummy", "subproc"))
    ap.add_argument("--sb3-torch-threads", type=int, default=1)
    ap.add_argument("--log-root", default="runs/bench_learning")
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.methods = "reach-v3", "clip,sb3"
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if args.minutes_per_run is None and tasks and methods:
        budget_s = 60.0 * (args.budget_minutes or (1.75 if args.quick else 9.5))
        n_seeds = len(args.seeds.split(",")) if args.seeds else 1
        overhead_s = n_seeds * len(tasks) * sum(OVERHEAD_S["sb3" if m == "sb3" else "system"] for m in methods)
        args.minutes_per_run = round(max(budget_s - overhead_s, 0.0) / (n_seeds * len(tasks) * len(methods)) / 60.0, 2)
    if unknown or not tasks or not methods or not args.minutes_per_run or args.minutes_per_run <= 0:
        ap.error(f"unknown method(s) {unknown}; choose from {','.join(METHODS)}" if unknown
                 else "need at least one task, one method and --minutes-per-run (or a budget) > 0")
    log_root = Path(args.log_root)
    png = common.plot_path(args) or log_root / "bench_learning.png"

    started = time.time()
    figures: dict[str, Any] = {
        **common.machine(), "seed": args.seed, "minutes_per_run": args.minutes_per_run,
        "tasks": ",".join(tasks), "methods": ",".join(methods), "sb3_preset": args.sb3_preset,
        "sb3_vec_env": args.sb3_vec_env, "sb3_n_envs": 2, "sb3_torch_threads": args.sb3_torch_threads,
        "loadavg_1min_start": round(os.getloadavg()[0], 2),
    }
    curves: dict[tuple[str, str], dict[str, Any]] = {}
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    # (method, seed, label): with several seeds a run's figures are <task>_<method>_s<seed>_...
    runs = [(m, sd, m if len(seeds) == 1 else f"{m}_s{sd}") for sd in seeds for m in methods]
    for task in tasks:
        for method, seed, label in runs:
            key = f"{task}_{label}"
            print(f"=== {key}: {args.minutes_per_run:g} min ===", flush=True)
            try:
                if method == "sb3":
                    curve = run_sb3(task, args.minutes_per_run, seed, args.sb3_preset, args.sb3_vec_env,
                                    args.sb3_torch_threads)
                else:
                    curve = run_system(task, method, args.minutes_per_run, seed, log_root)
                curves[(task, label)] = curve
                figures.update({f"{key}_{k}": v for k, v in summarize(curve).items()})
                print(f"{key}: {len(curve['success'])} log points, {figures[f'{key}_env_steps']} env steps, "
                      f"final success {figures[f'{key}_final_success']}", flush=True)
            except Exception as exc:  # noqa: BLE001  (record and go on with the next run)
                traceback.print_exc()
                figures.update({f"{key}_seconds_to_0.9": None, f"{key}_final_success": None, f"{key}_env_steps": None,
                                f"{key}_error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]})

    if len(seeds) > 1:  # per seed, then the ratio of the means (null unless every seed of both got there)
        for seed in seeds:
            figures[f"speedup_vs_sb3_s{seed}"] = speedup(figures, [f"{m}_s{seed}" for m in methods], f"sb3_s{seed}")
        sb3_times = [figures.get(f"reach-v3_sb3_s{sd}_seconds_to_0.9") for sd in seeds]
        ours_times = [best_time(figures, [f"{m}_s{sd}" for m in methods]) for sd in seeds]
        done = None not in sb3_times and None not in ours_times
        figures["speedup_vs_sb3"] = round(sum(sb3_times) / sum(ours_times), 3) if done and sum(ours_times) > 0 else None
    else:
        figures["speedup_vs_sb3"] = speedup(figures, methods, "sb3")
    methods = [label for _, _, label in runs]
    ours = [s for s in (figures.get(f"reach-v3_{m}_seconds_to_0.9") for m in methods if not m.startswith("sb3"))
            if s is not None]
    sb3, sb3_wall = figures.get("reach-v3_sb3_seconds_to_0.9"), figures.get("reach-v3_sb3_wall_seconds")  # one seed
    if sb3 is None and ours and sb3_wall:  # SB3 never got there: its whole run is a lower bound of its time
        figures["speedup_vs_sb3_lower_bound"] = round(sb3_wall / min(ours), 3)
    figures["loadavg_1min_end"] = round(os.getloadavg()[0], 2)
    figures["total_seconds"] = round(time.time() - started, 1)

    print_table(figures, tasks, methods)
    title = (f"MetaWorld MT1, seed {args.seed}, {args.minutes_per_run:g} min per run, {os.cpu_count()} cores "
             f"(1-min load {figures['loadavg_1min_start']} -> {figures['loadavg_1min_end']})\n"
             f"SB3 PPO: {args.sb3_preset}, {args.sb3_vec_env} x2")
    args.plot = str(png)
    common.report(figures, args, lambda path: plot(curves, tasks, methods, path, title),
                  headline=("speedup_vs_sb3", "speedup_vs_sb3_lower_bound", *(f"{t}_{m}_seconds_to_0.9" for t in tasks for m in methods),
                            *(f"{t}_{m}_final_success" for t in tasks for m in methods), "total_seconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
