"""The evaluation worker: every task's episodes, stepped in lock-step (one request per step of all)."""
from types import SimpleNamespace

import numpy as np
import pytest
import ray

from async_rl.actors.evaluation import EvaluationWorkerActor
from async_rl.experience import to_wire


class CountdownEnv:
    """Episodes of ``3 + task`` steps; success when the policy's action is positive on the last step."""

    def __init__(self, task: int) -> None:
        self.length, self.t = 3 + task, 0

    def reset(self):
        self.t = 0
        return np.zeros(1, dtype=np.float32)

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        return np.full(1, self.t, dtype=np.float32), 1.0, False, done, {"success": done and float(action[0]) > 0}

    def close(self):
        pass


class ToyTasks:
    task_names = ["short", "long"]

    def make_env(self, task: int, seed: int):
        return CountdownEnv(task)


def preprocess(raw, instruction):
    import torch
    from tensordict import TensorDict

    return TensorDict({"state": torch.as_tensor(raw)}, batch_size=[])


@ray.remote
class CountingInference:
    """Stands in for the inference actor: action -1 on an episode's first observation (0), +1 after; records rows."""

    def __init__(self):
        self.rows: list[int] = []

    async def request(self, wire, deterministic=False):
        import torch
        from tensordict import TensorDict

        state = torch.as_tensor(wire["state"])
        self.rows.append(len(state))
        out = TensorDict({"env_action": (state >= 1).float() * 2 - 1, "policy_version": torch.full((len(state),), 7)},
                         batch_size=[len(state)])
        return to_wire(out)

    def calls(self):
        return self.rows


@pytest.mark.parametrize("parallel", [4, 3])
def test_episodes_run_in_lock_step_and_are_scored_per_task(ray_local, parallel):
    inference = CountingInference.remote()
    cfg = SimpleNamespace(seed=0, envs_per_worker=parallel, actor_timeout_s=30.0)
    evaluator = EvaluationWorkerActor.remote(0, ToyTasks(), lambda: preprocess, inference, "inference-0", cfg)
    result = ray.get(evaluator.evaluate.remote(2, True), timeout=60)
    assert result["policy_versions"] == [7]
    # The first action (obs 0) is negative, later ones positive: every episode ends in success.
    assert result["tasks"] == {"short": {"success_rate": 1.0, "return": 3.0}, "long": {"success_rate": 1.0, "return": 4.0}}
    rows = ray.get(inference.calls.remote(), timeout=30)
    assert sum(rows) == 2 * 3 + 2 * 4  # one row per env step, nothing stepped twice
    if parallel == 4:  # all four episodes together: 3 steps of 4 rows, then 1 step of the 2 longer ones
        assert rows == [4, 4, 4, 2]
    else:  # chunks of 3 episodes (short, short, long), then the last long one alone
        assert rows == [3, 3, 3, 1, 1, 1, 1, 1]
    ray.get(evaluator.shutdown.remote(), timeout=30)
