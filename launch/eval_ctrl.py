"""Evaluate a CTRL critic on a file of cases: does its critique help the frozen reviser fix the code?

    python launch/eval_ctrl.py --checkpoint runs/ctrl_humaneval --problems cases.jsonl --out eval.json
    python launch/eval_ctrl.py --model-path /models/critic --problems cases.jsonl --out eval.json
    python launch/eval_ctrl.py --init-from runs/ctrl_sft/policy --problems cases.jsonl --out eval.json

Each line of --problems is ``{"prompt": problem, "solution": initial code, "tests": [...], "correct": bool}``
(optionally ``"prefix"``: code run before the solution). ``--write-heldout FILE`` writes the held-out cases of
configs/ctrl_humaneval.yaml in that format (balanced, as the training run's final evaluation uses them).
The critic is the checkpoint's trained weights, a supervised export (--init-from), or the model at --model-path (neither: the default model,
SmolLM2-135M-Instruct); it critiques greedily. The reviser is the critic's base model (--reviser-model-path
for another model, or a reviser's policy export from launch/sft.py), greedy. --out gets ``initial_pass``, ``revise_alone_pass``, ``critic_pass`` (revisions with
the critic's critique passing all tests), ``judgment_accuracy``, ``regression_rate``, ``critic_format_rate``
and, for a checkpoint or export, ``untrained_critic_pass`` (its base model as the critic), with per-case rows. Runs in
this process, no Ray. Bad input is one line on stderr and exit code 2, before a model loads.
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

from async_rl.errors import ConfigError, OneLineArgumentParser

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = OneLineArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", help="a run directory or one checkpoint of a CTRL run (the trained critic)")
    source.add_argument("--model-path", help="a Hugging Face folder or .gguf file as the critic")
    source.add_argument("--init-from", help="a supervised export of the critic (launch/sft.py's, LoRA merged)")
    ap.add_argument("--problems", help="JSONL file of cases")
    ap.add_argument("--out", help="write the figures here (JSON)")
    ap.add_argument("--write-heldout", metavar="FILE", help="write configs/ctrl_humaneval.yaml's held-out cases and exit")
    ap.add_argument("--reviser-model-path", default=None, help="the frozen reviser: a model or a policy export (default: the critic's base model)")
    ap.add_argument("--critique-tokens", type=int, default=None, help="critique length (default: the run's, else 96)")
    ap.add_argument("--revision-tokens", type=int, default=160, help="longest revision the reviser writes (default: 160)")
    ap.add_argument("--batch", type=int, default=8, help="prompts per generate call (default: 8)")
    ap.add_argument("--timeout-s", type=float, default=3.0, help="sandbox wall seconds per program")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (spinning OpenMP threads collapse on a busy machine)")
    return ap.parse_args(argv)


def write_heldout(path: str) -> int:
    from async_rl.config import load_config
    from async_rl.ctrl.cases import write_cases
    from async_rl.ctrl.env import CTRLTaskSet, heldout_set
    from async_rl.driver import prepare

    cfg = load_config(["--swanlab-mode", "disabled"], str(ROOT / "configs" / "ctrl_humaneval.yaml"))
    task_set = prepare(cfg)
    assert isinstance(task_set, CTRLTaskSet)  # the config's env
    cases = heldout_set(task_set)
    write_cases(path, cases)
    print(f"wrote {len(cases)} held-out cases ({sum(c['correct'] for c in cases)} correct) to {path}")
    return 0


def evaluate_critic(args: argparse.Namespace, cases: list[dict[str, Any]]) -> dict[str, Any]:
    from async_rl.ctrl.evaluate import evaluate, with_critic
    from async_rl.ctrl.reviser import load_writer
    from async_rl.ctrl.reward import ResultCache
    from async_rl.sandbox import SandboxPool

    trained = args.checkpoint or args.init_from
    tokens = args.critique_tokens if args.critique_tokens or trained else 96
    critic = load_writer(args.checkpoint, args.model_path, tokens, batch_size=args.batch, init_from=args.init_from)
    base = critic.preprocess.model_path  # the critic's base model (a checkpoint's adapters are not part of it)
    reviser = load_writer(None, args.reviser_model_path or base, args.revision_tokens, batch_size=args.batch)
    started = time.monotonic()
    figures = evaluate(cases, critic.write, reviser.write, args.timeout_s)
    if trained:
        untrained = load_writer(None, base, critic.policy.max_new_tokens, batch_size=args.batch)
        with SandboxPool() as pool:
            figures["untrained_critic_pass"] = with_critic(cases, untrained.write, reviser.write, pool, ResultCache(),
                                                           args.timeout_s)["critic_pass"]
    figures.update({"critic": trained or args.model_path or "default model", "reviser": args.reviser_model_path
                    or base, "seconds": time.monotonic() - started, "prompts_too_long": critic.too_long + reviser.too_long})
    return figures


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.write_heldout:
            return write_heldout(args.write_heldout)
        if not args.problems or not args.out:
            raise ConfigError("pass --problems FILE.jsonl and --out FILE.json (or --write-heldout FILE)")
        if min(args.revision_tokens, args.batch, args.threads, args.critique_tokens if args.critique_tokens is not None else 1) < 1 or not args.timeout_s > 0:
            raise ConfigError("--critique-tokens, --revision-tokens, --batch and --threads must be positive integers, "
                              "--timeout-s positive")
        from async_rl.ctrl.cases import read_cases

        cases = read_cases(args.problems)
        if args.checkpoint:
            from async_rl import checkpoint as ckpt
            from async_rl.policies.lm_checkpoint import run_config

            run_config(ckpt.resolve_checkpoint(args.checkpoint))  # a bad checkpoint is one line, before any model loads
        if args.init_from:
            from async_rl.policies.initial_weights import read_export_meta, resolve_export

            read_export_meta(resolve_export(args.init_from))
        if args.model_path is not None:
            from async_rl.policies.lm_loading import resolve_lm_path

            resolve_lm_path(args.model_path)
        if args.reviser_model_path is not None:
            from async_rl.ctrl.reviser import check_reviser_path

            check_reviser_path(args.reviser_model_path)
        torch.set_num_threads(args.threads)
        figures = evaluate_critic(args, cases)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")
    keys = ("initial_pass", "revise_alone_pass", "untrained_critic_pass", "critic_pass", "judgment_accuracy",
            "regression_rate", "critic_format_rate")
    print(", ".join(f"{k} {figures[k]:.3f}" for k in keys if k in figures) + f" ({figures['n']} cases); wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
