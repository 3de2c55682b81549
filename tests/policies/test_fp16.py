"""``precision: fp16`` DeepSpeed's fp16 with dynamic loss scaling.

On CPU the config asks DeepSpeed's CPU accelerator whether it has fp16 (it has where oneDNN does: Intel CPUs
with AVX-512 FP16 / AMX, not the AMD kind) and refuses fp16 in one line where it says no; where it says yes,
a real trainer rank trains in fp16 on CPU (below). The CUDA run is in tests/gpu/test_gpu_fp16.py, every
policy's fp16 forward/backward in tests/policies/test_bf16.py. Here: the accelerator's answer and the
config's, both branches, the DeepSpeed config per dtype, and training where the answer is yes.
"""
import functools

import pytest
import ray
import torch
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
from trainer_batches import ACTIONS, SPEC, mlp_step_records

from async_rl.actors.trainer import TrainerRank
from async_rl.actors.trainer_setup import deepspeed_config
from async_rl.config import load_config
from async_rl.config.schema import RunConfig
from async_rl.errors import ConfigError
from async_rl.policies import build_policy
from async_rl.process_setup import deepspeed_cpu_supports_fp16, precision_dtype
from async_rl.weights.rendezvous import find_free_port

CFG = RunConfig(device="cpu", precision="fp32", train_batch_size=2, accumulation_steps=1, super_batch_size=2)


def _answer(monkeypatch, has_fp16: bool) -> None:
    """DeepSpeed's CPU accelerator answers ``has_fp16`` (this machine's kind or the other)."""
    monkeypatch.setattr(CPU_Accelerator, "is_fp16_supported", lambda self: has_fp16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks DeepSpeed's CPU accelerator")
def test_the_config_does_what_deepspeeds_cpu_accelerator_answers():
    """No assumption about this CPU: DeepSpeed's engine asks ``get_accelerator()`` at ``deepspeed.initialize``
    and raises "Type fp16 is not supported on your device" where it says no; the config asks the same."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    assert accelerator.device_name() == "cpu"
    answer = bool(accelerator.is_fp16_supported())
    assert (torch.float16 in accelerator.supported_dtypes()) == answer == deepspeed_cpu_supports_fp16()
    if answer:
        assert load_config(["--precision", "fp16", "--device", "cpu"]).precision == "fp16"
    else:
        with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
            load_config(["--precision", "fp16", "--device", "cpu"])


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


def test_fp16_on_a_cpu_without_it_is_one_config_error(monkeypatch):
    _answer(monkeypatch, False)
    with pytest.raises(ConfigError, match=r"fp16 needs a CUDA device.*no fp16 on this CPU.*--precision bf16") as info:
        load_config(["--precision", "fp16", "--device", "cpu"])
    assert "\n" not in str(info.value)
    if not torch.cuda.is_available():  # auto resolves to CPU here
        with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
            load_config(["--precision", "fp16"])
    # On a cluster the driver cannot see the workers' GPUs: accepted, the trainers decide.
    assert load_config(["--precision", "fp16", "--ray-address", "10.0.0.1:6379"]).precision == "fp16"
    assert load_config(["--precision", "fp16", "--device", "cuda"]).precision == "fp16"


def test_fp16_on_a_cpu_with_it_is_accepted(monkeypatch):
    _answer(monkeypatch, True)
    assert load_config(["--precision", "fp16", "--device", "cpu"]).precision == "fp16"
    if not torch.cuda.is_available():
        assert load_config(["--precision", "fp16"]).precision == "fp16"


@ray.remote
class CpuFp16Trainer(TrainerRank):
    """A real trainer rank on a CPU whose DeepSpeed accelerator has fp16 (an Intel kind; here its answer is set)."""

    def __init__(self, *args, **kwargs):
        CPU_Accelerator.is_fp16_supported = lambda self: True
        super().__init__(*args, **kwargs)

    def dtypes(self):
        return sorted({str(p.dtype) for p in self.engine.module.parameters()})


def test_fp16_trains_on_a_cpu_where_deepspeed_has_it(ray_local, monkeypatch):
    """Where the config lets fp16 through on CPU, it trains: DeepSpeed ZeRO-2 in float16 with dynamic loss
    scaling on a real trainer rank, overflowing steps skipped while the scale drops, then steps applied."""
    _answer(monkeypatch, True)
    cfg = RunConfig(device="cpu", precision="fp16", num_trainers=1, train_batch_size=8, accumulation_steps=1,
                    super_batch_size=8, replay_capacity=8, updates_per_epoch=1, lr_policy=1e-2, lr_value=1e-2,
                    trainer_num_cpus=1, collective_timeout_s=60.0)
    factory = functools.partial(build_policy, "mlp", SPEC, ACTIONS)
    trainer = CpuFp16Trainer.options(num_cpus=1).remote(0, 1, "127.0.0.1", find_free_port("127.0.0.1"), cfg, factory, None)
    try:
        ray.get(trainer.setup.remote(), timeout=300)
        assert ray.get(trainer.dtypes.remote(), timeout=60) == ["torch.float16"]
        start = ray.get(trainer.weights.remote(), timeout=60)
        for epoch in range(8):
            weights = ray.get(trainer.weights.remote(), timeout=60)
            ray.get(trainer._train_on.remote(mlp_step_records({k: v.float() for k, v in weights.items()}, epoch), epoch),
                    timeout=120)
        status = ray.get(trainer.status.remote(), timeout=60)
        end = ray.get(trainer.weights.remote(), timeout=60)
    finally:
        ray.kill(trainer)
    assert status["global_step"] == 8 and status["skipped_updates"] < 8, status
    assert any(not torch.equal(end[k], start[k]) for k in start), "no fp16 step was applied"
    for name, value in end.items():
        assert value.dtype == torch.float16 and torch.isfinite(value).all(), name
