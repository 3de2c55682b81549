"""CompilerGym sidecar throughput: pass applications per second per core, and what keeping each
program's start state saves at reset.

    python benchmarks/bench_compilergym_sidecar.py [--quick] [--programs 6] [--rounds 3] [--out sidecar.json]

One env (``envs/compilergym/env.py``: this process, its Python 3.10 server and CompilerGym's service,
which take turns, so together they use about one core) on csmith programs:

- ``passes``: random passes one per env step, as the per-step policy applies them; passes per
  second of wall time and per CPU second of the three processes together (the per-core rate);
  also ``multistep``: 16 passes per call, as the sequence mode applies them.
- ``reset``: ``--rounds`` visits to each of ``--programs`` programs in turn (as training cycles
  through its programs), every reset after the first visit timed: ``rebuild`` makes the program
  again from its URI at every reset (what the server did before), ``reuse`` resets from the kept
  start state; ``fork`` restores a fork of the start state (the other way to reuse it).
- ``episodes``: 45-pass episodes cycling through the programs, with and without reuse: passes
  per second including the resets.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import psutil

from benchmarks import common
from envs import make_task_set
from envs.compilergym.client import compilergym_unavailable_reason

FIRST_SEED = 1_000_000  # small held-out csmith programs (seeds whose -Oz is below -O0 are used)
EPISODE = 45


class CpuClock:
    """CPU seconds of this process plus the env's server and CompilerGym service processes."""

    def __init__(self, env) -> None:
        pids = [env.client.proc.pid, env.client.call("hello")["service_pid"]]
        self.procs = [psutil.Process()] + [psutil.Process(p) for p in pids if p]

    def __call__(self) -> float:
        return sum(t.user + t.system for t in (p.cpu_times() for p in self.procs))


def _programs(env, count: int) -> list[str]:
    """The first ``count`` csmith seeds from FIRST_SEED that build (the env skips the others)."""
    uris, seed = [], FIRST_SEED
    while len(uris) < count and seed < FIRST_SEED + 10 * count:
        uri = f"generator://csmith-v0/{seed}"
        if env.reset_to(uri) is not None:
            uris.append(uri)
        seed += 1
    return uris


