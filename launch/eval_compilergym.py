"""Evaluate a trained CompilerGym policy with search at inference time on a folder of programs.

    python launch/eval_compilergym.py --checkpoint runs/compilergym_mlp --benchmark-dir envs/programs \\
        --search best-of-16 --budget 720 --out eval.json

--checkpoint: a run's log dir (its newest checkpoint), its checkpoints/ dir, or one epoch-* dir.
The policy runs in this process (no Ray): --search (greedy, best-of-K, beam-K) with --budget
compilations (pass applications) per program, on every .c/.cpp/.bc/.ll file of --benchmark-dir,
next to -Oz and to random search with the same number of compilations. --out gets the
per-program rows and ``geomean_vs_oz`` / ``random_search_geomean_vs_oz`` (geometric means over
programs of -Oz count / count; > 1 beats -Oz). Bad input is one line on stderr and exit code 2,
before any compiler or model starts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from async_rl import checkpoint as ckpt
from async_rl.checkpoint import resolve_checkpoint
from async_rl.errors import ConfigError, OneLineArgumentParser
from async_rl.policies import build_policy, build_preprocessor
from async_rl.policies.lora import apply_lora
from envs import make_task_set
from envs.compilergym.client import CompilerGymServerError
from envs.compilergym.evaluation import format_search_table, search_programs
from envs.compilergym.options import parse_search
from envs.compilergym.programs import program_folder, program_uris
from envs.compilergym.search import ModelPolicy, SearchSpec

# Options of the saved run that pick its programs: the evaluation picks its own.
_PROGRAM_OPTIONS = ("benchmark_dir", "datasets", "eval_benchmark_dir", "eval_search", "eval_search_budget")


def read_run_config(checkpoint: Path) -> dict[str, Any]:
    """The config the checkpoint was trained with; ConfigError unless it is a CompilerGym run with weights."""
    return ckpt.trained_config(checkpoint, "env", "compilergym")


def check_args(args: argparse.Namespace) -> tuple[Path, dict[str, Any], SearchSpec, list[str]]:
    """Every check that needs neither a compiler nor a model: (checkpoint, its config, search, programs)."""
    try:
        spec = parse_search(args.search, allow_none=False)  # the validator of the env's eval_search option
    except ValueError as exc:
        raise ConfigError(f"--search '{args.search}' is {exc}") from None
    if args.budget < 1:
        raise ConfigError(f"--budget must be a positive number of compilations per program, got {args.budget}")
    try:
        programs = program_uris(program_folder(args.benchmark_dir))  # the validator of the env's benchmark_dir option
    except ValueError as exc:
        raise ConfigError(f"--benchmark-dir {args.benchmark_dir}: {exc}") from None
    out = Path(args.out)
    if not out.parent.is_dir():
        raise ConfigError(f"--out {args.out}: no directory {out.parent}; create it or write elsewhere")
    checkpoint = resolve_checkpoint(args.checkpoint)
    return checkpoint, read_run_config(checkpoint), spec, programs


def load_policy(checkpoint: Path, config: dict[str, Any], benchmark_dir: Optional[str]) -> tuple[Any, Any, Any]:
    """(task set with ``benchmark_dir`` held out, or the run's own held-out programs if None; the
    trained model; its preprocessor), in this process."""

    env_kwargs = dict(config.get("env_kwargs") or {})
    if benchmark_dir is not None:
        env_kwargs = {k: v for k, v in env_kwargs.items() if k not in _PROGRAM_OPTIONS}
        env_kwargs["eval_benchmark_dir"] = benchmark_dir
    task_set = make_task_set("compilergym", **env_kwargs)
    obs_spec, kwargs = dict(task_set.obs_spec), dict(config.get("policy_kwargs") or {})  # type: ignore[attr-defined]  # CompilerGym's has one
    model = build_policy(config["policy"], obs_spec, task_set.action_dim, **kwargs)
    if config.get("lora_rank"):

        model = apply_lora(model, config["lora_rank"], config.get("lora_alpha", 16.0), 0.0,
                           config.get("lora_target_modules"), config.get("lora_trainable") or ())
    try:
        ckpt.load_model(model, checkpoint)
    except (ValueError, RuntimeError) as exc:  # the env's observations changed since the run
        raise ConfigError(f"--checkpoint {checkpoint}: its weights do not fit the policy this env builds now "
                          f"({str(exc).splitlines()[0]}); evaluate it with the code it was trained with") from None
    return task_set, model, build_preprocessor(config["policy"], obs_spec, **kwargs)


def evaluate(checkpoint: Path, config: dict[str, Any], spec: SearchSpec, budget: int, benchmark_dir: str,
             seed: int = 0) -> dict[str, Any]:
    """The search (and random search at its budget) with the checkpoint's policy on every program."""

    torch.manual_seed(seed)
    task_set, model, preprocess = load_policy(checkpoint, config, benchmark_dir)
    result = search_programs(task_set, ModelPolicy(model, preprocess, task_set), task_set.eval_benchmarks, spec,
                             budget, seed)
    return {"checkpoint": str(checkpoint), "epoch": ckpt.read_meta(checkpoint).get("epoch"), "policy": config["policy"],
            "mask_noops": bool(task_set.mask_noops),
            "benchmark_dir": str(Path(benchmark_dir).resolve()), "seed": seed, **result}


def main(argv: Optional[list[str]] = None) -> int:
    ap = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a run's log dir, its checkpoints/ dir or one checkpoint")
    ap.add_argument("--benchmark-dir", required=True, help="folder of .c/.cpp/.bc/.ll programs (e.g. envs/programs)")
    ap.add_argument("--search", required=True, help="greedy, best-of-K or beam-K")
    ap.add_argument("--budget", type=int, required=True, help="compilations (pass applications) per program")
    ap.add_argument("--out", required=True, help="JSON file for the results")
    ap.add_argument("--seed", type=int, default=0, help="torch seed of the search (default: 0)")
    ap.add_argument("--mask-noops", action="store_true",
                    help="per-step policies: rule out the passes run since the IR count last changed (the env's "
                         "mask_noops), whether or not the run trained with it")
    args = ap.parse_args(argv)
    started = time.monotonic()
    try:
        checkpoint, config, spec, _ = check_args(args)
        if args.mask_noops:
            config["env_kwargs"] = {**(config.get("env_kwargs") or {}), "mask_noops": True}
        result = evaluate(checkpoint, config, spec, args.budget, args.benchmark_dir, args.seed)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CompilerGymServerError as exc:  # the compiler service died or failed during the search
        print(f"error: the CompilerGym server failed during the search, nothing written: {exc}", file=sys.stderr)
        return 1
    if not result["rows"]:
        print(f"error: no program of {args.benchmark_dir} could be compiled (skipped: {result['skipped']})",
              file=sys.stderr)
        return 1
    result["seconds"] = time.monotonic() - started
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(format_search_table(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
