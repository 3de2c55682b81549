"""Where a completion's time goes, in one process: the operations both systems of bench_lm_peers.py run for each
batch of 16 completions of the arithmetic work (SmolLM2-135M-Instruct, LoRA r16 on the seven projections).

    python benchmarks/profile_lm_peers.py --threads 1 --out runs/bench/lm_peers_profile_t1.json
    python benchmarks/profile_lm_peers.py --threads 2 --out runs/bench/lm_peers_profile_t2.json

Measured with the same ``--threads`` for every operation, median of ``--repeats``: the prompts' prefill, one
sampled token after it (per-token decode), the trainer's forward and backward over prompt + response (the
LoRA model), the reference forward (adapters off, no gradient), the optimiser step, and pickling + unpickling
the 16 replay records (this project's worker -> replay -> trainer path, twice per record). Per-completion
figures are the batch's divided by 16. Both systems run all of these but the pickling (TRL is one process);
this project also sends the adapters to its inference actor once per update (sync/broadcast_seconds in a run).
"""
from __future__ import annotations

import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine, parser, report

BATCH, NEW_TOKENS, PROMPT_TOKENS = 16, 24, 64
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile(threads: int, repeats: int) -> dict[str, float]:
    import torch
    from tensordict import TensorDict
    from transformers import AutoModelForCausalLM

    from async_rl.policies.causal_lm import load_tokenizer
    from async_rl.policies.lm_loading import resolve_lm_path
    from async_rl.policies.lora import adapters_disabled, apply_lora
    from envs.arithmetic import heldout_problems

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    path = str(resolve_lm_path(None))
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "left"
    model = apply_lora(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), 16, 32.0, 0.0, TARGETS)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True,
                                           tokenize=False) for p in heldout_problems(BATCH, 1)]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    out: dict[str, float] = {"prompt_tokens_mean": float(mask.sum(1).float().mean())}

    def generate(n: int) -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=True,
                                  temperature=0.7, top_k=0, pad_token_id=tokenizer.pad_token_id)

    one, full = median_seconds(lambda: generate(1), repeats), median_seconds(lambda: generate(NEW_TOKENS), repeats)
    out["prefill_s"] = one
    out["decode_per_token_s"] = (full - one) / (NEW_TOKENS - 1)
    out["generate_24_tokens_s"] = full
    sequences = generate(NEW_TOKENS).clone()  # a normal tensor: autograd refuses inference-mode ones
    seq_mask = torch.cat([mask, torch.ones(BATCH, NEW_TOKENS, dtype=mask.dtype)], 1)
    response = sequences[:, ids.shape[1]:]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)

    def response_logp() -> torch.Tensor:
        logits = model(input_ids=sequences, attention_mask=seq_mask).logits[:, ids.shape[1] - 1:-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, response.unsqueeze(-1)).squeeze(-1)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        (-response_logp().mean()).backward()

    def reference() -> None:
        with torch.no_grad(), adapters_disabled(model):  # the project's reference: the adapters off
            response_logp()

    out["train_forward_backward_s"] = median_seconds(train_step, repeats)
    out["optimizer_step_s"] = median_seconds(optimizer.step, repeats)
    out["reference_forward_s"] = median_seconds(reference, repeats)
    records = TensorDict({"obs": {"input_ids": torch.zeros(BATCH, PROMPT_TOKENS, dtype=torch.int64),
                                  "attention_mask": torch.zeros(BATCH, PROMPT_TOKENS, dtype=torch.int64)},
                          "response": response.clone(), "logp": torch.zeros(BATCH, NEW_TOKENS),
                          "reward": torch.zeros(BATCH), "advantage": torch.zeros(BATCH),
                          "policy_version": torch.zeros(BATCH, dtype=torch.int64)}, batch_size=[BATCH])
    out["pickle_round_trip_s"] = median_seconds(lambda: pickle.loads(pickle.dumps(records)), repeats)
    adapters = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    out["adapter_mib"] = adapters / 2**20
    for key in [k for k in out if k.endswith("_s") and k != "decode_per_token_s"]:
        out[f"{key[:-2]}_per_completion_s"] = out[key] / BATCH
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "2 repeats")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    load = machine()["load_avg_1min"]
    figures = {"threads": args.threads, **profile(args.threads, 2 if args.quick else args.repeats),
               "load_avg_1min_start": load, "load_avg_1min_end": machine()["load_avg_1min"]}
    report({k: round(v, 5) if isinstance(v, float) else v for k, v in figures.items()}, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
