"""CompilerGym: train each policy for a few minutes, then search with it at inference time on
held-out programs, against -Oz and random search at the same compilation budget.

    python benchmarks/bench_compilergym.py --policy mlp passformer --minutes 15 --out cg.json
    python benchmarks/bench_compilergym.py --checkpoint runs/compilergym_mlp --out cg.json   # no training
    python benchmarks/bench_compilergym.py --checkpoint runs/compilergym_mlp --mask-noops --out cg.json  # no-op mask on
    python benchmarks/bench_compilergym.py --quick        # 1 minute of training per policy, 2 + 3 programs

Per policy and program set (held-out csmith programs, seeds 1000000...; the real C programs bundled
in envs/programs), three searches with the trained policy in process (envs/compilergym/search.py):
greedy, best-of-16 sampling and a policy-guided beam, each with a budget of ``--budget``
compilations (pass applications; default 16 x the policy's episode length, what best-of-16 uses)
per program, and random search with as many compilations as each search used. A beam probe keeps
its state in a fork of the compiler session: ~30 ms a compilation against ~8 ms for sampling. The figures are
geometric means over programs of -Oz count / count (> 1 beats -Oz): ``<policy>_<set>_<search>_vs_oz``
and ``..._random_vs_oz``; the run's own final evaluation (greedy, sampled and random search with as
many passes) is in ``<policy>_final_*``. ``--out`` writes them as flat JSON and a PNG. Training uses
the launch script's config (configs/compilergym_mlp.yaml; its variant picks
configs/compilergym_passformer.yaml for passformer); extra ``--`` arguments go to it.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from async_rl.checkpoint import resolve_checkpoint
from async_rl.config import load_config
from async_rl.driver import prepare, run
from async_rl.errors import ConfigError
from benchmarks import common
from envs.compilergym.client import compilergym_unavailable_reason
from envs.compilergym.evaluation import format_search_table, search_horizon, search_programs
from envs.compilergym.options import parse_search
from envs.compilergym.programs import BUNDLED_PROGRAMS, program_uris
from envs.compilergym.search import ModelPolicy
from launch.eval_compilergym import load_policy, read_run_config

QUICK_BUNDLED = ("crc32", "quicksort", "strings")  # a bit-twiddling loop, a sort, string handling


def train(policy: str, args: Any) -> tuple[Path, dict[str, float]]:
    """A run of ``args.minutes``; (its last checkpoint, figures of its own final evaluation)."""
    cfg = load_config(["--policy", policy, "--max-minutes", str(args.minutes), "--log-dir", f"{args.log_dir}/{policy}",
                       "--swanlab-mode", "disabled", *args.extra], str(common.ROOT / "configs" / "compilergym_mlp.yaml"))
    cfg.env_kwargs = {**cfg.env_kwargs, "eval_seeds": [1_000_000, args.eval_programs]}
    summary = run(cfg, prepare(cfg))
    final = summary.get("final_evaluation") or {}
    figures = {f"{policy}_final_{key}": final.get(key, float("nan")) for key in
               ("geomean_reduction_vs_oz", "sampled_geomean_reduction_vs_oz", "random_search_geomean_vs_oz")}
    figures.update({f"{policy}_epochs": summary["epochs"], f"{policy}_train_minutes": args.minutes,
                    f"{policy}_env_steps": summary.get("rollout/total_env_steps", 0.0)})
    if not summary.get("checkpoint"):
        raise RuntimeError(f"the {policy} run wrote no checkpoint")
    return Path(summary["checkpoint"]), figures


def evaluate(checkpoint: Path, args: Any) -> tuple[str, dict[str, float], list[dict]]:
    """The three searches and random search on both program sets; (policy, figures, tables)."""
    import torch

    torch.manual_seed(args.seed)  # the policy's samples
    config = read_run_config(checkpoint)
    policy_name = config["policy"]
    config["env_kwargs"] = {**config["env_kwargs"], "eval_seeds": [1_000_000, args.eval_programs]}
    if args.mask_noops:  # the policy never repeats a pass that did nothing (a mask on its logits, no new weights)
        config["env_kwargs"]["mask_noops"] = True
    task_set, model, preprocess = load_policy(checkpoint, config, None)
    policy = ModelPolicy(model, preprocess, task_set)
    budget = args.budget or 16 * search_horizon(task_set)
    bundled = program_uris(str(BUNDLED_PROGRAMS))  # the repository's own folder: not a user's input
    if args.quick:
        bundled = [u for u in bundled if Path(u).stem in QUICK_BUNDLED]
    sets = {name: programs for name, programs in (("csmith", task_set.eval_benchmarks), ("bundled", bundled))
            if name in args.sets}
    figures: dict[str, float] = {f"{policy_name}_budget": budget, f"{policy_name}_horizon": search_horizon(task_set),
                                 f"{policy_name}_mask_noops": bool(config["env_kwargs"].get("mask_noops", False))}
    results = []
    for set_name, benchmarks in sets.items():
        for search in args.searches:
            started = time.monotonic()
            result = search_programs(task_set, policy, benchmarks, parse_search(search), budget, args.seed)
            print(f"\n{policy_name}, {set_name}:\n{format_search_table(result)}", flush=True)
            key = f"{policy_name}_{set_name}_{search.replace('-', '_')}"
            rows = result["rows"]
            figures.update({f"{key}_vs_oz": result["geomean_vs_oz"],
                            f"{key}_random_vs_oz": result["random_search_geomean_vs_oz"],
                            f"{key}_compilations": float(np.mean([r["compilations"] for r in rows])) if rows else 0.0,
                            f"{key}_programs": len(rows), f"{key}_seconds": time.monotonic() - started})
            results.append({"policy": policy_name, "set": set_name, **result})
    return policy_name, figures, results


def plot(results: list[dict], path: Path) -> None:
    plt = common.pyplot()
    labels = [f"{r['policy']}\n{r['set']}\n{r['search']}" for r in results]
    x = np.arange(len(results))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(results) + 2), 4.5))
    ax.bar(x - 0.2, [r["geomean_vs_oz"] for r in results], 0.4, label="policy + search")
    ax.bar(x + 0.2, [r["random_search_geomean_vs_oz"] for r in results], 0.4, label="random search, same compilations")
    ax.axhline(1.0, color="gray", ls=":", label="-Oz")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("geomean -Oz count / count")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    common.save(fig, path, "CompilerGym: search at inference time vs random search (same budget) and -Oz")


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__, "1 minute of training per policy, 2 csmith + 3 bundled programs")
    ap.add_argument("--policy", nargs="+", choices=("mlp", "passformer"), default=["mlp", "passformer"])
    ap.add_argument("--checkpoint", nargs="+", default=None, help="evaluate these runs instead of training")
    ap.add_argument("--minutes", type=float, default=5.0, help="training time per policy")
    ap.add_argument("--eval-programs", type=int, default=20, help="held-out csmith programs (seeds 1000000...)")
    ap.add_argument("--budget", type=int, default=0, help="compilations per program (0: 16 x the episode length)")
    ap.add_argument("--beam-width", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-dir", default="runs/bench_compilergym")
    ap.add_argument("--mask-noops", action="store_true", help="search with the env's no-op mask (mask_noops) on, "
                    "whether or not the runs trained with it")
    ap.add_argument("--searches", default="greedy,best-of-16,beam-{beam}",
                    help="comma list of searches per program set ({beam} is --beam-width)")
    ap.add_argument("--sets", default="csmith,bundled", help="comma list of program sets: csmith (held out), bundled")
    ap.add_argument("extra", nargs="*", help="config flags for the runs (after --)")
    args = ap.parse_args(argv)
    if args.quick:
        args.minutes, args.eval_programs = 1.0, 2
    args.searches = [s.strip().format(beam=args.beam_width) for s in args.searches.split(",") if s.strip()]
    args.sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = sorted(set(args.sets) - {"csmith", "bundled"})
    if unknown:
        print(f"error: unknown --sets {', '.join(unknown)}: choose from csmith, bundled", file=sys.stderr)
        return 2
    for search in args.searches:
        try:
            parse_search(search, allow_none=False)  # the validator of the env's eval_search option
        except ValueError as exc:
            print(f"error: --searches entry '{search}' is {exc}", file=sys.stderr)
            return 2
    reason = compilergym_unavailable_reason()
    if reason:
        print(f"error: CompilerGym is not available: {reason}", file=sys.stderr)
        return 2
    started = time.monotonic()
    figures: dict[str, Any] = {"quick": args.quick, **common.machine()}
    results: list[dict] = []
    try:
        checkpoints = [resolve_checkpoint(c) for c in args.checkpoint] if args.checkpoint else None
        if checkpoints is None:
            checkpoints = []
            for policy in args.policy:
                checkpoint, trained = train(policy, args)
                checkpoints.append(checkpoint)
                figures.update(trained)
        for checkpoint in checkpoints:
            _, found, tables = evaluate(checkpoint, args)
            figures.update(found)
            results += tables
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    figures["seconds"] = time.monotonic() - started
    headline = [k for k in figures if k.endswith("_vs_oz")]
    common.report(figures, args, (lambda path: plot(results, path)) if results else None, headline=headline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
