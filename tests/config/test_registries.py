"""One discovery scheme: environments and policies are found by importing their package's modules,
which stays cheap (no simulator, transformers or peft import) and names the valid choices."""
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_discovering_every_policy_imports_no_heavy_package():
    _run("import sys\n"
         "from async_rl.policies import POLICIES, available_policies\n"
         "names = available_policies()\n"
         "assert {'mlp', 'categorical_mlp', 'passformer', 'vla', 'vla_discrete'} <= set(names), names\n"
         "assert not POLICIES.broken_modules, POLICIES.broken_modules\n"
         "heavy = [m for m in ('transformers', 'peft', 'deepspeed', 'ray') if m in sys.modules]\n"
         "assert not heavy, f'discovering the policies imported {heavy}'\n")


def test_discovering_every_env_imports_no_simulator():
    _run("import sys\n"
         "from envs import ENVS, available_envs\n"
         "assert {'compiler_gym', 'libero', 'metaworld'} <= set(available_envs())\n"
         "assert not ENVS.broken_modules, ENVS.broken_modules\n"
         "heavy = [m for m in ('metaworld', 'mujoco', 'libero', 'robosuite', 'ray', 'async_rl.driver') if m in sys.modules]\n"
         "assert not heavy, f'discovering the envs imported {heavy}'\n")


def test_unknown_names_list_the_registered_ones():
    from async_rl.policies import build_preprocessor
    from envs import make_task_set

    with pytest.raises(ConfigError, match=r"unknown policy 'mpl' \(did you mean 'mlp'\?\); valid keys: .*passformer"):
        build_preprocessor("mpl", {})
    with pytest.raises(ConfigError, match=r"unknown environment 'libro' \(did you mean 'libero'\?\)"):
        make_task_set("libro")


def test_a_module_that_fails_to_import_is_named_with_unknown_names(tmp_path, monkeypatch):
    from async_rl.registry import Registry

    pkg = tmp_path / "fake_envs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text("from tests_registry_target import REG\nREG.add('good', 1)\n")
    (pkg / "bad.py").write_text("import not_a_module_anywhere\n")
    reg = Registry("environment", package="fake_envs")
    target = type(sys)("tests_registry_target")
    target.REG = reg
    monkeypatch.setitem(sys.modules, "tests_registry_target", target)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert reg.get("good") == 1
    with pytest.raises(ConfigError, match=r"unknown environment 'other'.*fake_envs/bad.py: ModuleNotFoundError"):
        reg.get("other")
