"""Asynchronous against synchronous mode: the same actors on MetaWorld MT10, the same time budget.

    python benchmarks/bench_async_vs_sync.py [--quick] [--minutes 4] [--epochs N] [--out async_vs_sync.json] [-- launch flags...]

Runs ``async_rl.driver.run`` twice with ``configs/metaworld_mt1_ppo.yaml`` switched to MT10 (the same
actors, seed and ``--minutes``), once as is and once with ``--sync`` (collect a super-batch per
trainer, train, broadcast, collect again). Rates are read back from each run's TensorBoard events
over its training phase, from the first log point (written after the first epoch) to the last one
before the last epoch ended (so Ray and DeepSpeed start-up and the wind-down are left out of both).
Evaluation is off in both runs (``--num-eval-workers 0``): it competes for the same cores and its
last episodes would run past the time budget:

* env steps/s: growth of ``rollout/total_env_steps`` per second;
* trainer updates/s: growth of ``train/global_step`` (optimizer steps of one rank; the ranks step
  together) per second.

``async_speedup`` = async env steps/s / sync env steps/s (``async_update_speedup`` the same for
updates). ``--epochs`` also stops each run after that many epochs. ``--quick``: 1.25 minutes per
mode with a log point every 2 s (an epoch cap used to end the faster mode after a few seconds, with
too few log points for a rate). ``env_steps_per_update`` is each mode's env steps per optimizer step;
``trainer_data_waits`` the epochs whose super-batch was not ready (``--max-sample-reuse`` bounds
updates per env step). Extra launch flags after ``--`` go to both runs, except the asynchronous-only
``--max-sample-reuse`` (refused with ``--sync``), which goes to the async run only. Nothing is asserted.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common

if TYPE_CHECKING:
    from envs.base import TaskSet

ENV_KWARGS = "{benchmark: MT10, task: null, max_episode_steps: 500}"
ASYNC_ONLY_FLAGS = ("--max-sample-reuse",)  # the config refuses them with --sync


def flags_for(mode: str, extra: list[str]) -> list[str]:
    """``extra`` without the asynchronous-only flags (and their values) for the sync run."""
    if mode == "async":
        return list(extra)
    out, skip_value = [], False
    for arg in extra:
        if skip_value:
            skip_value = False
        elif arg in ASYNC_ONLY_FLAGS:
            skip_value = True
        elif not arg.startswith(tuple(f"{f}=" for f in ASYNC_ONLY_FLAGS)):
            out.append(arg)
    return out


def run_mode(mode: str, minutes: float, epochs: int | None, seed: int, log_root: Path, task_set: TaskSet,
             extra: list[str], log_interval_s: float = common.LOG_INTERVAL_S) -> dict[str, Any]:
    """One run in ``mode`` ("async" or "sync"); its rates and curves."""
    log_dir = log_root / mode
    timed = common.timed_run(
        common.ROOT / "configs" / "metaworld_mt1_ppo.yaml", log_dir, minutes,
        ["--env-kwargs", ENV_KWARGS, "--seed", str(seed), "--num-eval-workers", "0",
         *(["--sync"] if mode == "sync" else []), *(["--max-epochs", str(epochs)] if epochs else []), *flags_for(mode, extra)],
        task_set, log_interval_s)
    data_waits = common.scalars(log_dir, "health/data_waits")
    summary, t0 = timed.summary, timed.started
    steps, updates = common.training_steps(log_dir)
    lag = [v for _, v in common.scalars(log_dir, "rollout/policy_lag")]
    epoch_s = [v for _, v in common.scalars(log_dir, "train/epoch_seconds")]
    # The training window: from the first log point (written after the first epoch) to the last.
    start = steps[0][0] if steps else t0
    updates_in = [p for p in updates if p[0] >= start] or updates
    return {
        "env_steps_per_sec": common.rate(steps),
        "updates_per_sec": common.rate(updates_in),
        "epochs": summary.get("epochs", 0),
        "env_steps": int(steps[-1][1]) if steps else 0,
        "updates": int(updates[-1][1]) if updates else 0,
        "wall_seconds": summary.get("wall_seconds", time.time() - t0),
        "first_log_seconds": start - t0,
        "policy_lag_mean": sum(lag) / len(lag) if lag else float("nan"),
        "epoch_seconds_mean": sum(epoch_s) / len(epoch_s) if epoch_s else float("nan"),
        "broadcast_seconds_mean": summary.get("broadcast_seconds_mean", float("nan")),
        "success_rate_last": summary.get("rollout/success_rate"),
        "trainer_data_waits": int(data_waits[-1][1]) if data_waits else 0,
        "env_steps_per_update": common.ratio(common.rate(steps), common.rate(updates_in)),
        "curve_steps": [(t - t0, v) for t, v in steps],
        "curve_updates": [(t - t0, v) for t, v in updates],
    }


def plot(runs: dict[str, dict[str, Any]], figures: dict[str, Any], path: Path, title: str) -> None:
    plt = common.pyplot()
    fig, (ax_steps, ax_upd, ax_bar) = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [3, 3, 2]})
    for i, (mode, r) in enumerate(runs.items()):
        if r["curve_steps"]:
            ax_steps.plot(*zip(*r["curve_steps"]), "o-", ms=3, color=f"C{i}",
                          label=f"{mode}: {r['env_steps_per_sec']:,.0f} steps/s")
        if r["curve_updates"]:
            ax_upd.plot(*zip(*r["curve_updates"]), ".-", ms=3, color=f"C{i}",
                        label=f"{mode}: {r['updates_per_sec']:.2f} updates/s")
    ax_steps.set(xlabel="seconds since run() started", ylabel="total env steps", title="env steps (MT10)")
    ax_upd.set(xlabel="seconds since run() started", ylabel="optimizer steps (one rank)", title="trainer updates")
    for ax in (ax_steps, ax_upd):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    modes = list(runs)
    x = range(len(modes))
    steps_rel = [runs[m]["env_steps_per_sec"] / runs[modes[-1]]["env_steps_per_sec"] for m in modes]
    upd_rel = [runs[m]["updates_per_sec"] / runs[modes[-1]]["updates_per_sec"] for m in modes]
    ax_bar.bar([i - 0.2 for i in x], steps_rel, 0.4, label="env steps/s")
    ax_bar.bar([i + 0.2 for i in x], upd_rel, 0.4, label="updates/s")
    ax_bar.axhline(1.8, color="grey", ls=":", label="target 1.8x")
    ax_bar.set_xticks(list(x), modes)
    ax_bar.set(ylabel=f"relative to {modes[-1]}", title=f"async_speedup {figures.get('async_speedup')}")
    ax_bar.legend(fontsize=8)
    common.save(fig, path, title)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "1.25 minutes per mode, logging every 2 s (about 3 minutes in all)")
    ap.add_argument("--minutes", type=float, default=None, help="per mode, start-up included (default 4; quick 1.25)")
    ap.add_argument("--epochs", type=int, default=None, help="stop each mode after this many epochs (default: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-root", default="runs/bench_async_vs_sync")
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    minutes = args.minutes or (1.25 if args.quick else 4.0)
    # Quick runs are capped by time, not epochs: an epoch cap lets whichever mode trains faster stop
    # after a few seconds, with fewer than the two log points a rate needs (it was then null).
    epochs = args.epochs
    log_interval_s = 2.0 if args.quick else common.LOG_INTERVAL_S

    import envs
    from async_rl.config import load_config

    clock = common.Stopwatch()
    info = common.machine()
    cfg = load_config(["--env-kwargs", ENV_KWARGS, *extra], str(common.ROOT / "configs" / "metaworld_mt1_ppo.yaml"))
    task_set = envs.make_task_set(cfg.env, **cfg.env_kwargs)  # MT10 is built once (~8 s) for both runs
    runs = {mode: run_mode(mode, minutes, epochs, args.seed, Path(args.log_root), task_set, extra, log_interval_s)
            for mode in ("async", "sync")}

    a, s = runs["async"], runs["sync"]
    figures: dict[str, Any] = {
        "async_env_steps_per_sec": round(a["env_steps_per_sec"], 1),
        "sync_env_steps_per_sec": round(s["env_steps_per_sec"], 1),
        "async_speedup": round(common.ratio(a["env_steps_per_sec"], s["env_steps_per_sec"]), 3),
        "async_updates_per_sec": round(a["updates_per_sec"], 3),
        "sync_updates_per_sec": round(s["updates_per_sec"], 3),
        "async_update_speedup": round(common.ratio(a["updates_per_sec"], s["updates_per_sec"]), 3),
    }
    for mode, r in runs.items():
        for key in ("epochs", "env_steps", "updates", "wall_seconds", "first_log_seconds", "policy_lag_mean",
                    "epoch_seconds_mean", "broadcast_seconds_mean", "success_rate_last", "trainer_data_waits",
                    "env_steps_per_update"):
            value = r[key]
            figures[f"{mode}_{key}"] = round(value, 4) if isinstance(value, float) else value
    figures.update({"minutes_per_mode": minutes, "max_epochs_per_mode": epochs, "num_rollout_workers": cfg.num_rollout_workers,
                    "envs_per_worker": cfg.envs_per_worker, "num_trainers": cfg.num_trainers,
                    "super_batch_size": cfg.super_batch_size, "updates_per_epoch": cfg.updates_per_epoch,
                    "max_sample_reuse": cfg.max_sample_reuse,
                    "quick": args.quick, **info, "load_avg_1min_end": round(os.getloadavg()[0], 2),
                    "bench_seconds": clock()})

    common.print_table([{"mode": m, **{k: r[k] for k in ("env_steps_per_sec", "updates_per_sec", "epochs", "env_steps",
                                                          "updates", "policy_lag_mean", "epoch_seconds_mean",
                                                          "wall_seconds")}} for m, r in runs.items()],
                       title="\nMetaWorld MT10, same actors and budget")
    title = (f"MetaWorld MT10, async vs --sync, {minutes:g} min each, {info['cores']} cores, "
             f"1-min load {info['load_avg_1min']} -> {figures['load_avg_1min_end']}")
    common.report(figures, args, lambda p: plot(runs, figures, p, title),
                  headline=("async_env_steps_per_sec", "sync_env_steps_per_sec", "async_speedup",
                            "async_updates_per_sec", "sync_updates_per_sec", "async_update_speedup", "bench_seconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
