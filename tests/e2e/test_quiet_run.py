"""The main job's output (`make run`'s launch, shortened) holds status lines and real warnings once
each: a warning printed at every forward or step (e.g. a deprecated argument's warning) fails here."""
import collections
import os
import subprocess
from pathlib import Path

import pytest

from async_rl.process_setup import pythonpath_with

pytest.importorskip("libero", reason="LIBERO is not installed (make setup installs it)")

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"
MAX_REPEATS = 3
SHORT = [  # the main job's launch and config, a few small epochs on one LIBERO task (~1 min)
    "--clip-mode", "soft_clip", "--max-epochs", "3", "--max-minutes", "null", "--num-rollout-workers", "1",
    "--env-kwargs", "{suite: libero_spatial, tasks: [0], image_size: 64, cameras: [agentview], max_episode_steps: 10, "
                    "settle_steps: 2}",
    "--rollout-steps", "8", "--train-batch-size", "4", "--accumulation-steps", "2", "--super-batch-size", "8",
    "--updates-per-epoch", "1", "--swanlab-mode", "offline",
]


def test_main_job_output_repeats_no_line_more_than_three_times(tmp_path):
    log = tmp_path / "output.txt"
    env = {**os.environ, "PYTHONPATH": pythonpath_with(ROOT), "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:  # a file, as a user's redirected run: no TTY, no progress bar
        proc = subprocess.run([str(PYTHON), str(ROOT / "launch" / "ds_libero_ppo.py"), *SHORT,
                               "--log-dir", str(tmp_path / "run")],
                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=tmp_path,
                              timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "done: v3" in text, text[-3000:]
    counts = collections.Counter(line.strip() for line in text.splitlines() if line.strip())
    repeated = {line: n for line, n in counts.items() if n > MAX_REPEATS}
    assert not repeated, f"lines printed more than {MAX_REPEATS} times: {repeated}"
