"""Real runs of both LIBERO launches with the tiny VLA: local Ray, one DeepSpeed ZeRO-2 trainer
with LoRA, one inference actor, a rollout worker on a real LIBERO task (and the discrete
launch's evaluation worker); a couple of epochs, then versions, weights, experience and logs.

The continuous launch's run is also the suite's real bf16 run of the VLA (LoRA over a backbone; ``--precision
bf16``, what ``auto`` picks on CUDA; formerly tests/policies/test_bf16.py's own LIBERO run, an otherwise identical
launch): DeepSpeed trains in bf16 with finite losses and no skipped update, the inference actor serves the
trainer's exact bf16 weights, and the checkpoint restores them exactly. The discrete launch's run stays in
float32 (the VLA's float32 run path)."""
import functools
import json
import math
from pathlib import Path

import pytest
import ray
import torch
from conftest import wait_for_replay
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import envs
from async_rl.config import load_config
from async_rl.driver import run
from async_rl.policies import build_policy
from async_rl.policies.initial_weights import with_initial_weights
from async_rl.policies.nets import cast_parameters

pytest.importorskip("libero", reason="LIBERO is not installed (make setup installs it)")

ROOT = Path(__file__).resolve().parents[2]
TASK = "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"
REQUIRED_TAGS = [
    "train/policy_loss", "train/value_loss", "train/entropy", "train/approx_kl", "train/lr_policy",
    "rollout/episode_return", "rollout/success_rate", "rollout/env_steps_per_sec", "rollout/policy_lag",
    "sync/broadcast_seconds", "sync/policy_version", "replay/size", "inference/batch_size",
    f"rollout_task/{TASK}/success_rate",
]


def _inspect(runtime):
    """Live actors after training: trainer status, weights on both sides, what the buffer holds."""
    status = ray.get(runtime.trainers["trainer-0"].status.remote(), timeout=60)
    trainer = ray.get(runtime.trainers["trainer-0"].weights.remote(), timeout=60)
    inference = ray.get(runtime.inference["inference-0"].weights.remote(), timeout=60)
    # The final evaluation (the discrete run's held-out states) leaves the workers paused and the trainer may have
    # drained the buffer: they collect again for the sample.
    runtime.workers.call("resume", what="resume")
    sample = wait_for_replay(runtime)
    return {"status": status, "trainer": trainer, "inference": inference, "sample": sample}


