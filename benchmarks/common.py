"""What every benchmark shares: its command line, its outputs (table, flat JSON, PNG) and a local Ray.

Each benchmark's ``main`` builds its parser with :func:`parser` (``--quick``, ``--out``, ``--plot``),
measures, then calls :func:`report` with its flat figures and a plotting function.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `async_rl` / `envs` / `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from async_rl.errors import OneLineArgumentParser  # noqa: E402 (after the path set-up above)

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig
    from envs.base import TaskSet

Scalar = (int, float, str, bool, type(None))


def parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark has."""
    ap = OneLineArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", default=None, help="write the figures here as flat JSON")
    ap.add_argument("--plot", default=None, help="write the PNG plot here (default: --out with .png)")
    return ap


def plot_path(args: argparse.Namespace) -> Optional[Path]:
    if args.plot:
        return Path(args.plot)
    return Path(args.out).with_suffix(".png") if args.out else None


def machine() -> dict[str, Any]:
    """Facts recorded with every result: cores, memory, GPU or not, and how loaded the machine was."""
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:
        gpu = "unknown"
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cores": os.cpu_count(), "memory_gib": round(mem_gib, 1), "gpu": gpu,
            "load_avg_1min": round(os.getloadavg()[0], 2)}


def run_facts(quick: bool, load_before: Sequence[float], load_after: Sequence[float], seconds: float) -> dict[str, Any]:
    """What a benchmark's figures say of its own run: quick or not, cores, the 1-minute load average
    before and after (``os.getloadavg()`` at its start and end) and how long it took."""
    return {"quick": quick, "cores": os.cpu_count(), "load_avg_1min_before": round(load_before[0], 2),
            "load_avg_1min_after": round(load_after[0], 2), "bench_seconds": round(seconds, 1)}


def print_table(rows: Sequence[Mapping[str, Any]], columns: Optional[Sequence[str]] = None, title: str = "") -> None:
    """Rows of dicts as an aligned text table (floats with 4 significant digits)."""
    if not rows:
        return
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    if title:
        print(title)
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)), flush=True)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def report(figures: Mapping[str, Any], args: argparse.Namespace, plot: Optional[Callable[[Path], None]] = None,
           headline: Sequence[str] = ()) -> None:
    """Print the figures (``headline`` keys first), write ``--out`` (flat JSON) and the PNG."""
    bad = {k: type(v).__name__ for k, v in figures.items() if not isinstance(v, Scalar)}
    if bad:
        raise TypeError(f"figures must be flat (numbers, strings, booleans, null); not: {bad}")
    # nan (e.g. a rate with fewer than two log points) is not JSON: it is written as null
    figures = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in figures.items()}
    keys = [k for k in headline if k in figures] or list(figures)
    width = max(map(len, keys))
    print()
    for key in keys:
        print(f"{key:<{width}}  {_fmt(figures[key])}")
    png = plot_path(args)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(dict(figures), indent=2) + "\n")
        print(f"wrote {out}")
    if png is not None and plot is not None:
        png.parent.mkdir(parents=True, exist_ok=True)
        plot(png)
        print(f"wrote {png}")


