"""GPU ids as CUDA_VISIBLE_DEVICES writes them (indices, GPU UUIDs, MIG ids), pinned in each actor before
CUDA initialises, and the LOCAL_RANK / device pair every trainer rank hands DeepSpeed. No GPU is needed: the
parsing and the plan are pure, the actors' constructors are stopped right after they pinned."""
import os

import pytest
import torch

import async_rl.actors.inference as inference_module
import async_rl.actors.trainer as trainer_module
from async_rl.actors.inference import InferenceServer
from async_rl.actors.trainer import TrainerRank
from async_rl.config import load_config
from async_rl.config.schema import RunConfig
from async_rl.errors import ConfigError
from async_rl.process_setup import parse_visible_devices, pin_gpu, plan_gpus, trainer_rank_env, visible_gpu_ids

UUID_A = "GPU-8f2c3d4e-1a2b-3c4d-5e6f-708192a3b4c5"
UUID_B = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
MIG = "MIG-5c6d7e8f-9a0b-1c2d-3e4f-50617283a4b5"
MIG_OLD = f"MIG-{UUID_A}/1/0"


@pytest.mark.parametrize("value, devices", [
    ("0,1", ["0", "1"]),
    (" 2 , 0 ", ["2", "0"]),
    (f"{UUID_A},{UUID_B}", [UUID_A, UUID_B]),
    (f"{MIG}, {MIG_OLD}", [MIG, MIG_OLD]),
    (f"1,{UUID_B}", ["1", UUID_B]),
    ("", []),
    ("   ", []),
    ("-1", []),
    ("NoDevFiles", []),
    ("0,-1,1", ["0"]),  # CUDA stops at the first entry that names no device
    ("0,,1", ["0"]),
])
def test_a_visible_devices_value_reads_as_cuda_reads_it(value, devices, monkeypatch):
    assert parse_visible_devices(value) == devices
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert visible_gpu_ids() == devices


def _plan(monkeypatch, visible, *flags):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return plan_gpus(load_config(["--device", "cuda", *flags]))


def test_the_plan_takes_uuid_and_mig_ids_and_names_wrong_ones_in_one_line(monkeypatch):
    assert _plan(monkeypatch, f"{UUID_A},{UUID_B}", "--num-trainers", "1", "--num-inference-actors", "2") == (
        [UUID_A], [UUID_B, UUID_B])
    assert _plan(monkeypatch, f"{MIG},{MIG_OLD},3", "--num-trainers", "2", "--num-inference-actors", "1",
                 "--trainer-gpu-ids", f"[{MIG_OLD}, 3]", "--inference-gpu-ids", f"[{MIG}]") == ([MIG_OLD, "3"], [MIG])
    # 0 and "0" are one id; an index is the one CUDA_VISIBLE_DEVICES writes.
    assert _plan(monkeypatch, "0,1", "--num-trainers", "1", "--trainer-gpu-ids", "[1]", "--inference-gpu-ids", "['0']") == (
        ["1"], ["0"])
    with pytest.raises(ConfigError, match=rf"GPU id\(s\) 0 are not visible \(visible: {UUID_A}, {UUID_B}\)") as info:
        _plan(monkeypatch, f"{UUID_A},{UUID_B}", "--num-trainers", "1", "--trainer-gpu-ids", "[0]")
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="name a GPU twice"):
        _plan(monkeypatch, "0,1", "--num-trainers", "2", "--trainer-gpu-ids", "[1, 1]")
    with pytest.raises(ConfigError, match=r"only 0 GPU\(s\) visible \(none\)"):
        _plan(monkeypatch, "NoDevFiles", "--num-trainers", "1")
    with pytest.raises(ConfigError, match="'cuda:1' is not a GPU id"):
        load_config(["--trainer-gpu-ids", "['cuda:1']"])


class _Pinned(Exception):
    """Raised where the actor's constructor first configures torch: what CUDA_VISIBLE_DEVICES was then."""


def _stop_at_configure(monkeypatch, module):
    def configure_torch(*args):
        raise _Pinned(os.environ.get("CUDA_VISIBLE_DEVICES"))
    monkeypatch.setattr(module, "configure_torch", configure_torch)


def _trainer(gpu_id, rank=0, world_size=1):
    return TrainerRank(rank, world_size, "127.0.0.1", 1, RunConfig(device="cpu"), None, None, gpu_id)


def test_each_actor_pins_its_gpu_before_anything_else_and_refuses_once_cuda_is_up(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        # setenv first: monkeypatch records (and so restores) only a variable it found or set, and the actors
        # write these straight into os.environ; a bare delenv of an absent one would leak the test's MIG id.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    _stop_at_configure(monkeypatch, trainer_module)
    _stop_at_configure(monkeypatch, inference_module)
    with pytest.raises(_Pinned, match=UUID_B):
        _trainer(UUID_B)
    with pytest.raises(_Pinned, match=MIG):
        InferenceServer(0, None, 4, 2.0, MIG)
    # CUDA read the variable already: setting it now would change nothing, so the actor says so.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match=r"^trainer-0: CUDA was initialised in this process before GPU 1 was pinned"):
        _trainer("1")
    with pytest.raises(RuntimeError, match=r"^inference-0: CUDA was initialised .* before GPU 1 was pinned"):
        InferenceServer(0, None, 4, 2.0, "1")
    pin_gpu(None, "trainer-0")  # Ray's choice (num_gpus) is left alone
    assert os.environ["CUDA_VISIBLE_DEVICES"] == MIG


def test_every_rank_hands_deepspeed_local_rank_0_for_its_one_gpu(monkeypatch):
    """DeepSpeed puts a rank on cuda:LOCAL_RANK; each trainer actor sees exactly its own GPU as cuda:0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for rank, gpu in enumerate([UUID_A, UUID_B, MIG, "3"]):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpu)
        assert trainer_rank_env(rank, 4, "cuda") == {"RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": "0"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUID_A},{UUID_B}")
    with pytest.raises(ConfigError, match=rf"^trainer-1 sees 2 GPUs \({UUID_A}, {UUID_B}\); a trainer rank uses one"):
        trainer_rank_env(1, 2, "auto")
    assert trainer_rank_env(1, 2, "cpu")["LOCAL_RANK"] == "0"  # a CPU run ignores the GPUs
