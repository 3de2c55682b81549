"""benchmarks/bench_lm_peers.py without running anything heavy: its rate, its refusal without TRL, and the
figures its process sampler writes."""
import math
import os
import time

from benchmarks import bench_lm_peers as bench


def test_the_rate_counts_completions_between_the_first_and_the_last_update():
    assert bench.trained_rate([100.0, 110.0, 120.0]) == 2 * bench.PER_UPDATE / 20.0
    assert math.isnan(bench.trained_rate([100.0]))  # one update: no interval, no rate


def test_without_trl_installed_it_says_how_to_install_it_and_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "PEERS", tmp_path / "site-packages")
    assert bench.main(["--quick", "--systems", "trl", "--log-root", str(tmp_path)]) == 2
    assert "make peers" in capsys.readouterr().err


def test_the_sampler_names_processes_and_counts_their_cpu():
    with bench.ProcessSampler(os.getpid(), period_s=0.05) as sampler:
        end = time.process_time() + 1.2
        while time.process_time() < end:  # busy: over the 1 s below which a process is left out
            pass
        time.sleep(0.2)
    figures = sampler.figures("x_")
    assert figures["x_peak_rss_gib"] > 0
    names = [k for k in figures if k.startswith("x_cpu_s/")]
    assert names and all(f"x_threads/{k.split('/', 1)[1]}" in figures for k in names)
