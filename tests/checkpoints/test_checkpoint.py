"""Checkpoints: safe formats, atomic commit, and a real run that stops and resumes (LoRA, 2 ZeRO-2 ranks)."""
import json
import random
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensordict import TensorDict

from async_rl import checkpoint as ckpt
from async_rl.actors.replay_buffer import ReplayStorage
from async_rl.config import load_config
from async_rl.driver import run
from async_rl.errors import ConfigError
from async_rl.policies import build_policy

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = str(ROOT / "configs" / "metaworld_mt1_ppo.yaml")


def _items(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"obs": {"state": torch.arange(start, start + n).float().unsqueeze(-1).expand(n, 3)},
                       "policy_version": torch.full((n,), start, dtype=torch.int64)}, batch_size=[n])


def test_replay_round_trip_keeps_items_order_counters_and_sampler(tmp_path):
    store = ReplayStorage(8, seed=3)
    store.add_batch(_items(6))
    store.sample(2, consume=True)
    store.add_batch(_items(5, start=100))  # evicts the oldest live items
    store.save(tmp_path / "replay.safetensors")
    restored = ReplayStorage(8, seed=99)
    restored.load(tmp_path / "replay.safetensors")
    assert restored.counters == store.counters and restored.size() == store.size()
    torch.testing.assert_close(restored.sample(store.size()), store.sample(store.size()))  # same items, same draw


def test_nested_tensordict_and_rng_round_trip(tmp_path):
    td = TensorDict({"a": torch.randn(4, 2), "b": {"c": torch.arange(4)}}, batch_size=[4])
    ckpt.save_tensordict(td, tmp_path / "td.safetensors")
    assert (ckpt.load_tensordict(tmp_path / "td.safetensors") == td).all()
    state = ckpt.rng_state()
    ckpt.save_weights_only(state, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1))
    ckpt.set_rng_state(ckpt.load_weights_only(tmp_path / "rng.pt"))
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


def test_commit_is_atomic_and_keeps_the_last_k(tmp_path):
    root = tmp_path / "checkpoints"
    for epoch in (1, 2, 3):
        staging = ckpt.staging_dir(root, epoch)
        (staging / "x").write_text(str(epoch))
        ckpt.commit(staging, {"epoch": epoch}, keep=2)
    interrupted = ckpt.staging_dir(root, 4)  # a save killed half-way: never a checkpoint
    (interrupted / "x").write_text("partial")
    assert [p.name for p in ckpt.complete_checkpoints(root)] == ["epoch-000002", "epoch-000003"]
    assert ckpt.resolve_resume(str(tmp_path)).name == "epoch-000003"
    ckpt.discard_staging(root)
    assert sorted(p.name for p in root.iterdir()) == ["epoch-000002", "epoch-000003"]


def test_resume_refuses_what_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        load_config(["--resume", str(tmp_path / "nope")], DEFAULT)
    with pytest.raises(ConfigError, match="not a checkpoint"):
        load_config(["--resume", str(tmp_path)], DEFAULT)


def test_resume_refuses_a_checkpoint_of_another_shape(tmp_path):
    staging = ckpt.staging_dir(tmp_path / "checkpoints", 1)
    saved = load_config(["--num-trainers", "1"], DEFAULT).model_dump(mode="json")
    del saved["normalize_advantages_per"]  # as in a checkpoint written before the key existed
    path = ckpt.commit(staging, {"format": ckpt.FORMAT, "epoch": 1, "config": saved}, keep=1)
    with pytest.raises(ConfigError, match="written with num_trainers=1 but this run has num_trainers=2; pass --num-trainers"):
        load_config(["--resume", str(path)], DEFAULT)
    # Steps stored under per-batch whitening carry no task field, which per-task whitening reads
    with pytest.raises(ConfigError, match="written with normalize_advantages_per='batch' but this run has "
                                          "normalize_advantages_per='task'; pass --normalize-advantages-per"):
        load_config(["--resume", str(path), "--num-trainers", "1", "--normalize-advantages-per", "task"], DEFAULT)


def test_a_checkpoint_saved_under_renamed_keys_resumes_and_old_spellings_are_refused_in_one_line(tmp_path):
    saved = load_config([], DEFAULT).model_dump(mode="json")
    saved["rollout_local_buf"] = saved.pop("rollout_steps")  # as an earlier version wrote it
    path = ckpt.commit(ckpt.staging_dir(tmp_path / "checkpoints", 1), {"format": ckpt.FORMAT, "epoch": 1, "config": saved}, keep=1)
    assert ckpt.read_meta(path)["config"]["rollout_steps"] == saved["rollout_local_buf"]
    load_config(["--resume", str(path)], DEFAULT)  # the same run, resumed
    with pytest.raises(ConfigError, match="rollout_steps=64 but this run has rollout_steps=8"):
        load_config(["--resume", str(path), "--rollout-steps", "8"], DEFAULT)
    with pytest.raises(ConfigError, match=r"^flag --rollout-local-buf is now --rollout-steps \(same meaning"):
        load_config(["--rollout-local-buf", "8"], DEFAULT)
    old_file = tmp_path / "old.yaml"
    old_file.write_text("rollout_local_buf: 8\n")
    with pytest.raises(ConfigError, match="config key 'rollout_local_buf' is now 'rollout_steps'"):
        load_config(["--config", str(old_file)], DEFAULT)


