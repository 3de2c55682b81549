"""A real run: local Ray, 2 DeepSpeed ZeRO-2 trainer ranks over gloo, 1 inference actor,
2 rollout workers on MetaWorld, a few epochs; then the weights, versions, logs and leftovers."""
import ipaddress
import math
import time
from pathlib import Path

import psutil
import pytest
import ray
import torch
from conftest import wait_for_replay
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from async_rl.config import load_config
from async_rl.driver import run
from async_rl.experience import policy_versions

ROOT = Path(__file__).resolve().parents[2]
REQUIRED_TAGS = [
    "train/policy_loss", "train/value_loss", "train/entropy", "train/clip_frac", "train/dead_grad_frac", "train/ess",
    "train/approx_kl", "train/lr_policy", "train/lr_value", "rollout/episode_return", "rollout/success_rate",
    "rollout/env_steps_per_sec", "rollout/policy_lag", "sync/broadcast_seconds", "sync/policy_version",
    "replay/size", "inference/batch_size", "eval/success_rate",
]


def _replay_versions(runtime, newer_than: int = -1) -> torch.Tensor:
    """Policy versions of what the replay buffer holds, once it holds steps newer than ``newer_than``."""
    return policy_versions(wait_for_replay(runtime, lambda batch: int(policy_versions(batch).max()) > newer_than))


def _inspect(runtime):
    """Look at the live actors after training, before shut-down."""
    trainers = [ray.get(t.weights.remote(), timeout=60) for t in runtime.trainers.values()]
    status = [ray.get(t.status.remote(), timeout=60) for t in runtime.trainers.values()]
    inference = ray.get(runtime.inference["inference-0"].weights.remote(), timeout=60)
    actors = {**runtime.trainers, **runtime.inference}
    pids = dict(zip(actors, ray.get([a.pid.remote() for a in actors.values()], timeout=60)))
    # The training group (store, gloo pairs) and the weight-sync group listen on loopback only.
    listening = {name: [c.laddr.ip for c in psutil.Process(pid).net_connections("inet") if c.status == psutil.CONN_LISTEN]
                 for name, pid in pids.items()}
    # Training may have drawn only the first pushes (v0: the workers collect during the evaluation before
    # training, and an epoch here is one small update), so wait for what a broadcast policy collected.
    before = _replay_versions(runtime, newer_than=0)
    runtime.train_epoch()  # one more epoch and broadcast: workers must move to the new version
    after = _replay_versions(runtime, newer_than=runtime.policy_version - 1)
    return {"trainers": trainers, "inference": inference, "status": status, "versions": (before, after),
            "version": runtime.policy_version, "listening": listening}


# Both runs keep a KL to the reference policy (a frozen copy; with LoRA the model with its adapters off),
# which must leave the broadcast weights alone; the V-trace run trains LoRA adapters (merged for the broadcast).
KL_REF = ["--kl-ref-coef", "0.1", "--kl-ref-estimator", "k3"]
LORA = ["--lora-rank", "4", "--lora-trainable", "[log_std]"]


@pytest.mark.parametrize("launch_config, clip_mode, extra", [("metaworld_mt1_ppo.yaml", "soft_clip", KL_REF),
                                                             ("metaworld_mt1_vtrace.yaml", "sapo", [*KL_REF, *LORA])],
                         ids=["ppo-soft_clip-full", "vtrace-sapo-lora"])
