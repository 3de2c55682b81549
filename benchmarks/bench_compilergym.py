"""CompilerGym: train a policy for a few minutes, then compare it (greedy and sampled) with random
search on held-out programs (geometric mean over programs of -Oz count / count after the sequence; > 1 beats -Oz).

    python benchmarks/bench_compilergym.py --policy mlp --minutes 5 [--eval-programs 20] [--out cg.json]
    python benchmarks/bench_compilergym.py --policy passformer --minutes 5 --random-trials 1 10
    python benchmarks/bench_compilergym.py --quick        # 1 minute of training, 5 programs

Random search gets, per program, ``trials`` random sequences of as many passes as the policy
applied there (``trials = 1``: the same number of env steps). Prints the per-program table;
``--out`` writes a flat JSON of numbers and a PNG (greedy, sampled and random search against -Oz,
per program). Training uses the launch script's config (configs/compilergym_mlp.yaml, whose variant picks
configs/compilergym_passformer.yaml for --policy passformer); extra
``--`` arguments go to it (e.g. ``-- --seed 3``).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from async_rl.config import load_config  # noqa: E402
from async_rl.driver import prepare, run  # noqa: E402
from async_rl.errors import ConfigError  # noqa: E402
from benchmarks import common  # noqa: E402
from envs.compiler_gym import compiler_gym_unavailable_reason, geomean, random_search  # noqa: E402

HEADLINE = ("geomean_reduction_vs_oz", "sampled_geomean_reduction_vs_oz", "random_search_geomean_vs_oz", "epochs",
            "env_steps", "programs")


def plot(rows: list[dict], figures: dict, path: Path) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows) + 2), 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.27, [r["policy_vs_oz"] for r in rows], 0.27, label="policy, greedy")
    ax.bar(x, [r["sampled_vs_oz"] for r in rows], 0.27, label="policy, sampled")
    ax.bar(x + 0.27, [r["random_vs_oz"] for r in rows], 0.27, label="random search, same env steps")
    ax.axhline(1.0, color="gray", ls=":", label="-Oz")
    ax.set_xticks(x, [str(i) for i in x])
    ax.set_xlabel("held-out program")
    ax.set_ylabel("-Oz count / count after the sequence")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    common.save(fig, path, f"CompilerGym, {figures['policy']} after {figures['train_minutes']:g} min: geomean greedy "
                           f"{figures['geomean_reduction_vs_oz']:.3f}, sampled {figures['sampled_geomean_reduction_vs_oz']:.3f}, "
                           f"random {figures['random_search_geomean_vs_oz']:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "1 minute of training, 5 held-out programs (< 2 min plus set-up)")
    ap.add_argument("--policy", choices=("mlp", "passformer"), default="mlp")
    ap.add_argument("--minutes", type=float, default=5.0, help="training time before the evaluation")
    ap.add_argument("--eval-programs", type=int, default=20, help="held-out csmith programs (seeds 1000000...)")
    ap.add_argument("--random-trials", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--log-dir", default="runs/bench_compilergym")
    ap.add_argument("extra", nargs="*", help="config flags for the run (after --)")
    args = ap.parse_args(argv)
    if args.quick:
        args.minutes, args.eval_programs, args.random_trials = 1.0, 5, [1]
    reason = compiler_gym_unavailable_reason()
    if reason:
        print(f"error: CompilerGym is not available: {reason}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(["--policy", args.policy, "--max-minutes", str(args.minutes), "--log-dir", args.log_dir,
                           "--swanlab-mode", "disabled", *args.extra],
                          str(common.ROOT / "configs" / "compilergym_mlp.yaml"))  # the launch script's
        cfg.env_kwargs = {**cfg.env_kwargs, "eval_seeds": [1_000_000, args.eval_programs]}
        task_set = prepare(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    # The run ends with the env's final evaluation (greedy, sampled, random search x 1).
    summary = run(cfg, task_set)
    result = summary["final_evaluation"]
    extra = {}  # random search with more trials, on the same programs, after the run
    env = task_set.make_env(0, seed=cfg.seed + 1, benchmarks=[r["benchmark"] for r in result["rows"]])
    rng = np.random.default_rng(cfg.seed + 1)
    try:
        for trials in (t for t in args.random_trials if t != 1):
            started = time.monotonic()
            ratios = [r["oz_count"] / max(random_search(env, r["benchmark"], max(r["policy_passes"], 1), trials, rng), 1)
                      for r in result["rows"]]
            extra[trials] = (geomean(ratios), time.monotonic() - started)
    finally:
        env.close()
    rows = result["rows"]
    figures = {"policy": args.policy, "train_minutes": args.minutes, "quick": args.quick, **common.machine(),
               "epochs": summary["epochs"], "env_steps": summary.get("rollout/total_env_steps", 0.0),
               "programs": len(rows), "geomean_reduction_vs_oz": result["geomean_reduction_vs_oz"],
               "sampled_geomean_reduction_vs_oz": result["sampled_geomean_reduction_vs_oz"],
               "random_search_geomean_vs_oz": result["random_search_geomean_vs_oz"],
               "skipped_build_failed": result["skipped"]["build_failed"],
               "skipped_oz_above_o0": result["skipped"]["oz_above_o0"]}
    headline = list(HEADLINE)
    for trials, (value, seconds) in extra.items():
        figures[f"random_search_{trials}x_geomean_vs_oz"] = value
        figures[f"random_search_{trials}x_seconds"] = seconds
        headline.append(f"random_search_{trials}x_geomean_vs_oz")
    columns = ("o0_count", "oz_count", "policy_count", "sampled_count", "random_count", "policy_vs_oz", "sampled_vs_oz",
               "random_vs_oz")
    for i, row in enumerate(rows):
        figures.update({f"program_{i}_{key}": row[key] for key in columns})
    # (the run printed the per-program table)
    common.report(figures, args, (lambda path: plot(rows, figures, path)) if rows else None, headline=headline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
