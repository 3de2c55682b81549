"""TRL's GRPOTrainer on the work of configs/lm_arithmetic.yaml, for benchmarks/bench_lm_peers.py (which runs
this file in its own process with .venv-peers/site-packages on its path: TRL is not in the project's venv).

Same model folder, LoRA (r16, alpha 32, the seven projections), arithmetic training prompts as chat messages,
the arithmetic env's exact-answer reward, groups of 8 at temperature 0.7, 24 new tokens, 32 completions per
update (16 x 2 accumulation), lr 2e-4 after 2 warm-up steps, KL k3 at 0.001 to the adapters-off reference,
DAPO's token mean over the accumulated batch (the project's global-token-mean); no gradient checkpointing. Trains for --minutes, then
writes the merged model (a Hugging Face folder launch/eval_lm.py scores) and --stats JSON: updates, update
times, completions and tokens generated, and seconds spent generating + scoring (TRL's
``_generate_and_score_completions``: prefill, sampling, reward, reference and old log-probs) against
computing the loss and its backward (``training_step`` less the former).

``--device cuda`` (bench_lm_peers.py --gpu): the same run on the first visible GPU, fp32 weights under bf16
autocast (TRL's usual GPU set-up), generating and training on that one device.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from async_rl.errors import OneLineArgumentParser  # noqa: E402 (after the path set-up above)

TRAIN_PROMPTS = 20_000  # more than 15 minutes can use: no prompt is seen twice


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True, help="the Hugging Face folder of the base model")
    ap.add_argument("--out-dir", required=True, help="the merged model goes to OUT_DIR/merged")
    ap.add_argument("--stats", required=True, help="JSON file for the run's figures")
    ap.add_argument("--minutes", type=float, required=True, help="a time limit (the run also stops at --max-steps)")
    ap.add_argument("--max-steps", type=int, default=100_000, help="updates (fixed-count runs: a busy machine's figure)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the whole 2-core machine: one process)")
    ap.add_argument("--difficulty", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():  # before TRL's imports and the model
        print("peers_trl_grpo: --device cuda but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    import numpy as np
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envs.arithmetic import arithmetic_reward, draw_problem

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    rows = [draw_problem(rng, args.difficulty, heldout=False) for _ in range(TRAIN_PROMPTS)]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows])

    def exact_answer(prompts, completions, answer, **_):
        return [arithmetic_reward(c[0]["content"], a) for c, a in zip(completions, answer)]

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=str(Path(args.out_dir) / "trainer"), per_device_train_batch_size=16, gradient_accumulation_steps=2,
        num_generations=8, temperature=0.7, top_p=1.0, max_completion_length=24, learning_rate=2e-4, warmup_steps=2,
        lr_scheduler_type="constant_with_warmup", beta=0.001, loss_type="dapo", num_iterations=1, max_grad_norm=1.0,
        max_steps=args.max_steps, logging_steps=1, save_strategy="no", report_to="none", use_cpu=not on_gpu,
        bf16=on_gpu and torch.cuda.is_bf16_supported(),
        seed=args.seed, dataloader_num_workers=0, disable_tqdm=True,
        # TRL turns activation recomputation on by default; this project does not recompute, and 135M parameters
        # fit either way: off, TRL is as fast as it can be here.
        gradient_checkpointing=False)
    timings = {"generate_and_score_seconds": 0.0, "training_step_seconds": 0.0}

    class TimedGRPOTrainer(GRPOTrainer):
        """Times TRL's two phases without changing them."""

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                timings["generate_and_score_seconds"] += time.perf_counter() - start

        def training_step(self, *a, **k):
            start = time.perf_counter()
            try:
                return super().training_step(*a, **k)
            finally:
                timings["training_step_seconds"] += time.perf_counter() - start

    deadline = time.monotonic() + 60 * args.minutes
    update_times: list[float] = []
    lengths: list[float] = []

    class StopAtDeadline(TrainerCallback):
        def on_step_end(self, _args, state, control, **_):
            update_times.append(time.time())
            # Keep the Trainer's own stop (max_steps, set by its flow callback before this one): assigning
            # would clear it, and the run went on past --max-steps.
            control.should_training_stop = control.should_training_stop or time.monotonic() >= deadline

        def on_log(self, _args, state, control, logs=None, **_):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    trainer = TimedGRPOTrainer(model=model, reward_funcs=exact_answer, args=config, train_dataset=data,
                               processing_class=tokenizer, peft_config=lora, callbacks=[StopAtDeadline()])
    started = time.time()
    trainer.train()
    merged = trainer.model.merge_and_unload()
    merged.save_pretrained(Path(args.out_dir) / "merged")
    tokenizer.save_pretrained(Path(args.out_dir) / "merged")
    updates = len(update_times)
    per_update = 16 * 2
    stats = {"updates": updates, "completions_trained": updates * per_update, "started": started,
             "update_times": update_times, "completion_tokens_mean": sum(lengths) / len(lengths) if lengths else None,
             "threads": args.threads, "device": args.device, **timings}
    timed = timings["training_step_seconds"]  # training_step holds the generation (TRL generates inside it)
    stats["loss_and_backward_seconds"] = max(timed - timings["generate_and_score_seconds"], 0.0)
    Path(args.stats).write_text(json.dumps(stats, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