def test_real_run(tmp_path, launch_config, clip_mode, extra):
    log_dir = tmp_path / "run"
    overrides = [
        *extra, "--clip-mode", clip_mode, "--log-dir", str(log_dir), "--max-epochs", "4", "--swanlab-mode", "offline",
        "--env-kwargs", "{benchmark: MT1, task: reach-v3, max_episode_steps: 40}", "--eval-interval-epochs", "1",
        "--eval-episodes", "1", "--log-interval-seconds", "0.01", "--updates-per-epoch", "1",
    ]
    if "vtrace" in launch_config:
        overrides += ["--rollout-steps", "16", "--train-batch-size", "4", "--accumulation-steps", "2", "--super-batch-size", "8"]
    else:
        overrides += ["--train-batch-size", "32", "--accumulation-steps", "2", "--super-batch-size", "64"]
    cfg = load_config(overrides, str(ROOT / "configs" / launch_config))
    summary = run(cfg, inspect=_inspect)
    seen = summary["inspect"]

    # Both ranks stepped, and ZeRO-2 kept them identical.
    assert summary["epochs"] == 4
    assert [s["global_step"] for s in seen["status"]] == [4, 4], seen["status"]
    rank0, rank1 = seen["trainers"]
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0, msg=name)
    assert summary["sync/policy_version"] == 4
    # The inference actor serves exactly rank 0's (merged) weights after the last broadcast.
    assert seen["inference"].keys() == rank0.keys()
    for name in rank0:
        torch.testing.assert_close(seen["inference"][name], rank0[name], rtol=0, atol=0, msg=name)
    listening = seen["listening"]
    assert listening["trainer-0"], "rank 0 hosts the training and weight-sync stores"
    exposed = {name: ips for name, ips in listening.items()
               if any(not ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback for ip in ips)}
    assert not exposed, exposed
    # Experience carries the versions that produced it, and they advance.
    before, after = seen["versions"]
    assert 1 <= int(before.max()) <= 4 and int(after.max()) == seen["version"] == 5

    # TensorBoard holds every required tag.
    events = EventAccumulator(str(log_dir)).Reload()
    missing = [tag for tag in REQUIRED_TAGS if tag not in events.Tags()["scalars"]]
    assert not missing, missing
    assert list((log_dir / "swanlab").rglob("*")), "SwanLab offline run files"
    assert events.Scalars("eval/success_rate")[0].step == 0  # the initial weights' evaluation (eval_before_training)
    kl_ref = [e.value for e in events.Scalars("train/kl_ref")]  # finite, and leaves 0 as training moves
    assert kl_ref and all(math.isfinite(v) and v >= 0 for v in kl_ref) and max(kl_ref) > 0, kl_ref

    # No Ray process of this run survives it.
    session = (log_dir / "ray_session.txt").read_text().split("\n")[1]
    assert session
    def leftovers():
        return [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"]) if session in " ".join(p.info["cmdline"] or [])]

    # Ray's workers and agents exit on their own once the raylet is gone: give them a moment.
    deadline = time.monotonic() + 30
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers()
    assert not ray.is_initialized()


def _bf16_inspect(runtime):
    """After the last broadcast, before shut-down: every rank's weights and counters, and what inference serves."""
    return {"ranks": [ray.get(t.weights.remote(), timeout=60) for t in runtime.trainers.values()],
            "status": [ray.get(t.status.remote(), timeout=60) for t in runtime.trainers.values()],
            "inference": ray.get(runtime.inference["inference-0"].weights.remote(), timeout=60)}


def test_sync_mode_trains_on_fresh_experience_only(tmp_path):
    """--sync: collect, then train, then broadcast; no experience more than one version old.

    The run is also the suite's real bf16 run of an MLP (``--precision bf16``, what ``auto`` picks on CUDA;
    formerly tests/policies/test_bf16.py's own MetaWorld run): two ZeRO-2 ranks train in bf16 with finite losses and
    no skipped update, stay identical, and the inference actor serves rank 0's exact bf16 weights."""
    log_dir = tmp_path / "run"
    cfg = load_config(["--sync", "--log-dir", str(log_dir), "--max-epochs", "3", "--swanlab-mode", "disabled",
                       "--num-eval-workers", "0", "--train-batch-size", "32", "--accumulation-steps", "2", "--super-batch-size", "64",
                       "--env-kwargs", "{benchmark: MT1, task: reach-v3, max_episode_steps: 40}", "--precision", "bf16"],
                      str(ROOT / "configs" / "metaworld_mt1_ppo.yaml"))
    summary = run(cfg, inspect=_bf16_inspect)
    assert summary["epochs"] == 3
    seen = summary["inspect"]
    for key in ("train/policy_loss", "train/value_loss", "train/entropy"):
        assert math.isfinite(summary[key]), (key, summary[key])
    steps = [s["global_step"] for s in seen["status"]]
    assert len(steps) == 2 and steps[0] == steps[1] > 0, seen["status"]
    assert all(s["skipped_updates"] == 0 for s in seen["status"]), seen["status"]
    rank0, rank1 = seen["ranks"]
    assert torch.bfloat16 in {v.dtype for v in rank0.values()}
    assert rank0.keys() == rank1.keys() == seen["inference"].keys()
    for name, value in rank0.items():  # same dtype too
        torch.testing.assert_close(rank1[name], value, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(seen["inference"][name], value, rtol=0, atol=0, msg=name)
    lag_max = [e.value for e in EventAccumulator(str(log_dir)).Reload().Scalars("rollout/policy_lag_max")]
    # Pieces a worker had half-built when paused carry the previous version; nothing older.
    assert len(lag_max) == 3 and max(lag_max) <= 1.0, lag_max
    # Steps flushed at a pause are counted too (workers are paused now: every push has been counted).
    assert summary["rollout/total_env_steps"] == summary["replay/added"], summary
