"""Collection only: the launch's rollout workers, inference actor, replay buffer and stats actor, no trainers.

What the collection path alone costs (the trainers' CPU is left out): a local Ray of 2 CPUs, one
``InferenceActor`` serving its initial weights, ``workers`` ``RolloutWorkerActor``s of the config's
``envs_per_worker`` envs pushing to a ``ReplayBufferActor`` (a bounded FIFO: full, it drops its oldest
items, so nothing stalls). After ``warmup_s`` the workers' env steps are counted over ``seconds``:
``pause`` returns each worker's count at a step boundary, so the window holds whole lock-step rounds.
Beside the rate, the CPU milliseconds per env step of the workers' and the inference actor's processes
over the same window (psutil): a figure the other jobs on a shared machine move far less than a rate.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import psutil
import ray

from benchmarks import common

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig
    from envs.base import TaskSet


def _workers_steps(workers: list[Any], method: str) -> int:
    """Pause (or wait for) every worker; the sum of their env-step counts."""
    return sum(ray.get([getattr(w, method).remote() for w in workers], timeout=120))


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds so far of the processes ``pids``."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def collect_only_steps_per_sec(cfg: RunConfig, task_set: TaskSet, workers: int, seconds: float,
                               warmup_s: float) -> dict[str, float]:
    """Env steps/s of ``workers`` workers collecting with no trainer, and the inference batching seen."""
    from async_rl.actors.inference import InferenceActor  # heavy imports only when needed
    from async_rl.actors.peers import SharedValue
    from async_rl.actors.replay_buffer import ReplayBufferActor
    from async_rl.actors.rollout_worker import RolloutWorkerActor, WorkerPeers
    from async_rl.actors.stats import StatsActor
    from async_rl.orchestration.runtime import Runtime

    runtime = Runtime(cfg, task_set)  # the factories only; starts nothing
    tag = f"collect{os.getpid()}"
    peers = WorkerPeers(task_set=f"{tag}:task_set", inference=f"{tag}:inference", replay=f"{tag}:replay",
                        stats=f"{tag}:stats")
    common.start_local_ray(2)
    try:
        inference = InferenceActor.options(name=peers.inference, num_cpus=0).remote(
            0, runtime.policy_factory, cfg.inference_batch, cfg.inference_timeout_ms, seed=cfg.seed)
        ray.get(inference.serve_built_weights.remote(), timeout=120)
        # Held here: a named actor whose last handle goes away is ended by Ray.
        held = [SharedValue.options(name=peers.task_set, num_cpus=0).remote(task_set),
                ReplayBufferActor.options(name=peers.replay, num_cpus=0).remote(cfg.replay_capacity, cfg.seed),
                StatsActor.options(name=peers.stats, num_cpus=0).remote()]
        ray.get([held[0].get.remote(), held[1].size.remote()], timeout=120)
        actors = [RolloutWorkerActor.options(num_cpus=0).remote(i, peers, runtime.preprocessor_factory, cfg)
                  for i in range(workers)]
        runs = [w.run.remote() for w in actors]
        worker_pids = ray.get([w.pid.remote() for w in actors], timeout=120)
        inference_pid = ray.get(inference.pid.remote(), timeout=60)
        time.sleep(warmup_s)
        start = _workers_steps(actors, "pause")
        ray.get(inference.stats.remote(), timeout=60)  # resets its batching counters
        cpu = _cpu_seconds(worker_pids), _cpu_seconds([inference_pid])
        ray.get([w.resume.remote() for w in actors], timeout=60)
        began = time.perf_counter()
        time.sleep(seconds)
        end = _workers_steps(actors, "pause")
        elapsed = time.perf_counter() - began
        cpu = _cpu_seconds(worker_pids) - cpu[0], _cpu_seconds([inference_pid]) - cpu[1]
        batching = ray.get(inference.stats.remote(), timeout=60)
        ray.get([w.stop.remote() for w in actors], timeout=60)
        ray.get([w.resume.remote() for w in actors], timeout=60)
        ray.get(runs, timeout=120)
    finally:
        ray.shutdown()
    steps = max(end - start, 1)
    return {"env_steps_per_sec": (end - start) / elapsed, "rows_per_forward": batching["batch_size"],
            "forward_ms": batching["forward_ms"], "worker_cpu_ms_per_step": 1000.0 * cpu[0] / steps,
            "inference_cpu_ms_per_step": 1000.0 * cpu[1] / steps}
