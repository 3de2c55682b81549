"""bench_lm_peers.py --gpu without a GPU: the refusal before anything starts, the runs it would start (config,
device flags, the CPU benchmark's work kept), TRL's command on one GPU, and the JSON main writes from them."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_lm_peers as bench

ROOT = Path(__file__).resolve().parents[2]
REQUIRED_KEYS = ("ours_completions_per_sec", "trl_completions_per_sec", "ours_heldout_accuracy", "trl_heldout_accuracy",
                 "ours_sync_completions_per_sec", "minutes", "seeds", "device")


def test_gpu_without_a_gpu_is_one_line_and_exit_3_before_anything_starts(tmp_path):
    log_root, out = tmp_path / "runs", tmp_path / "f.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_lm_peers.py"), "--gpu", "--quick",
                           "--log-root", str(log_root), "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "CUDA GPU" in done.stderr and "Traceback" not in done.stderr
    assert not log_root.exists() and not out.exists() and not out.with_suffix(".partial.json").exists()


def test_without_a_gpu_neither_the_setup_nor_a_run_starts(tmp_path, monkeypatch):
    def must_not_run(*_a, **_k):
        raise AssertionError("started without a GPU")

    for name in ("set_up", "heldout_file", "run_ours", "run_trl"):
        monkeypatch.setattr(bench, name, must_not_run)
    monkeypatch.setattr(bench, "cuda_gpu_count", lambda: 0)
    assert bench.main(["--gpu", "--setup", "--log-root", str(tmp_path)]) == 3


def test_gpu_runs_use_the_gpu_preset_on_cuda_with_the_cpu_benchmarks_work():
    from async_rl.config import load_config, read_config_file
    from async_rl.orchestration.placement import gpu_shares

    gpu_config, gpu_argv = bench.ours_run_args(0, False, 3, ["--torch-threads", "2"], gpu=True)
    cpu_config, cpu_argv = bench.ours_run_args(0, False, 3, ["--torch-threads", "2"], gpu=False)
    assert gpu_config == ROOT / "configs" / "lm_arithmetic_gpu_preset.yaml" and cpu_config == bench.CONFIG
    assert gpu_argv[gpu_argv.index("--device") + 1] == "cuda" and "--device" not in cpu_argv
    assert gpu_argv[-2:] == ["--torch-threads", "2"]  # --ours-flags come last: they override the preset's work
    run = ["--log-dir", "/tmp/unused", "--max-minutes", "1"]
    on_gpu, on_cpu = load_config([*run, *gpu_argv], str(gpu_config)), load_config([*run, *cpu_argv], str(cpu_config))
    preset = read_config_file(gpu_config).values
    assert preset["group_size"] != on_cpu.group_size  # the preset's own work differs: the flags are what align it
    for key in (*bench.WORK_KEYS, "env_kwargs", "max_epochs", "seed"):
        assert getattr(on_gpu, key) == getattr(on_cpu, key), key
    assert (on_gpu.group_size, on_gpu.policy_kwargs["max_new_tokens"], on_gpu.train_batch_size * on_gpu.accumulation_steps,
            on_gpu.num_trainers) == (8, 24, bench.PER_UPDATE, 1)
    assert on_gpu.device == "cuda" and on_gpu.precision == "auto"
    assert on_gpu.inference_batch > on_cpu.inference_batch  # the preset's GPU-sized generation batches stay
    # what --gpu's help says of the placement: a GPU each from 2, one shared by both with 1
    assert gpu_shares(2, on_gpu.num_trainers, on_gpu.num_inference_actors) == (1.0, 1.0)
    assert gpu_shares(1, on_gpu.num_trainers, on_gpu.num_inference_actors) == (0.75, 0.25)


@pytest.mark.parametrize("visible, expected", [("3,5", "3"), (None, "0")])
def test_trl_on_gpu_runs_on_one_gpu_with_cuda(tmp_path, monkeypatch, visible, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    cmd, env = bench.trl_command(1, 2.0, tmp_path, 3, "/models/m", gpu=True)
    assert cmd[1].endswith("peers_trl_grpo.py") and cmd[cmd.index("--device") + 1] == "cuda"
    assert cmd[cmd.index("--max-steps") + 1] == "3" and cmd[cmd.index("--model-path") + 1] == "/models/m"
    assert env["CUDA_VISIBLE_DEVICES"] == expected  # more than one: the Trainer would split batches (DataParallel)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(bench.PEERS)


def test_trl_on_cpu_is_left_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    cmd, env = bench.trl_command(0, 15.0, tmp_path, None, "/models/m", gpu=False)
    assert "--device" not in cmd and "--max-steps" not in cmd and env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_trl_script_takes_the_device():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers_trl_grpo

    base = ["--model-path", "m", "--out-dir", "o", "--stats", "s", "--minutes", "1"]
    assert peers_trl_grpo.parse_args(base).device == "cpu"
    assert peers_trl_grpo.parse_args([*base, "--device", "cuda"]).device == "cuda"
    with pytest.raises(SystemExit):
        peers_trl_grpo.parse_args([*base, "--device", "tpu"])


def test_no_heldout_problems_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--heldout", "0"])
    assert exc.value.code == 2 and "--heldout 0" in capsys.readouterr().err


def test_the_layout_says_which_gpu_does_what():
    assert "trainer GPU 0, generation GPU 1" in bench.gpu_layout(4)
    assert "share GPU 0" in bench.gpu_layout(1)


def test_gpu_json_has_the_headline_keys_and_the_device(tmp_path, monkeypatch):
    calls = []

    def fake_ours(seed, minutes, sync, root, problems, flags, updates, gpu=False):
        calls.append(("ours_sync" if sync else "ours", gpu, flags, updates))
        name = "ours_sync" if sync else "ours"
        return {f"{name}_completions_per_sec": 4.0 + seed, f"{name}_heldout_accuracy": 0.25,
                f"{name}_generated_tokens_per_sec": 900.0, f"{name}_generation_phase_tokens_per_sec": 5000.0}

    def fake_trl(seed, minutes, root, problems, updates, model_path=None, gpu=False):
        calls.append(("trl", gpu, model_path, updates))
        return {"trl_completions_per_sec": 2.0, "trl_heldout_accuracy": 0.2, "trl_generated_tokens_per_sec": 300.0,
                "trl_generation_phase_tokens_per_sec": 1000.0}

    (tmp_path / "peers" / "trl").mkdir(parents=True)
    monkeypatch.setattr(bench, "PEERS", tmp_path / "peers")
    monkeypatch.setattr(bench, "cuda_gpu_count", lambda: 2)
    monkeypatch.setattr(bench, "run_ours", fake_ours)
    monkeypatch.setattr(bench, "run_trl", fake_trl)
    monkeypatch.setattr(bench, "heldout_file", lambda path, count: calls.append(("heldout", count)) or path)
    out = tmp_path / "gpu.json"
    assert bench.main(["--gpu", "--quick", "--updates", "3", "--model-path", "/models/m", "--heldout", "16",
                       "--log-root", str(tmp_path), "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert all(key in figures for key in REQUIRED_KEYS)
    assert figures["device"].startswith("cuda") and "generation GPU 1" in figures["device"]
    assert figures["ours_over_trl_completions"] == 2.0 and figures["seeds"] == "0"
    assert figures["trl_generation_phase_tokens_per_sec"] == 1000.0 and figures["ours_generated_tokens_per_sec"] == 900.0
    assert calls.pop(0) == ("heldout", 16) and figures["heldout_problems"] == 16
    assert [c[:2] for c in calls] == [("ours", True), ("trl", True), ("ours_sync", True)]
    assert calls[0][2] == ["--model-path", "/models/m"] and calls[1][2] == "/models/m"
    assert all(c[3] == 3 for c in calls)


def test_without_gpu_the_json_says_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "run_ours", lambda *a, **k: {"ours_completions_per_sec": 1.0, "ours_heldout_accuracy": 0.2})
    monkeypatch.setattr(bench, "heldout_file", lambda path, count: path)
    monkeypatch.setattr(bench, "cuda_gpu_count", lambda: 8)  # a GPU present but not asked for: the CPU run
    out = tmp_path / "cpu.json"
    assert bench.main(["--quick", "--systems", "ours", "--log-root", str(tmp_path), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["device"] == "cpu"
