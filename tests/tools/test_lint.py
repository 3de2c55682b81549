"""`make test` runs ruff and mypy (pyproject.toml [tool.ruff], [tool.mypy]) before pytest, so a finding fails it;
both are pinned with hashes in the main lock, and their configuration turns a finding into a non-zero exit."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _recipe_lines(target: str) -> list[str]:
    make = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", make, re.M)
    assert match, f"no {target} target"
    return [line.strip() for line in match.group(1).splitlines()]


def test_make_test_runs_the_linter_and_the_type_checker_before_the_tests():
    lines = _recipe_lines("test")
    assert lines[:2] == ["$(PY) -m ruff check .", "$(PY) -m mypy"]
    assert lines[-1].startswith("$(PY) -m pytest tests")
    assert _recipe_lines("lint") == lines[:2]


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_the_tool_is_pinned_in_the_dev_extra_and_locked_with_hashes(tool):
    pin = re.search(rf'"{tool}==([0-9.]+)"', (ROOT / "setup.py").read_text())
    assert pin, f"setup.py's dev extra pins no {tool}"
    lock = (ROOT / "requirements" / "main.lock.txt").read_text()
    entry = re.search(rf"^{tool}=={re.escape(pin.group(1))} \\\n((?:    .*\n)+)", lock, re.M)
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


def _mypy(tmp_path, module: str, source: str) -> subprocess.CompletedProcess:
    """mypy with the project's configuration on one file placed as ``module`` (its level is the module's)."""
    path = tmp_path / f"{module.replace('.', '/')}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    for package in list(path.relative_to(tmp_path).parents)[:-1]:  # the last is tmp_path itself: no package
        (tmp_path / package / "__init__.py").touch()
    path.write_text(source)
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
               "--python-executable", sys.executable, str(path.relative_to(tmp_path))]
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)


def test_a_type_error_fails_the_type_checker(tmp_path):
    """A wrong-typed call in a module of the basic level fails; the same file typed right passes."""
    bad = _mypy(tmp_path, "envs.bad", "def twice(x: int) -> int:\n    return 2 * x\n\n\ntwice('a')\n")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "[arg-type]" in bad.stdout
    good = _mypy(tmp_path, "envs.good", "def twice(x: int) -> int:\n    return 2 * x\n\n\ntwice(1)\n")
    assert good.returncode == 0, good.stdout + good.stderr


def test_the_strict_packages_refuse_an_unannotated_function(tmp_path):
    """What the basic level lets pass (a function without annotations) fails in a strict package."""
    source = "def twice(x):\n    return 2 * x\n"
    strict = _mypy(tmp_path, "async_rl.algo.untyped", source)
    assert strict.returncode == 1 and "[no-untyped-def]" in strict.stdout, strict.stdout + strict.stderr
    basic = _mypy(tmp_path, "async_rl.policies.untyped", source)
    assert basic.returncode == 0, basic.stdout + basic.stderr
