"""Ctrl-C and SIGTERM stop a run as its time limit does: the epoch ends, a checkpoint is written, the actors
shut down, the exit code is 128 + the signal's number and the output holds no traceback. SwanLab (offline,
the default) is on: its own SIGINT handler once swallowed the interrupt and the next log raised."""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from async_rl import checkpoint as ckpt
from async_rl.process_setup import pythonpath_with

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--clip-mode", "clip", "--max-minutes", "10", "--swanlab-mode", "offline", "--log-interval-seconds", "0.5",
        "--env-kwargs", "{benchmark: MT1, task: reach-v3, max_episode_steps: 40}", "--updates-per-epoch", "1",
        "--num-rollout-workers", "1", "--rollout-steps", "16", "--train-batch-size", "4", "--accumulation-steps", "2",
        "--super-batch-size", "8", "--checkpoint-interval-epochs", "1000"]


@pytest.mark.timeout(600)
# Ctrl-C in a terminal signals the whole foreground process group (the driver and the Ray services it
# started: GCS, raylet, agents, actors), so that run keeps the launch's two trainer ranks and its evaluator;
# a scheduler's SIGTERM goes to the driver alone, where the path after the signal is the same: one trainer
# rank and no evaluator there (two actors fewer to start) change nothing the signal reaches.
@pytest.mark.parametrize("signum, to_group, smaller", [(signal.SIGINT, True, []),
                                                        (signal.SIGTERM, False, ["--num-trainers", "1", "--num-eval-workers", "0"])],
                         ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_ends_the_epoch_checkpoints_and_exits_with_its_code(tmp_path, signum, to_group, smaller):
    log_dir, output = tmp_path / "run", tmp_path / "output.txt"
    env = {**os.environ, "PYTHONPATH": pythonpath_with(ROOT), "OMP_NUM_THREADS": "1"}
    with output.open("w") as out:
        proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "launch" / "ds_metaworld_ppo_mlp.py"),
                                 *ARGS, *smaller, "--log-dir", str(log_dir)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=tmp_path, start_new_session=True)
        try:
            give_up = time.monotonic() + 300
            # a few epochs trained (the status line's epoch, whatever the log interval skipped)
            while max(map(int, re.findall(r"^epoch (\d+)", output.read_text(), flags=re.M)), default=0) < 3:
                assert proc.poll() is None and time.monotonic() < give_up, output.read_text()[-3000:]
                time.sleep(0.5)
            if to_group:
                os.killpg(proc.pid, signum)
            else:
                proc.send_signal(signum)
            code = proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = output.read_text()
    assert code == 128 + signum, text[-3000:]
    assert f"{signal.Signals(signum).name}: stopping after this epoch" in text
    stopped = re.search(r"stopped by \w+ at epoch (\d+); continue with --resume", text)
    assert stopped, text[-3000:]
    assert "Traceback" not in text and "Error" not in text, text[-3000:]
    # The epoch it stopped at is checkpointed (the interval, 1000, would have written none).
    latest = ckpt.latest_checkpoint(str(log_dir))
    assert latest is not None and latest.name.endswith(f"{int(stopped[1]):06d}"), (latest, text[-2000:])
