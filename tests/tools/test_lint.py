"""`make test` runs ruff (pyproject.toml [tool.ruff]) before pytest, so a finding fails it; ruff is pinned with
hashes in the main lock, and the configuration turns a finding into a non-zero exit."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _recipe_lines(target: str) -> list[str]:
    make = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", make, re.M)
    assert match, f"no {target} target"
    return [line.strip() for line in match.group(1).splitlines()]


def test_make_test_runs_the_linter_before_the_tests():
    lines = _recipe_lines("test")
    assert lines[0] == "$(PY) -m ruff check ."
    assert lines[-1].startswith("$(PY) -m pytest tests")


def test_ruff_is_pinned_in_the_dev_extra_and_locked_with_hashes():
    pin = re.search(r'"ruff==([0-9.]+)"', (ROOT / "setup.py").read_text())
    assert pin, "setup.py's dev extra pins no ruff"
    lock = (ROOT / "requirements" / "main.lock.txt").read_text()
    entry = re.search(rf"^ruff=={re.escape(pin.group(1))} \\\n((?:    .*\n)+)", lock, re.M)
    assert entry and "--hash=sha256:" in entry.group(1)


def test_a_finding_fails_the_check(tmp_path):
    """The project's configuration, on a file with an unused import and one import out of order."""
    (tmp_path / "bad.py").write_text("import sys\nimport os\n\nprint(os.sep)\n")
    (tmp_path / "good.py").write_text("import os\n\nprint(os.sep)\n")
    command = [sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"), "--no-cache"]
    bad = subprocess.run([*command, str(tmp_path / "bad.py")], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "F401" in bad.stdout and "I001" in bad.stdout
    good = subprocess.run([*command, str(tmp_path / "good.py")], capture_output=True, text=True, cwd=tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