@pytest.mark.parametrize("launch_config", ["libero_ppo.yaml", "libero_ppo_discrete.yaml"])
def test_real_run(tmp_path, launch_config):
    log_dir = tmp_path / "run"
    discrete = "discrete" in launch_config
    overrides = [
        "--clip-mode", "soft_clip", "--log-dir", str(log_dir), "--max-epochs", "2", "--max-minutes", "null",
        "--swanlab-mode", "offline", "--log-interval-seconds", "0.01", "--num-rollout-workers", "1",
        "--env-kwargs", "{suite: libero_spatial, tasks: [0], image_size: 64, cameras: [agentview], max_episode_steps: 10, "
                        "settle_steps: 2" + (", init_states: 0-47, heldout_init_states: 48-49}" if discrete else "}"),
        "--rollout-steps", "8", "--train-batch-size", "4", "--accumulation-steps", "2", "--super-batch-size", "8",
        "--updates-per-epoch", "1",
    ]
    if discrete:
        overrides += ["--eval-interval-epochs", "1", "--eval-episodes", "1"]
    else:  # advantages whitened per task: the worker stamps each step with its task; mixed precision
        overrides += ["--normalize-advantages-per", "task", "--precision", "bf16"]
    cfg = load_config(overrides, str(ROOT / "configs" / launch_config))
    summary = run(cfg, inspect=_inspect)
    seen = summary["inspect"]

    assert summary["epochs"] == 2 and summary["sync/policy_version"] == 2
    assert seen["status"]["global_step"] == 2  # one optimiser step (2 accumulated micro-batches) per epoch
    assert seen["status"]["skipped_updates"] == 0, seen["status"]
    for key in ("train/policy_loss", "train/value_loss", "train/entropy"):
        assert math.isfinite(summary[key]), (key, summary[key])
    # The continuous run trains in bf16 (parameters; float32 buffers stay float32), the discrete one in float32.
    dtype = torch.float32 if discrete else torch.bfloat16
    assert (torch.bfloat16 in {v.dtype for v in seen["trainer"].values()}) == (not discrete)
    # The inference actor holds the trainer's LoRA-merged weights of the last broadcast (dtypes too).
    assert seen["trainer"].keys() == seen["inference"].keys()
    assert not any("lora_" in name for name in seen["inference"])
    for name, value in seen["trainer"].items():
        torch.testing.assert_close(seen["inference"][name], value, rtol=0, atol=0, msg=name)

    # Experience records what training reads (async_rl/experience.py): the behaviour log-prob
    # (the original ds_libero_ppo.py framework rebuilds it from mu/log_std or logits), not unread statistics.
    sample = seen["sample"]
    keys = set(sample.keys())
    assert {"advantage", "value_target", "logp", "value", "policy_version"} <= keys
    assert sample["obs", "pixel_values"].dtype == torch.uint8
    assert sample["logp"].shape[1:] == (7,) and sample["logp"].dtype == torch.float32
    assert not keys & {"behaviour_logits", "mu", "log_std", "env_action"}
    assert ("action_token" in keys and "action" not in keys) if discrete else "action" in keys
    if discrete:
        assert "task" not in keys  # only with normalize_advantages_per: task
    else:
        assert sample["task"].dtype == torch.int64 and sample["task"].eq(0).all()  # tasks: [0]

    events = EventAccumulator(str(log_dir)).Reload()
    tags = events.Tags()["scalars"]
    required = REQUIRED_TAGS + (["eval/success_rate", f"eval_task/{TASK}/success_rate"] if discrete else [])
    missing = [tag for tag in required if tag not in tags]
    assert not missing, missing
    if discrete:  # held-out initial states: scored by the initial weights (epoch 0) and the final ones
        assert [e.step for e in events.Scalars("eval/heldout_success_rate")] == [0, 2]
        assert summary["final_evaluation"]["heldout_success_rate"] in (0.0, 0.5, 1.0)
        for name in ("before_training_heldout_episodes.json", "heldout_episodes.json"):
            episodes = json.loads((log_dir / name).read_text())
            assert [e["init_state"] for e in episodes] == [48, 49] and all(1 <= e["steps"] <= 10 for e in episodes)
    assert list((log_dir / "swanlab").rglob("*")), "SwanLab offline run files"
    assert not ray.is_initialized()

    # The final checkpoint's LoRA adapter loads with plain peft onto a fresh policy (started from the
    # run's init_from export, if any: a checkpoint holds only what trained); merged, with the fully
    # trained heads from model.safetensors, it is the trainer's policy.
    from peft import PeftModel
    from safetensors.torch import load_file

    saved = Path(summary["checkpoint"])
    task_set = envs.make_task_set(cfg.env, **cfg.env_kwargs)
    fresh = with_initial_weights(functools.partial(build_policy, cfg.policy, task_set.obs_spec, task_set.action_dim,
                                                   **cfg.policy_kwargs), cfg.init_from)()
    fresh = cast_parameters(fresh, dtype)  # as DeepSpeed cast the trainer's (a no-op in float32)
    fresh_params = dict(fresh.named_parameters())
    heads = {k: v for k, v in load_file(str(saved / "model.safetensors")).items() if k in fresh_params}
    assert any(k.startswith("value_head.") for k in heads), "the heads are trained in full and saved"
    fresh.load_state_dict(heads, strict=False)
    # The adapter is relative to the Hugging Face model the policy holds (its backbone), as a user loads it onto
    # that model; in the dtype it was saved in (peft would otherwise lift a bf16 adapter to float32).
    assert fresh.hf_model_attr == "backbone"
    fresh.backbone = PeftModel.from_pretrained(fresh.backbone, str(saved / "adapter"),
                                               autocast_adapter_dtype=False).merge_and_unload()
    restored = dict(fresh.inference_tensors())
    assert restored.keys() == seen["trainer"].keys()
    for name, value in seen["trainer"].items():
        torch.testing.assert_close(restored[name], value, rtol=1e-6, atol=1e-6, msg=name)
