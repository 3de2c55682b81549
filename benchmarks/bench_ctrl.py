"""CTRL: does the trained critic's critique help the frozen reviser more than no critique or the untrained critic?

    python benchmarks/bench_ctrl.py --quick --out runs/bench/ctrl.json                      # 3 seeds x 30 min
    python benchmarks/bench_ctrl.py --quick --seeds 0 --train-minutes 15 --out runs/bench/ctrl_s0.json
    python benchmarks/bench_ctrl.py --quick --sft-epochs 2 --out runs/bench/ctrl_sft.json  # SFT stage, then GRPO
    python benchmarks/bench_ctrl.py --quick --seeds --out runs/bench/ctrl_baselines.json   # stage 1 only, no training
    python benchmarks/bench_ctrl.py --quick --seeds 0 --init-from runs/bench/ctrl/sft-seed-0/policy \
        --reviser-model-path runs/ctrl_reviser_sft/policy --out F.json   # an earlier SFT critic, a fine-tuned reviser

On the balanced held-out set of configs/ctrl_humaneval.yaml (``heldout_cases`` correct and incorrect initial
solutions of held-out problems, the same set for every measure):

1. in this process, no training: ``initial_pass`` (initial solutions passing all tests), ``revise_alone_pass``
   (the reviser asked to revise with no critique), ``untrained_critic_pass`` (the reviser given the base
   model's greedy critique), with the untrained critic's judgment accuracy and regression rate; and the
   reviser's headroom (``async_rl.ctrl.headroom``): ``approve_all_pass`` (every solution approved) and
   ``oracle_critique_pass`` / ``oracle_fix_rate`` (each mutant's exact fault and fix named): no critic can
   beat ``revise_alone_pass`` by more than the oracle does;
2. per seed, ``launch/ds_ctrl_grpo.py``'s config trains for ``--train-minutes``; the run's final evaluation
   critiques the same cases with the trained weights: ``trained_critic_pass``, ``judgment_accuracy`` (its
   judgment line against the label; a missing line counts as wrong) and ``regression_rate`` (correct initial
   solutions whose revision fails);
With ``--sft-epochs N`` each seed first trains the critic on reference critiques of the training cases
(``async_rl.ctrl.critique_sft``, ``configs/ctrl_sft.yaml``, N passes), measures that supervised critic alone
(``sft_critic_pass``, ``sft_judgment_accuracy``, ``sft_format_rate``, ``sft_regression_rate``) and trains GRPO
from its export with the format rule on (``configs/ctrl_from_sft.yaml``), as the CTRL paper does.

3. the overlap of the asynchronous loop, from the ReviserActor's record of each run: seconds it revised the
   workers' batches (``revising_s``, ``revise_calls``, ``revision_batch_mean``) and the share of that time in
   which another worker's critiques were being generated (``generating_while_revising_share``).
Keys: each figure per seed (``<key>_seed<N>``) and its mean (``<key>``). Run it on an idle machine; the
machine's load is written with the figures.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, machine, parser, report

CONFIG = ROOT / "configs" / "ctrl_humaneval.yaml"
SFT_CONFIG, FROM_SFT_CONFIG = ROOT / "configs" / "ctrl_sft.yaml", ROOT / "configs" / "ctrl_from_sft.yaml"
KEYS = ("initial_pass", "revise_alone_pass", "untrained_critic_pass", "trained_critic_pass", "judgment_accuracy",
        "regression_rate")
SFT_KEYS = ("sft_critic_pass", "sft_judgment_accuracy", "sft_format_rate")
HEADROOM_KEYS = ("approve_all_pass", "oracle_critique_pass", "oracle_fix_rate")


def config(argv: list[str], path: Path = CONFIG) -> Any:
    from async_rl.config import load_config

    return load_config(["--swanlab-mode", "disabled", *argv], str(path))


def load(argv: list[str], path: Path = CONFIG) -> tuple[Any, Any]:
    """The config and its task set (the cases built or read from the disk cache)."""
    from async_rl.driver import prepare

    cfg = config(argv, path)
    return cfg, prepare(cfg)


def untrained_figures(argv: list[str]) -> dict[str, float]:
    """Stage 1: the base model as the critic, the reviser as the runs configure it, in this process."""
    import torch

    from async_rl.ctrl.cases import reference_solutions
    from async_rl.ctrl.env import heldout_set
    from async_rl.ctrl.evaluate import evaluate
    from async_rl.ctrl.headroom import reviser_headroom
    from async_rl.ctrl.reviser import load_writer

    cfg, task_set = load(argv)
    torch.set_num_threads(cfg.torch_threads)  # as the actors of a run
    cases = heldout_set(task_set)
    critic = load_writer(None, cfg.policy_kwargs["model_path"], cfg.policy_kwargs["max_new_tokens"],
                         batch_size=task_set.options.reviser_batch)
    reviser = load_writer(None, *task_set.reviser_args())
    figures = evaluate(cases, critic.write, reviser.write, task_set.options.timeout_s)
    headroom = reviser_headroom(cases, reference_solutions("heldout"), reviser.write, task_set.options.timeout_s)
    return {**headroom, "cases": figures["n"], "cases_correct": figures["n_correct"], "initial_pass": figures["initial_pass"],
            "revise_alone_pass": figures["revise_alone_pass"], "untrained_critic_pass": figures["critic_pass"],
            "untrained_judgment_accuracy": figures["judgment_accuracy"],
            "untrained_regression_rate": figures["regression_rate"],
            "untrained_format_rate": figures["critic_format_rate"]}


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _covered(start: float, end: float, by: list[tuple[float, float]]) -> float:
    """Seconds of [start, end] during which one of the (merged) spans ``by`` runs."""
    return sum(max(0.0, min(end, e) - max(start, s)) for s, e in by)


def overlap(stats: dict[str, Any]) -> dict[str, float]:
    """From the ReviserActor's record: seconds it revised the workers' batches, and the share of that time
    in which another worker's critiques were being generated (asked of the inference actor, not yet back)."""
    busy = [b for b in stats["busy"] if any(g[2] == b[3] for g in stats["generated"])]  # the workers' calls
    total = sum(e - s for s, e, _, _ in busy)
    covered = 0.0
    for start, end, _, caller in busy:
        others = _merged([(s, e) for s, e, pid in stats["generated"] if pid != caller])
        covered += _covered(start, end, others)
    return {"revising_s": total, "revise_calls": len(busy),
            "revision_batch_mean": sum(n for _, _, n, _ in busy) / len(busy) if busy else float("nan"),
            "generating_while_revising_share": covered / total if total else float("nan")}


