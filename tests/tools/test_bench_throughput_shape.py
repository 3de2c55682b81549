"""The throughput benchmark's collection shape: flags a launch config accepts, and one clear line (before
Ray starts, nothing written) for a shape that cannot be split into lock-step groups."""
import subprocess
import sys
from pathlib import Path

from async_rl.config import load_config
from benchmarks.bench_throughput import CONFIGS, collect_shape

ROOT = Path(__file__).resolve().parents[2]


def test_collection_shape_loads_into_the_metaworld_config_with_a_groups_rows_per_forward():
    cfg = load_config(collect_shape(64, 2), str(CONFIGS["metaworld"]))
    assert (cfg.envs_per_worker, cfg.env_groups, cfg.inference_batch) == (64, 2, 32)
    assert load_config(collect_shape(16, 1), str(CONFIGS["metaworld"])).inference_batch == 16


def test_a_shape_that_does_not_split_into_groups_exits_with_one_line_before_ray(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, "benchmarks/bench_throughput.py", "--collect-only", "--collect-envs-per-worker",
                           "10", "--collect-env-groups", "3", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["--collect-envs-per-worker 10 must be a positive multiple of --collect-env-groups 3"]
    assert "ray" not in proc.stdout.lower() and not out.exists()