def pyplot():
    """matplotlib's pyplot on the file-only backend (no display here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def label_panel(ax: Any, ylabel: str, title: str, from_zero: bool = False, **legend: Any) -> None:
    """One panel's y label, title and legend (``legend``: its options, font size 8 unless given);
    ``from_zero``: the y axis starts at 0."""
    ax.set_ylabel(ylabel)
    if from_zero:
        ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(**{"fontsize": 8, **legend})


def save(fig: Any, path: Path, title: str = "") -> None:
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def start_local_ray(num_cpus: int, attempts: int = 3) -> None:
    """A fresh local Ray bound to 127.0.0.1 whose workers import this checkout (as ``driver.init_ray``).

    Ray gives its raylet a fixed 30 s to register, which a loaded machine can miss: retry a few
    times. The caller calls ``ray.shutdown()`` in a ``finally``.
    """
    import ray

    from async_rl.process_setup import pythonpath_with  # imports torch: only when needed

    env_vars = {"PYTHONPATH": pythonpath_with(ROOT)}
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                     runtime_env={"env_vars": env_vars}, log_to_driver=True, logging_level="WARNING")
            return
        except Exception as e:  # Ray raises a bare Exception on a start-up timeout
            ray.shutdown()
            if attempt == attempts:
                raise
            print(f"ray.init failed ({e}); retrying ({attempt}/{attempts})", file=sys.stderr, flush=True)


LOG_INTERVAL_S = 5.0  # TensorBoard points every 5 s: enough for rates and curves of minutes-long runs


@dataclass
class TimedRun:
    cfg: RunConfig
    task_set: TaskSet
    summary: dict[str, Any]
    started: float  # time.time() when run() was called (TensorBoard wall times are on this clock)


def timed_run(config: Path, log_dir: Path, minutes: float, argv: Sequence[str] = (), task_set: Optional[TaskSet] = None,
              log_interval_s: float = LOG_INTERVAL_S) -> TimedRun:
    """One run of the system for ``minutes`` with ``config`` + ``argv``, logging every
    ``log_interval_s`` into a fresh ``log_dir`` (old event files would mix into its rates). No evaluation before
    training: figures over a run's wall clock (seconds to a success rate, rates from the start) stay comparable
    with the recorded results and with peers that do not evaluate first."""
    from async_rl.config import load_config  # heavy imports only when needed
    from async_rl.driver import prepare, run

    shutil.rmtree(log_dir, ignore_errors=True)
    cfg = load_config(["--max-minutes", str(minutes), "--log-dir", str(log_dir), "--swanlab-mode", "disabled",
                       "--log-interval-seconds", str(log_interval_s), "--no-eval-before-training", *argv], str(config))
    task_set = task_set if task_set is not None else prepare(cfg)
    started = time.time()
    return TimedRun(cfg, task_set, run(cfg, task_set), started)


def scalars(log_dir: str | Path, tag: str) -> list[tuple[float, float]]:
    """``(wall_time, value)`` of every TensorBoard event of ``tag`` under ``log_dir`` ([] if none)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}).Reload()
    if tag not in events.Tags()["scalars"]:
        return []
    return [(e.wall_time, float(e.value)) for e in events.Scalars(tag)]


def rate(points: Sequence[tuple[float, float]]) -> float:
    """Growth per second of a running total between its first and last point (nan if < 2 points)."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return float("nan")
    (t0, v0), (t1, v1) = points[0], points[-1]
    return (v1 - v0) / (t1 - t0)


def training_steps(log_dir: str | Path) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(``rollout/total_env_steps`` points, ``train/global_step`` points) of a run's training phase.

    The first log point is written after the first epoch (start-up is before it); points after the
    last epoch are dropped: the run's final snapshot comes after the loop, while it winds down.
    """
    updates = scalars(log_dir, "train/global_step")
    end = updates[-1][0] if updates else float("inf")
    return [p for p in scalars(log_dir, "rollout/total_env_steps") if p[0] <= end + 1e-3], updates


def optional_import(module: str) -> Optional[str]:
    """None if ``module`` imports, else the one-line reason it does not (for guarded benchmark parts)."""
    import importlib

    try:
        importlib.import_module(module)
        return None
    except Exception as exc:  # noqa: BLE001 - any import failure means "not installed here"
        return f"{module} not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"


class Stopwatch:
    """Seconds since construction; the benchmark's total is recorded with its figures."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return round(time.perf_counter() - self.start, 1)


# The LIBERO / tiny-VLA parts run only where that code and its extra are installed.
LIBERO_MODULES = ("envs.libero", "async_rl.policies.vla")
LIBERO_CONFIG = ROOT / "configs" / "libero_ppo.yaml"


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, nan where the denominator is 0 or nan (a run that measured nothing)."""
    return numerator / denominator if denominator and not math.isnan(denominator) else float("nan")


def libero_unavailable(config: Path = LIBERO_CONFIG) -> Optional[str]:
    """None if the LIBERO environment, the VLA policy and ``config`` are all here; else why not."""
    for module in LIBERO_MODULES:
        reason = optional_import(module)
        if reason:
            return reason
    return None if Path(config).is_file() else f"{config} not found (pass the LIBERO launch config)"