def test_a_compilergym_checkpoint_saved_with_baseline_thre_reads_as_leaky_above(tmp_path):
    """Saved under the env's old name (compiler_gym) and an option's old key: read under today's names."""
    saved = {"env": "compiler_gym", "env_kwargs": {"baseline_thre": 0.5, "max_steps": 10}, "rollout_local_buf": 16}
    path = ckpt.commit(ckpt.staging_dir(tmp_path / "checkpoints", 1), {"format": ckpt.FORMAT, "epoch": 1, "config": saved}, keep=1)
    config = ckpt.read_meta(path)["config"]
    assert config["env"] == "compilergym"
    assert config["env_kwargs"] == {"leaky_above": 0.5, "max_steps": 10} and config["rollout_steps"] == 16
    assert config["normalize_advantages_per"] == "batch"  # a key added since: what the old version did
    with pytest.raises(ConfigError, match=r"^flag --env.baseline-thre is now --env.leaky-above \(same meaning"):
        load_config(["--env", "compilergym", "--env.baseline-thre", "0.5"], DEFAULT)
    with pytest.raises(ConfigError, match=r"environment 'compiler_gym' is now 'compilergym' \(the same environment\)"):
        load_config(["--env", "compiler_gym"], DEFAULT)


def _cfg(log_dir, *extra):
    return load_config([
        "--log-dir", str(log_dir), "--swanlab-mode", "disabled", "--num-eval-workers", "0", "--envs-per-worker", "2",
        "--train-batch-size", "32", "--accumulation-steps", "2", "--super-batch-size", "64", "--updates-per-epoch", "1",
        "--env-kwargs", "{benchmark: MT1, task: reach-v3, max_episode_steps: 40}", "--log-interval-seconds", "0.01",
        "--lora-rank", "4", "--lora-trainable", "[log_std]", "--checkpoint-interval-epochs", "1",
        "--replay-capacity", "65536", *extra], DEFAULT)  # large: no eviction, so restored items stay comparable


def _replay_in_order(runtime, path):
    ray.get(runtime.replay.save.remote(str(path)), timeout=60)
    return ckpt.load_tensordict(path)


def test_stop_and_resume_continues_counters_weights_and_buffer(tmp_path):
    first = run(_cfg(tmp_path / "a", "--max-epochs", "2", "--keep-checkpoints", "1"))
    saved = Path(first["checkpoint"])
    assert saved.name == "epoch-000002"
    assert [p.name for p in ckpt.complete_checkpoints(saved.parent)] == ["epoch-000002"]  # keep 1
    meta = ckpt.read_meta(saved)
    assert meta["epoch"] == 2 and meta["policy_version"] == 2 and meta["config"]["lora_rank"] == 4

    # Safe formats only: the weights load as safetensors, the rest with weights_only=True.
    for rank in (0, 1):
        state = ckpt.load_weights_only(saved / f"trainer-{rank}.pt")
        assert state["global_steps"] == 2 and state["optimizer"]["state"]
    # The LoRA adapter loads with plain peft onto a fresh policy.
    from peft import PeftModel

    base = build_policy("mlp", {"state_dim": 39}, 4, hidden_sizes=[256, 256], init_log_std=-0.5)
    peft_model = PeftModel.from_pretrained(base, str(saved / "adapter"))
    adapter = load_file(str(saved / "adapter" / "adapter_model.safetensors"))
    loaded = dict(peft_model.named_parameters())
    for key, value in adapter.items():
        torch.testing.assert_close(loaded[key.replace(".weight", ".default.weight")], value, rtol=0, atol=0)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in adapter.items())  # trained (peft starts B at zero)
    saved_replay = ckpt.load_tensordict(saved / "replay.safetensors")
    pending = sorted(saved.glob("pending-trainer-*.safetensors"))
    assert pending, "trainers had prefetched super-batches that were not trained on"
    # Untrained batches left the buffer when fetched: saved once, not twice. An item is known by
    # its state *and* sampled action: episodes of the same task variant start from the same state.
    def items(td):
        return {tuple(r.tolist()) for r in torch.cat([td["obs", "state"], td["action"]], dim=-1)}

    replay_items = items(saved_replay)
    assert len(replay_items) == saved_replay.batch_size[0]
    for p in pending:
        assert not replay_items & items(ckpt.load_tensordict(p))

    def inspect(runtime):
        status = [ray.get(t.status.remote(), timeout=60) for t in runtime.trainers.values()]
        return {"status": status, "replay": _replay_in_order(runtime, tmp_path / "after.safetensors"),
                "stats": ray.get(runtime.stats.state_dict.remote(), timeout=60),
                "counters": ray.get(runtime.replay.counters.remote(), timeout=60)}

    # "reuse" sampling in the resumed run, so the restored items are still there to compare.
    second = run(_cfg(tmp_path / "b", "--max-epochs", "3", "--replay-sampling", "reuse", "--resume", str(saved.parent)),
                 inspect=inspect)
    seen = second["inspect"]
    assert second["epochs"] == 3 and second["sync/policy_version"] == 3
    assert [s["global_step"] for s in seen["status"]] == [3, 3]  # one optimizer step per epoch, continued
    n = saved_replay.batch_size[0]
    after = seen["replay"]
    assert seen["counters"]["evicted"] == 0
    assert after.batch_size[0] >= n
    assert (after[:n] == saved_replay).all(), "the buffer holds what it held, in the same order"
    assert seen["stats"]["total_env_steps"] >= meta["stats"]["total_env_steps"]
    assert second["replay/added"] >= json.loads((saved / "replay.safetensors.json").read_text())["counters"]["added"]
    steps = [e.step for e in EventAccumulator(str(tmp_path / "b")).Reload().Scalars("sync/policy_version")]
    assert min(steps) == 3  # logging continues at the resumed epoch
    assert Path(second["checkpoint"]).name == "epoch-000003"
