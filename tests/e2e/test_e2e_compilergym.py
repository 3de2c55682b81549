"""Real runs on CompilerGym: local Ray, a DeepSpeed trainer, an inference actor, 2 rollout workers
each driving CompilerGym server processes; 2 epochs per policy, then the env's final evaluation
(held-out programs against -Oz and random search) in the summary, its TensorBoard scalars and
eval_programs.json, and no server process left behind.

The Passformer (BART) run is also the suite's real bf16 run of a model with float32 buffers beside bf16
parameters (``--precision bf16``, what ``auto`` picks on CUDA; tests/policies/test_bf16.py checks every policy in
process): DeepSpeed trains in bf16, no update is skipped, and the inference actor serves trainer rank 0's
exact weights, dtypes included."""
import json
import math
import time
from pathlib import Path

import psutil
import pytest
import ray
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from async_rl.config import load_config
from async_rl.driver import run
from envs.compilergym.client import compilergym_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
UNAVAILABLE = compilergym_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


def _servers() -> set[int]:
    return {p.pid for p in psutil.process_iter(["cmdline"]) if any("_compilergym_server" in a for a in p.info["cmdline"] or [])}


def _inspect(runtime):
    """After the last broadcast, before shut-down: both copies of the weights and the trainer's counters."""
    return {"rank0": ray.get(runtime.trainers["trainer-0"].weights.remote(), timeout=60),
            "inference": ray.get(runtime.inference["inference-0"].weights.remote(), timeout=60),
            "status": ray.get(runtime.trainers["trainer-0"].status.remote(), timeout=60)}


