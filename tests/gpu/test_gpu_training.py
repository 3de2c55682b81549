"""Real runs on CUDA (skipped without a GPU): ZeRO-2 with bf16 (what ``precision: auto`` picks
there), batched inference on the GPU, and the weight sync between them: gloo over host memory
when trainer and inference actor share one GPU, NCCL when the inference actor has its own."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import ray
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (tests/gpu)")
# The functions sent to the actors with __ray_call__ travel by value: the actors cannot import this file.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ROOT = Path(__file__).resolve().parents[2]


def _device_and_dtype(actor_self):
    """Runs inside an actor (``__ray_call__``): where its model lives and in which dtype."""
    model = actor_self.engine.module if hasattr(actor_self, "engine") else actor_self.model
    return str(next(model.parameters()).device), str(next(model.parameters()).dtype)


def _inspect(runtime):
    trainer, inference = runtime.trainers["trainer-0"], runtime.inference["inference-0"]
    return {"rank0": ray.get(trainer.weights.remote(), timeout=120),
            "inference": ray.get(inference.weights.remote(), timeout=120),
            "status": ray.get(trainer.status.remote(), timeout=120),
            "trainer_at": ray.get(trainer.__ray_call__.remote(_device_and_dtype), timeout=120),
            "inference_at": ray.get(inference.__ray_call__.remote(_device_and_dtype), timeout=120)}


@pytest.mark.parametrize("trainer_gpus, inference_gpu, transport", [
    ([0], 0, "share one GPU"), ([0], 1, "nccl"), ([0, 1], 2, "nccl"),
], ids=["co-located", "own-gpu", "two-ranks-nccl"])
def test_metaworld_bf16_on_cuda(tmp_path, capsys, trainer_gpus, inference_gpu, transport):
    from async_rl.config import load_config
    from async_rl.driver import run

    if max(*trainer_gpus, inference_gpu) >= torch.cuda.device_count():
        pytest.skip(f"needs {max(*trainer_gpus, inference_gpu) + 1} GPUs, {torch.cuda.device_count()} visible")
    log_dir = tmp_path / "run"
    cfg = load_config(["--device", "cuda", "--precision", "auto", "--log-dir", str(log_dir), "--max-epochs", "3",
                       "--swanlab-mode", "disabled", "--num-trainers", str(len(trainer_gpus)),
                       "--trainer-gpu-ids", str(trainer_gpus),
                       "--inference-gpu-ids", f"[{inference_gpu}]", "--num-eval-workers", "0",
                       "--env-kwargs", "{benchmark: MT1, task: reach-v3, max_episode_steps: 40}",
                       "--train-batch-size", "32", "--accumulation-steps", "2", "--super-batch-size", "64",
                       "--log-interval-seconds", "0.01"], str(ROOT / "configs" / "metaworld_mt1_ppo.yaml"))
    summary = run(cfg, inspect=_inspect)
    seen = summary["inspect"]

    assert summary["epochs"] == 3 and math.isfinite(summary["train/policy_loss"])
    assert seen["status"]["global_step"] >= 3 and seen["status"]["skipped_updates"] == 0, seen["status"]
    assert seen["trainer_at"] == ("cuda:0", "torch.bfloat16") and seen["inference_at"] == ("cuda:0", "torch.bfloat16")
    for key, value in seen["rank0"].items():
        torch.testing.assert_close(seen["inference"][key], value, rtol=0, atol=0, msg=key)
    assert transport in capsys.readouterr().err  # the coordinator says which transport and why
    # Inference batched the workers' requests on the GPU (2 workers x 8 envs each).
    batch_sizes = [e.value for e in EventAccumulator(str(log_dir)).Reload().Scalars("inference/batch_size")]
    assert max(batch_sizes) > 1, batch_sizes
