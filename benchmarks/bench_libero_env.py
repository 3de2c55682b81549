"""LIBERO env steps/s per worker (one process, one env): default rendering, fast rendering, physics only.

    python benchmarks/bench_libero_env.py [--quick] [--suite libero_spatial] [--task 0]
        [--image-size 128] [--seconds 10] [--backend auto] [--out libero_env.json]

Each mode builds its own env of the same task (two cameras, agent view and wrist, at
``--image-size``), resets it, steps it with uniform random actions for ``--seconds`` (episodes that
end are reset, and resets count in the time, as in a rollout worker), and reports steps/s, the
mean reset time and the env creation time. "default" is MuJoCo's own render settings (4x MSAA,
shadows, reflections), "fast" is the env's fast_render (MSAA, shadows, reflections off; its
default on a software renderer), "physics" renders nothing (``cameras: []``). The numbers are
per core: a worker steps one env at a time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run as a script: make `envs` / `async_rl` importable
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

MODES = {
    "default": {"fast_render": False},
    "fast": {"fast_render": True},
    "physics": {"cameras": []},
}


def measure(mode: str, suite: str, task: int, image_size: int, seconds: float, backend: str, seed: int = 0) -> dict:
    """Steps/s of one env of ``suite`` task ``task`` in ``mode`` (a key of MODES)."""
    from envs import make_task_set  # noqa: PLC0415

    ts = make_task_set("libero", suite=suite, tasks=[task], image_size=image_size, render_backend=backend,
                       **MODES[mode])
    t0 = time.perf_counter()
    env = ts.make_env(0, seed=seed)
    create_s = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    try:
        resets = [_timed(env.reset)]
        for _ in range(3):  # warm-up (first renders compile shaders)
            env.step(rng.uniform(-1.0, 1.0, size=ts.action_dim))
        steps, start = 0, time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            _, _, terminated, truncated, _ = env.step(rng.uniform(-1.0, 1.0, size=ts.action_dim))
            steps += 1
            if terminated or truncated:
                resets.append(_timed(env.reset))
        elapsed = time.perf_counter() - start
        settings = env.render_settings()
    finally:
        env.close()
    return {
        "steps_per_sec": steps / elapsed,
        "reset_ms": 1000.0 * float(np.mean(resets)),
        "create_s": create_s,
        "steps": steps,
        "gl_renderer": settings.get("gl_renderer", ""),
        "backend": settings.get("backend", "none"),
    }


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="libero_spatial")
    ap.add_argument("--task", type=int, default=0, help="task index in the suite")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=10.0, help="stepping time per mode")
    ap.add_argument("--backend", default="auto", choices=["auto", "egl", "osmesa"], help="render_backend")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--quick", action="store_true", help="2 s per mode")
    ap.add_argument("--out", default=None, help="write flat JSON results here")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    seconds = 2.0 if args.quick else args.seconds

    results = {m: measure(m, args.suite, args.task, args.image_size, seconds, args.backend) for m in modes}
    renderer = next((r["gl_renderer"] for r in results.values() if r["gl_renderer"]), "none")
    print(f"LIBERO {args.suite} task {args.task}, 2 cameras at {args.image_size}x{args.image_size}, "
          f"{seconds:g} s per mode, renderer: {renderer}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'mode':<10}{'steps/s':>10}{'reset ms':>10}{'create s':>10}{'steps':>8}")
    for m, r in results.items():
        print(f"{m:<10}{r['steps_per_sec']:>10.1f}{r['reset_ms']:>10.0f}{r['create_s']:>10.1f}{r['steps']:>8}")
    flat: dict = {"suite": args.suite, "task": args.task, "image_size": args.image_size, "seconds": seconds,
                  "gl_renderer": renderer, "load_average": os.getloadavg()[0]}
    for m, r in results.items():
        for k in ("steps_per_sec", "reset_ms", "create_s", "steps"):
            flat[f"{m}_{k}"] = r[k]
    if "default" in results and "fast" in results:
        flat["fast_speedup"] = results["fast"]["steps_per_sec"] / results["default"]["steps_per_sec"]
        print(f"fast render speed-up: {flat['fast_speedup']:.1f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(flat, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
