"""LIBERO environment (envs/libero.py) on a real task: libero_spatial task 0.

"pick up the black bowl between the plate and the ramekin and place it on the plate". Envs are
built at 64x64 to keep the file quick; env creation is the main cost (~4 s each, uncontended).
"""
from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from async_rl.errors import ConfigError

if importlib.util.find_spec("libero") is None:
    pytest.skip("LIBERO is not installed (run: make setup)", allow_module_level=True)

import envs
from envs.libero import ACTION_DIM, PROPRIO_DIM, InitStateSchedule, load_init_states

ROOT = Path(__file__).resolve().parents[2]
SUITE, TASK = "libero_spatial", 0
SIZE = 64
SEED = 7
NOOP = np.array([0.0] * 6 + [-1.0])


@pytest.fixture(scope="module")
def task_set():
    return envs.make_task_set("libero", suite=SUITE, tasks=[TASK], image_size=SIZE)


@pytest.fixture(scope="module")
def env_and_first_obs(task_set):
    env = task_set.make_env(0, seed=SEED)
    first = env.reset()
    yield env, first
    env.close()


def _subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LIBERO_CONFIG_PATH", "MUJOCO_GL", "PYOPENGL_PLATFORM")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _run_python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)


# ---- the TaskSet: plain data, validated options -----------------------------------------
def test_task_set_is_plain_data_with_obs_spec(task_set):
    ts = pickle.loads(pickle.dumps(task_set))
    assert ts.task_names == ["pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"]
    assert ts.instructions == ["pick up the black bowl between the plate and the ramekin and place it on the plate"]
    assert ts.max_episode_steps == 220  # OpenVLA's libero_spatial limit
    assert (ts.action_dim, ts.obs_dim) == (ACTION_DIM, PROPRIO_DIM) == (7, 8)
    spec = ts.obs_spec
    assert spec["cameras"] == ["agentview", "wrist"]
    assert spec["image_shape"] == [SIZE, SIZE, 3] and spec["proprio_dim"] == 8
    assert spec["instructions"] == ts.instructions
    assert all(not f.startswith("/") for f in ts.bddl_files + ts.init_state_files)  # resolved per worker


def test_task_selection_all_names_and_limits():
    ts = envs.make_task_set("libero", suite="libero_goal")
    assert len(ts.task_names) == 10 and ts.max_episode_steps == 300
    by_name = envs.make_task_set("libero", suite="libero_goal", tasks=[ts.task_names[3], 1])
    assert by_name.task_indices == [3, 1] and by_name.task_names == [ts.task_names[3], ts.task_names[1]]
    with pytest.raises(ConfigError, match=r"give task 3 \(.*\) by its index and by its name; list each task once"):
        envs.make_task_set("libero", suite="libero_goal", tasks=[ts.task_names[3], 3])  # only the suite knows
    assert envs.make_task_set("libero", suite="libero_10", tasks=0).max_episode_steps == 520
    assert envs.make_task_set("libero", suite="libero_90", tasks=[89], max_episode_steps=50).max_episode_steps == 50


@pytest.mark.parametrize("kwargs, words", [
    ({"suite": "libero_spatail"}, ["option 'suite' = 'libero_spatail'", "did you mean 'libero_spatial'"]),
    ({"tasks": ["pick_up_the_black_bowl_between_the_plate_and_the_ramekin"]}, ["unknown libero_spatial task", "did you mean"]),
    ({"tasks": [10]}, ["unknown libero_spatial task 10;", "give an index 0..9"]),
    ({"tasks": []}, ["tasks is empty"]),
    ({"tasks": [1, 1]}, ["option 'tasks' = [1, 1]", "names a task twice", "list each once"]),
    ({"cameras": ["agentview", "front"]}, ["option 'cameras.1'", "'agentview' or 'wrist'"]),
    ({"render_backend": "glfw"}, ["option 'render_backend' = 'glfw'", "'auto', 'egl' or 'osmesa'"]),
    ({"init_state_order": "random"}, ["option 'init_state_order' = 'random'", "'cycle' or 'sample'"]),
    ({"image_size": 0}, ["image_size"]),
    ({"max_episode_steps": 0}, ["max_episode_steps"]),
    ({"fast_render": "maybe"}, ["option 'fast_render' = 'maybe'", "valid boolean"]),
    ({"cameras": None}, ["option 'cameras' = None", "valid list"]),
    ({"reward_scale": "one"}, ["option 'reward_scale' = 'one'", "valid number"]),
    ({"suit": "libero_10"}, ["unknown libero env option 'suit'", "did you mean 'suite'"]),
    ({"heldout_init_states": "40-49"}, ["heldout_init_states '40-49' and init_states 'all' share initial states (all)",
                                        'e.g. init_states "0-39" with heldout_init_states "40-49"']),
    ({"init_states": "0-40", "heldout_init_states": [40, 41]}, ["share initial states ([40])"]),
    ({"init_states": "0-39", "heldout_init_states": "49-40"}, ["libero heldout_init_states range '49-40' is empty"]),
    ({"init_states": "0-39", "heldout_init_states": "40-50"}, ["libero heldout_init_states '40-50' goes past the last "
                                                               "initial state: the tasks have 50 (indices 0..49)"]),
])
def test_bad_options_are_config_errors(kwargs, words):
    with pytest.raises(ConfigError) as err:
        envs.make_task_set("libero", **kwargs)
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_init_state_schedule_is_reproducible():
    cyc = [InitStateSchedule(50, "cycle", seed=3) for _ in range(2)]
    a = [cyc[0].next() for _ in range(60)]
    assert a == [cyc[1].next() for _ in range(60)]
    assert sorted(a[:50]) == list(range(50)) and a[50:] == a[:10]  # every state once, then again
    smp = [InitStateSchedule(50, "sample", seed=3) for _ in range(2)]
    b = [smp[0].next() for _ in range(20)]
    assert b == [smp[1].next() for _ in range(20)] and len(set(b)) > 1
    assert [InitStateSchedule(50, "cycle", seed=s).next() for s in range(8)] != [0] * 8  # offset from the seed


