"""Raw environment throughput: N processes, each stepping one env with random actions.

    python benchmarks/bench_env_raw.py [--quick] --workers 2 --seconds 10 [--task reach-v3] [--out raw.json]

Prints total env steps/s (the sum over workers, each timed over its own stepping window; env
construction and the first reset are not timed) and each worker's. ``raw_env_steps_per_sec`` is
importable by other benchmarks (e.g. to compare end-to-end rollout throughput against this ceiling).
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks import common


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
    """Total steps/s of ``workers`` processes each stepping ``task_set.make_env(i % n_tasks, seed + i)``."""
    return sum(per_worker_steps_per_sec(task_set, workers, seconds, seed))


def per_worker_steps_per_sec(task_set, workers: int, seconds: float, seed: int = 0) -> list[float]:
    """Steps/s of each of ``workers`` processes stepping at the same time.

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
    return [float(steps / elapsed) for steps, elapsed in out]


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "3 s of stepping instead of 10")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=None, help="stepping window (default 10; quick 3)")
    ap.add_argument("--task", default="reach-v3", help="MetaWorld MT1 task")
    ap.add_argument("--max-episode-steps", type=int, default=500)
    args = ap.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 10.0)

    from envs import make_task_set

    clock = common.Stopwatch()
    info = common.machine()
    t0 = time.perf_counter()
    task_set = make_task_set("metaworld", benchmark="MT1", task=args.task, max_episode_steps=args.max_episode_steps)
    build_s = time.perf_counter() - t0
    rates = per_worker_steps_per_sec(task_set, args.workers, seconds)
    common.print_table([{"worker": i, "env_steps_per_sec": r} for i, r in enumerate(rates)],
                       title=f"MetaWorld MT1 {args.task}, random actions, {seconds:g} s")
    figures = {"raw_env_steps_per_sec": round(sum(rates), 1),
               "raw_env_steps_per_sec_per_worker": round(sum(rates) / len(rates), 1),
               "workers": args.workers, "task": args.task, "seconds": seconds,
               "task_set_build_seconds": round(build_s, 2), "quick": args.quick, **info, "bench_seconds": clock()}

    def plot(path: Path) -> None:
        plt = common.pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar([f"worker {i}" for i in range(len(rates))] + ["total"], [*rates, sum(rates)],
               color=[*["C0"] * len(rates), "C1"])
        ax.set_ylabel("env steps/s")
        ax.grid(axis="y", alpha=0.3)
        common.save(fig, path, f"raw MetaWorld {args.task}, random actions, {args.workers} processes, "
                               f"{info['cores']} cores (load {info['load_avg_1min']})")

    common.report(figures, args, plot, headline=("raw_env_steps_per_sec", "raw_env_steps_per_sec_per_worker",
                                                 "workers", "bench_seconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
