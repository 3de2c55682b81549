"""The whole system's env steps/s against the raw environment on this machine, and the broadcast cost.

    python benchmarks/bench_throughput.py [--quick] [--minutes 3] [--envs metaworld,libero] [--out system.json]
        [-- launch flags...]

For each environment, runs its launch config (MetaWorld: ``configs/metaworld_mt1_ppo.yaml``; LIBERO
with the tiny VLA: ``--libero-config``, only where ``envs.libero`` and ``async_rl.policies.vla``
import, otherwise skipped with the reason printed) for ``--minutes``, then the same number of worker
processes stepping that environment with random actions and no model. The system's rate is the
growth of ``rollout/total_env_steps`` per second over the training phase (first log point, after
the first epoch, to the last epoch; start-up and wind-down are left out). ``system_over_raw`` = system / raw; the
weight-broadcast time is the mean over the run for the policy's size. Extra launch flags after
``--`` go to every run. Nothing is asserted.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from benchmarks.bench_env_raw import raw_env_steps_per_sec  # noqa: E402

CONFIGS = {"metaworld": common.ROOT / "configs" / "metaworld_mt1_ppo.yaml", "libero": common.LIBERO_CONFIG}


def measure(env: str, config: Path, minutes: float, raw_seconds: float, log_root: Path,
            extra: list[str], workers: int | None = None) -> dict[str, Any]:
    """The system's steps/s for ``minutes`` (with ``workers`` rollout workers, else the config's),
    then the raw env's with as many processes."""
    from async_rl.orchestration.runtime import obs_spec_of  # noqa: PLC0415
    from async_rl.policies import build_policy  # noqa: PLC0415

    log_dir = log_root / (env if workers is None else f"{env}_w{workers}")
    # Logical CPUs only (placement): 0.1 per worker lets 4 workers + 2 trainers fit a 2-core Ray.
    scale = [] if workers is None else ["--num-rollout-workers", str(workers), "--worker-num-cpus", "0.1"]
    timed = common.timed_run(config, log_dir, minutes, [*scale, *extra])
    cfg, task_set, summary, t0 = timed.cfg, timed.task_set, timed.summary, timed.started
    policy = build_policy(cfg.policy, obs_spec_of(task_set), task_set.action_dim, **cfg.policy_kwargs)
    policy_mib = sum(t.numel() * t.element_size() for _, t in policy.inference_tensors()) / 2**20
    del policy
    steps, _ = common.training_steps(log_dir)
    system = common.rate(steps)
    raw = raw_env_steps_per_sec(task_set, cfg.num_rollout_workers, raw_seconds, cfg.seed)
    return {
        "system_env_steps_per_sec": system,
        "raw_env_steps_per_sec": raw,
        "system_over_raw": common.ratio(system, raw),
        "num_rollout_workers": cfg.num_rollout_workers,
        "envs_per_worker": cfg.envs_per_worker,
        "num_trainers": cfg.num_trainers,
        "policy_mib": policy_mib,
        "broadcast_seconds_mean": summary.get("broadcast_seconds_mean", float("nan")),
        "epochs": summary.get("epochs", 0),
        "wall_seconds": summary.get("wall_seconds", time.time() - t0),
        "rollout_success_rate_last": summary.get("rollout/success_rate"),
        "curve": [(t - t0, v) for t, v in steps],
    }


