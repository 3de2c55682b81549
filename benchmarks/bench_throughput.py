"""The whole system against the raw environment on this machine, and the broadcast cost.

    python benchmarks/bench_throughput.py [--minutes 2] [--out system.json] [-- launch flags...]

Runs the MetaWorld PPO launch config for ``--minutes`` (the system's env steps/s over its
steady state), then the same number of worker processes stepping MetaWorld with random actions
and no model, and prints both, their ratio, and the mean weight-broadcast time for the
policy's size. Numbers are printed and written with ``--out``; nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import envs  # noqa: E402
from async_rl.config import load_config  # noqa: E402
from async_rl.driver import obs_spec_of, run  # noqa: E402
from async_rl.policies import build_policy  # noqa: E402
from benchmarks.bench_env_raw import raw_env_steps_per_sec  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--raw-seconds", type=float, default=20.0)
    ap.add_argument("--out", default=None)
    args, launch_flags = ap.parse_known_args()
    cfg = load_config(["--max-minutes", str(args.minutes), "--log-dir", "runs/bench_system", "--swanlab-mode",
                       "disabled", "--log-interval-seconds", "5", *launch_flags],
                      str(_ROOT / "configs" / "metaworld_mt1_ppo.yaml"))
    task_set = envs.make_task_set(cfg.env, **cfg.env_kwargs)
    policy = build_policy(cfg.policy, obs_spec_of(task_set), task_set.action_dim, **cfg.policy_kwargs)
    policy_mib = sum(t.numel() * t.element_size() for _, t in policy.inference_tensors()) / 2**20

    summary = run(cfg, task_set)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rates = [e.value for e in EventAccumulator(cfg.log_dir).Reload().Scalars("rollout/env_steps_per_sec")]
    steady = rates[len(rates) // 3 :] or rates  # skip start-up (Ray, DeepSpeed, first episodes)
    system = sum(steady) / len(steady)
    raw = raw_env_steps_per_sec(task_set, cfg.num_rollout_workers, args.raw_seconds, cfg.seed)
    figures = {
        "cores": os.cpu_count(),
        "num_rollout_workers": cfg.num_rollout_workers,
        "envs_per_worker": cfg.envs_per_worker,
        "num_trainers": cfg.num_trainers,
        "system_env_steps_per_sec": round(system, 1),
        "raw_env_steps_per_sec": round(raw, 1),
        "system_over_raw": round(system / raw, 3),
        "policy_mib": round(policy_mib, 3),
        "broadcast_seconds_mean": round(summary["broadcast_seconds_mean"], 5),
        "epochs": summary["epochs"],
        "rollout_success_rate_last": summary.get("rollout/success_rate"),
        "eval_success_rate_last": summary.get("eval/success_rate"),
    }
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
