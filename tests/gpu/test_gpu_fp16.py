"""``precision: fp16`` on CUDA (skipped without a GPU; on a CPU whose DeepSpeed has no fp16 the config refuses
it, see tests/policies/test_fp16.py): DeepSpeed ZeRO-2 in float16 with dynamic loss scaling, the inference actor
in float16 on the same GPU, a few epochs of MetaWorld."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import ray
import torch
from test_gpu_training import _inspect

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (tests/gpu)")
# The functions sent to the actors with __ray_call__ travel by value: the actors cannot import this file.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROOT = Path(__file__).resolve().parents[2]


def _loss_scale(actor_self):
    """Runs inside the trainer (``__ray_call__``): DeepSpeed's current dynamic loss scale."""
    return float(actor_self.engine.optimizer.loss_scale)


def _inspect_fp16(runtime):
    seen = _inspect(runtime)
    seen["loss_scale"] = ray.get(runtime.trainers["trainer-0"].__ray_call__.remote(_loss_scale), timeout=120)
    return seen


def test_metaworld_fp16_with_loss_scaling_on_cuda(tmp_path):
    from async_rl.config import load_config
    from async_rl.driver import run

    cfg = load_config(["--device", "cuda", "--precision", "fp16", "--log-dir", str(tmp_path / "run"), "--max-epochs", "4",
                       "--swanlab-mode", "disabled", "--num-trainers", "1", "--trainer-gpu-ids", "[0]",
                       "--inference-gpu-ids", "[0]", "--num-eval-workers", "0",
                       "--env-kwargs", "{benchmark: MT1, task: reach-v3, max_episode_steps: 40}",
                       "--train-batch-size", "32", "--accumulation-steps", "2", "--super-batch-size", "64"],
                      str(ROOT / "configs" / "metaworld_mt1_ppo.yaml"))
    summary = run(cfg, inspect=_inspect_fp16)
    seen = summary["inspect"]

    assert summary["epochs"] == 4 and summary["sync/policy_version"] == 4
    for key in ("train/policy_loss", "train/value_loss", "train/entropy"):
        assert math.isfinite(summary[key]), (key, summary[key])
    # Dynamic loss scaling: a step that overflows is skipped and halves the scale (2**16 at start);
    # the run must still have taken real steps.
    status = seen["status"]
    assert status["global_step"] >= 4 and status["skipped_updates"] < status["global_step"], status
    assert 1 <= seen["loss_scale"] <= 2.0**16
    assert seen["trainer_at"] == ("cuda:0", "torch.float16") and seen["inference_at"] == ("cuda:0", "torch.float16")
    for key, value in seen["rank0"].items():
        torch.testing.assert_close(seen["inference"][key], value, rtol=0, atol=0, msg=key)