def plot(results: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2 * len(results), figsize=(7 * len(results), 4.5), squeeze=False)
    for i, (env, r) in enumerate(results.items()):
        ax_bar, ax_curve = axes[0, 2 * i], axes[0, 2 * i + 1]
        ax_bar.bar(["raw env\n(random actions)", "whole system"],
                   [r["raw_env_steps_per_sec"], r["system_env_steps_per_sec"]], color=["C7", "C0"])
        ax_bar.axhline(0.7 * r["raw_env_steps_per_sec"], color="C3", ls=":", label="target 0.7 x raw")
        ax_bar.set(ylabel="env steps/s", title=f"{env}: system_over_raw {r['system_over_raw']:.2f} "
                                                f"({r['num_rollout_workers']} workers)")
        ax_bar.legend(fontsize=8)
        if r["curve"]:
            ax_curve.plot(*zip(*r["curve"]), "o-", ms=3)
        ax_curve.set(xlabel="seconds since run() started", ylabel="total env steps", title=f"{env}: env steps")
        for ax in (ax_bar, ax_curve):
            ax.grid(alpha=0.3)
    common.save(fig, path, title)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "1.25 minutes of MetaWorld only, 5 s of raw stepping (about 2 minutes)")
    ap.add_argument("--minutes", type=float, default=None, help="system run per env, start-up included "
                                                                 "(default 3; quick 1.25)")
    ap.add_argument("--raw-seconds", type=float, default=None, help="raw stepping window (default 20; quick 5)")
    ap.add_argument("--envs", default=None, help="comma list from metaworld,libero (default both; quick metaworld)")
    ap.add_argument("--libero-config", default=str(common.LIBERO_CONFIG), help="LIBERO launch config")
    ap.add_argument("--workers", default=None, help="comma list of rollout-worker counts, each a run of its own with "
                    "figures suffixed _w<N> (default: the config's count, unsuffixed; quick 1,2,4 for MetaWorld)")
    ap.add_argument("--log-root", default="runs/bench_throughput")
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    minutes = args.minutes or (1.25 if args.quick else 3.0)
    raw_seconds = args.raw_seconds or (5.0 if args.quick else 20.0)
    wanted = [e.strip() for e in (args.envs or ("metaworld" if args.quick else "metaworld,libero")).split(",")]
    configs = {**CONFIGS, "libero": Path(args.libero_config)}
    unknown = [e for e in wanted if e not in configs]
    if unknown:
        ap.error(f"unknown --envs {unknown}; choose from {','.join(configs)}")

    clock = common.Stopwatch()
    info = common.machine()
    results: dict[str, dict[str, Any]] = {}
    figures: dict[str, Any] = {}
    for env in wanted:
        skip = common.libero_unavailable(configs[env]) if env == "libero" else None
        if skip:
            print(f"{env}: skipped: {skip}", flush=True)
            figures[f"{env}_skipped"] = skip
            continue
        counts = [int(w) for w in args.workers.split(",")] if args.workers else (
            [1, 2, 4] if args.quick and env == "metaworld" else [None])
        for workers in counts:
            label = env if workers is None else f"{env}_w{workers}"
            print(f"=== {label}: {minutes:g} min system run, then {raw_seconds:g} s raw ===", flush=True)
            r = results[label] = measure(env, configs[env], minutes, raw_seconds, Path(args.log_root), extra, workers)
            # the figure names are MetaWorld's; other envs and worker counts are prefixed / suffixed
            prefix, suffix = ("" if env == "metaworld" else f"{env}_"), ("" if workers is None else f"_w{workers}")
            for key, value in r.items():
                if key != "curve":
                    figures[prefix + key + suffix] = round(value, 5) if isinstance(value, float) else value
    figures.update({"minutes": minutes, "raw_seconds": raw_seconds, "quick": args.quick, **info,
                    "bench_seconds": clock()})

    common.print_table([{"env": env, **{k: r[k] for k in ("system_env_steps_per_sec", "raw_env_steps_per_sec",
                                                            "system_over_raw", "num_rollout_workers", "envs_per_worker",
                                                            "policy_mib", "broadcast_seconds_mean", "epochs")}}
                        for env, r in results.items()], title="\nwhole system vs raw environment")
    title = (f"env steps/s, whole system ({minutes:g} min) vs raw env ({raw_seconds:g} s), {info['cores']} cores, "
             f"1-min load {info['load_avg_1min']}")
    common.report(figures, args, (lambda p: plot(results, p, title)) if results else None,
                  headline=("system_env_steps_per_sec", "raw_env_steps_per_sec", "system_over_raw",
                            *(f"{p}system_over_raw_w{n}" for p in ("", "libero_") for n in (1, 2, 4)),
                            "broadcast_seconds_mean", "policy_mib", "libero_system_over_raw", "libero_skipped",
                            "bench_seconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