def test_init_states_load_with_weights_only(task_set):
    spec = importlib.util.find_spec("libero")
    root = Path(next(iter(spec.submodule_search_locations))) / "libero" / "init_files"
    states = load_init_states(root / task_set.init_state_files[0])
    assert states.dtype == np.float64 and states.shape[0] == 50 and states.ndim == 2


# ---- a real env ---------------------------------------------------------------------------
def _check_obs(obs, task_set):
    assert set(obs) == {"agentview", "wrist", "proprio", "instruction"}
    for cam in ("agentview", "wrist"):
        assert obs[cam].shape == (SIZE, SIZE, 3) and obs[cam].dtype == np.uint8
        assert obs[cam].flags.c_contiguous and obs[cam].std() > 5  # a real picture, not a blank frame
    assert obs["proprio"].shape == (PROPRIO_DIM,) and obs["proprio"].dtype == np.float32
    assert np.all(np.isfinite(obs["proprio"]))
    assert obs["instruction"] == task_set.instructions[0]


def test_reset_step_shapes_and_types(env_and_first_obs, task_set):
    env, first = env_and_first_obs
    _check_obs(first, task_set)
    obs = env.reset()
    _check_obs(obs, task_set)
    up = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, -1.0])
    for _ in range(3):
        nxt, reward, terminated, truncated, info = env.step(up)
    _check_obs(nxt, task_set)
    assert isinstance(reward, float) and reward == 0.0
    assert terminated is False and truncated is False
    assert isinstance(info["success"], bool) and info["success"] is False
    assert nxt["proprio"][2] > obs["proprio"][2] + 0.01  # the end effector moved up
    assert not np.array_equal(nxt["wrist"], obs["wrist"])
    with pytest.raises(ValueError, match="7 values"):
        env.step(np.zeros(4))


def test_truncation_after_max_episode_steps(env_and_first_obs):
    env, _ = env_and_first_obs
    limit, env.max_episode_steps = env.max_episode_steps, 3
    try:
        env.reset()
        flags = [env.step(NOOP)[2:4] for _ in range(3)]
        assert flags == [(False, False), (False, False), (False, True)]
        with pytest.raises(RuntimeError, match="call reset"):
            env.step(NOOP)
    finally:
        env.max_episode_steps = limit


def test_success_comes_from_the_env_check(env_and_first_obs):
    """Put the bowl on the plate (the task's goal) and the env's own predicate reports success."""
    env, _ = env_and_first_obs
    env.reset(init_state=0)
    inner = env._env.env
    assert inner.parsed_problem["goal_state"] == [["on", "akita_black_bowl_1", "plate_1"]]
    _, _, terminated, _, info = env.step(NOOP)
    assert not terminated and not info["success"]
    plate = inner.sim.data.body_xpos[inner.obj_body_id["plate_1"]]
    joint = inner.objects_dict["akita_black_bowl_1"].joints[-1]
    qpos = inner.sim.data.get_joint_qpos(joint).copy()
    qpos[:3] = plate + np.array([0.0, 0.0, 0.05])
    inner.sim.data.set_joint_qpos(joint, qpos)
    inner.sim.forward()
    for _ in range(10):
        _, reward, terminated, truncated, info = env.step(NOOP)
        if terminated:
            break
    assert terminated and info["success"] is True and reward == 1.0 and not truncated
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(NOOP)


