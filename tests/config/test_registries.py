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
         "assert {'compilergym', 'libero', 'metaworld', 'ctrl_humaneval'} <= set(available_envs())\n"
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


def _fake_registry(tmp_path, monkeypatch, files: dict[str, str], **kwargs):
    """A Registry over packages written under ``tmp_path`` (``files``: relative path -> source; their modules
    register with ``tests_registry_target.REG``)."""
    from async_rl.registry import Registry

    for rel, source in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(source)
    reg = Registry("environment", **kwargs)
    target = type(sys)("tests_registry_target")
    target.REG = reg
    monkeypatch.setitem(sys.modules, "tests_registry_target", target)
    monkeypatch.syspath_prepend(str(tmp_path))
    return reg


def test_a_module_that_fails_to_import_is_named_with_unknown_names(tmp_path, monkeypatch):
    reg = _fake_registry(tmp_path, monkeypatch, {
        "fake_envs/__init__.py": "", "fake_envs/good.py": "from tests_registry_target import REG\nREG.add('good', 1)\n",
        "fake_envs/bad.py": "import not_a_module_anywhere\n"}, package="fake_envs")
    assert reg.get("good") == 1
    with pytest.raises(ConfigError, match=r"unknown environment 'other'.*fake_envs/bad.py: ModuleNotFoundError"):
        reg.get("other")


def test_a_domain_env_resolves_by_name_in_a_fresh_process():
    """CTRL's env lives in its package (``async_rl/ctrl/env.py``), above envs/: a process that imports nothing of
    CTRL (a Ray worker, the config loader) still finds ``ctrl_humaneval`` by name, and envs/ imports no CTRL code."""
    _run("import sys\n"
         "from envs import env_options_model, final_evaluation_for\n"
         "assert not [m for m in sys.modules if m.startswith('async_rl.ctrl')]\n"
         "assert env_options_model('ctrl_humaneval').__module__ == 'async_rl.ctrl.env'\n"
         "assert final_evaluation_for('ctrl_humaneval') is not None\n")


def test_a_plugin_module_registers_and_a_broken_one_is_named(tmp_path, monkeypatch):
    """A module named in ``plugins`` (a domain package's env, outside the registry's package) is discovered too."""
    reg = _fake_registry(tmp_path, monkeypatch, {
        "fake_core/__init__.py": "", "fake_domain/__init__.py": "",
        "fake_domain/env.py": "from tests_registry_target import REG\nREG.add('domain', 2)\n",
        "fake_domain/bad.py": "import not_a_module_anywhere\n"},
        package="fake_core", plugins=("fake_domain.env", "fake_domain.bad"))
    assert reg.get("domain") == 2
    with pytest.raises(ConfigError, match=r"unknown environment 'other'.*fake_domain/bad.py: ModuleNotFoundError"):
        reg.get("other")
