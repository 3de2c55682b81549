"""Supervised fine-tuning (launch/sft.py) end to end on a tiny demonstration set, and the export it
writes loaded through an RL run's ``init_from``.

The demonstrations are written in the recorder's format with synthetic images whose brightness
sets the demonstrated action (learnable from pixels alone), so the test needs no simulator steps;
the LIBERO task set is still built, as the launch builds it.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

if importlib.util.find_spec("libero") is None:
    pytest.skip("LIBERO is not installed (run: make setup)", allow_module_level=True)

pytestmark = pytest.mark.timeout(600)

ENV_KWARGS = {"suite": "libero_spatial", "tasks": [0, 1], "image_size": 64, "cameras": ["agentview"]}


def _write_demos(root: Path, episodes: int = 4, steps: int = 24) -> Path:
    from async_rl.demos.storage import FORMAT, episode_file, write_episode, write_manifest
    from envs import make_task_set

    task_set = make_task_set("libero", **ENV_KWARGS)
    rng = np.random.default_rng(0)
    entries = []
    for k in range(episodes):
        task = k % 2
        level = rng.uniform(0.0, 1.0, steps)
        images = np.broadcast_to((level * 255).astype(np.uint8)[:, None, None, None], (steps, 64, 64, 3)).copy()
        labels = np.zeros((steps, 7), dtype=np.float32)
        labels[:, 0] = 2.0 * level - 1.0  # x follows the brightness
        labels[:, 6] = np.where(level > 0.5, 1.0, -1.0)  # closed on bright frames
        tensors = {"obs.agentview": images, "obs.proprio": np.zeros((steps, 8), np.float32), "action": labels,
                   "expert_action": labels, "sim_state": np.zeros((steps + 1, 3))}
        name = episode_file(task, k)
        write_episode(root / name, tensors, {"instruction": task_set.instructions[task]})
        entries.append({"file": name, "task_index": task, "task_name": task_set.task_names[task],
                        "instruction": task_set.instructions[task], "init_state": k, "seed": k, "steps": steps})
    write_manifest(root, {"format": FORMAT, "env": "libero", "env_kwargs": ENV_KWARGS, "expert": {}, "seed": 0,
                          "episodes": entries})
    return root


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """launch/sft.py with LoRA on (the export must merge it) for a few epochs on the synthetic set."""
    from launch.sft import main

    root = tmp_path_factory.mktemp("sft")
    demos = _write_demos(root / "demos")
    summary = main(["--demos", str(demos), "--log-dir", str(root / "run"), "--sft-epochs", "6", "--swanlab-mode",
                    "disabled", "--lora-rank", "4", "--train-batch-size", "16", "--super-batch-size", "16",
                    "--lr-policy", "3e-3", "--lr-decay-steps", "40", "--warmup-steps", "2", "--num-rollout-workers", "1"])
    return root, summary


def test_sft_loss_falls_and_logs_to_tensorboard(sft_run):
    root, summary = sft_run
    assert summary["epochs"] == 6 and summary["frames"] == 96
    assert summary["loss_last"] < 0.5 * summary["loss_first"], summary
    assert list((root / "run").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert json.loads((root / "run" / "sft_summary.json").read_text())["export"] == summary["export"]


def test_the_learning_rate_follows_its_schedule_from_the_first_step(sft_run):
    """libero_sft.yaml takes the RL config as its base, critic warm-up and KL to a reference included: neither
    applies to behaviour cloning (the warm-up held the rate at its first factor for 200 steps)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from async_rl.actors.trainer_setup import warmup_cosine
    from async_rl.config import load_config

    root, _ = sft_run
    cfg = load_config([], str(Path(__file__).resolve().parents[2] / "configs" / "libero_sft.yaml"))
    assert cfg.critic_warmup_epochs > 0 and cfg.kl_ref_coef > 0  # what the test is about: both inherited
    events = EventAccumulator(str(root / "run"), size_guidance={"scalars": 0}).Reload()
    lrs = [e.value for e in events.Scalars("lr_policy")]
    steps = [e.value for e in events.Scalars("global_step")]
    schedule = warmup_cosine(2, 40, cfg.min_lr_ratio)  # the run's --warmup-steps 2 --lr-decay-steps 40
    assert lrs == pytest.approx([3e-3 * schedule(int(s)) for s in steps], rel=1e-4), (lrs, steps)


def test_the_export_loads_through_the_rl_launch_and_acts_as_trained(sft_run):
    from async_rl.config import load_config
    from async_rl.demos import load_demos
    from async_rl.driver import prepare
    from async_rl.orchestration.runtime import Runtime, obs_spec_of
    from async_rl.orchestration.supervised import PROBE_FRAMES, demonstration_frames
    from async_rl.policies import build_preprocessor

    root, summary = sft_run
    export = summary["export"]
    cfg = load_config(["--init-from", export, "--log-dir", str(root / "rl"), "--env-kwargs", json.dumps(ENV_KWARGS)],
                      str(Path(__file__).resolve().parents[2] / "configs" / "libero_ppo.yaml"))
    task_set = prepare(cfg)  # the RL launch's checks, init_from's included
    policy = Runtime(cfg, task_set).policy_factory().eval()  # what its trainers and inference actors build
    frames = demonstration_frames(load_demos(root / "demos"),
                                  build_preprocessor(cfg.policy, obs_spec_of(task_set), **cfg.policy_kwargs))
    with torch.inference_mode():
        actions = policy.act(frames["obs"][:PROBE_FRAMES], True)["env_action"]
    torch.testing.assert_close(actions, torch.tensor(summary["probe_env_actions"]), atol=1e-5, rtol=1e-5)
    plain = load_config(["--init-from", "null", "--env-kwargs", json.dumps(ENV_KWARGS)],
                        str(Path(__file__).resolve().parents[2] / "configs" / "libero_ppo.yaml"))
    untrained = Runtime(plain, prepare(plain)).policy_factory().eval()
    with torch.inference_mode():
        assert not torch.allclose(untrained.act(frames["obs"][:PROBE_FRAMES], True)["env_action"], actions)


def test_init_from_of_another_policy_or_env_is_one_line_before_ray(sft_run, tmp_path):
    import subprocess
    import sys

    root, summary = sft_run
    launch = Path(__file__).resolve().parents[2] / "launch"
    bad = {
        "another policy": [str(launch / "ds_libero_ppo_discrete.py"), "--init-from", summary["export"]],
        "not an export": [str(launch / "ds_libero_ppo.py"), "--init-from", str(tmp_path)],
        "another env": [str(launch / "ds_metaworld_ppo_mlp.py"), "--init-from", summary["export"]],
        "another base model": [str(launch / "ds_libero_ppo.py"), "--init-from", summary["export"], "--policy-kwargs",
                               "{cameras: [agentview], max_prompt_tokens: 96, tiny_vla: {patch_size: 8}}"],
    }
    for what, argv in bad.items():
        proc = subprocess.run([sys.executable, *argv, "--log-dir", str(tmp_path / "x")], capture_output=True, text=True,
                              timeout=120)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2, (what, proc.stderr)
        assert len(lines) == 1 and "init_from" in lines[0], (what, proc.stderr)
    assert not (tmp_path / "x").exists()
