"""Raw environment throughput: N processes, each stepping one env with random actions.

    python benchmarks/bench_env_raw.py --workers 2 --seconds 10 [--task reach-v3] [--out raw.json]

Prints total env steps/s (the sum over workers, each timed over its own stepping window; env
construction and the first reset are not timed). ``raw_env_steps_per_sec`` is importable by other
benchmarks (e.g. to compare end-to-end rollout throughput against this ceiling).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run as a script: make `envs` / `async_rl` importable
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402


def _worker(task_set, task_index: int, seed: int, seconds: float, barrier, results) -> None:
    env = task_set.make_env(task_index, seed)
    env.reset()
    actions = np.random.default_rng(seed).uniform(-1.0, 1.0, size=(1024, task_set.action_dim))
    barrier.wait()
    steps = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        _, _, terminated, truncated, _ = env.step(actions[steps & 1023])
        steps += 1
        if terminated or truncated:
            env.reset()  # resets are part of raw throughput, as they are in real rollouts
        if (steps & 63) == 0 and time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - start
    env.close()
    results.put((steps, elapsed))


def raw_env_steps_per_sec(task_set, workers: int, seconds: float, seed: int = 0) -> float:
    """Total steps/s of ``workers`` processes each stepping ``task_set.make_env(i % n_tasks, seed + i)``.

    Uses the 'spawn' start method (safe when the caller has threads, e.g. torch or Ray).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    n_tasks = len(task_set.task_names)
    procs = [
        ctx.Process(target=_worker, args=(task_set, i % n_tasks, seed + i, seconds, barrier, results), daemon=True)
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        out = [results.get(timeout=seconds + 300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    bad = [p.exitcode for p in procs if p.exitcode not in (0, None)]
    if bad:
        raise RuntimeError(f"benchmark worker(s) exited with codes {bad}")
    return float(sum(steps / elapsed for steps, elapsed in out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--task", default="reach-v3", help="MetaWorld MT1 task")
    ap.add_argument("--max-episode-steps", type=int, default=500)
    ap.add_argument("--out", default=None, help="write flat JSON results here")
    args = ap.parse_args(argv)

    from envs import make_task_set

    t0 = time.perf_counter()
    task_set = make_task_set("metaworld", benchmark="MT1", task=args.task, max_episode_steps=args.max_episode_steps)
    build_s = time.perf_counter() - t0
    sps = raw_env_steps_per_sec(task_set, args.workers, args.seconds)
    print(
        f"raw env steps/s: {sps:,.0f} total ({sps / args.workers:,.0f} per worker), "
        f"workers={args.workers} task={args.task} seconds={args.seconds} (task set built in {build_s:.2f} s)"
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"raw_env_steps_per_sec": sps, "workers": args.workers, "task": args.task}) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
