"""Every launch resumes from its own checkpoint: the config a run saves (after its policy's
prepare hook resolved e.g. the VLA's model directory) passes ``--resume`` with the same launch,
a different seed is refused, and a real LIBERO VLA run resumes with its weights and optimizer
state bit-identical and its replay contents, policy version and env-step counters carried over."""
import json
from pathlib import Path

import pytest
import ray
import torch
from conftest import wait_for_replay
from safetensors.torch import load_file
from test_checkpoint import _replay_in_order

from async_rl import checkpoint as ckpt
from async_rl.config import load_config
from async_rl.driver import prepare, run
from async_rl.errors import ConfigError
from async_rl.experience import policy_versions
from envs.compilergym.client import compilergym_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
LAUNCHES = {  # launch script -> its config and flags
    "ds_libero_ppo": ("libero_ppo.yaml", []),
    "ds_libero_ppo_discrete": ("libero_ppo_discrete.yaml", []),
    "ds_metaworld_ppo_mlp": ("metaworld_mt1_ppo.yaml", []),
    "ds_metaworld_ppo_mlp_vtrace": ("metaworld_mt1_vtrace.yaml", []),
    "ds_compilergym_ppo mlp": ("compilergym_mlp.yaml", []),
    "ds_compilergym_ppo passformer": ("compilergym_mlp.yaml", ["--policy", "passformer"]),
}


def _saved_by_a_run(tmp_path, config: str, flags: list[str]) -> Path:
    """A checkpoint whose meta.json holds the config exactly as a run of the launch saves it."""
    cfg = load_config([*flags, "--log-dir", str(tmp_path / "first")], str(ROOT / "configs" / config))
    if cfg.env == "libero":
        pytest.importorskip("libero", reason="LIBERO is not installed (make setup installs it)")
    if cfg.env == "compilergym" and compilergym_unavailable_reason():
        pytest.skip(str(compilergym_unavailable_reason()))
    prepare(cfg)  # as run() does before its first checkpoint
    staging = ckpt.staging_dir(ckpt.checkpoint_root(cfg.log_dir), 3)
    meta = {"format": ckpt.FORMAT, "epoch": 3, "policy_version": 3, "config": cfg.model_dump(mode="json")}
    return ckpt.commit(staging, meta, keep=1)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_every_launch_accepts_its_own_checkpoint_and_refuses_another_seed(tmp_path, launch):
    config, flags = LAUNCHES[launch]
    saved = _saved_by_a_run(tmp_path, config, flags)
    resumed = load_config([*flags, "--log-dir", str(tmp_path / "second"), "--resume", str(saved.parent)],
                          str(ROOT / "configs" / config))
    assert resumed.resume == str(saved)
    with pytest.raises(ConfigError, match=r"written with seed=0 but this run has seed=5; pass --seed with the saved value"):
        load_config([*flags, "--seed", "5", "--resume", str(saved)], str(ROOT / "configs" / config))


def test_a_checkpoint_of_a_named_model_needs_the_model_again(tmp_path):
    saved = _saved_by_a_run(tmp_path, "libero_ppo.yaml", [])
    meta = ckpt.read_meta(saved)
    meta["config"]["model_path"] = meta["config"]["policy_kwargs"]["model_path"]  # as if given by --model-path
    (saved / ckpt.META).write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="written with model_path=.*; pass --model-path"):
        load_config(["--resume", str(saved)], str(ROOT / "configs" / "libero_ppo.yaml"))


def test_a_damaged_checkpoint_is_refused_by_name(tmp_path):
    saved = _saved_by_a_run(tmp_path, "metaworld_mt1_ppo.yaml", [])
    meta = ckpt.read_meta(saved)
    meta["files"]["model.safetensors"] = 100  # listed at commit, then lost or truncated
    (saved / "model.safetensors").write_bytes(b"x")
    (saved / ckpt.META).write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="model.safetensors is 1 bytes, not 100 .damaged checkpoint.; pass an older one"):
        load_config(["--resume", str(saved)], str(ROOT / "configs" / "metaworld_mt1_ppo.yaml"))