def supervised_stage(seed: int, epochs: int, argv: list[str], log_dir: Path) -> tuple[str, dict[str, float]]:
    """The critic's supervised stage for one seed: reference critiques of the training cases, ``launch/sft.py``
    for ``epochs`` passes, and the exported critic's own figures on the held-out set (no RL yet)."""
    import shutil

    from async_rl.ctrl.critique_sft import critique_demonstrations
    from launch.sft import main as sft_main

    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    _, task_set = load(argv, SFT_CONFIG)
    demos = log_dir / "critiques.jsonl"
    demos.write_text("".join(json.dumps(p) + "\n" for p in critique_demonstrations(task_set.train, seed)))
    export = log_dir / "policy"
    sft_main(["--config", str(SFT_CONFIG), "--swanlab-mode", "disabled", "--seed", str(seed), "--demos", str(demos),
              "--sft-epochs", str(epochs), "--log-dir", str(log_dir), "--sft-export", str(export), *argv])
    return str(export), supervised_figures(str(export), argv)


def supervised_figures(export: str, argv: list[str]) -> dict[str, float]:
    """A supervised critic's own figures on the held-out set (no RL)."""
    import torch

    from async_rl.ctrl.env import heldout_set
    from async_rl.ctrl.evaluate import evaluate
    from async_rl.ctrl.reviser import load_writer

    cfg, task_set = load(argv, SFT_CONFIG)
    torch.set_num_threads(cfg.torch_threads)
    critic = load_writer(None, None, None, batch_size=task_set.options.reviser_batch, init_from=export)
    reviser = load_writer(None, *task_set.reviser_args())
    figures = evaluate(heldout_set(task_set), critic.write, reviser.write, task_set.options.timeout_s, alone=False)
    return {"sft_critic_pass": figures["critic_pass"], "sft_judgment_accuracy": figures["judgment_accuracy"],
                         "sft_regression_rate": figures["regression_rate"], "sft_format_rate": figures["critic_format_rate"]}


def trained_run(seed: int, minutes: float, argv: list[str], log_dir: Path, init_from: Optional[str] = None) -> dict[str, Any]:
    """Stage 2 and 3 for one seed: a run of ``minutes`` (from the supervised export ``init_from``, with
    ``configs/ctrl_from_sft.yaml``), its final evaluation and its timeline overlap."""
    import shutil

    import ray

    from async_rl.driver import run

    shutil.rmtree(log_dir, ignore_errors=True)
    start = ["--init-from", init_from] if init_from else []
    cfg, task_set = load(["--seed", str(seed), "--max-minutes", str(minutes), "--log-dir", str(log_dir), *start, *argv],
                         FROM_SFT_CONFIG if init_from else CONFIG)

    def inspect(runtime: Any) -> dict[str, Any]:
        return overlap(ray.get(ray.get_actor(runtime.task_set.reviser_name).stats.remote(), timeout=120))

    summary = run(cfg, task_set, inspect=inspect)
    final = summary.get("final_evaluation") or {}
    lookups = summary.get("env/ctrl_cache_lookups", 0)
    return {"trained_critic_pass": final.get("critic_pass", float("nan")),
            "judgment_accuracy": final.get("judgment_accuracy", float("nan")),
            "regression_rate": final.get("regression_rate", float("nan")),
            "trained_format_rate": final.get("critic_format_rate", float("nan")),
            "epochs": summary.get("epochs"), "critiques": summary.get("rollout/total_env_steps"),
            "cache_hit_rate": summary.get("env/ctrl_cache_hits", 0) / lookups if lookups else float("nan"),
            "reviser_wait_s": summary.get("env/ctrl_reviser_wait_ms", 0) / 1000.0, **summary["inspect"]}


