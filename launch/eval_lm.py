"""Answer a file of problems with a causal language model and score the answers.

    python launch/eval_lm.py --problems problems.jsonl --out eval.json                 # the default model
    python launch/eval_lm.py --checkpoint runs/lm_arithmetic --problems p.jsonl --out eval.json --samples 4
    python launch/eval_lm.py --model-path DIR --data heldout.parquet --reward math --reward my_rewards:brevity=0.2 --out e.json

Without --reward, each line of --problems is ``{"prompt": ..., "answer": ...}`` (scored by the built-in ``math``
reward, as the arithmetic env is) or ``{"prompt": ..., "tests": [...]}`` (``code_tests``: the response's first
code block, after the optional ``"prefix"``, runs in the sandbox, each test statement on its own; the score is
the fraction that pass). One kind per file. With --reward (the names of launch/ds_lm_grpo.py: built-ins or
module:function, each NAME_OR_PATH[=WEIGHT]) the file is any data the prompts env reads (--data is the same
flag: JSONL, Parquet, a datasets folder; --split for a DatasetDict, else its test or validation split;
--prompt-column names the prompt) and its columns go to the rewards, called as the run calls them (TRL's
arguments, ``completion_ids`` the answer's own ids). A chat prompt's messages go to the chat template whole.
``--samples 1`` answers greedily; ``K > 1`` samples K answers per problem at the model's temperature.
The options that shape the answers (max_new_tokens, temperature, top_p, ...) are a checkpoint's own (its run's
policy_kwargs); for the base model, those of --options-from RUN (a run or checkpoint) or else of the launch config
that trains such data (configs/lm_prompts.yaml; lm_humaneval.yaml for code problems): a base-vs-checkpoint
comparison without flags answers alike (--out's ``generation`` says which were used).
--out gets ``accuracy`` (answers) or ``pass_rate`` (code; also ``solved``: the fraction of answers passing every
test) or, with --reward, ``reward`` (the weighted sum's mean); always ``rewards`` (each reward's mean and std),
``n`` (problems) and per-problem results. Runs in this process, no Ray. Bad input is one line on stderr and
exit code 2, before the model loads.
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
from async_rl.jsonl import jsonl_values
from async_rl.rewards.functions import parse_reward_specs, split_reward_item
from async_rl.rewards.scoring import RewardSet, dry_run, missing_column_message
from envs._prompt_rows import data_path, heldout_split_of, is_split_folder, read_rows

DEFAULT_REWARD = {"answer": "math", "tests": "code_tests"}  # a file's kind -> its reward when --reward is not given
ROOT = Path(__file__).resolve().parents[1]
# The policy options that shape an answer, and the launch config whose options a base model answers a kind with.
GENERATION_OPTIONS = ("max_new_tokens", "min_new_tokens", "temperature", "top_k", "top_p", "min_p", "system_prompt")
LAUNCH_CONFIGS = {"answer": "lm_prompts.yaml", "rows": "lm_prompts.yaml", "tests": "lm_humaneval.yaml"}


def read_problems(path: str) -> tuple[list[dict[str, Any]], str]:
    """The problems of a JSONL file and their kind (``answer`` or ``tests``); ConfigError naming the line."""
    problems, kinds = [], set()
    for number, item in jsonl_values(path, "--problems", "{\"prompt\", \"answer\"|\"tests\"}"):
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ConfigError(f"--problems {path} line {number}: needs a string \"prompt\"")
        kind = [k for k in ("answer", "tests") if k in item]
        if len(kind) != 1:
            raise ConfigError(f"--problems {path} line {number}: needs exactly one of \"answer\" or \"tests\"")
        if kind == ["tests"] and (not isinstance(item["tests"], list) or not all(isinstance(t, str) for t in item["tests"])):
            raise ConfigError(f"--problems {path} line {number}: \"tests\" must be a list of Python statements")
        kinds.add(kind[0])
        problems.append(item)
    if not problems:
        raise ConfigError(f"--problems {path}: no problems in it")
    if len(kinds) > 1:
        raise ConfigError(f"--problems {path}: mixes answer and tests problems; one kind per file")
    return problems, kinds.pop()


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()  # a checkpoint names its own base model
    source.add_argument("--checkpoint", help="a run's log dir (its newest checkpoint), its checkpoints/ dir or one epoch-* dir")
    source.add_argument("--model-path", help="a Hugging Face folder or a .gguf file (neither flag: the default model)")
    parser.add_argument("--problems", "--data", dest="problems", required=True,
                        help="JSONL of {prompt, answer} or {prompt, tests[, prefix]}; with --reward any data the prompts "
                             "env reads (JSONL, Parquet, a datasets folder)")
    parser.add_argument("--reward", action="append", help="NAME_OR_PATH[=WEIGHT] as for launch/ds_lm_grpo.py; repeat "
                        "for several (default: math for answer files, code_tests for tests files)")
    parser.add_argument("--split", help="the split of a saved DatasetDict folder (default: test, else validation)")
    parser.add_argument("--prompt-column", default="prompt", help="with --reward: the column that holds the prompt "
                        "(default: prompt)")
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--samples", type=int, default=1, help="answers per problem (1: greedy; K > 1: sampled)")
    parser.add_argument("--options-from", metavar="RUN", help="a run's log dir or checkpoint whose policy options "
                        "(max_new_tokens, temperature, top_p, ...) the answers use (default: the checkpoint's own; for "
                        "a base model configs/lm_prompts.yaml's, lm_humaneval.yaml's for code problems)")
    parser.add_argument("--max-new-tokens", type=int, help="longest answer (default: that of the options above)")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per generate call")
    parser.add_argument("--timeout", type=float, default=3.0, help="sandbox wall seconds per code answer")
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the sampling (default: 0)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: robust on a busy machine, where spinning threads slow each other)")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    if args.samples < 1 or args.batch_size < 1 or args.threads < 1 or (args.max_new_tokens is not None and args.max_new_tokens < 1):
        raise ConfigError("--samples, --batch-size, --threads and --max-new-tokens must be positive integers")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise ConfigError(f"--out {args.out}: not a writable file path (a directory, or its folder does not exist)")
    if args.reward:  # rows read as the prompts env reads them: the path checked by the validator of its data option
        try:
            data_path(args.problems)
        except ValueError as exc:
            raise ConfigError(f"--problems {args.problems}: {exc}") from None


def load_problems(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str], str, RewardSet]:
    """The problems, how messages name each, their kind (``answer``, ``tests`` or ``rows``: --reward given) and
    the rewards, every reward checked on them (its columns, a dry run on the first rows)."""
    if args.reward:
        split = heldout_split_of(args.problems, args.split, "", "--problems") if is_split_folder(args.problems) else None
        loaded = read_rows(args.problems, split, "--problems", args.prompt_column)
        problems, labels, kind = list(loaded.rows), list(loaded.labels), "rows"
        specs = parse_reward_specs(args.reward, {"code_tests": {"timeout_s": args.timeout}} if any(
            split_reward_item(r)[0] == "code_tests" for r in args.reward) else None)
    else:
        problems, kind = read_problems(args.problems)
        labels = [f"{args.problems} problem {i + 1}" for i in range(len(problems))]
        options = {"code_tests": {"timeout_s": args.timeout}} if kind == "tests" else None
        specs = parse_reward_specs([DEFAULT_REWARD[kind]], options)
    rewards = RewardSet(specs)
    for row, label in zip(problems, labels):
        missing = rewards.missing_columns(list(row))
        if missing:
            name, columns = next(iter(missing.items()))
            raise ConfigError(missing_column_message(name, columns, label, [c for c in row if c != "prompt"]))
    dry_run(rewards, problems[:4], labels[:4])
    return problems, labels, kind, rewards


def evaluate(args: argparse.Namespace, problems: list[dict[str, Any]], labels: list[str], kind: str,
             rewards: RewardSet) -> dict[str, Any]:
    from async_rl.policies.causal_lm import load_tokenizer
    from async_rl.policies.lm_checkpoint import answer, load_lm_policy

    overrides, options_from = generation_options(args, kind)
    policy, preprocess, source = load_lm_policy(args.checkpoint, args.model_path, overrides)
    # The prompt width only pads a batch to one shape: widened to the longest prompt, not a refusal
    # (the default model's width is 256 tokens; HumanEval's prompts reach 334 with the chat template).
    width, preprocess.max_prompt_tokens = preprocess.max_prompt_tokens, 1 << 30
    longest = max(len(preprocess.prompt_ids(item["prompt"])) for item in problems)
    preprocess.max_prompt_tokens = max(width, longest)
    context = getattr(policy.lm.config, "max_position_embeddings", None)
    if context is not None and longest + policy.max_new_tokens > context:
        raise ConfigError(f"--problems {args.problems}: a prompt of {longest} tokens plus {policy.max_new_tokens} new "
                          f"tokens exceeds the model's context of {context}; shorten it or lower --max-new-tokens")
    tokenizer = load_tokenizer(preprocess.model_path)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    prompts = [item["prompt"] for item in problems for _ in range(args.samples)]  # chat prompts whole: system kept
    ids = answer(policy, preprocess, prompts, greedy=args.samples == 1, batch_size=args.batch_size)
    responses = [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    generated = time.perf_counter() - started
    # Every answer scored in one call per reward (code tests run in parallel), in TRL's form for chat prompts.
    k = args.samples
    repeated = [item for item in problems for _ in range(k)]
    completions = [t if isinstance(item["prompt"], str) else [{"role": "assistant", "content": t}]
                   for item, t in zip(repeated, responses)]
    totals, values = rewards.score([item["prompt"] for item in repeated], completions, repeated,
                                   [label for label in labels for _ in range(k)], completion_ids=ids)
    rows = []
    for i, item in enumerate(problems):
        scores = totals[i * k:(i + 1) * k]
        per_reward = {name: v[i * k:(i + 1) * k] for name, v in values.items()}
        row: dict[str, Any] = {**{c: item[c] for c in ("prompt", "answer", "tests") if c in item}, "responses": responses[i * k:(i + 1) * k],
               "scores": scores, "score": sum(scores) / k, "rewards": per_reward}
        if kind == "tests":
            row["solved"] = sum(v is not None and v >= 1.0 for v in per_reward["code_tests"]) / k  # every test passed
        rows.append(row)
    mean = sum(r["score"] for r in rows) / len(rows)
    key = {"answer": "accuracy", "tests": "pass_rate", "rows": "reward"}[kind]
    report: dict[str, Any] = {key: mean, "rewards": {name: {"mean": _mean(v), "std": _std(v)} for name, v in values.items()},
                              "n": len(rows), "samples": args.samples, "source": source, "generation_seconds": generated,
                              "generation": {**overrides, "max_new_tokens": policy.max_new_tokens, "from": options_from},
                              "problems": rows}
    if kind == "tests":
        report["solved"] = sum(r["solved"] for r in rows) / len(rows)
    return report


def generation_options(args: argparse.Namespace, kind: str) -> tuple[dict[str, Any], str]:
    """The policy options that shape the answers (``GENERATION_OPTIONS``) and where they come from: --options-from's
    run, else --checkpoint's, else the launch config that trains problems of ``kind`` (the base model answers as a
    run of it does); --max-new-tokens over them. ConfigError for a bad --options-from, before anything loads."""
    from async_rl.checkpoint import resolve_checkpoint
    from async_rl.config import read_config_file
    from async_rl.policies.lm_checkpoint import run_config

    run, flag = (args.options_from, "--options-from") if args.options_from is not None else (args.checkpoint, "--checkpoint")
    if run is not None:
        try:
            kwargs, source = run_config(resolve_checkpoint(run)).get("policy_kwargs") or {}, f"{flag} {run}"
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("--checkpoint", flag, 1)) from None
    else:
        config = ROOT / "configs" / LAUNCH_CONFIGS[kind]
        kwargs, source = read_config_file(config).values.get("policy_kwargs") or {}, f"configs/{config.name}"
    options = {key: kwargs[key] for key in GENERATION_OPTIONS if key in kwargs}
    if args.max_new_tokens is not None:
        options["max_new_tokens"] = args.max_new_tokens
    return options, source


def _mean(values: list[Optional[float]]) -> Optional[float]:
    """The mean of the values a reward gave (None: rows it skipped; all skipped: None)."""
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def _std(values: list[Optional[float]]) -> Optional[float]:
    mean, scored = _mean(values), [v for v in values if v is not None]
    return None if mean is None else (sum((v - mean) ** 2 for v in scored) / len(scored)) ** 0.5


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
        problems, labels, kind, rewards = load_problems(args)  # bad files and rewards fail before anything loads
        report = evaluate(args, problems, labels, kind, rewards)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(report, indent=1))
    metric = next(k for k in ("accuracy", "pass_rate", "reward") if k in report)
    each = ", ".join(f"{name} {row['mean']:.3f}" if row["mean"] is not None else f"{name} (skipped every row)"
                     for name, row in report["rewards"].items())
    print(f"{metric} {report[metric]:.3f} over {report['n']} problems x {report['samples']} sample(s) "
          f"({report['source']}); rewards: {each}; results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