def test_same_init_state_gives_same_observation(env_and_first_obs):
    """Soft resets (no scene rebuild) restore the state exactly, whatever happened before."""
    env, _ = env_and_first_obs
    a = env.reset(init_state=5)
    for _ in range(5):
        env.step(np.array([0.5, -0.5, 0.3, 0.1, 0.0, 0.2, 1.0]))
    b = env.reset(init_state=5)
    np.testing.assert_allclose(a["proprio"], b["proprio"], atol=1e-6)
    assert np.array_equal(a["agentview"], b["agentview"]) and np.array_equal(a["wrist"], b["wrist"])
    c = env.reset(init_state=6)
    assert not np.array_equal(a["agentview"], c["agentview"])  # a different fixed initial state
    with pytest.raises(IndexError):
        env.reset(init_state=env.num_init_states)


def test_same_seed_same_initial_observation(env_and_first_obs, task_set):
    env, first = env_and_first_obs
    twin = task_set.make_env(0, seed=SEED)
    try:
        obs = twin.reset()
        assert twin.init_state_index == InitStateSchedule(env.num_init_states, "cycle", SEED).next()
    finally:
        twin.close()
    # Also after many episodes, and after another env in this process freed its renderer.
    for other in (first, env.reset(init_state=twin.init_state_index)):
        np.testing.assert_array_equal(obs["proprio"], other["proprio"])
        assert np.array_equal(obs["agentview"], other["agentview"]) and np.array_equal(obs["wrist"], other["wrist"])


def test_same_start_same_initial_observation_whatever_the_env_seed(env_and_first_obs, task_set):
    """Group rollouts: members on two workers' envs (other seeds) that reset with the same start
    begin from the same init state and fixture placement."""
    env, _ = env_and_first_obs
    with closing(task_set.make_env(0, seed=SEED + 1)) as other:
        a, b = env.reset(start=11), other.reset(start=11)
    assert env.init_state_index == 11 % env.num_init_states
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


def test_fast_render_switch(env_and_first_obs):
    env, _ = env_and_first_obs
    default = env.render_settings()
    if any(s in default["gl_renderer"].lower() for s in ("llvmpipe", "softpipe", "swrast")):
        assert default["fast_render"] is True  # the default on a software renderer

    def make(fast: bool):
        ts = envs.make_task_set("libero", suite=SUITE, tasks=[TASK], image_size=SIZE, fast_render=fast)
        return ts.make_env(0, seed=SEED)

    slow_env = make(False)
    fast_env = env if default["fast_render"] else make(True)
    try:
        slow, fast = slow_env.render_settings(), fast_env.render_settings()
        assert slow["fast_render"] is False and slow["shadows"] and slow["reflections"]
        assert slow["offsamples"] > 0 and slow["context_samples"] > 0
        assert fast["fast_render"] is True and not fast["shadows"] and not fast["reflections"]
        assert fast["offsamples"] == 0 and fast["context_samples"] == 0
        # Same state, different render settings: the same scene, not the same pixels.
        slow_obs, fast_obs = slow_env.reset(init_state=3), fast_env.reset(init_state=3)
        np.testing.assert_allclose(slow_obs["proprio"], fast_obs["proprio"], atol=1e-6)
        assert not np.array_equal(slow_obs["agentview"], fast_obs["agentview"])
        assert np.abs(slow_obs["agentview"].astype(float) - fast_obs["agentview"]).mean() < 40
    finally:
        slow_env.close()
        if fast_env is not env:
            fast_env.close()


def test_backend_cannot_change_after_robosuite_import(env_and_first_obs, task_set):
    env, _ = env_and_first_obs
    other = "osmesa" if env.render_backend == "egl" else "egl"
    bad = envs.make_task_set("libero", suite=SUITE, tasks=[TASK], image_size=SIZE, render_backend=other)
    with pytest.raises(RuntimeError, match="MUJOCO_GL"):
        bad.make_env(0, seed=0)


def test_physics_only_env_has_no_images():
    ts = envs.make_task_set("libero", suite=SUITE, tasks=[TASK], cameras=[], settle_steps=0)
    env = ts.make_env(0, seed=1)
    try:
        obs = env.reset()
        assert set(obs) == {"proprio", "instruction"} and ts.obs_spec["cameras"] == []
        assert env.render_settings() == {}
        obs, *_ = env.step(NOOP)
        assert obs["proprio"].shape == (PROPRIO_DIM,)
    finally:
        env.close()


