"""No actor's death ends a run with a traceback: a killed evaluator is replaced, a killed replay
buffer comes back with the last checkpoint's items, and the run goes on (real actors, SIGKILL)."""
import os
import signal
import time
from pathlib import Path

import ray

from async_rl import checkpoint as ckpt
from async_rl.config import load_config
from async_rl.driver import run

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = str(ROOT / "configs" / "metaworld_mt1_ppo.yaml")


def _wait(condition, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.2)


def test_a_killed_evaluator_and_a_killed_replay_buffer_do_not_end_the_run(tmp_path):
    log_dir = tmp_path / "run"
    cfg = load_config(["--log-dir", str(log_dir), "--swanlab-mode", "disabled", "--envs-per-worker", "2",
                       "--num-eval-workers", "2", "--eval-interval-epochs", "1", "--eval-episodes", "1",
                       "--train-batch-size", "32", "--accumulation-steps", "2", "--super-batch-size", "64",
                       "--updates-per-epoch", "1", "--max-epochs", "2", "--checkpoint-interval-epochs", "1",
                       "--env-kwargs", "{benchmark: MT1, task: reach-v3, max_episode_steps: 30}",
                       "--log-interval-seconds", "0.01", "--worker-num-cpus", "0.15"], DEFAULT)
    seen = {}

    def inject(runtime):
        poller, e = runtime.eval_poller, runtime.epoch
        # 1. Every evaluator takes a turn: evaluations due at two epochs run on two actors at once.
        poller.poll(e + 1)
        poller.poll(e + 2)
        seen["first_on"] = set(poller.in_flight)
        # 2. An evaluator dies mid-evaluation: it is replaced, and a later evaluation runs.
        victim = sorted(poller.in_flight)[0]
        os.kill(runtime.evaluators.pids[victim], signal.SIGKILL)
        _wait(lambda: not poller.poll(e + 2) and victim not in poller.in_flight, 120, "the dead evaluator replaced")
        seen["evaluator_restarts"] = dict(runtime.evaluators.restarts)
        poller.poll(e + 3)
        seen["results_after"] = poller.finish(120)
        # 3. The replay buffer dies: Ray restarts it, it reloads the last checkpoint's items, and
        # the trainers, workers and the next checkpoint carry on.
        checkpointed = ray.get(runtime.replay.counters.remote(), timeout=60)  # acknowledged so far
        runtime.replay_supervisor.counters()
        os.kill(ray.get(runtime.replay.pid.remote(), timeout=60), signal.SIGKILL)
        seen["epoch"] = runtime.train_epoch()
        seen["checkpoint"] = runtime.save_checkpoint()
        seen["restored_from"] = ray.get(runtime.replay.restored_from.remote(), timeout=60)
        seen["counters"] = runtime.replay_supervisor.counters()
        seen["checkpointed"] = checkpointed
        seen["health"] = runtime.snapshot()["stats"]["health"]

    summary = run(cfg, inspect=inject)
    assert summary["epochs"] >= 2
    assert seen["first_on"] == {"eval-0", "eval-1"}
    assert sum(seen["evaluator_restarts"].values()) == 1, seen["evaluator_restarts"]
    assert seen["results_after"] and all("tasks" in r for r in seen["results_after"])
    assert seen["restored_from"] is not None and Path(seen["restored_from"]).name.startswith("epoch-")
    assert seen["checkpoint"].is_dir()
    curriculum = ckpt.read_meta(seen["checkpoint"])["curriculum"]  # every worker's task sampler is kept
    assert set(curriculum) == {"worker-0", "worker-1"} and all(len(c["outcomes"]) == 1 for c in curriculum.values())
    health = seen["health"]
    assert health["evaluator_restarts"] == 1 and health["replay_restarts"] == 1, health
    # The replay log: everything the buffer acknowledged before the kill is back after it.
    assert health["replay_items_lost"] == 0, health
    assert seen["counters"]["restored_added"] >= seen["checkpointed"]["added"], (seen["counters"], seen["checkpointed"])
