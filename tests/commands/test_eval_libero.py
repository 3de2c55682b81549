"""launch/eval_libero.py on an RL run whose starting export has moved: one line naming the fix, exit 2,
and ``--init-from`` gives the export's new place."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.errors import ConfigError
from async_rl.orchestration.policy_evaluation import checkpoint_policy

ROOT = Path(__file__).resolve().parents[2]


def _run_whose_export_moved(root: Path) -> Path:
    """A run directory with one checkpoint whose saved config starts from an export that is gone."""
    epoch = root / "run" / "checkpoints" / "epoch-000010"
    epoch.mkdir(parents=True)
    config = {"init_from": str(root / "moved" / "policy"), "policy": "tiny_vla", "policy_kwargs": {},
              "advantage": "gae"}
    (epoch / "meta.json").write_text(json.dumps({"epoch": 10, "config": config}))
    return root / "run"


def test_a_moved_starting_export_is_a_config_error_naming_the_flag(tmp_path):
    run = _run_whose_export_moved(tmp_path)
    with pytest.raises(ConfigError, match=r"is no longer there; pass --init-from with where it is now"):
        checkpoint_policy(str(run), {}, 7)


@pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="LIBERO is not installed (run: make setup)")
def test_eval_libero_says_it_in_one_line_and_exits_2(tmp_path):
    run = _run_whose_export_moved(tmp_path)
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "eval_libero.py"), "--checkpoint", str(run),
                           "--init-states", "40-40"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "no longer there; pass --init-from" in lines[0], lines
