"""LIBERO env steps/s per worker (one process, one env): default rendering, fast rendering, physics only.

    python benchmarks/bench_libero_env.py [--quick] [--suite libero_spatial] [--task 0]
        [--image-size 128] [--seconds 5] [--rounds 3] [--backend auto] [--out libero_env.json]

Each mode builds its own env of the same task (two cameras, agent view and wrist, at
``--image-size``) in this process, resets it, and steps it with uniform random actions in
``--rounds`` windows of ``--seconds``, interleaved across modes (episodes that end are reset, and
resets count in the time, as in a rollout worker). It reports the best window's steps/s (the one
least slowed by other jobs), the mean over windows, the mean reset time and the env creation time. "default" is MuJoCo's own render settings (4x MSAA,
shadows, reflections), "fast" is the env's fast_render (MSAA, shadows, reflections off; its
default on a software renderer), "physics" renders nothing (``cameras: []``). The numbers are
per core: a worker steps one env at a time.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run as a script: make `envs` / `async_rl` importable
    sys.path.insert(0, str(_ROOT))

from async_rl.errors import OneLineArgumentParser  # noqa: E402 (after the path set-up above)

MODES = {
    "default": {"fast_render": False},
    "fast": {"fast_render": True},
    "physics": {"cameras": []},
}


class ModeRun:
    """One env of the benchmark task in one mode, stepped in timing windows."""

    def __init__(self, mode: str, suite: str, task: int, image_size: int, backend: str, seed: int = 0) -> None:
        from envs import make_task_set

        ts = make_task_set("libero", suite=suite, tasks=[task], image_size=image_size, render_backend=backend,
                           **MODES[mode])
        self.action_dim = ts.action_dim
        t0 = time.perf_counter()
        self.env = ts.make_env(0, seed=seed)
        self.create_s = time.perf_counter() - t0
        self.rng = np.random.default_rng(seed)
        self.env.reset()
        for _ in range(3):  # warm-up (first renders compile shaders)
            self._step()
        self.resets = [_timed(self.env.reset)]
        self.windows: list[float] = []  # steps/s of each window
        self.steps = 0
        self.settings = self.env.render_settings()

    def _step(self) -> None:
        _, _, terminated, truncated, _ = self.env.step(self.rng.uniform(-1.0, 1.0, size=self.action_dim))
        if terminated or truncated:  # resets count in the time, as in a rollout worker
            self.resets.append(_timed(self.env.reset))

    def window(self, seconds: float) -> None:
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            self._step()
            steps += 1
        self.windows.append(steps / (time.perf_counter() - start))
        self.steps += steps

    def result(self) -> dict:
        return {
            "steps_per_sec": max(self.windows),  # the best window: least disturbed by other jobs
            "mean_steps_per_sec": float(np.mean(self.windows)),
            "reset_ms": 1000.0 * float(np.mean(self.resets)),
            "create_s": self.create_s,
            "steps": self.steps,
        }


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = OneLineArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="libero_spatial")
    ap.add_argument("--task", type=int, default=0, help="task index in the suite")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=5.0, help="length of one timing window")
    ap.add_argument("--rounds", type=int, default=3, help="timing windows per mode, interleaved across modes")
    ap.add_argument("--backend", default="auto", choices=["auto", "egl", "osmesa"], help="render_backend")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--quick", action="store_true", help="one 2 s window per mode")
    ap.add_argument("--out", default=None, help="write flat JSON results here")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    seconds, rounds = (2.0, 1) if args.quick else (args.seconds, args.rounds)
    if seconds <= 0 or rounds < 1:
        ap.error("--seconds must be > 0 and --rounds >= 1")

    runs = {m: ModeRun(m, args.suite, args.task, args.image_size, args.backend) for m in modes}
    try:
        for _ in range(rounds):  # interleaved, so load changes hit every mode alike
            for run in runs.values():
                run.window(seconds)
        results = {m: run.result() for m, run in runs.items()}
        renderer = next((r.settings["gl_renderer"] for r in runs.values() if r.settings), "none")
    finally:
        for run in runs.values():
            run.env.close()
    print(f"LIBERO {args.suite} task {args.task}, 2 cameras at {args.image_size}x{args.image_size}, "
          f"{rounds} x {seconds:g} s per mode, renderer: {renderer}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'mode':<10}{'steps/s':>10}{'mean':>8}{'reset ms':>10}{'create s':>10}{'steps':>8}")
    for m, r in results.items():
        print(f"{m:<10}{r['steps_per_sec']:>10.1f}{r['mean_steps_per_sec']:>8.1f}{r['reset_ms']:>10.0f}"
              f"{r['create_s']:>10.1f}{r['steps']:>8}")
    flat: dict = {"suite": args.suite, "task": args.task, "image_size": args.image_size, "seconds": seconds,
                  "rounds": rounds, "gl_renderer": renderer, "load_average": os.getloadavg()[0]}
    for m, r in results.items():
        for k, v in r.items():
            flat[f"{m}_{k}"] = v
    if "default" in results and "fast" in results:
        flat["fast_speedup"] = results["fast"]["steps_per_sec"] / results["default"]["steps_per_sec"]
        print(f"fast render speed-up: {flat['fast_speedup']:.1f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(flat, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
