"""Configuration: defaults < YAML < flags, and one clear line for every bad input."""
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.config import load_config
from async_rl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
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
        (["--super-batch-size", "100"], "super_batch_size (100) must be a multiple of train_batch_size x accumulation_steps"),
        (["--envs-per-worker", "16", "--env-groups", "3"], "envs_per_worker (16) must be a multiple of env_groups (3)"),
        (["--no-normalize-advantages", "--normalize-advantages-per", "task"],
         "normalize_advantages_per task needs normalize_advantages true"),
        (["--clip-mode", "nope"], "unknown clip mode 'nope'; valid modes and aliases: ce-gppo_clip, cispo"),
        (["--clip-mode", "sapo", "--clip-params", "{dual_clip_c: 3}"], "'dual_clip_c' does not apply to clip mode 'sapo'"),
        (["--clip-params", "{clip_epss: 0.1}"], "unknown clip param 'clip_epss' (did you mean 'clip_eps'?)"),
        (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: no such file"),
        (["--log-dir", str(LAUNCH)], "is a file; pass a directory"),
        (["--reference-logp-on", "sampler"], "reference_logp_on sampler: nothing reads the reference policy"),
        (["--reference-logp-on", "sampler", "--kl-ref-coef", "0.1"], "reference_logp_on sampler needs LoRA with --lora-sync adapters"),
        (["--reference-logp-on", "sampler", "--kl-ref-coef", "0.1", "--lora-rank", "4", "--lora-sync", "adapters",
          "--lora-trainable", "[value_head]"], "lora_trainable 'value_head' is trained whole and may enter the log-probs"),
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
    (["--advantage", "vtrace", "--rollout-steps", "16", "--num-rollout-workers", "2", "--envs-per-worker", "2",
      "--train-batch-size", "4", "--accumulation-steps", "2", "--super-batch-size", "8"], 8, 64),
])
def test_sync_worker_share_covers_the_items_needed(overrides, items, share):
    from async_rl.orchestration.schedules import worker_share

    cfg = load_config(overrides)
    assert worker_share(cfg, items) == share


# ---- sections, presets with a base, variants, --help and --print-config ---------------------
def test_every_key_is_in_exactly_one_section():
    from async_rl.config.schema import SECTIONS, RunConfig

    keys = [key for cls in SECTIONS.values() for key in cls.model_fields]
    assert sorted(keys) == sorted(RunConfig.model_fields)  # none missing, none twice
    assert list(SECTIONS) == ["run", "env", "policy", "objective", "scale", "timeouts", "supervised"]


def test_a_section_is_a_frozen_typed_copy():
    import pydantic

    from async_rl.config.schema import TimeoutsSection

    cfg = load_config(["--actor-timeout-s", "33", "--env-kwargs", "{task: push-v3}"], DEFAULT)
    timeouts = cfg.section("timeouts")
    assert isinstance(timeouts, TimeoutsSection) and timeouts.actor_timeout_s == 33.0
    assert set(type(timeouts).model_fields) == {"actor_timeout_s", "collective_timeout_s", "startup_timeout_s",
                                                 "actor_max_restarts"}
    with pytest.raises(pydantic.ValidationError):
        timeouts.actor_timeout_s = 1.0
    env = cfg.section("env")
    env.env_kwargs["task"] = "changed"  # a copy: the config itself is untouched
    assert cfg.env_kwargs == {"task": "push-v3"}
    with pytest.raises(KeyError, match="unknown config section 'timeout'"):
        cfg.section("timeout")


def _file_error(path, text):
    """The ConfigError of ``--config path`` once ``path`` holds ``text``; it must be one line."""
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(["--config", str(path)], DEFAULT)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_yaml_keys_may_be_flat_or_under_their_section(tmp_path):
    nested = tmp_path / "nested.yaml"
    nested.write_text("env: {env: metaworld, env_kwargs: {task: push-v3}}\nscale: {num_rollout_workers: 3}\n"
                      "timeouts:\n  actor_timeout_s: 50\npolicy: mlp\ngamma: 0.9\n")
    cfg = load_config(["--config", str(nested)], DEFAULT)
    assert (cfg.env_kwargs, cfg.num_rollout_workers, cfg.actor_timeout_s, cfg.policy, cfg.gamma) == \
        ({"task": "push-v3"}, 3, 50.0, "mlp", 0.9)
    for text, message in [("scale: {gamma: 0.9}\n", "config key 'gamma' belongs to section 'objective', not 'scale'"),
                          ("scale: {num_trainer: 2}\n", "unknown scale config key 'num_trainer' (did you mean 'num_trainers'?)"),
        ("gamma: 0.9\nobjective: {gamma: 0.8}\n", "config key 'gamma' is given twice")]:
        assert f"--config {nested}: {message}" in _file_error(nested, text)


