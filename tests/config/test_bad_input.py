"""Every class of bad input to a launch script: one line on stderr, exit code 2, nothing started or written."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from async_rl.process_setup import pythonpath_with

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch" / "ds_metaworld_ppo_mlp.py"

# (class, extra argv, text the line must contain); "{tmp}" is the test's temp dir.
CASES = [
    ("unknown_key", ["--config", "{tmp}/bad.yaml"], "unknown config key 'replay_capcity' (did you mean 'replay_capacity'?)"),
    ("wrong_type", ["--num-trainers", "two"], "'num_trainers' = 'two': Input should be a valid integer"),
    ("out_of_range", ["--gamma", "1.5"], "'gamma' = 1.5: Input should be less than or equal to 1"),
    ("inconsistent_sizes", ["--super-batch-size", "100"], "super_batch_size (100) must be a multiple of train_batch_size x accumulation_steps"),
    ("resume_missing", ["--resume", "{tmp}/nope"], "--resume {tmp}/nope: no such directory"),
    ("resume_not_a_checkpoint", ["--resume", "{tmp}/empty"], "--resume {tmp}/empty: not a checkpoint"),
    ("log_dir_is_a_file", ["--log-dir", "{tmp}/bad.yaml"], "is a file; pass a directory"),
    ("too_many_cpus", ["--num-rollout-workers", "64", "--worker-num-cpus", "1"], "are available; lower the counts"),
    ("no_gpu", ["--device", "cuda"], "GPU(s) visible"),
    ("missing_extra", ["--block-module", "metaworld"], "MetaWorld is not installed"),
    ("policy_kwarg", ["--policy-kwargs", "{d_model: 64}"], "unknown mlp policy option 'd_model'"),
    ("env_option", ["--env.max-episode-steps", "0"], "metaworld env option 'max_episode_steps' = 0: Input should be greater than 0"),
    ("env_options_relation", ["--env", "arithmetic", "--env-kwargs", "{difficulty: 1, heldout_size: 600}"],
     "arithmetic heldout_size 600: difficulty 1 has only 497 distinct held-out problems; set heldout_size <= 497"),
    ("base_missing", ["--config", "{tmp}/preset.yaml"], "{tmp}/preset.yaml: base nowhere.yaml: no such file"),
    ("key_in_wrong_section", ["--config", "{tmp}/sections.yaml"], "config key 'gamma' belongs to section 'objective', not 'scale'"),
]

# Runs the launch script as __main__ with one module made unimportable (a missing optional extra).
BLOCKING_RUNNER = """
import runpy, sys
args = sys.argv[1:]
if "--block-module" in args:
    i = args.index("--block-module")
    sys.modules[args[i + 1]] = None  # `import <name>` now raises ImportError
    del args[i:i + 2]
sys.argv = [{launch!r}, *args]
runpy.run_path({launch!r}, run_name="__main__")
"""


def _launch(tmp_path: Path, argv: list[str]) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """One bad launch in a directory of its own: (the finished process, its log dir, its working dir)."""
    work = tmp_path / "cwd"
    work.mkdir()
    (tmp_path / "bad.yaml").write_text("replay_capcity: 10\n")
    (tmp_path / "preset.yaml").write_text("base: nowhere.yaml\nseed: 1\n")
    (tmp_path / "sections.yaml").write_text("scale: {gamma: 0.9}\n")
    (tmp_path / "empty").mkdir()
    log_dir = tmp_path / "run"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--log-dir" not in argv:
        argv += ["--log-dir", str(log_dir)]
    env = {**os.environ, "PYTHONPATH": pythonpath_with(ROOT)}
    proc = subprocess.run([sys.executable, "-c", BLOCKING_RUNNER.format(launch=str(LAUNCH)), *argv],
                          capture_output=True, text=True, timeout=300, cwd=work, env=env)
    return proc, log_dir, work


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    """Every case launched once, two at a time: each launch is ~10 s of single-threaded imports before
    its check refuses the input, so the cases share the machine's two cores (half the wall time)."""
    dirs = {case: tmp_path_factory.mktemp(case) for case, _, _ in CASES}
    with ThreadPoolExecutor(2) as pool:
        futures = {case: pool.submit(_launch, dirs[case], list(argv)) for case, argv, _ in CASES}
        return {case: (dirs[case], *future.result()) for case, future in futures.items()}


@pytest.mark.parametrize("case, message", [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(launched, case, message):
    tmp_path, proc, log_dir, work = launched[case]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert message.replace("{tmp}", str(tmp_path)) in lines[0]
    assert not log_dir.exists()
    assert list(work.iterdir()) == []  # nothing written where it ran
