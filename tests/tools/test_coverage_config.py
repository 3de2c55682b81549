"""`make coverage` (tests/README.md, Coverage) measures what `make test` runs: the same pytest command, coverage
pinned in the lock, .coveragerc naming async_rl and envs and following subprocesses, and the recorder's JSON."""
import configparser
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> str:
    make = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", make, re.M)
    assert match, f"no {target} target"
    return match.group(1).replace("\\\n", " ")


def test_coverage_runs_what_make_test_runs_with_the_same_options():
    test = " ".join(_recipe("test").split())
    coverage = " ".join(_recipe("coverage").split()).replace("$(or $(FILES),tests)", "tests")
    pytest_command = "$(PY) -m pytest tests -q -p no:cacheprovider --timeout=900"
    assert test.endswith(pytest_command)  # after the linter (tests/tools/test_lint.py)
    assert coverage.endswith(pytest_command)
    assert "coverage_record.py" in coverage and "COVERAGE" not in test and "coverage" not in test


def test_coveragerc_measures_the_two_packages_in_every_process():
    rc = configparser.ConfigParser()
    rc.read(ROOT / ".coveragerc")
    run = rc["run"]
    assert run["source_pkgs"].split() == ["async_rl", "envs"]
    assert run.getboolean("parallel") and run.getboolean("sigterm")
    assert {"multiprocessing", "thread"} <= set(run["concurrency"].split())
    assert {"subprocess", "fork", "_exit"} <= set(run["patch"].split())


def test_coverage_is_pinned_with_hashes_in_the_main_lock():
    lock = (ROOT / "requirements" / "main.lock.txt").read_text()
    entry = re.search(r"^coverage==(\S+) \\\n((?:    .*\n)+)", lock, re.M)
    assert entry and "--hash=sha256:" in entry.group(2)
    assert f"coverage=={entry.group(1)}" in (ROOT / "requirements" / "main.in").read_text()


def test_a_child_process_is_measured_and_the_json_holds_the_figures(tmp_path):
    out = tmp_path / "coverage.json"
    child = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
             "'from async_rl.process_setup import pythonpath_with; pythonpath_with()'], check=True)")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "coverage_record.py"), "--out", str(out),
                           "--data-dir", str(tmp_path / "data"), "--", sys.executable, "-c", child],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["processes_measured"] >= 2  # the command and its child
    assert set(result["per_package"]) == {"async_rl", "envs"}
    assert 0 < result["line_coverage_percent"] < 100
    assert result["files"]["async_rl/process_setup.py"]["missed"] < result["files"]["async_rl/process_setup.py"]["statements"]
    for key in ("date", "commit", "wall_seconds", "load_1min", "exit_status"):
        assert key in result