class WithRotary(torch.nn.Module):
    """A layer plus buffers as in the VLA's backbone: a persistent one and a non-persistent one."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        self.register_buffer("running", torch.arange(4.0))
        self.register_buffer("inv_freq", torch.rand(2), persistent=False)


def test_lora_weights_round_trip_without_non_persistent_buffers(tmp_path):
    from async_rl.policies.lora import apply_lora

    saved = apply_lora(WithRotary(), 2, 4.0, trainable=["head"])
    with torch.no_grad():
        for p in saved.parameters():
            if p.requires_grad:
                p.add_(1.0)
    ckpt.save_model(saved, tmp_path)
    restored = apply_lora(WithRotary(), 2, 4.0, trainable=["head"])
    ckpt.load_model(restored, tmp_path)
    want = dict(saved.named_parameters())
    trained = [n for n, v in restored.named_parameters() if v.requires_grad]
    assert trained and all(torch.equal(dict(restored.named_parameters())[n], want[n]) for n in trained)


def assert_restored(saved: Path, runtime, scratch: Path) -> None:
    """The live trainers hold exactly what ``saved`` holds (weights, optimizer partitions,
    scheduler, counters, RNG, untrained super-batches), written again with the real save path."""
    scratch.mkdir()
    ray.get([t.save_checkpoint.remote(str(scratch)) for t in runtime.trainers.values()], timeout=120)
    for name, value in load_file(str(saved / "model.safetensors")).items():
        assert torch.equal(load_file(str(scratch / "model.safetensors"))[name], value), name
    for rank in range(len(runtime.trainers)):
        before = ckpt.load_weights_only(saved / f"trainer-{rank}.pt")
        after = ckpt.load_weights_only(scratch / f"trainer-{rank}.pt")
        torch.testing.assert_close(after["optimizer"]["state"], before["optimizer"]["state"], rtol=0, atol=0)
        assert after["optimizer"]["param_groups"] == before["optimizer"]["param_groups"]
        torch.testing.assert_close(after["fp32_partitions"], before["fp32_partitions"], rtol=0, atol=0)
        assert torch.equal(after["rng"]["torch"], before["rng"]["torch"])
        for key in ("scheduler", "global_steps", "global_samples", "skipped_steps", "next_version"):
            assert after[key] == before[key], key
    pending = sorted(p.name for p in saved.glob("pending-trainer-*"))
    assert pending == sorted(p.name for p in scratch.glob("pending-trainer-*"))
    for name in pending:
        assert (ckpt.load_tensordict(scratch / name) == ckpt.load_tensordict(saved / name)).all(), name


def test_a_libero_vla_run_resumes_from_its_own_checkpoint(tmp_path):
    pytest.importorskip("libero", reason="LIBERO is not installed (make setup installs it)")

    def cfg(log_dir, *extra):
        return load_config([
            "--log-dir", str(tmp_path / log_dir), "--swanlab-mode", "disabled", "--log-interval-seconds", "0.01",
            "--num-rollout-workers", "1", "--max-minutes", "null",
            "--env-kwargs", "{suite: libero_spatial, tasks: [0], image_size: 64, cameras: [agentview], "
                            "max_episode_steps: 10, settle_steps: 2}",
            "--rollout-steps", "8", "--train-batch-size", "4", "--accumulation-steps", "2", "--super-batch-size", "8",
            "--updates-per-epoch", "1", *extra], str(ROOT / "configs" / "libero_ppo.yaml"))

    first = run(cfg("a", "--max-epochs", "1"))
    saved = Path(first["checkpoint"])
    meta = ckpt.read_meta(saved)
    assert meta["config"]["policy_kwargs"]["model_path"]  # resolved by the VLA's prepare hook (a resume must not rebuild it)
    saved_replay = ckpt.load_tensordict(saved / "replay.safetensors")
    n = saved_replay.batch_size[0]

    def inspect(runtime):
        assert_restored(saved, runtime, tmp_path / "live")
        fresh = wait_for_replay(runtime, accept=lambda b: b.batch_size[0] > n)  # workers add after the restored items
        return {"replay": fresh, "version": runtime.policy_version, "epoch": runtime.epoch,
                "stats": ray.get(runtime.stats.state_dict.remote(), timeout=60),
                "order": _replay_in_order(runtime, tmp_path / "after.safetensors")}

    # The same epoch count: the resumed run trains nothing, so the live state is the restored one.
    second = run(cfg("b", "--max-epochs", "1", "--resume", str(saved)), inspect=inspect)
    seen = second["inspect"]
    assert seen["epoch"] == meta["epoch"] == 1 and seen["version"] == meta["policy_version"] == 1
    assert (seen["order"][:n] == saved_replay).all(), "the buffer holds what it held, in the same order"
    assert (policy_versions(seen["replay"][n:]) >= 1).all(), "the inference actor serves the restored version"
    assert seen["stats"]["total_env_steps"] >= meta["stats"]["total_env_steps"] > 0
    assert seen["stats"]["total_episodes"] >= meta["stats"]["total_episodes"]
