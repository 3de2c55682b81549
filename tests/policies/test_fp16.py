"""``precision: fp16`` DeepSpeed's fp16 with dynamic loss scaling on CUDA.

DeepSpeed's CPU accelerator has no fp16 here, so on CPU the config refuses it in one line;
the training run is in tests/gpu/test_gpu_fp16.py, every policy's fp16 forward/backward in
tests/policies/test_bf16.py. Here: why the refusal, the DeepSpeed config per dtype, the refusal.
"""
import pytest
import torch

from async_rl.actors.trainer_setup import deepspeed_config
from async_rl.config import load_config
from async_rl.config.schema import RunConfig
from async_rl.errors import ConfigError
from async_rl.process_setup import precision_dtype

CFG = RunConfig(device="cpu", precision="fp32", train_batch_size=2, accumulation_steps=1, super_batch_size=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks DeepSpeed's CPU accelerator")
def test_deepspeed_cannot_train_fp16_on_this_cpu():
    """The reason fp16 is refused on CPU: DeepSpeed's engine asks its accelerator at
    ``deepspeed.initialize`` and raises "Type fp16 is not supported on your device" (measured:
    one rank, gloo, this config); the CPU accelerator has fp16 only where oneDNN does."""
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415

    accelerator = get_accelerator()
    assert accelerator.device_name() == "cpu"
    assert not accelerator.is_fp16_supported() and torch.float16 not in accelerator.supported_dtypes()


def test_deepspeed_config_per_dtype():
    fp16 = deepspeed_config(CFG, torch.float16)
    assert fp16["fp16"]["enabled"] and not fp16["bf16"]["enabled"]
    assert fp16["fp16"]["loss_scale"] == 0  # 0 = dynamic loss scaling
    assert fp16["fp16"]["initial_scale_power"] > 0 and fp16["fp16"]["loss_scale_window"] > 0
    bf16 = deepspeed_config(CFG, torch.bfloat16)
    assert bf16["bf16"]["enabled"] and not bf16["fp16"]["enabled"]
    fp32 = deepspeed_config(CFG, torch.float32)
    assert not fp32["bf16"]["enabled"] and not fp32["fp16"]["enabled"]
    # The same ZeRO-2 set-up whatever the dtype.
    assert fp16["zero_optimization"] == bf16["zero_optimization"] == fp32["zero_optimization"]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert precision_dtype("fp16", cuda) == torch.float16 and precision_dtype("fp32", cuda) == torch.float32
    assert precision_dtype("bf16", cpu) == torch.bfloat16 and precision_dtype("auto", cpu) == torch.float32


def test_fp16_on_cpu_is_one_config_error():
    with pytest.raises(ConfigError, match=r"fp16 needs a CUDA device.*--precision bf16") as info:
        load_config(["--precision", "fp16", "--device", "cpu"])
    assert "\n" not in str(info.value)
    if not torch.cuda.is_available():  # auto resolves to CPU here
        with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
            load_config(["--precision", "fp16"])
    # On a cluster the driver cannot see the workers' GPUs: accepted, the trainers decide.
    assert load_config(["--precision", "fp16", "--ray-address", "10.0.0.1:6379"]).precision == "fp16"
    assert load_config(["--precision", "fp16", "--device", "cuda"]).precision == "fp16"