def partial(figures: dict[str, Any], out: Optional[str]) -> None:
    """What is measured so far, after each stage (a stopped benchmark keeps it)."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).with_suffix(".partial.json").write_text(json.dumps(figures, indent=2) + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    ap = parser(__doc__, "the full benchmark: 3 seeds x 30 minutes of training, the config's 16 held-out cases")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="training seeds (none: stage 1 only)")
    ap.add_argument("--train-minutes", type=float, default=30.0, help="training minutes per seed")
    ap.add_argument("--cases", type=int, default=None, help="held-out cases (balanced; default: the config's)")
    ap.add_argument("--log-root", default=str(ROOT / "runs" / "bench" / "ctrl"))
    ap.add_argument("--sft-epochs", type=int, default=0, help="a supervised stage of this many passes before GRPO (0: none)")
    ap.add_argument("--reviser-model-path", default=None,
                    help="the frozen reviser: a model or a reviser's export (async_rl.ctrl.revision_sft; default: the base model)")
    ap.add_argument("--init-from", default=None,
                    help="start each seed's GRPO from this supervised critic's export (instead of --sft-epochs)")
    args = ap.parse_args(argv)
    amended = {k: v for k, v in (("heldout_cases", args.cases), ("reviser_model_path", args.reviser_model_path))
               if v is not None}
    run_argv = ["--env-kwargs", json.dumps({**config([]).env_kwargs, **amended})] if amended else []
    # The RL stage after SFT keeps its own env options (the format rule on); only these follow the flags.
    supervised = bool(args.sft_epochs or args.init_from)
    rl_argv = run_argv if not supervised or not amended else \
        ["--env-kwargs", json.dumps({**config([], FROM_SFT_CONFIG).env_kwargs, **amended})]
    started = time.monotonic()
    figures: dict[str, Any] = {"train_minutes": args.train_minutes, "sft_epochs": args.sft_epochs,
                               "reviser": args.reviser_model_path or "base model",
                               "load_avg_1min_start": machine()["load_avg_1min"]}
    base = untrained_figures(run_argv)
    figures.update(base)
    figures["untrained_seconds"] = time.monotonic() - started
    print(", ".join(f"{k} {v:.3f}" for k, v in base.items() if isinstance(v, float)), flush=True)
    partial(figures, args.out)
    per_seed: dict[str, list[float]] = {}
    for seed in args.seeds:
        export, seed_figures = None, {k: base[k] for k in KEYS if k in base}
        if args.init_from:
            export, sft = args.init_from, supervised_figures(args.init_from, run_argv)
            seed_figures.update(sft)
            print(f"seed {seed}, supervised critic {export}: " + ", ".join(f"{k} {v:.3f}" for k, v in sft.items()), flush=True)
        elif args.sft_epochs:
            export, sft = supervised_stage(seed, args.sft_epochs, run_argv, Path(args.log_root) / f"sft-seed-{seed}")
            seed_figures.update(sft)
            print(f"seed {seed} after SFT: " + ", ".join(f"{k} {v:.3f}" for k, v in sft.items()), flush=True)
        seed_figures.update(trained_run(seed, args.train_minutes, rl_argv, Path(args.log_root) / f"seed-{seed}", export))
        for key, value in seed_figures.items():
            figures[f"{key}_seed{seed}"] = value
            if isinstance(value, (int, float)) and value is not None:
                per_seed.setdefault(key, []).append(float(value))
        print(f"seed {seed}: " + ", ".join(f"{k} {seed_figures[k]:.3f}" for k in KEYS), flush=True)
        figures["load_avg_1min_after_seed" + str(seed)] = machine()["load_avg_1min"]
        partial(figures, args.out)
    figures.update({key: statistics.fmean(values) for key, values in per_seed.items()})
    figures.update({k: v for k, v in machine().items() if k != "load_avg_1min"})
    figures["load_avg_1min_end"] = machine()["load_avg_1min"]
    figures["seconds"] = time.monotonic() - started
    report(figures, args, headline=[*KEYS, *HEADROOM_KEYS, "untrained_judgment_accuracy",
                                    *(SFT_KEYS if supervised else ()), "generating_while_revising_share",
                                    "cache_hit_rate", "epochs"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
