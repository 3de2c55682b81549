"""MetaWorld TaskSet / TaskEnv and the env registry. MT10 takes ~10 s to build; MT50 is not built."""
from __future__ import annotations

import pickle
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("metaworld")

from async_rl.errors import ConfigError
from envs import ENVS, TaskEnv, TaskSet, available_envs, final_evaluation_for, make_task_set


@pytest.fixture(scope="module")
def reach():
    return make_task_set("metaworld", benchmark="MT1", task="reach-v3", seed=0, max_episode_steps=20)


def _actions(n: int, seed: int = 123) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(n, 4))


def test_registry_lists_metaworld():
    assert "metaworld" in available_envs()
    assert "metaworld" in ENVS
    assert final_evaluation_for("metaworld") is None  # it registers no final evaluation


def test_import_envs_does_not_import_metaworld():
    code = "import sys, envs; assert 'metaworld' not in sys.modules, 'envs imported metaworld'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[2]))


def test_unknown_env_name_lists_valid_names():
    with pytest.raises(ConfigError, match=r"unknown environment 'metawrld'.*did you mean 'metaworld'.*metaworld"):
        make_task_set("metawrld")


def test_unknown_env_option():
    with pytest.raises(ConfigError, match=r"unknown metaworld env option 'benchmrk'.*benchmark"):
        make_task_set("metaworld", benchmrk="MT10")


def test_unknown_task_and_benchmark():
    with pytest.raises(ConfigError, match=r"unknown MetaWorld task 'reach-v2'.*did you mean 'reach-v3'"):
        make_task_set("metaworld", benchmark="MT1", task="reach-v2")
    with pytest.raises(ConfigError, match=r"metaworld env option 'benchmark' = 'MT11': Input should be 'MT1', 'MT10' or 'MT50'"):
        make_task_set("metaworld", benchmark="MT11")
    with pytest.raises(ConfigError, match=r"MT1 needs a task"):
        make_task_set("metaworld", benchmark="MT1", task=None)
    with pytest.raises(ConfigError, match=r"only applies to benchmark MT1"):
        make_task_set("metaworld", benchmark="MT10", task="push-v3")
    with pytest.raises(ConfigError, match=r"max_episode_steps"):
        make_task_set("metaworld", max_episode_steps=0)


def test_task_set_builds_and_pickles(reach):
    assert isinstance(reach, TaskSet)
    assert reach.task_names == ["reach-v3"]
    assert (reach.obs_dim, reach.action_dim, reach.max_episode_steps) == (39, 4, 20)
    t0 = time.perf_counter()
    blob = pickle.dumps(reach)
    clone = pickle.loads(blob)
    assert time.perf_counter() - t0 < 1.0
    assert clone.task_names == reach.task_names and clone.task_data == reach.task_data
    env = clone.make_env(0, seed=0)
    assert env.reset().shape == (39,)
    env.close()


def test_reset_step_shapes_and_dtypes(reach):
    env = reach.make_env(0, seed=1)
    assert isinstance(env, TaskEnv)
    assert env.task_name == "reach-v3"
    obs = env.reset()
    assert obs.shape == (39,) and obs.dtype == np.float32
    obs, reward, terminated, truncated, info = env.step(np.array([5.0, -5.0, 0.3, 0.0], dtype=np.float32))  # clipped
    assert obs.shape == (39,) and obs.dtype == np.float32
    assert isinstance(reward, float) and np.isfinite(reward)
    assert terminated is False and truncated is False
    assert isinstance(info["success"], bool)
    with pytest.raises(ValueError, match="4 values"):
        env.step(np.zeros(3))
    env.close()


def test_truncation_at_max_episode_steps(reach):
    env = reach.make_env(0, seed=2)
    for _episode in range(2):
        env.reset()
        for t in range(1, 21):
            _, _, terminated, truncated, _ = env.step(np.zeros(4))
            assert not terminated
            assert truncated == (t == 20)
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.zeros(4))
    env.close()


def test_long_episodes_past_metaworld_limit():
    ts = make_task_set("metaworld", benchmark="MT1", task="reach-v3", max_episode_steps=505)
    env = ts.make_env(0, seed=0)
    env.reset()
    flags = [env.step(np.zeros(4))[3] for _ in range(505)]
    assert not any(flags[:-1]) and flags[-1]
    env.close()


def test_determinism_same_seed(reach):
    acts = _actions(15)

    def rollout(seed: int) -> tuple[list[np.ndarray], list[float]]:
        env = reach.make_env(0, seed=seed)
        firsts, rewards = [], []
        for _ in range(3):  # several resets: goal sampling must follow the seed too
            firsts.append(env.reset())
            rewards += [env.step(a)[1] for a in acts]
        env.close()
        return firsts, rewards

    f1, r1 = rollout(7)
    f2, r2 = rollout(7)
    for a, b in zip(f1, f2):
        np.testing.assert_array_equal(a, b)
    assert r1 == r2
    f3, _ = rollout(8)
    assert any(not np.array_equal(a, b) for a, b in zip(f1, f3))  # other seed, other goals
    # goals vary across resets of one env (obs[36:39] is the goal position in MT benchmarks)
    assert len({tuple(f[36:39]) for f in f1}) > 1


def test_reward_scale():
    ts1 = make_task_set("metaworld", task="reach-v3", max_episode_steps=5)
    ts2 = make_task_set("metaworld", task="reach-v3", max_episode_steps=5, reward_scale=0.1)
    e1, e2 = ts1.make_env(0, seed=3), ts2.make_env(0, seed=3)
    e1.reset(), e2.reset()
    for a in _actions(5):
        assert e2.step(a)[1] == pytest.approx(0.1 * e1.step(a)[1])


def test_mt10_has_ten_distinct_tasks():  # builds MT10: ~8-10 s
    ts = make_task_set("metaworld", benchmark="MT10", task=None, max_episode_steps=10)
    assert len(ts.task_names) == 10 and len(set(ts.task_names)) == 10
    assert all(len(d) == 50 for d in ts.task_data)
    clone = pickle.loads(pickle.dumps(ts))
    idx = len(ts.task_names) - 1
    env = clone.make_env(idx, seed=0)
    assert env.task_name == ts.task_names[idx]
    obs = env.reset()
    assert obs.shape == (39,) and obs.dtype == np.float32
    env.close()
