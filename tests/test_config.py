"""Configuration: defaults < YAML < flags, and one clear line for every bad input."""
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.config import load_config
from async_rl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch" / "ds_metaworld_ppo_mlp.py"
DEFAULT = str(ROOT / "configs" / "metaworld_mt1_ppo.yaml")


def test_yaml_then_flags_override(tmp_path):
    extra = tmp_path / "c.yaml"
    extra.write_text("num_rollout_workers: 3\nclip_mode: sapo\n")
    cfg = load_config(["--config", str(extra), "--clip-mode", "cispo", "--inference-timeout-ms", "7"], DEFAULT)
    assert cfg.num_rollout_workers == 3 and cfg.clip_mode == "cispo" and cfg.inference_timeout_ms == 7.0
    assert cfg.env_kwargs["task"] == "reach-v3"  # from the launch's own config


def test_clip_config_file_feeds_clip_params(tmp_path):
    clip = tmp_path / "clip.json"
    clip.write_text('{"soft_clip_alpha": 2}')
    cfg = load_config(["--clip-mode", "soft_clip", "--clip-config", str(clip)], DEFAULT)
    assert cfg.clip_params == {"soft_clip_alpha": 2}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-trainer", "2"], "unknown flag '--num-trainer' (did you mean '--num-trainers'?)"),
        (["--num-trainers", "0"], "'num_trainers' = 0: Input should be greater than 0"),
        (["--gamma", "abc"], "'gamma' = 'abc'"),
        (["--super-batch-size", "100"], "super_batch_size (100) must equal train_batch_size x accumulation_steps"),
        (["--clip-mode", "nope"], "unknown clip mode 'nope'; valid modes and aliases: ce-gppo_clip, cispo"),
        (["--clip-mode", "sapo", "--clip-params", "{dual_clip_c: 3}"], "'dual_clip_c' does not apply to clip mode 'sapo'"),
        (["--clip-params", "{clip_epss: 0.1}"], "unknown clip param 'clip_epss' (did you mean 'clip_eps'?)"),
        (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: no such file"),
        (["--log-dir", str(LAUNCH)], "is a file; pass a directory"),
    ],
)
def test_bad_input_is_one_clear_line(argv, message):
    with pytest.raises(ConfigError) as err:
        load_config(argv, DEFAULT)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_yaml_key_names_the_closest_valid_one(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("replay_capcity: 10\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'replay_capcity' \(did you mean 'replay_capacity'\?\)"):
        load_config(["--config", str(bad)], DEFAULT)


def test_launch_refuses_bad_input_before_starting_anything(tmp_path):
    log_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(LAUNCH), "--clip-mode", "bogus", "--log-dir", str(log_dir)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: unknown clip mode 'bogus'")
    assert not log_dir.exists()
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_impossible_resources_are_refused_before_ray_starts(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(LAUNCH), "--num-rollout-workers", "64", "--worker-num-cpus", "1", "--log-dir", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "CPUs" in proc.stderr and "available" in proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("overrides, items, share", [
    # GAE: 128 steps over 2 workers x 8 envs = 8 lock-step rounds each, +1 for the held-back last step.
    (["--num-rollout-workers", "2", "--envs-per-worker", "8"], 128, 72),
    (["--num-rollout-workers", "2", "--envs-per-worker", "8"], 1, 16),
    (["--num-rollout-workers", "3", "--envs-per-worker", "4"], 100, 40),
    # V-trace: 8 segments of 16 steps over 2 workers x 2 envs = 2 segments per env = 64 steps per worker.
    (["--advantage", "vtrace", "--rollout-local-buf", "16", "--num-rollout-workers", "2", "--envs-per-worker", "2",
      "--train-batch-size", "4", "--accumulation-steps", "2", "--super-batch-size", "8"], 8, 64),
])
def test_sync_worker_share_covers_the_items_needed(overrides, items, share):
    from async_rl.driver import worker_share

    cfg = load_config(overrides)
    assert worker_share(cfg, items) == share