def test_a_preset_overrides_its_base_recursively(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "root.yaml").write_text("num_rollout_workers: 3\ngamma: 0.5\nseed: 1\n")
    (tmp_path / "sub" / "mid.yaml").write_text("base: ../root.yaml\nobjective: {gamma: 0.6}\n")
    (tmp_path / "top.yaml").write_text("base: sub/mid.yaml\nseed: 7\n")  # relative to the file naming it
    cfg = load_config(["--config", str(tmp_path / "top.yaml")], DEFAULT)
    assert (cfg.num_rollout_workers, cfg.gamma, cfg.seed) == (3, 0.6, 7)
    assert load_config(["--config", str(tmp_path / "top.yaml"), "--seed", "9"], DEFAULT).seed == 9  # flags still win


@pytest.mark.parametrize("files, message", [
    ({"a.yaml": "base: b.yaml\n", "b.yaml": "base: a.yaml\n"}, "base cycle a.yaml -> b.yaml -> a.yaml"),
    ({"a.yaml": "base: a.yaml\n"}, "base cycle a.yaml -> a.yaml"),
    ({"a.yaml": "base: b.yaml\n", "b.yaml": "base: missing.yaml\n"}, "b.yaml: base missing.yaml: no such file"),
    ({"a.yaml": "base: [b.yaml]\n"}, "a.yaml: base must be one file name"),
])
def test_a_bad_base_is_one_line_naming_the_file(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(["--config", str(tmp_path / "a.yaml")], DEFAULT)
    assert message in str(err.value) and "\n" not in str(err.value)


# The GPU presets as they were before they became a few lines on top of their CPU twins.
OLD_METAWORLD_GPU = dict(
    env="metaworld", env_kwargs={"benchmark": "MT10", "task": None, "max_episode_steps": 500}, policy="mlp",
    advantage="gae", device="cuda", num_trainers=4, num_inference_actors=1, num_rollout_workers=40, envs_per_worker=1,
    rollout_steps=64, inference_batch=8, inference_timeout_ms=300, replay_capacity=1000, train_batch_size=20,
    accumulation_steps=13, super_batch_size=260, log_interval_seconds=10, trainer_num_cpus=1, inference_num_cpus=1,
    worker_num_cpus=0.25, log_dir="runs/metaworld_gpu_preset")
_VLA_KWARGS = {"cameras": ["agentview"], "max_prompt_tokens": 64, "unnorm_key": "libero_spatial",
               "trust_remote_code": True, "dtype": "bfloat16", "value_hidden": 1024}
OLD_LIBERO_GPU = dict(
    env="libero", env_kwargs={"suite": "libero_spatial", "tasks": "all", "image_size": 224, "cameras": ["agentview"]},
    policy="vla", policy_kwargs={**_VLA_KWARGS, "init_log_std": -1.0}, model_path=None, init_from=None, lora_rank=32, lora_alpha=16,
    lora_dropout=0.0, lora_target_modules=r".*(language_model|text_model).*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)",
    lora_trainable=["action_head", "value_head"], advantage="gae", device="cuda", precision="bf16", num_trainers=4,
    num_inference_actors=1, num_rollout_workers=40, envs_per_worker=1, rollout_steps=64, inference_batch=8,
    inference_timeout_ms=300, replay_capacity=1000, train_batch_size=20, accumulation_steps=13, super_batch_size=260,
    log_interval_seconds=10, replay_sampling="reuse", updates_per_epoch=1, lr_policy=1e-5, lr_value=1e-4,
    reward_scale=1.0, trainer_num_cpus=1, inference_num_cpus=1, worker_num_cpus=0.5, num_eval_workers=0,
    startup_timeout_s=1800, actor_timeout_s=600, log_dir="runs/libero_ppo_gpu_preset")
OLD_LIBERO_DISCRETE_GPU = {
    **OLD_LIBERO_GPU, "policy": "vla_discrete", "policy_kwargs": _VLA_KWARGS, "lora_trainable": ["value_head"],
    "num_eval_workers": 1, "eval_interval_epochs": 10, "eval_episodes": 1, "log_dir": "runs/libero_ppo_discrete_gpu_preset"}


@pytest.mark.parametrize("preset, twin, old", [
    ("metaworld_gpu_preset", "metaworld_mt1_ppo", OLD_METAWORLD_GPU),
    ("libero_ppo_gpu_preset", "libero_ppo", OLD_LIBERO_GPU),
    ("libero_ppo_discrete_gpu_preset", "libero_ppo_discrete", OLD_LIBERO_DISCRETE_GPU),
])
def test_gpu_presets_resolve_to_the_values_they_had(tmp_path, preset, twin, old):
    import yaml

    text = (ROOT / "configs" / f"{preset}.yaml").read_text()
    assert text.startswith("#") and f"base: {twin}.yaml" in text
    assert len([line for line in text.splitlines() if line and not line.startswith("#")]) <= 14  # a few lines
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    twin_yaml = str(ROOT / "configs" / f"{twin}.yaml")
    before = load_config(["--config", str(tmp_path / "old.yaml")], twin_yaml).model_dump()  # as launched before
    now = load_config(["--config", str(ROOT / "configs" / f"{preset}.yaml")], twin_yaml).model_dump()
    assert now == before
    assert load_config(["--config", str(ROOT / "configs" / f"{preset}.yaml")]).model_dump() == before  # alone too


CG_MLP, CG_PASSFORMER = (str(ROOT / "configs" / f"compilergym_{p}.yaml") for p in ("mlp", "passformer"))


def test_policy_passformer_picks_the_passformer_config(tmp_path):
    passformer = load_config([], CG_PASSFORMER).model_dump()
    assert load_config(["--policy", "passformer"], CG_MLP).model_dump() == passformer
    assert load_config(["--policy=passformer"], CG_MLP).model_dump() == passformer
    user = tmp_path / "user.yaml"
    user.write_text("policy: passformer\nseed: 4\n")  # a --config file may choose the variant too
    assert load_config(["--config", str(user)], CG_MLP).model_dump() == {**passformer, "seed": 4}
    # Flags stay above the variant; without it, the MLP's settings.
    cfg = load_config(["--policy", "passformer", "--lr-policy", "0.01"], CG_MLP)
    assert cfg.lr_policy == 0.01 and cfg.env_kwargs["mode"] == "sequence"
    mlp = load_config([], CG_MLP)
    assert mlp.policy == "mlp" and mlp.env_kwargs["mode"] == "per_step"
    assert load_config(["--policy", "categorical_mlp"], CG_MLP).env_kwargs == mlp.env_kwargs


def test_a_variant_may_build_on_the_file_declaring_it(tmp_path):
    (tmp_path / "small.yaml").write_text("variants: {policy: {categorical_mlp: {base: big.yaml}}}\nseed: 1\ngamma: 0.5\n")
    (tmp_path / "big.yaml").write_text("base: small.yaml\nseed: 2\n")  # its variants are not applied again
    small = str(tmp_path / "small.yaml")
    assert (load_config([], small).seed, load_config(["--policy", "categorical_mlp"], small).seed) == (1, 2)
    assert load_config(["--policy", "categorical_mlp"], small).gamma == 0.5


def test_bad_variants_are_one_line_naming_the_file(tmp_path):
    bad = tmp_path / "v.yaml"
    for text, message in [("variants: {polcy: {x: {}}}\n", "variants: unknown config key 'polcy' (did you mean 'policy'?)"),
                          ("variants: {policy: {x: 3}}\n", "variants.policy must map values of policy to mappings"),
        ("variants: {policy: {x: {base: none.yaml}}}\npolicy: x\n", "base none.yaml: no such file")]:
        assert f"--config {bad}: variants" in _file_error(bad, text) and message in _file_error(bad, text)


def _launch(script, *argv, cwd):
    return subprocess.run([sys.executable, str(ROOT / "launch" / script), *argv], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_print_config_prints_the_sectioned_config_and_exits(tmp_path):
    import yaml

    proc = _launch("ds_compilergym_ppo.py", "--policy", "passformer", "--seed", "3", "--print-config",
                   "--log-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert list(printed) == ["run", "env", "policy", "objective", "scale", "timeouts", "supervised"]
    assert printed["policy"]["policy"] == "passformer" and printed["env"]["env_kwargs"]["mode"] == "sequence"
    assert printed["run"]["seed"] == 3 and printed["timeouts"]["actor_timeout_s"] == 600
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written
    # The printed config is a config file: it loads back to the same values.
    (tmp_path / "printed.yaml").write_text(proc.stdout)
    again = load_config(["--config", str(tmp_path / "printed.yaml")])
    assert again.model_dump() == load_config(["--policy", "passformer", "--seed", "3", "--log-dir", str(tmp_path / "run")],
                                             CG_MLP).model_dump()


def test_help_lists_every_flag_by_section_with_the_launch_defaults(tmp_path):
    from async_rl.config.schema import SECTIONS

    proc = _launch("ds_libero_ppo.py", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    positions = [out.index(f"\n{name} section:") for name in SECTIONS]
    assert positions == sorted(positions)
    for name, cls in SECTIONS.items():
        block = out[out.index(f"\n{name} section:"):]
        for key in cls.model_fields:
            assert f"--{key.replace('_', '-')}" in block
    assert "--print-config" in out and "--config FILE" in out
    flat = " ".join(out.split())  # argparse wraps the help text
    assert "--lora-rank LORA_RANK LoRA (peft)" in flat and "(default: 8)" in flat  # libero_ppo.yaml's, not 0
    assert "(default: 5)" in flat[flat.index("--max-minutes MAX_MINUTES"):flat.index("--ray-address RAY_ADDRESS")]
    assert "one of offline, disabled, local, cloud (default: offline)" in flat
