"""Throughput knobs that only mean something in one mode are refused where they would be ignored."""
from pathlib import Path

import pytest

from async_rl.config import load_config
from async_rl.errors import ConfigError

DEFAULT = str(Path(__file__).resolve().parents[2] / "configs" / "metaworld_mt1_ppo.yaml")


def test_sample_reuse_bound_under_sync_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(["--sync", "--max-sample-reuse", "2"], DEFAULT)
    message = str(err.value)
    assert "\n" not in message
    assert "max_sample_reuse (2) applies only to asynchronous mode" in message
    assert "--max-sample-reuse null" in message  # the fix is named


def test_sync_alone_and_the_bound_alone_are_accepted():
    assert load_config(["--sync"], DEFAULT).sync
    assert load_config(["--max-sample-reuse", "2"], DEFAULT).max_sample_reuse == 2.0
    assert load_config(["--sync", "--max-sample-reuse", "null"], DEFAULT).max_sample_reuse is None


def test_async_vs_sync_benchmark_gives_the_reuse_bound_to_the_async_run_only():
    from benchmarks.bench_async_vs_sync import flags_for

    extra = ["--max-sample-reuse", "2", "--envs-per-worker", "16", "--max-sample-reuse=3"]
    assert flags_for("async", extra) == extra
    sync = flags_for("sync", extra)
    assert sync == ["--envs-per-worker", "16"]
    load_config(["--sync", *sync], DEFAULT)  # what the sync run is launched with is accepted
