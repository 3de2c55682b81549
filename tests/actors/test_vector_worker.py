"""A rollout worker stepping K envs in lock-step (one batched inference request per step, the compact
wire layout both ways) produces, for every env, exactly the experience a single env stepped on its
own produces: the same episodes, the same GAE advantages and value targets, and the same
time-limit bootstraps."""
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from conftest import lone_rollout_worker
from tensordict import TensorDict

from async_rl.algo.estimators import GaeSegmenter
from async_rl.config import load_config
from async_rl.experience import step_records
from async_rl.policies import build_preprocessor

ROOT = Path(__file__).resolve().parents[2]
K = 3
SPEC = {"state_dim": 3}


class CountingEnv:
    """Actions are ignored; the seed sets the rewards, the time limit and (for odd seeds) a terminal
    step, so that envs differ. Observation: (seed, episode, t)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.episode, self.t = seed, -1, 0
        self.limit = 5 + seed % 4
        self.terminal_at = 3 if seed % 2 else None

    def _obs(self) -> np.ndarray:
        return np.array([self.seed % 1000 / 100.0, self.episode, self.t], dtype=np.float32)

    def reset(self):
        self.episode, self.t = self.episode + 1, 0
        return self._obs()

    def step(self, action):
        self.t += 1
        reward = (self.seed % 7) * 0.1 + 0.05 * self.t
        terminated = self.terminal_at is not None and self.episode % 2 == 1 and self.t == self.terminal_at
        return self._obs(), reward, terminated, self.t >= self.limit and not terminated, {}

    def close(self) -> None:
        pass


class CountingTasks:
    task_names = ["count"]

    def make_env(self, task: int, seed: int) -> CountingEnv:
        return CountingEnv(seed)


def reference_items(seed: int, steps: int, value, cfg) -> dict[tuple, dict[str, float]]:
    """One env stepped alone through the estimator's segmenter: (obs) -> the fields of its step."""
    env, preprocess, segmenter = CountingEnv(seed), build_preprocessor("mlp", SPEC), GaeSegmenter(
        cfg.rollout_steps, cfg.gamma, cfg.gae_lambda)
    obs, items = preprocess(env.reset(), "count"), {}
    for _ in range(steps):
        raw, reward, terminated, truncated, _ = env.step(None)
        next_obs = preprocess(raw, "count")
        cut = truncated and not terminated
        learn_reward = reward * cfg.reward_scale + (cfg.gamma * value(next_obs) if cut else 0.0)
        out = {"value": torch.tensor(value(obs)), "logp": torch.zeros(()), "policy_version": torch.tensor(0)}
        record = step_records(obs.unsqueeze(0), TensorDict(out, []).unsqueeze(0), [learn_reward],
                              [terminated or truncated])[0]
        piece = segmenter.add(record, next_obs)
        if piece is not None:
            for row in piece:
                items[tuple(row["obs", "state"].tolist())] = {k: float(row[k]) for k in
                                                              ("reward", "done", "value", "advantage", "value_target")}
        obs = preprocess(env.reset(), "count") if terminated or truncated else next_obs
    return items


@pytest.mark.parametrize("envs, groups, inline", [(K, 1, False), (4, 2, True)],
                         ids=["one-group-env-thread", "two-groups-inline"])
def test_k_lockstepped_envs_match_single_env_references(ray_local, envs, groups, inline):
    """Also with the envs in two lock-step groups (one group's request in flight while the other steps)
    stepped on the worker's event loop: the same experience per env."""
    K = envs
    cfg = load_config(["--envs-per-worker", str(K), "--rollout-steps", "4", "--reward-scale", "1",
                       "--actor-timeout-s", "60", "--env-groups", str(groups),
                       "--inline-env-steps" if inline else "--no-inline-env-steps"],
                      str(ROOT / "configs" / "metaworld_mt1_ppo.yaml"))
    tag = f"vector{time.monotonic_ns()}"
    lone = lone_rollout_worker(tag, CountingTasks(), SPEC, K, cfg)
    worker, inference, replay, factory, run = lone.worker, lone.inference, lone.replay, lone.factory, lone.run
    deadline = time.monotonic() + 60
    while ray.get(replay.size.remote(), timeout=30) < 40 * K:
        assert time.monotonic() < deadline, "the worker did not fill the replay buffer"
        assert not ray.wait([run], timeout=0.2)[0], ray.get(run)
    ray.get(worker.stop.remote(), timeout=30)
    steps = ray.get(run, timeout=60)
    stored = ray.get(replay.snapshot.remote(), timeout=30)

    policy = factory()
    loaded = policy.load_state_dict(ray.get(inference.weights.remote(), timeout=30), strict=False)
    assert not [k for k in loaded.missing_keys if k.startswith("value_net")], loaded
    policy.eval()

    def value(obs) -> float:
        with torch.no_grad():
            return float(policy.value(obs.unsqueeze(0))[0])

    # The worker's env k has the seed its EnvPool gives it (task 0).
    seeds = [cfg.seed + 100_003 + 7_777 * k for k in range(K)]
    reference = {}
    for seed in seeds:
        reference.update(reference_items(seed, steps // K + 1, value, cfg))
    per_env = dict.fromkeys(seeds, 0)
    for row in stored:
        key = tuple(row["obs", "state"].tolist())
        assert key in reference, f"step {key} is not in its env's single-env stream"
        ref = reference[key]
        for field in ("reward", "done", "value", "advantage", "value_target"):
            assert abs(float(row[field]) - ref[field]) < 1e-4, (key, field, float(row[field]), ref[field])
        per_env[next(s for s in seeds if abs(s % 1000 / 100.0 - key[0]) < 1e-4)] += 1
    assert all(n >= 20 for n in per_env.values()), per_env  # every env contributed, episodes of both kinds
    assert {bool(r) for r in stored["done"]} == {False, True}
    for actor in lone.actors:
        ray.kill(actor)