@pytest.mark.parametrize("policy, clip_mode", [("mlp", "clip"), ("passformer", "sapo")], ids=["mlp-clip", "passformer-sapo-bf16"])
def test_compilergym_run(tmp_path, policy, clip_mode):
    before = _servers()
    log_dir = tmp_path / "run"
    # Small programs (csmith seed 1: ~2.9k instructions at -O0), two held-out ones, tiny batches.
    env_kwargs = "{train_seeds: [1, 1], eval_seeds: [1000001, 2], max_steps: 4}" if policy == "mlp" else \
        "{mode: sequence, seq_len: 6, ir_tokens: 64, train_seeds: [1, 1], eval_seeds: [1000001, 2]}"
    overrides = ["--policy", policy, "--clip-mode", clip_mode, "--log-dir", str(log_dir), "--max-epochs", "2",
                 "--swanlab-mode", "disabled", "--env-kwargs", env_kwargs, "--envs-per-worker", "1",
                 "--log-interval-seconds", "0.01", "--updates-per-epoch", "1", "--train-batch-size", "4",
                 "--accumulation-steps", "2", "--super-batch-size", "8", "--replay-capacity", "64",
                 "--rollout-steps", "4"]
    if policy == "mlp":  # the final evaluation also searches with the policy behind the inference actor
        overrides += ["--eval-search", "best-of-2", "--eval-search-budget", "8"]
    else:  # mixed precision; the held-out programs after training only
        overrides += ["--precision", "bf16", "--no-eval-before-training"]
    # The launch script's config; --policy passformer picks the Passformer's settings (its variant).
    cfg = load_config(overrides, str(ROOT / "configs" / "compilergym_mlp.yaml"))
    assert ("d_model" in cfg.policy_kwargs) == (policy == "passformer") and cfg.actor_timeout_s == (
        600 if policy == "passformer" else 120)
    summary = run(cfg, inspect=_inspect)
    result, seen = summary["final_evaluation"], summary["inspect"]

    assert summary["epochs"] == 2 and summary["sync/policy_version"] == 2
    for key in ("train/policy_loss", "train/value_loss", "train/entropy"):
        assert math.isfinite(summary[key]), (key, summary[key])
    assert seen["status"]["global_step"] == 2 and seen["status"]["skipped_updates"] == 0, seen["status"]
    # The inference actor serves exactly rank 0's weights after the last broadcast (same dtypes too).
    rank0, inference = seen["rank0"], seen["inference"]
    assert rank0.keys() == inference.keys()
    for key, value in rank0.items():
        torch.testing.assert_close(inference[key], value, rtol=0, atol=0, msg=key)
    # Passformer: bf16 parameters (float32 buffers such as BART's final_logits_bias stay float32 on both
    # sides: the comparison above checks dtypes); the MLP run stays in float32.
    assert (torch.bfloat16 in {v.dtype for v in rank0.values()}) == (policy == "passformer")
    assert summary["rollout/total_env_steps"] >= 8
    # Held-out evaluation: every program has a row; the ratios agree with the counts.
    assert [r["benchmark"] for r in result["rows"]] == ["generator://csmith-v0/1000001", "generator://csmith-v0/1000002"]
    for row in result["rows"]:
        assert 0 < row["oz_count"] < row["o0_count"] and row["policy_count"] > 0  # a pass may also grow the code
        assert row["policy_vs_oz"] == pytest.approx(row["oz_count"] / row["policy_count"])
        assert 1 <= row["policy_passes"] <= 6
        assert len(row["policy_sequence"]) == row["policy_passes"] and row["sampled_count"] > 0
        assert row["sampled_vs_oz"] == pytest.approx(row["oz_count"] / row["sampled_count"])
    ratios = [r["policy_vs_oz"] for r in result["rows"]]
    assert result["geomean_reduction_vs_oz"] == pytest.approx(math.sqrt(ratios[0] * ratios[1]))
    assert result["random_search_geomean_vs_oz"] > 0
    sampled = [r["sampled_vs_oz"] for r in result["rows"]]
    assert result["sampled_geomean_reduction_vs_oz"] == pytest.approx(math.sqrt(sampled[0] * sampled[1]))
    for key in ("geomean_reduction_vs_oz", "sampled_geomean_reduction_vs_oz", "random_search_geomean_vs_oz"):
        assert summary[f"eval/{key}"] == pytest.approx(result[key])
        assert result["scalars"][f"eval/{key}"] == pytest.approx(result[key])
    assert "geomean" in result["text"]
    if policy == "mlp":
        searched = result["search"]
        assert searched["search"] == "best-of-2" and len(searched["rows"]) == 2
        assert all(r["compilations"] == r["random_compilations"] == 8 for r in searched["rows"])
        assert summary["eval/compilergym/best_of_2_geomean_vs_oz"] == pytest.approx(searched["geomean_vs_oz"])

    events = EventAccumulator(str(log_dir)).Reload()
    tags = events.Tags()["scalars"]
    for tag in ("eval/geomean_reduction_vs_oz", "eval/sampled_geomean_reduction_vs_oz",
                "eval/random_search_geomean_vs_oz", "train/policy_loss",
                "rollout/episode_return", "env/skipped_build_failed", "env/skipped_oz_above_o0", "env/unknown_passes"):
        assert tag in tags, tag
    assert events.Scalars("env/skipped_build_failed")[-1].value == 0  # csmith programs build
    per_program = [f"eval/compilergym/csmith-v0_{seed}/vs_oz" for seed in (1000001, 1000002)]
    if policy == "mlp":
        per_program += ["eval/compilergym/best_of_2_geomean_vs_oz", "eval/compilergym/csmith-v0_1000001/best_of_2_vs_oz"]
    assert set(per_program) <= set(tags), per_program
    written = json.loads((log_dir / "eval_programs.json").read_text())
    assert [r["policy_sequence"] for r in written["rows"]] == [r["policy_sequence"] for r in result["rows"]]
    # The MLP run evaluated the held-out programs on its initial weights too (at epoch 0, on the evaluator it keeps
    # for the env's evaluations, whose servers are checked gone below); the Passformer run turned that off.
    steps = [e.step for e in events.Scalars("eval/geomean_reduction_vs_oz")]
    assert steps == ([0, 2] if policy == "mlp" else [2]), steps
    assert (log_dir / "before_training_eval_programs.json").exists() == (policy == "mlp")

    # Every server process (and with it its CompilerGym service) is gone after the run.
    deadline = time.monotonic() + 30
    while _servers() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _servers() - before
