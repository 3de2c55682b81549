"""The suite's own tools: the layer markers of conftest.py name real tests, and the per-file time
recorder (tests/durations_record.py, ``make durations``) writes and merges tests/durations.json."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parents[1]


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")}


def test_every_e2e_and_multinode_entry_names_an_existing_test():
    """A renamed test or file would silently leave its layer: each entry must name a test that exists."""
    for file, names in conftest.E2E.items():
        found = list(TESTS.rglob(file))
        assert len(found) == 1, f"conftest.E2E names {file}: {len(found)} files of that name under tests/"
        path = found[0]
        missing = set(names or ()) - _test_functions(path)
        assert not missing, f"conftest.E2E names tests that {file} does not hold: {sorted(missing)}"
    assert conftest.MULTINODE <= {f for f, names in conftest.E2E.items() if names is None}, "multinode tests are e2e too"


SUITE = '''
import pytest

@pytest.fixture(scope="module")
def slow():
    yield 1

def test_a(slow):
    assert slow == 1

def test_b():
    assert False

@pytest.mark.skip(reason="no")
def test_c():
    pass
'''


def test_durations_json_holds_each_files_time_and_keeps_files_not_run(tmp_path):
    (tmp_path / "test_one.py").write_text(SUITE)
    (tmp_path / "test_two.py").write_text("def test_x():\n    pass\n")
    out = tmp_path / "durations.json"
    out.write_text(json.dumps({"files": {"test_gone.py": {"seconds": 7.0}, "test_two.py": {"seconds": 99.0}}}))
    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps({"raw_env_steps_per_sec_per_worker": 1234.5}))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "durations_record",
                           f"--durations-json={out}", f"--durations-machine={speed}", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(TESTS)})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # test_b fails
    assert "wall time per file" in proc.stdout and "99.0" in proc.stdout, proc.stdout  # compared with the old figure
    files = json.loads(out.read_text())["files"]
    assert files["test_gone.py"] == {"seconds": 7.0}  # not run: kept as it was
    one, two = files["test_one.py"], files["test_two.py"]
    assert one["outcomes"] == {"failed": 1, "passed": 1, "skipped": 1}, one
    assert set(one["tests"]) == {"test_one.py::test_a", "test_one.py::test_b", "test_one.py::test_c"}
    assert one["seconds"] >= 0 and two["seconds"] < 99.0 and two["outcomes"] == {"passed": 1}
    assert one["env_raw_steps_per_sec"] == 1234.5 and len(one["load_1min"]) == 2
