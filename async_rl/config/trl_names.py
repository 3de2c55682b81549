"""TRL's names (``GRPOConfig``, its ``TrainingArguments`` and TRL's ``ModelConfig``) and this project's flags
for the same thing. An unknown flag that is one of TRL's names (dashes or underscores) is refused with the
flag to use instead (``trl_flag_hint``), not with difflib's nearest spelling, which points elsewhere
(``--num-generations`` is not ``--num-trainers``). docs/language_models.md, "Coming from TRL", is
``markdown_table()``; ``tests/config/test_help.py`` keeps the two equal and checks that every flag named
here exists.
"""
from __future__ import annotations

from typing import NamedTuple, Optional


class TrlName(NamedTuple):
    trl: str  # TRL's spelling, underscores
    flag: Optional[str]  # this project's flag; None: no equivalent
    note: str  # what to write, or how it differs


TRL_NAMES: tuple[TrlName, ...] = (
    TrlName("model_name_or_path", "--model-path", "a Hugging Face folder or a .gguf file"),
    TrlName("num_generations", "--group-size", "completions per prompt"),
    TrlName("beta", "--kl-ref-coef", "KL to the reference, the model with its adapters off; TRL's estimator is --kl-ref-estimator k3"),
    TrlName("learning_rate", "--lr-policy", "the policy's learning rate"),
    TrlName("per_device_train_batch_size", "--train-batch-size", "completions per micro-batch on each trainer"),
    TrlName("gradient_accumulation_steps", "--accumulation-steps", "micro-batches per optimiser step"),
    TrlName("generation_batch_size", "--super-batch-size", "completions each trainer draws per epoch"),
    TrlName("num_iterations", "--updates-per-epoch", "passes over each super-batch, TRL's mu"),
    TrlName("max_steps", "--max-epochs", "an epoch is one super-batch's update: one optimiser step with the LM configs"),
    TrlName("num_train_epochs", None, "prompts are drawn until --max-epochs or --max-minutes, not in passes over the data"),
    TrlName("max_completion_length", "--policy.max-new-tokens", "longest completion"),
    TrlName("max_prompt_length", "--policy.max-prompt-tokens", "a longer prompt is refused before the run, not cut"),
    TrlName("temperature", "--policy.temperature", "sampling temperature"),
    TrlName("top_p", "--policy.top-p", "nucleus sampling"),
    TrlName("top_k", "--policy.top-k", "0 = off"),
    TrlName("min_p", "--policy.min-p", "0 = off"),
    TrlName("gradient_checkpointing", "--policy.gradient-checkpointing", "recompute the decoder layers in backward"),
    TrlName("disable_dropout", "--policy.disable-dropout", "on by default here"),
    TrlName("epsilon", "--clip-params", "'{clip_eps: 0.2}': the clip range"),
    TrlName("epsilon_high", "--clip-params", "'{clip_eps_high: 0.28}': the upper clip range, DAPO's clip-higher"),
    TrlName("loss_type", "--loss-agg", "bnpo: minibatch-token-mean, grpo: seq-mean-token-mean, "
            "dr_grpo: seq-mean-token-sum-norm, dapo: global-token-mean"),
    TrlName("scale_rewards", "--grpo-scale-by-std", "false: centre the group's rewards only, as Dr. GRPO does"),
    TrlName("reward_funcs", "--reward", "launch/ds_lm_grpo.py: a built-in or module:function, repeated for several"),
    TrlName("reward_weights", "--reward", "NAME=WEIGHT, one weight per --reward"),
    TrlName("dataset_train_split", "--env.train-split", "the split of a saved DatasetDict folder"),
    TrlName("use_vllm", "--policy.generation-engine", "vllm: each inference actor's own engine, by name; auto, the default, takes hf on CPU"),
    TrlName("sync_ref_model", None, "the reference is fixed: the model with LoRA adapters off, or the initial weights"),
    TrlName("lr_scheduler_type", None, "always linear warm-up then cosine decay: --warmup-steps, --lr-decay-steps, --min-lr-ratio"),
    TrlName("warmup_ratio", "--warmup-steps", "in optimiser steps"),
    TrlName("bf16", "--precision", "bf16; auto = bf16 on CUDA, fp32 on CPU"),
    TrlName("fp16", "--precision", "fp16"),
    TrlName("output_dir", "--log-dir", "logs, checkpoints and the report"),
    TrlName("logging_dir", "--log-dir", "TensorBoard logs are under it"),
    TrlName("logging_steps", "--log-interval-seconds", "in seconds, not steps"),
    TrlName("report_to", "--swanlab-mode", "TensorBoard always; SwanLab offline, local, cloud or disabled"),
    TrlName("save_steps", "--checkpoint-interval-epochs", "in epochs"),
    TrlName("save_total_limit", "--keep-checkpoints", "checkpoints kept"),
    TrlName("resume_from_checkpoint", "--resume", "a checkpoint, or a folder of them: the newest"),
    TrlName("eval_steps", "--eval-interval-epochs", "in epochs; the held-out prompts are answered at the end"),
    TrlName("lora_r", "--lora-rank", "0 = no LoRA: every parameter trains"),
    TrlName("use_peft", "--lora-rank", "LoRA is on when the rank is above 0"),
    TrlName("lora_task_type", None, "always a causal LM"),
    *(TrlName(same, "--" + same.replace("_", "-"), "the same name") for same in (
        "seed", "lora_alpha", "lora_dropout", "lora_target_modules", "warmup_steps", "weight_decay", "max_grad_norm")),
)

_BY_NAME = {entry.trl: entry for entry in TRL_NAMES}


def trl_flag_hint(flag: str) -> Optional[str]:
    """The line refusing ``flag`` (``--num-generations``, ``--num_generations=8``) when it is TRL's name for
    something here, else None."""
    name = flag.split("=")[0]
    entry = _BY_NAME.get(name.removeprefix("--").replace("-", "_")) if name.startswith("--") else None
    if entry is None:
        return None
    if entry.flag is None:
        return f"{name} is TRL's name: no equivalent here ({entry.note})"
    return f"{name} is TRL's name: use {entry.flag} ({entry.note})"


def dash_spelling_hint(flag: str, valid: set[str]) -> Optional[str]:
    """The line refusing ``--group_size`` when ``--group-size`` is a flag (flags are written with dashes), else None."""
    name = flag.split("=")[0]
    dashed = name[:2] + name[2:].replace("_", "-")
    if dashed != name and dashed in valid:
        return f"{name}: flags are written with dashes; use {dashed}"
    return None


def markdown_table() -> str:
    """The TRL-to-flag table of docs/language_models.md."""
    rows = ["| TRL (`GRPOConfig`) | here | |", "|---|---|---|"]
    rows += [f"| `{e.trl}` | {f'`{e.flag}`' if e.flag else 'no equivalent'} | {e.note} |" for e in TRL_NAMES]
    return "\n".join(rows) + "\n"
