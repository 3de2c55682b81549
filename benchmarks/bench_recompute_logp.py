"""What ``--recompute-logp`` costs a trainer: one forward pass without gradient over the super-batch, against the
forward and backward passes the update makes over the same rows anyway.

The shape of ``configs/lm_arithmetic.yaml`` by default (SmolLM2-135M-Instruct, LoRA rank 16 on the attention and MLP
projections, a super-batch of 32 responses of 24 tokens after prompts padded to 64, micro-batches of 16), fp32 on
the CPU, one thread as a trainer rank has. The reference's forward (KL term) is left out of the update's time, so
the ratio is an upper bound of the share recompute adds to an epoch's training.

    .venv/bin/python benchmarks/bench_recompute_logp.py --out runs/bench/recompute_logp.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import types
from pathlib import Path

import torch

from async_rl.errors import OneLineArgumentParser

PROMPTS = ["What is 17 + 25?", "What is 48 - 19?", "Compute 7 + 36.", "What is 50 - 42? Answer with the number only."]


def _model(args: argparse.Namespace):
    from async_rl.actors.trainer_setup import training_model
    from async_rl.policies.causal_lm import CausalLMActorCritic, ChatPreprocessor, lm_target_modules, prepare_causal_lm

    kwargs = prepare_causal_lm({"text": True}, 1, args.model_path, {"max_prompt_tokens": args.prompt_tokens,
                                                                      "max_new_tokens": args.new_tokens})
    cfg = types.SimpleNamespace(lora_rank=16, lora_alpha=32.0, lora_dropout=0.0, lora_target_modules=list(lm_target_modules()),
                                lora_trainable=[], lora_sync="adapters")
    model = training_model(cfg, lambda: CausalLMActorCritic({"text": True}, 1, **kwargs).drop_critic()).train()
    pre = ChatPreprocessor({"text": True}, **kwargs)
    obs = torch.stack([pre({"prompt": PROMPTS[i % len(PROMPTS)]}) for i in range(args.rows)])
    g = torch.Generator().manual_seed(0)
    response = torch.randint(100, 40000, (args.rows, args.new_tokens), generator=g)
    return model, obs, response


def _paired_seconds(first, second, repeats: int) -> tuple[float, float, float]:
    """Medians of ``first``'s and ``second``'s times and of their ratio, timed in alternation: on a shared machine
    the load drifts, and a pair sees nearly the same load."""
    pairs = []
    for _ in range(repeats):
        times = []
        for fn in (first, second):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        pairs.append(times)
    return (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
            statistics.median(a / b for a, b in pairs))


def main() -> None:
    parser = OneLineArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="a causal LM folder or .gguf (default: SmolLM2-135M)")
    parser.add_argument("--rows", type=int, default=32, help="responses in the super-batch")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, obs, response = _model(args)
    mb = args.micro_batch

    def recompute() -> None:
        with torch.no_grad():
            for i in range(0, args.rows, mb):
                model.evaluate(obs[i:i + mb], response[i:i + mb])

    def update() -> None:
        for i in range(0, args.rows, mb):
            logp, _, _ = model.evaluate(obs[i:i + mb], response[i:i + mb])
            logp.sum().backward()
        model.zero_grad(set_to_none=True)

    recompute()  # warm-up
    load_before = list(os.getloadavg())
    recompute_s, update_s, ratio = _paired_seconds(recompute, update, args.repeats)
    figures = {"recompute_s": recompute_s, "update_forward_backward_s": update_s, "recompute_over_update": ratio}
    figures.update(rows=args.rows, micro_batch=mb, tokens_per_row=args.prompt_tokens + args.new_tokens,
                   load_average_before=load_before, load_average_after=list(os.getloadavg()))
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
