"""The LIBERO fine-tuning benchmark's bookkeeping: state ranges, the evaluation split, and the figures it
assembles from evaluated runs (--reuse; the runs themselves are a benchmark, not a test)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench_libero_finetune import halves, parse_states

ROOT = Path(__file__).resolve().parents[2]


def test_states_parse_and_split_into_two_ranges_covering_each_state_once():
    assert parse_states("40-49") == list(range(40, 50)) and parse_states("7") == [7]
    assert halves(list(range(40, 50))) == ["40-44", "45-49"]
    assert halves([40, 41, 42]) == ["40-41", "42-42"] and halves([40]) == ["40-40"]
    for bad in ("49-40", "x", "40-"):
        with pytest.raises(SystemExit, match="FIRST-LAST"):
            parse_states(bad)


def _held(rates: list[bool], states=None) -> dict:
    held = {"success_rate": sum(rates) / len(rates), "episodes": [{"task": "t", "success": s} for s in rates]}
    return held if states is None else {**held, "init_states": states}


def test_reuse_assembles_per_seed_means_and_gains_from_the_evaluations(tmp_path):
    pytest.importorskip("envs.libero")
    runs = tmp_path / "runs"
    runs.mkdir()
    for name, rates in {"sft_heldout": [1, 0, 0, 0], "ppo_seed0_heldout": [1, 1, 0, 0],
                        "ppo_seed1_heldout": [1, 1, 1, 0], "grpo_seed0_heldout": [0, 0, 0, 0],
                        "naive_seed3_heldout": [1, 1, 1, 1], "ppo_large_batch_seed2_heldout": [1, 1, 0, 1]}.items():
        (runs / f"{name}.json").write_text(json.dumps(_held(rates)))
    for name, rates in {"sft_train": [1, 0], "ppo_seed0_train": [1, 1], "ppo_seed1_train": [1, 0],
                        "grpo_seed0_train": [0, 0],
                        "naive_seed3_train": [0, 1],
                        "ppo_large_batch_seed2_train": [1, 1]}.items():  # --train-states 0-1: two training states
        (runs / f"{name}.json").write_text(json.dumps(_held(rates, [0, 1])))
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, "benchmarks/bench_libero_finetune.py", "--reuse", "--seeds", "0", "1",
                           "--naive-seeds", "3", "--ppo-large-batch-seeds", "2", "--train-states", "0-1", "--runs-dir", str(runs),
                           "--out", str(out)],
                          cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["sft_heldout"] == 0.25 and figures["ppo_heldout_seed0"] == 0.5 and figures["ppo_heldout_seed1"] == 0.75
    assert figures["ppo_heldout"] == pytest.approx(0.625) and figures["ppo_gain"] == pytest.approx(0.375)
    assert figures["grpo_heldout"] == 0.0 and figures["grpo_gain"] == pytest.approx(-0.25)
    assert figures["sft_train"] == 0.5 and figures["ppo_train_seed0"] == 1.0 and figures["ppo_train"] == 0.75
    assert figures["ppo_train_gain"] == pytest.approx(0.25) and figures["grpo_train_gain"] == pytest.approx(-0.5)
    assert figures["naive_heldout_seed3"] == 1.0 and figures["naive_gain"] == pytest.approx(0.75)
    assert figures["naive_train_gain"] == pytest.approx(0.0)
    assert figures["ppo_large_batch_heldout_seed2"] == 0.75 and figures["ppo_large_batch_gain"] == pytest.approx(0.5)
    assert figures["ppo_large_batch_train_gain"] == pytest.approx(0.5)
    assert "ppo_epochs_seed0" not in figures  # its run dir is not under --runs-dir: no epochs to read
