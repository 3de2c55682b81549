"""CompilerGym: train a policy for a few minutes, then compare it with random search on held-out
programs (geometric mean over programs of -Oz count / count after the sequence; > 1 beats -Oz).

    python benchmarks/bench_compilergym.py --policy mlp --minutes 5 [--eval-programs 20] [--out cg.json]
    python benchmarks/bench_compilergym.py --policy passformer --minutes 5 --random-trials 1 10

Random search gets, per program, ``trials`` random sequences of as many passes as the policy
applied there (``trials = 1``: the same number of env steps). Prints the per-program table;
``--out`` writes a flat JSON of numbers. Training uses the launch script's config
(configs/compilergym_<policy>.yaml); extra ``--`` arguments go to it (e.g. ``-- --seed 3``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run as a script: make `envs` / `async_rl` importable
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from async_rl.config import load_config  # noqa: E402
from async_rl.driver import run  # noqa: E402
from async_rl.errors import ConfigError  # noqa: E402
from envs.compiler_gym import geomean, held_out_evaluation, random_search  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", choices=("mlp", "passformer"), default="mlp")
    parser.add_argument("--minutes", type=float, default=5.0, help="training time before the evaluation")
    parser.add_argument("--eval-programs", type=int, default=20, help="held-out csmith programs (seeds 1000000...)")
    parser.add_argument("--random-trials", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--log-dir", default="runs/bench_compilergym")
    parser.add_argument("--out", help="write the results as flat JSON here")
    parser.add_argument("extra", nargs="*", help="config flags for the run (after --)")
    args = parser.parse_args()

    try:
        cfg = load_config(["--policy", args.policy, "--max-minutes", str(args.minutes), "--log-dir", args.log_dir,
                           "--swanlab-mode", "disabled", *args.extra],
                          str(_ROOT / "configs" / f"compilergym_{args.policy}.yaml"))
        cfg.env_kwargs = {**cfg.env_kwargs, "eval_seeds": [1_000_000, args.eval_programs]}
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def evaluate(runtime):
        result = held_out_evaluation(runtime, random_trials=1)
        extra = {}
        env = runtime.task_set.make_env(0, seed=cfg.seed + 1, benchmarks=[r["benchmark"] for r in result["rows"]])
        rng = np.random.default_rng(cfg.seed + 1)
        try:
            for trials in (t for t in args.random_trials if t != 1):
                started = time.monotonic()
                ratios = [r["oz_count"] / max(random_search(env, r["benchmark"], max(r["policy_passes"], 1), trials, rng), 1)
                          for r in result["rows"]]
                extra[trials] = (geomean(ratios), time.monotonic() - started)
        finally:
            env.close()
        return result, extra

    summary = run(cfg, inspect=evaluate)
    result, extra = summary["inspect"]
    out = {"policy": args.policy, "train_minutes": args.minutes, "epochs": summary["epochs"],
           "env_steps": summary.get("rollout/total_env_steps", 0.0), "programs": len(result["rows"]),
           "geomean_reduction_vs_oz": result["geomean_reduction_vs_oz"],
           "random_search_geomean_vs_oz": result["random_search_geomean_vs_oz"],
           "skipped_build_failed": result["skipped"]["build_failed"],
           "skipped_oz_above_o0": result["skipped"]["oz_above_o0"]}
    print(f"\n{'':<40}{'geomean -Oz/count':>18}")
    print(f"{'policy (' + args.policy + ', greedy)':<40}{out['geomean_reduction_vs_oz']:>18.4f}")
    print(f"{'random search, same env steps':<40}{out['random_search_geomean_vs_oz']:>18.4f}")
    for trials, (value, seconds) in extra.items():
        out[f"random_search_{trials}x_geomean_vs_oz"] = value
        print(f"{f'random search, {trials}x the env steps':<40}{value:>18.4f}   ({seconds:.0f} s)")
    for i, row in enumerate(result["rows"]):
        for key in ("o0_count", "oz_count", "policy_count", "random_count", "policy_vs_oz", "random_vs_oz"):
            out[f"program_{i}_{key}"] = row[key]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
