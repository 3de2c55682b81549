"""The whole system's env steps/s against the raw environment on this machine, and the broadcast cost.

    python benchmarks/bench_throughput.py [--quick] [--minutes 3] [--envs metaworld,libero] [--workers 1,2,4]
        [--out system.json] [-- launch flags...]

For each environment, runs its launch config (MetaWorld: ``configs/metaworld_mt1_ppo.yaml``; LIBERO
with the tiny VLA: ``--libero-config``, only where ``envs.libero`` and ``async_rl.policies.vla``
import, otherwise skipped with the reason printed) for ``--minutes``, then the same number of worker
processes stepping that environment with random actions and no model. The system's rate is the
growth of ``rollout/total_env_steps`` per second over the training phase (first log point, after
the first epoch, to the last epoch; start-up and wind-down are left out). ``system_over_raw`` = system / raw; the
weight-broadcast time is the mean over the run for the policy's size. Next to each rate, so that a
faster collection cannot hide a starved trainer: ``updates_per_sec`` (optimizer steps of one rank),
``env_steps_per_update`` and ``policy_lag_mean``. ``--quick`` measures both environments at 1, 2 and 4
workers (MetaWorld 1.25 minutes per run, LIBERO 1.5; a log point every 2 s). Extra launch flags after
``--`` go to every run. Nothing is asserted.

Collection only (``benchmarks/collect_only.py``: workers, inference, replay, no trainers), MetaWorld at
``--collect-workers`` workers (default 1,2; run with ``--quick`` or ``--collect-only``, which skips the
training runs): ``collect_only_env_steps_per_sec_w<N>``, the raw env's with N processes measured right
after, and ``collect_only_over_raw_w<N>``. The workers run in the collection shape (``--collect-envs-per-worker``
envs in ``--collect-env-groups`` lock-step groups, default 64 in 2, and an inference batch of one group's rows):
a round's fixed cost (stack, checks, the request and its signal, the forward's overhead) is spread over a
group's envs, and one group steps while the other's forward pass runs (RESULTS.md section 2 has the sweep:
16 envs per worker as configured, 0.57 of raw at 2 workers; 64 in two groups, 0.72).
``--collect-as-configured`` runs the config's own shape. The keys ``collect_only_envs_per_worker_w<N>``
and ``collect_only_env_groups_w<N>`` record the shape.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common
from benchmarks.bench_env_raw import raw_env_steps_per_sec
from benchmarks.collect_only import collect_only_steps_per_sec

CONFIGS = {"metaworld": common.ROOT / "configs" / "metaworld_mt1_ppo.yaml", "libero": common.LIBERO_CONFIG}


def collect_shape(envs_per_worker: int, env_groups: int) -> list[str]:
    """Launch flags of the collection shape: ``env_groups`` lock-step groups, each answered by one forward pass."""
    if envs_per_worker < 1 or env_groups < 1 or envs_per_worker % env_groups:
        raise SystemExit(f"--collect-envs-per-worker {envs_per_worker} must be a positive multiple of "
                         f"--collect-env-groups {env_groups}")
    return ["--envs-per-worker", str(envs_per_worker), "--env-groups", str(env_groups),
            "--inference-batch", str(envs_per_worker // env_groups)]


def measure(env: str, config: Path, minutes: float, raw_seconds: float, log_root: Path,
            extra: list[str], workers: int | None = None, log_interval_s: float = common.LOG_INTERVAL_S) -> dict[str, Any]:
    """The system's steps/s for ``minutes`` (with ``workers`` rollout workers, else the config's),
    then the raw env's with as many processes."""
    from async_rl.orchestration.runtime import obs_spec_of
    from async_rl.policies import build_policy

    log_dir = log_root / (env if workers is None else f"{env}_w{workers}")
    # Logical CPUs only (placement): 0.1 per worker lets 4 workers + 2 trainers fit a 2-core Ray.
    scale = [] if workers is None else ["--num-rollout-workers", str(workers), "--worker-num-cpus", "0.1"]
    timed = common.timed_run(config, log_dir, minutes, [*scale, *extra], log_interval_s=log_interval_s)
    cfg, task_set, summary, t0 = timed.cfg, timed.task_set, timed.summary, timed.started
    policy = build_policy(cfg.policy, obs_spec_of(task_set), task_set.action_dim, **cfg.policy_kwargs)
    policy_mib = sum(t.numel() * t.element_size() for _, t in policy.inference_tensors()) / 2**20
    del policy
    steps, updates = common.training_steps(log_dir)
    system = common.rate(steps)
    updates_in = [p for p in updates if not steps or p[0] >= steps[0][0]] or updates
    lag = [v for _, v in common.scalars(log_dir, "rollout/policy_lag")]
    raw = raw_env_steps_per_sec(task_set, cfg.num_rollout_workers, raw_seconds, cfg.seed)
    return {
        "system_env_steps_per_sec": system,
        "raw_env_steps_per_sec": raw,
        "system_over_raw": common.ratio(system, raw),
        "updates_per_sec": common.rate(updates_in),
        "env_steps_per_update": common.ratio(system, common.rate(updates_in)),
        "policy_lag_mean": sum(lag) / len(lag) if lag else float("nan"),
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


def measure_collect_only(config: Path, workers: int, seconds: float, raw_seconds: float,
                         extra: list[str]) -> dict[str, float]:
    """Collection only with ``workers`` workers (the config's envs per worker), then the raw env with as many
    processes; figures suffixed ``_w<workers>``."""
    from async_rl.config import load_config  # heavy imports only when needed
    from async_rl.driver import prepare

    cfg = load_config(["--num-rollout-workers", str(workers), *extra], str(config))
    task_set = prepare(cfg)
    collected = collect_only_steps_per_sec(cfg, task_set, workers, seconds, warmup_s=8.0)
    raw = raw_env_steps_per_sec(task_set, workers, raw_seconds, cfg.seed)
    figures = {"collect_only_env_steps_per_sec": collected["env_steps_per_sec"],
               "collect_only_raw_env_steps_per_sec": raw,
               "collect_only_over_raw": common.ratio(collected["env_steps_per_sec"], raw),
               "collect_only_rows_per_forward": collected["rows_per_forward"],
               "collect_only_worker_cpu_ms_per_step": collected["worker_cpu_ms_per_step"],
               "collect_only_inference_cpu_ms_per_step": collected["inference_cpu_ms_per_step"],
               "collect_only_envs_per_worker": cfg.envs_per_worker, "collect_only_env_groups": cfg.env_groups,
               "collect_only_inline_env_steps": cfg.inline_env_steps}
    return {f"{key}_w{workers}": round(value, 5) if isinstance(value, float) else value for key, value in figures.items()}


def plot(results: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    """Side by side: env steps/s of the system and of the raw env per run, ``system_over_raw`` against
    workers per environment (target 0.7), and the trainers' updates/s of the same runs."""
    plt = common.pyplot()
    fig, (ax_rate, ax_ratio, ax_upd) = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [3, 2, 2]})
    labels = list(results)
    x = range(len(labels))
    ax_rate.bar([i - 0.2 for i in x], [results[k]["raw_env_steps_per_sec"] for k in labels], 0.4, color="C7",
                label="raw env, random actions, same processes")
    ax_rate.bar([i + 0.2 for i in x], [results[k]["system_env_steps_per_sec"] for k in labels], 0.4, color="C0",
                label="whole system (training)")
    ax_rate.set_xticks(list(x), [f"{k}\n{results[k]['num_rollout_workers']}w x {results[k]['envs_per_worker']} envs"
                                 for k in labels], fontsize=8)
    ax_rate.set(yscale="log", ylabel="env steps/s", title="env steps/s")
    ax_rate.legend(fontsize=8)
    for i, env in enumerate(sorted({k.split("_w")[0] for k in labels})):
        runs = sorted((r["num_rollout_workers"], r["system_over_raw"]) for k, r in results.items() if k.split("_w")[0] == env)
        ax_ratio.plot(*zip(*runs), "o-", color=f"C{i}", label=env)
        runs = sorted((r["num_rollout_workers"], r["updates_per_sec"]) for k, r in results.items() if k.split("_w")[0] == env)
        ax_upd.plot(*zip(*runs), "s-", color=f"C{i}", label=env)
    ax_ratio.axhline(0.7, color="C3", ls=":", label="target 0.7")
    ax_ratio.set(xlabel="rollout workers", ylabel="system / raw", title="system_over_raw", ylim=(0, 1))
    ax_upd.set(xlabel="rollout workers", ylabel="optimizer steps/s (one rank)", title="trainer updates/s (same runs)")
    for ax in (ax_rate, ax_ratio, ax_upd):
        ax.grid(alpha=0.3)
    for ax in (ax_ratio, ax_upd):
        ax.legend(fontsize=8)
    common.save(fig, path, title)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "MetaWorld and LIBERO at 1, 2, 4 workers: 1.25 / 1.5 minutes per run, 5 s of raw "
                                "stepping (about 10 minutes; --envs metaworld: about 5)")
    ap.add_argument("--minutes", type=float, default=None, help="system run per env, start-up included "
                                                                 "(default 3; quick 1.25, LIBERO 1.5)")
    ap.add_argument("--raw-seconds", type=float, default=None, help="raw stepping window (default 20; quick 5)")
    ap.add_argument("--envs", default=None, help="comma list from metaworld,libero (default both)")
    ap.add_argument("--libero-config", default=str(common.LIBERO_CONFIG), help="LIBERO launch config")
    ap.add_argument("--workers", default=None, help="comma list of rollout-worker counts, each a run of its own with "
                    "figures suffixed _w<N> (default: the config's count, unsuffixed; quick 1,2,4)")
    ap.add_argument("--log-root", default="runs/bench_throughput")
    ap.add_argument("--collect-only", action="store_true", help="only the collection-only runs (no training runs)")
    ap.add_argument("--collect-workers", default="1,2", help="worker counts of the collection-only runs (MetaWorld)")
    ap.add_argument("--collect-seconds", type=float, default=20.0, help="measured window of a collection-only run")
    ap.add_argument("--collect-envs-per-worker", type=int, default=64, help="envs per worker of the collection shape")
    ap.add_argument("--collect-env-groups", type=int, default=2, help="lock-step groups of the collection shape")
    ap.add_argument("--collect-as-configured", action="store_true",
                    help="the collection runs in the config's shape, not the collection shape")
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    shape = [] if args.collect_as_configured else collect_shape(args.collect_envs_per_worker, args.collect_env_groups)
    minutes = args.minutes or (1.25 if args.quick else 3.0)
    raw_seconds = args.raw_seconds or (5.0 if args.quick else 20.0)
    wanted = [e.strip() for e in (args.envs or "metaworld,libero").split(",")]
    log_interval_s = 2.0 if args.quick else common.LOG_INTERVAL_S
    configs = {**CONFIGS, "libero": Path(args.libero_config)}
    unknown = [e for e in wanted if e not in configs]
    if unknown:
        ap.error(f"unknown --envs {unknown}; choose from {','.join(configs)}")

    clock = common.Stopwatch()
    info = common.machine()
    results: dict[str, dict[str, Any]] = {}
    figures: dict[str, Any] = {}
    if args.quick or args.collect_only:
        for workers in (int(w) for w in args.collect_workers.split(",")):
            print(f"=== collection only, metaworld, {workers} workers: {args.collect_seconds:g} s, then "
                  f"{raw_seconds:g} s raw ===", flush=True)
            figures.update(measure_collect_only(CONFIGS["metaworld"], workers, args.collect_seconds, raw_seconds,
                                                [*shape, *extra]))
            print({k: v for k, v in figures.items() if k.endswith(f"_w{workers}")}, flush=True)
    for env in ([] if args.collect_only else wanted):
        skip = common.libero_unavailable(configs[env]) if env == "libero" else None
        if skip:
            print(f"{env}: skipped: {skip}", flush=True)
            figures[f"{env}_skipped"] = skip
            continue
        counts = [int(w) for w in args.workers.split(",")] if args.workers else (
            [1, 2, 4] if args.quick else [None])
        # LIBERO starts slower (env creation ~4 s per worker, the VLA's DeepSpeed engine): a longer quick run
        run_minutes = args.minutes or (1.5 if args.quick and env == "libero" else minutes)
        for workers in counts:
            label = env if workers is None else f"{env}_w{workers}"
            print(f"=== {label}: {run_minutes:g} min system run, then {raw_seconds:g} s raw ===", flush=True)
            r = results[label] = measure(env, configs[env], run_minutes, raw_seconds, Path(args.log_root), extra, workers,
                                         log_interval_s)
            # the figure names are MetaWorld's; other envs and worker counts are prefixed / suffixed
            prefix, suffix = ("" if env == "metaworld" else f"{env}_"), ("" if workers is None else f"_w{workers}")
            for key, value in r.items():
                if key != "curve":
                    figures[prefix + key + suffix] = round(value, 5) if isinstance(value, float) else value
    figures.update({"minutes": minutes, "raw_seconds": raw_seconds, "quick": args.quick, **info,
                    "bench_seconds": clock()})

    common.print_table([{"env": env, **{k: r[k] for k in ("system_env_steps_per_sec", "raw_env_steps_per_sec",
                                                            "system_over_raw", "updates_per_sec", "policy_lag_mean",
                                                            "num_rollout_workers", "envs_per_worker", "num_trainers",
                                                            "broadcast_seconds_mean", "epochs")}}
                        for env, r in results.items()], title="\nwhole system vs raw environment")
    title = (f"env steps/s, whole system ({minutes:g} min) vs raw env ({raw_seconds:g} s), {info['cores']} cores, "
             f"1-min load {info['load_avg_1min']}")
    common.report(figures, args, (lambda p: plot(results, p, title)) if results else None,
                  headline=("system_env_steps_per_sec", "raw_env_steps_per_sec", "system_over_raw",
                            *(f"{p}system_over_raw_w{n}" for p in ("", "libero_") for n in (1, 2, 4)),
                            *(f"collect_only_over_raw_w{n}" for n in (1, 2)), "system_env_steps_per_sec_w2",
                            "broadcast_seconds_mean", "policy_mib", "libero_system_over_raw", "libero_skipped",
                            "bench_seconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
