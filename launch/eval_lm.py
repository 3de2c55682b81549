"""Answer a file of problems with a causal language model and score the answers.

    python launch/eval_lm.py --problems problems.jsonl --out eval.json                 # the default model
    python launch/eval_lm.py --checkpoint runs/lm_arithmetic --problems p.jsonl --out eval.json --samples 4

Each line of --problems is ``{"prompt": ..., "answer": ...}`` (the last number of the response must equal
the answer exactly, as the arithmetic env checks) or ``{"prompt": ..., "tests": [...]}`` (code: the
response's first code block, after the optional ``"prefix"``, runs in the sandbox, each test statement
on its own; the score is the fraction that pass). One kind per file. ``--samples 1`` answers greedily;
``K > 1`` samples K answers per problem at the model's temperature. --out gets ``accuracy`` (answers)
or ``pass_rate`` (code; also ``solved``: the fraction of answers passing every test), ``n`` (problems)
and per-problem results. Runs in this process, no Ray. Bad input is one line on stderr and exit code 2,
before the model loads.
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

import torch  # noqa: E402

from async_rl.errors import ConfigError  # noqa: E402
from async_rl.jsonl import jsonl_values  # noqa: E402


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="a run's log dir (its newest checkpoint), its checkpoints/ dir or one epoch-* dir")
    parser.add_argument("--model-path", help="a Hugging Face folder or a .gguf file (neither flag: the default model)")
    parser.add_argument("--problems", required=True, help="JSONL of {prompt, answer} or {prompt, tests[, prefix]}")
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--samples", type=int, default=1, help="answers per problem (1: greedy; K > 1: sampled)")
    parser.add_argument("--max-new-tokens", type=int, help="longest answer (default: the run's or the policy's)")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per generate call")
    parser.add_argument("--timeout", type=float, default=3.0, help="sandbox wall seconds per code answer")
    parser.add_argument("--seed", type=int, default=0)
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


def evaluate(args: argparse.Namespace, problems: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    from async_rl.policies.causal_lm import load_tokenizer
    from async_rl.policies.lm_checkpoint import answer, load_lm_policy
    from async_rl.sandbox import SandboxPool
    from envs.arithmetic import arithmetic_reward
    from envs.humaneval import code_reward

    overrides = {} if args.max_new_tokens is None else {"max_new_tokens": args.max_new_tokens}
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
    prompts = [item["prompt"] for item in problems for _ in range(args.samples)]
    responses = [tokenizer.decode(ids, skip_special_tokens=True)
                 for ids in answer(policy, preprocess, prompts, greedy=args.samples == 1, batch_size=args.batch_size)]
    generated = time.perf_counter() - started
    rows = []
    with SandboxPool() as pool:
        for i, item in enumerate(problems):
            texts = responses[i * args.samples:(i + 1) * args.samples]
            if kind == "answer":
                scores, solved = [arithmetic_reward(t, item["answer"]) for t in texts], None
            else:
                results = [code_reward(t, item["tests"], pool, item.get("prefix", ""), args.timeout) for t in texts]
                scores = [r.fraction for r in results]
                solved = [r.all_passed for r in results]
            rows.append({**{k: item[k] for k in ("prompt", "answer", "tests") if k in item}, "responses": texts,
                         "scores": scores, "score": sum(scores) / len(scores),
                         **({} if solved is None else {"solved": sum(solved) / len(solved)})})
    mean = sum(r["score"] for r in rows) / len(rows)
    report: dict[str, Any] = {"accuracy" if kind == "answer" else "pass_rate": mean, "n": len(rows),
                              "samples": args.samples, "source": source, "generation_seconds": generated,
                              "problems": rows}
    if kind == "tests":
        report["solved"] = sum(r["solved"] for r in rows) / len(rows)
    return report


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
        problems, kind = read_problems(args.problems)  # bad files fail before anything loads
        report = evaluate(args, problems, kind)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(report, indent=1))
    metric = "accuracy" if "accuracy" in report else "pass_rate"
    print(f"{metric} {report[metric]:.3f} over {report['n']} problems x {report['samples']} sample(s) "
          f"({report['source']}); results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
