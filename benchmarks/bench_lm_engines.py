"""The causal-LM policy's two generation engines side by side (``generation_engine``: vllm, hf), in this process.

    python benchmarks/bench_lm_engines.py --out runs/bench/lm_engines.json                 # SmolLM2-135M, fp32
    python benchmarks/bench_lm_engines.py --model tiny --dtypes fp32 bf16 --out runs/bench/lm_engines_tiny.json

Per model and dtype, the same batch (``--prompts`` arithmetic questions, sampled at T 1.0, ``--tokens`` new tokens
each: min = max, so both engines generate equal lengths) through ``CausalLMActorCritic.act``:

* ``<dtype>_<engine>_tokens_per_sec``: generated tokens / wall seconds, the best of ``--repeats`` batches after a
  warm-up; ``<dtype>_vllm_over_hf`` their ratio;
* ``<dtype>_vllm_start_s``: the engine's start-up (its process, imports, weights, compilation), in the first batch;
* ``<dtype>_logp_max_abs_diff`` / ``_mean_abs_diff``: the log-probs vLLM recorded against the policy's
  recomputation (``evaluate``, what the trainer computes before an update) on the same tokens, from a batch
  without ``min_new_tokens`` (a suppressed eos changes the sampled distribution, which training does not know);
* ``<dtype>_logp_max_abs_diff_after_updates``: the same, the worst of ``--weight-updates`` batches, each after
  every adapter tensor moved in place as a weight sync moves it (``copy_``, by half its mean magnitude): the
  engine generates with the weights the policy holds after each update, not those of its first batch.

``--lora-rank`` (16 by default, on the 7 projections with alpha 2r, as ``configs/lm_arithmetic.yaml``; 0: none) puts
LoRA adapters with non-zero B on the policy, as a trained run's inference copy holds them: ``generate`` runs them as
peft layers, vLLM receives the merged weights (``lm_vllm``).

``--model tiny`` is a random Llama (2 layers, hidden 128) with SmolLM2's tokenizer. Threads: ``--threads`` for both
engines (torch's and vLLM's OpenMP). Figures are wall-clock: the machine's load and CPU are written with them.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine, parser, report

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def tiny_llama(folder: Path, tokenizer_source: str) -> str:
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_source)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=512, tie_word_embeddings=True,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return str(folder)


PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def with_trained_lora(policy: Any, rank: int) -> Any:
    """``policy`` with LoRA adapters whose B is not zero (an untrained adapter is the base model)."""
    import torch

    from async_rl.policies.lora import apply_lora

    if rank == 0:
        return policy
    apply_lora(policy, rank=rank, alpha=2.0 * rank, target_modules=PROJECTIONS)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator).to(param.dtype) * 0.01)
    return policy


def gap_after_updates(policy: Any, obs: Any, sampled: Any, updates: int) -> float:
    """The worst |vLLM's sampled log-prob - the policy's recomputation| over ``updates`` batches, each after the
    adapters (or, without LoRA, every weight) moved in place, as the inference actor's weight sync moves them."""
    import torch

    from async_rl.policies.lora import is_lora_name

    generator = torch.Generator().manual_seed(2)
    moved = [p for n, p in policy.named_parameters() if is_lora_name(n)] or list(policy.parameters())
    worst = 0.0
    for _ in range(updates):
        for param in moved:
            step = torch.randn(param.shape, generator=generator).to(param.dtype) * param.abs().mean() * 0.5
            param.copy_(param + step)
        out = policy.act(obs, sampled)
        recomputed, _, _ = policy.evaluate(obs, out["response"])
        real = policy.action_mask(out["response"])
        worst = max(worst, float((recomputed - out["logp"])[real].abs().max()))
    return worst