def measure_passes(env, uris: list[str], passes_per_program: int, rng: np.random.Generator) -> dict[str, float]:
    clock, n_flags = CpuClock(env), len(env.ts.flags)
    wall = cpu = 0.0
    step_ms, done = [], 0
    for uri in uris:
        env.reset_to(uri)
        cpu0, t0 = clock(), time.perf_counter()
        for _ in range(passes_per_program):
            s = time.perf_counter()
            *_, terminated, truncated, _ = env.step(np.array([rng.integers(n_flags)]))
            step_ms.append((time.perf_counter() - s) * 1e3)
            done += 1
            if terminated or truncated:
                env.reset_to(uri)
        wall, cpu = wall + time.perf_counter() - t0, cpu + clock() - cpu0
    # Sixteen passes per call (the sequence mode's way): one service call for all of them.
    multi_wall, multi_passes = 0.0, 0
    for uri in uris:
        env.reset_to(uri)
        t0 = time.perf_counter()
        for _ in range(max(passes_per_program // 16, 1)):
            env.apply_passes([int(a) for a in rng.integers(n_flags, size=16)])
            multi_passes += 16
        multi_wall += time.perf_counter() - t0
    return {"passes_per_s": done / wall, "passes_per_cpu_s": done / cpu, "cpu_per_wall": cpu / wall,
            "step_ms_median": statistics.median(step_ms), "step_ms_p90": float(np.percentile(step_ms, 90)),
            "multistep16_passes_per_s": multi_passes / multi_wall, "passes_measured": done}


def _timed_resets(env, uris: list[str], rounds: int, reset) -> tuple[list[float], list[float]]:
    """(first visits, later visits) reset times in ms, visiting ``uris`` in turn ``rounds`` times."""
    first, later = [], []
    for r in range(rounds):
        for uri in uris:
            t0 = time.perf_counter()
            reset(uri)
            (first if r == 0 else later).append((time.perf_counter() - t0) * 1e3)
    return first, later


def measure_resets(task_set, uris: list[str], rounds: int) -> dict[str, float]:
    out = {}
    for name, reuse in (("rebuild", False), ("reuse", True)):
        ts = dataclasses.replace(task_set, reuse_programs=reuse)
        env = ts.make_env(0, seed=0, benchmarks=uris)  # a fresh server: nothing kept from before
        try:
            first, later = _timed_resets(env, uris, rounds, env.reset_to)
        finally:
            env.close()
        out[f"reset_first_{name}_ms_median"] = statistics.median(first)
        out[f"reset_{name}_ms_median"] = statistics.median(later)
        out[f"reset_{name}_ms_mean"] = statistics.fmean(later)
    # The alternative: a fork of the start state, restored at each reset (one program at a time).
    env = task_set.make_env(0, seed=0, benchmarks=uris)
    try:
        restore_ms = []
        for uri in uris:
            env.reset_to(uri)
            env.client.call("fork")
            for _ in range(rounds):
                t0 = time.perf_counter()
                env.client.call("restore")
                restore_ms.append((time.perf_counter() - t0) * 1e3)
    finally:
        env.close()
    out["reset_fork_restore_ms_median"] = statistics.median(restore_ms)
    out["reset_speedup_reuse_vs_rebuild"] = out["reset_rebuild_ms_mean"] / out["reset_reuse_ms_mean"]
    return out


def measure_episodes(task_set, uris: list[str], episodes: int, rng_seed: int) -> dict[str, float]:
    """45-pass episodes cycling through ``uris`` (first visits excluded): passes/s with resets."""
    out = {}
    for name, reuse in (("rebuild", False), ("reuse", True)):
        ts = dataclasses.replace(task_set, reuse_programs=reuse, max_steps=EPISODE)
        env = ts.make_env(0, seed=0, benchmarks=uris)
        rng = np.random.default_rng(rng_seed)
        try:
            for uri in uris:  # first visits: build every program once, untimed
                env.reset_to(uri)
            passes, resetting, t0 = 0, 0.0, time.perf_counter()
            for e in range(episodes):
                r0 = time.perf_counter()
                env.reset_to(uris[e % len(uris)])
                resetting += time.perf_counter() - r0
                truncated = terminated = False
                while not (terminated or truncated):
                    *_, terminated, truncated, _ = env.step(np.array([rng.integers(len(ts.flags))]))
                    passes += 1
            wall = time.perf_counter() - t0
            out[f"episode_passes_per_s_{name}"] = passes / wall
            out[f"episode_reset_share_{name}"] = resetting / wall
        finally:
            env.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "3 programs, 2 rounds, fewer passes (about 1 minute)")
    ap.add_argument("--programs", type=int, default=6, help="csmith programs (seeds 1000000...)")
    ap.add_argument("--rounds", type=int, default=3, help="visits to each program in the reset measurement")
    ap.add_argument("--passes", type=int, default=150, help="random passes per program in the pass measurement")
    ap.add_argument("--episodes", type=int, default=12, help="45-pass episodes per setting in the episode measurement")
    args = ap.parse_args(argv)
    if args.quick:
        args.programs, args.rounds, args.passes, args.episodes = 3, 2, 60, 4
    reason = compilergym_unavailable_reason()
    if reason:
        print(f"error: CompilerGym is not available: {reason}", file=sys.stderr)
        return 2
    task_set = make_task_set("compilergym", mode="per_step", max_steps=10**6, train_seeds=(0, 1), eval_seeds=(FIRST_SEED, 1))
    env = task_set.make_env(0, seed=0, benchmarks=[f"generator://csmith-v0/{FIRST_SEED}"])
    try:
        uris = _programs(env, args.programs)
        sizes = [env.reset_to(u)["ir_count"] for u in uris]
        figures = {**common.machine(), "programs": len(uris), "o0_count_median": float(np.median(sizes)),
                   **measure_passes(env, uris, args.passes, np.random.default_rng(0))}
    finally:
        env.close()
    figures.update(measure_resets(task_set, uris, args.rounds))
    figures.update(measure_episodes(task_set, uris, args.episodes, rng_seed=1))
    figures["quick"] = args.quick
    common.report(figures, args, headline=(
        "passes_per_s", "passes_per_cpu_s", "step_ms_median", "multistep16_passes_per_s", "reset_rebuild_ms_median",
        "reset_reuse_ms_median", "reset_fork_restore_ms_median", "reset_speedup_reuse_vs_rebuild",
        "episode_passes_per_s_rebuild", "episode_passes_per_s_reuse", "o0_count_median", "load_avg_1min"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
