"""The throughput figures side by side (system against raw env, async against sync, request path, weight
sync, inference), in one PNG, from the JSON files the benchmarks wrote.

    python benchmarks/plot_throughput_panels.py --suffix _idle_quick [--results benchmarks/results] [--out throughput_panels_idle_quick.png]

Reads ``throughput*<suffix>.json`` (bench_throughput, merged: ``system_over_raw`` per env and worker count),
``async_vs_sync<suffix>.json``, ``request_path<suffix>.json`` (env steps/s against envs per worker),
``weight_sync<suffix>.json`` (broadcast time against parameter count) and ``inference<suffix>.json``
(latency against batch size), and draws one panel per file; a missing file leaves its panel empty
with its name. Measures nothing.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.errors import OneLineArgumentParser
from benchmarks import common

PANELS = ("throughput", "async_vs_sync", "request_path", "weight_sync", "inference")


def load(results: Path, name: str, suffix: str) -> tuple[Path, Optional[dict[str, Any]]]:
    """``<name><suffix>.json``; for ``throughput`` every ``throughput*<suffix>.json`` merged (e.g. one file
    per environment)."""
    path = results / f"{name}{suffix}.json"
    paths = sorted(results.glob(f"{name}*{suffix}.json")) if name == "throughput" else [path]
    merged: dict[str, Any] = {}
    for p in paths:
        if p.is_file():
            merged.update(json.loads(p.read_text()))
    return path, (merged or None)


def numbered(figures: dict[str, Any], pattern: str) -> list[tuple[float, float]]:
    """(number, value) for every key matching ``pattern`` (one group: the number), sorted."""
    out = []
    for key, value in figures.items():
        m = re.fullmatch(pattern, key)
        if m and isinstance(value, (int, float)) and value is not None:
            out.append((float(m.group(1).replace("p", ".")), float(value)))
    return sorted(out)


def draw_throughput(ax: Any, f: dict[str, Any]) -> None:
    for i, (env, prefix) in enumerate((("MetaWorld", ""), ("LIBERO", "libero_"))):
        points = numbered(f, rf"{prefix}system_over_raw_w(\d+)")
        if points:
            ax.plot(*zip(*points), "o-", color=f"C{i}", label=env)
    ax.axhline(0.7, color="C3", ls=":", label="goal 0.7")
    ax.set(xlabel="rollout workers", ylabel="system / raw env steps/s", title="system_over_raw", ylim=(0, 1))


def draw_async(ax: Any, f: dict[str, Any]) -> None:
    a, s = f.get("async_env_steps_per_sec"), f.get("sync_env_steps_per_sec")
    ua, us = f.get("async_updates_per_sec"), f.get("sync_updates_per_sec")
    ax.bar([-0.2, 0.8], [a or 0, s or 0], 0.4, label="env steps/s")
    ax2 = ax.twinx()
    ax2.bar([0.2, 1.2], [ua or 0, us or 0], 0.4, color="C1", label="updates/s")
    ax.set_xticks([0, 1], ["async", "sync"])
    ax.set(ylabel="env steps/s", title=f"async_speedup {f.get('async_speedup')} (goal 1.8)")
    ax2.set_ylabel("updates/s (one rank)")
    ax2.legend(fontsize=8, loc="upper right")


def draw_request_path(ax: Any, f: dict[str, Any]) -> None:
    points = numbered(f, r"env_steps_per_sec_k(\d+)")
    if points:
        ax.plot(*zip(*points), "o-", label="one worker, no trainers")
    raw = f.get("raw_env_steps_per_sec_one_process")
    if raw:
        ax.axhline(raw, color="C7", ls=":", label="one process, raw env")
    ax.set(xscale="log", xlabel="envs per worker (K)", ylabel="env steps/s", title="cost growth: envs per worker")


def draw_weight_sync(ax: Any, f: dict[str, Any]) -> None:
    for i, (label, pattern) in enumerate((("weight-sync group", r"broadcast_([\d.]+)m_params_seconds"),
                                          ("object store (torch)", r"object_store_([\d.]+)m_params_seconds"))):
        points = numbered(f, pattern)
        if points:
            ax.plot([p for p, _ in points], [1000 * v for _, v in points], "o-", color=f"C{i}", label=label)
    ax.set(xscale="log", yscale="log", xlabel="parameters (millions, float32)", ylabel="ms",
           title="weight broadcast vs parameter count")


def draw_inference(ax: Any, f: dict[str, Any]) -> None:
    timeouts = sorted({m.group(1) for k in f if (m := re.fullmatch(r"p50_ms_b\d+_t([\dp]+)", k))},
                      key=lambda t: float(t.replace("p", ".")))
    for i, t in enumerate(timeouts):
        points = numbered(f, rf"p50_ms_b(\d+)_t{t}")
        ax.plot(*zip(*points), "o-", color=f"C{i}", label=f"p50, timeout {t.replace('p', '.')} ms")
        forward = numbered(f, rf"forward_ms_b(\d+)_t{t}")
        ax.plot(*zip(*forward), "s--", color=f"C{i}", alpha=0.6, label=f"forward, timeout {t.replace('p', '.')} ms")
    ax.set(xscale="log", xlabel="inference batch size", ylabel="ms", title="inference latency vs batch size")


DRAW = {"throughput": draw_throughput, "async_vs_sync": draw_async, "request_path": draw_request_path,
        "weight_sync": draw_weight_sync, "inference": draw_inference}


def main(argv: list[str] | None = None) -> int:

    ap = OneLineArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suffix", default="", help="the benchmarks' --out names are <name><suffix>.json")
    ap.add_argument("--results", default=str(common.ROOT / "benchmarks" / "results"))
    ap.add_argument("--out", default=None, help="PNG (default <results>/throughput_panels<suffix>.png)")
    args = ap.parse_args(argv)
    results = Path(args.results)
    plt = common.pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.2 * len(PANELS), 4.6))
    loads = []
    for ax, name in zip(axes, PANELS):
        path, figures = load(results, name, args.suffix)
        if figures is None:
            ax.set_title(f"{path.name}: not found")
            ax.axis("off")
            continue
        DRAW[name](ax, figures)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        loads.append(f"{name} {figures.get('load_avg_1min', figures.get('load_avg_1min_before', '?'))}")
    out = Path(args.out) if args.out else results / f"throughput_panels{args.suffix}.png"
    common.save(fig, out, f"throughput figures ({args.suffix or 'no suffix'}); 1-min load at start: "
                          + ", ".join(loads))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