def measure(model_path: str, dtype: str, prompts: int, tokens: int, repeats: int, lora_rank: int,
            weight_updates: int = 0) -> dict[str, float]:
    import torch

    from async_rl.policies.causal_lm import CausalLMActorCritic, ChatPreprocessor, prepare_causal_lm
    from async_rl.policies.nets import cast_parameters
    from envs.arithmetic import heldout_problems

    figures: dict[str, float] = {}
    kwargs = prepare_causal_lm({"text": True}, 1, model_path, {"max_prompt_tokens": 64, "max_new_tokens": tokens,
                                                               "temperature": 1.0, "generation_engine": "vllm"})
    preprocess = ChatPreprocessor({"text": True}, **kwargs)
    obs = torch.stack([preprocess({"prompt": p["prompt"]}) for p in heldout_problems(prompts, 2)])
    sampled = torch.zeros(prompts, dtype=torch.bool)
    torch.manual_seed(0)
    policy = CausalLMActorCritic({"text": True}, 1, **kwargs).eval()
    policy.drop_critic()  # as GRPO runs it: act() times generation alone, not a value forward besides
    policy = cast_parameters(with_trained_lora(policy, lora_rank), getattr(torch, DTYPES[dtype]))
    with torch.inference_mode():
        # Log-probs with eos allowed (min_new_tokens 0): a suppressed eos renormalises the sampled distribution, which
        # training does not know of (causal_lm's min_new_tokens), in either engine.
        start = time.perf_counter()
        out = policy.act(obs, sampled)
        figures["vllm_start_s"] = time.perf_counter() - start  # the first batch: the engine's start and one batch
        recomputed, _, _ = policy.evaluate(obs, out["response"])
        real = policy.action_mask(out["response"])
        diff = (recomputed - out["logp"])[real].abs()
        figures.update(logp_max_abs_diff=float(diff.max()), logp_mean_abs_diff=float(diff.mean()),
                       logp_tokens=int(real.sum()))
        if weight_updates:
            figures["logp_max_abs_diff_after_updates"] = gap_after_updates(policy, obs, sampled, weight_updates)
        if repeats == 0:
            policy.close_engine()
            return figures
        policy.min_new_tokens = tokens  # speed at equal lengths
        for engine in ("vllm", "hf"):
            policy.generation_engine = engine
            policy.act(obs, sampled)  # warm-up
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                out = policy.act(obs, sampled)
                best = min(best, time.perf_counter() - start)
            figures[f"{engine}_tokens_per_sec"] = int(policy.action_mask(out["response"]).sum()) / best
    policy.close_engine()
    figures["vllm_over_hf"] = figures["vllm_tokens_per_sec"] / figures["hf_tokens_per_sec"]
    return figures


def cpu_model() -> str:
    """The CPU's name (bf16 speed differs much between the machine kinds: AMX on the Intel kind)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "one timed batch per engine, not three")
    ap.add_argument("--model", default="smollm2", help="smollm2 (the default model), tiny, or a model folder")
    ap.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed batches per engine; 0: the log-probs only")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora-rank", type=int, default=16, help="LoRA adapters (7 projections, alpha 2r); 0: none")
    ap.add_argument("--weight-updates", type=int, default=3,
                    help="batches after in-place weight updates whose log-prob gap is measured (0: none)")
    args = ap.parse_args(argv)
    import torch

    from async_rl.policies.lm_loading import resolve_lm_path

    torch.set_num_threads(args.threads)
    smollm2 = str(resolve_lm_path(None))
    figures: dict[str, Any] = {"model": args.model, "prompts": args.prompts, "tokens": args.tokens,
                               "threads": args.threads, "lora_rank": args.lora_rank, "cpu": cpu_model(), "load_avg_1min_start": machine()["load_avg_1min"]}
    with tempfile.TemporaryDirectory() as scratch:
        model = {"smollm2": smollm2, "tiny": None}.get(args.model, args.model) or tiny_llama(Path(scratch), smollm2)
        for dtype in args.dtypes:
            measured = measure(model, dtype, args.prompts, args.tokens, 1 if args.quick else args.repeats, args.lora_rank,
                               args.weight_updates)
            figures.update({f"{dtype}_{key}": value for key, value in measured.items()})
    figures["load_avg_1min_end"] = machine()["load_avg_1min"]
    report(figures, args)
    return 0


if __name__ == "__main__":  # guarded: a spawned process re-imports this module
    sys.exit(main())
