"""scripts/gpu_check.sh's CPU-visible parts: the one-line answer on a machine without a GPU, argument
errors, and how each step's exit code and output become the one JSON (steps run by a stand-in
interpreter that answers as pytest and the two benchmarks would)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402

# Answers as the steps would: pytest's closing line; the weight-sync benchmark writes its --out JSON and
# succeeds; the LM step writes its JSON and fails (a check that did not hold).
STAND_IN = """#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1] if "--out" in args else None
if args[:2] == ["-m", "pytest"]:
    print("tests/gpu/test_x.py ..s"); print("2 passed, 1 skipped in 3.1s"); sys.exit(0)
if args[0].endswith("bench_weight_sync.py"):
    json.dump({"broadcast_100mib_seconds": 0.02, "backend": "gloo (host)", "rows": [1, 2]}, open(out, "w")); sys.exit(0)
if args[0].endswith("gpu_lm_grpo.py"):
    json.dump({"generation_tokens_per_sec": 1234.5, "zero2_bf16_update_ok": False}, open(out, "w")); sys.exit(1)
sys.exit(9)
"""


def test_no_gpu_is_one_line_and_exit_3(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--out", str(tmp_path / "g.json")],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "no CUDA GPU" in done.stderr
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("argv, problem", [(["--budget-minutes", "0"], "give 1 to 60 minutes"),
                                           (["--skip", "everything"], "invalid choice"),
                                           (["--lm-model-path", "a", "--lm-random-smollm2-shape", "b"], "not both")])
def test_bad_arguments_exit_2(argv, problem, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(argv, detect=lambda: "Fake GPU")
    assert exc.value.code == 2 and problem in capsys.readouterr().err


def test_steps_become_one_json(tmp_path, capsys):
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    out = tmp_path / "check" / "gpu_check.json"
    code = gpu_check.main(["--out", str(out), "--python", str(stand_in)], detect=lambda: "Fake GPU")
    figures = json.loads(out.read_text())
    assert code == 1 and figures["all_ok"] is False  # the LM step failed
    assert figures["device_name"] == "Fake GPU"
    assert (figures["tests_ok"], figures["tests_passed"], figures["tests_skipped"], figures["tests_failed"]) == \
        (True, 2, 1, 0)
    assert figures["weight_sync_ok"] is True and figures["weight_sync_broadcast_100mib_seconds"] == 0.02
    assert "weight_sync_rows" not in figures  # lists stay in the step's own file
    assert figures["lm_grpo_ok"] is False and figures["lm_grpo_generation_tokens_per_sec"] == 1234.5
    assert all(isinstance(figures[f"{s}_seconds"], float) for s in gpu_check.STEPS)
    printed = capsys.readouterr().out
    assert "lm_grpo: FAILED" in printed and "failed: lm_grpo" in printed
    assert (out.parent / "steps" / "tests.log").read_text().endswith("2 passed, 1 skipped in 3.1s\n")


def test_skipped_steps_are_not_run(tmp_path):
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    out = tmp_path / "g.json"
    code = gpu_check.main(["--out", str(out), "--python", str(stand_in), "--skip", "lm_grpo"], detect=lambda: "GPU")
    figures = json.loads(out.read_text())
    assert code == 0 and figures["all_ok"] is True and figures["lm_grpo_ok"] is None
    assert "lm_grpo_seconds" not in figures


def test_pytest_counts_reads_the_closing_line():
    assert gpu_check.pytest_counts("x\n1 failed, 3 passed, 2 skipped, 1 error in 5s") == \
        {"passed": 3, "failed": 1, "skipped": 2, "errors": 1}
    assert gpu_check.pytest_counts("") == {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