# ---- in fresh processes: no prompt, the osmesa override, missing assets ------------------
def test_no_prompt_with_an_empty_home(tmp_path):
    """A fresh process with an empty HOME and no stdin builds and renders an env. It also has
    CUDA_VISIBLE_DEVICES="" (what a GPU-less Ray actor gets), which robosuite's EGL device
    selection alone cannot parse."""
    home = tmp_path / "home"
    home.mkdir()
    # Control: LIBERO on its own, with no config file, asks on stdin and fails without one.
    bare = _run_python("import libero.libero", _subprocess_env(HOME=str(home), LIBERO_CONFIG_PATH=str(tmp_path / "x")),
                       tmp_path)
    assert bare.returncode != 0 and "EOFError" in bare.stderr
    code = f"""
        import envs
        ts = envs.make_task_set("libero", suite="{SUITE}", tasks=[{TASK}], image_size=32, settle_steps=1)
        env = ts.make_env(0, seed=0)
        obs = env.reset()
        env.step([0.0] * 7)
        print("OK", obs["agentview"].shape, env.render_settings()["backend"], int(obs["agentview"].std() > 5))
        env.close()
    """
    res = _run_python(code, _subprocess_env(HOME=str(home), CUDA_VISIBLE_DEVICES=""), tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "OK (32, 32, 3) egl 1" in res.stdout
    assert "Do you want" not in res.stdout + res.stderr
    assert not (home / ".libero").exists()


def test_osmesa_backend_override(tmp_path):
    code = f"""
        import envs
        ts = envs.make_task_set("libero", suite="{SUITE}", tasks=[{TASK}], image_size=32, settle_steps=1,
                                render_backend="osmesa")
        env = ts.make_env(0, seed=0)
        obs = env.reset()
        s = env.render_settings()
        print("OK", obs["wrist"].shape, s["backend"], int(obs["agentview"].std() > 5), s["gl_renderer"])
        env.close()
    """
    res = _run_python(code, _subprocess_env(), tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "OK (32, 32, 3) osmesa 1" in res.stdout


def test_missing_assets_is_a_config_error(tmp_path):
    fake = tmp_path / "site" / "libero" / "libero"
    for sub in ("bddl_files", "init_files"):
        (fake / sub).mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    code = """
        import envs
        from async_rl.errors import ConfigError
        try:
            envs.make_task_set("libero", suite="libero_spatial")
        except ConfigError as exc:
            print("CONFIG_ERROR", exc)
    """
    res = _run_python(code, _subprocess_env(PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{ROOT}"), tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "CONFIG_ERROR the installed LIBERO package" in res.stdout and "no assets/scenes there" in res.stdout
    assert "make setup" in res.stdout


def test_held_out_states_are_written_as_the_options_write_them():
    """The report names the held-out states as a range only when they run without a gap (40, 45 is not 40..45)."""
    from envs.libero_evaluation import states_text

    assert states_text([40, 41, 42]) == "40-42"
    assert states_text([40, 45]) == "40, 45"
    assert states_text([7]) == "7"


def test_held_out_evaluation_scores_every_task_from_each_held_out_state():
    """The env's final evaluation runs only when held-out initial states are asked for; then it plays one
    deterministic episode of each task from each of them through ``act`` and reports their success."""
    import torch

    from envs.libero_evaluation import held_out_evaluation

    assert envs.final_evaluation_for("libero") is held_out_evaluation
    ts = envs.make_task_set("libero", suite=SUITE, tasks=[TASK], cameras=[], max_episode_steps=3, settle_steps=0,
                            init_states="0-47", heldout_init_states="48-49")
    assert envs.final_evaluation_for("libero", ts) is held_out_evaluation
    assert envs.final_evaluation_for("libero", envs.make_task_set("libero", suite=SUITE, tasks=[TASK])) is None
    calls = []

    def act(obs, deterministic):
        calls.append((tuple(obs.shape), deterministic))
        return np.tile(NOOP, (obs.shape[0], 1))

    report = held_out_evaluation(ts, act, lambda obs, task: torch.as_tensor(obs["proprio"]), SEED)
    assert [(e["init_state"], e["steps"], e["success"]) for e in report["files"]["heldout_episodes.json"]] == [
        (48, 3, False), (49, 3, False)]  # three no-op steps succeed at nothing; each ran to the limit
    assert calls == [((1, PROPRIO_DIM), True)] * 6
    assert report["scalars"] == {"eval/heldout_success_rate": 0.0, f"eval/heldout_success_rate/{ts.task_names[0]}": 0.0}
    assert report["text"].startswith("libero: 2 held-out episodes (1 tasks x initial states 48-49), deterministic: "
                                     "success 0.000")
