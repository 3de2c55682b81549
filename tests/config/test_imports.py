"""Imports flow one way: launch -> runtime -> ctrl -> demos -> config -> envs -> policies -> algo -> utilities.

Reads every module of the project with ``ast`` (imports inside functions count too) and fails on
an import of a higher layer or on a cycle between modules. A new module must be given a layer
here: that is the moment to decide where it belongs. Every layer may import any layer below it; a domain
package (``async_rl/ctrl``: CTRL) sits above the envs, policies and config it uses, and nothing below it
imports it (its env registers through ``envs.DOMAIN_ENV_MODULES``, imported by name at discovery).
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("async_rl", "envs", "launch", "benchmarks")
# Module-name prefixes -> layer (the longest matching prefix wins). Lower layers never import higher ones.
LAYERS = {
    "async_rl": 0,  # package docstring / version only
    "async_rl.errors": 0, "async_rl.validation": 0, "async_rl.registry": 0, "async_rl.tokens": 0,
    "async_rl.plugin_options": 0,  # the options models' base, and how --print-config describes them
    "async_rl.process_setup": 0, "async_rl.cluster_probe": 0, "async_rl.logger": 0, "async_rl.checkpoint": 0,
    "async_rl.weights": 0,  # the weight-sync group: its process group, rendezvous, signatures, transport
    "async_rl.sandbox": 0, "async_rl.code_blocks": 0,  # verifiable rewards (the sandbox: a package)
    "async_rl.jsonl": 0,  # the evaluation commands' problem files
    "async_rl.rewards": 0,  # reward functions of the text envs (TRL's convention; the code_tests one runs the sandbox)
    "async_rl.user_cache": 0,
    "async_rl.renamed_keys": 0,  # config keys of earlier versions: refused in configs, migrated in checkpoints
    "async_rl.media": 0, "async_rl.experience": 0,  # the record's schema and wire format; estimators (algo) build records
    "async_rl.algo": 1,
    "async_rl.policies": 2,  # networks and language models (their losses are algo's)
    "envs": 3,  # the environments and their registry
    "async_rl.config": 4,  # the schema, its sections and the loader (checks env and policy options)
    "async_rl.demos": 5,  # scripted-expert demonstrations: recorded over envs, read by supervised training
    "async_rl.ctrl": 6,  # CTRL critique training, a domain package: its env, cases, reward, reviser and figures
    "async_rl.actors": 7, "async_rl.orchestration": 7, "async_rl.driver": 7, "async_rl.report": 7,
    "launch": 8, "benchmarks": 8,
}
NAMES = {0: "utilities", 1: "algo", 2: "policies", 3: "envs", 4: "config", 5: "demos", 6: "ctrl", 7: "runtime",
         8: "launch/benchmarks"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "results" not in path.parts:
                found[_module_name(path)] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Project modules that ``name`` imports (resolved to the most specific existing module)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _layer(module: str) -> int:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    if prefix is None:
        raise AssertionError(f"module {module} has no layer in tests/config/test_imports.py LAYERS; add one")
    return LAYERS[prefix]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} ({NAMES[_layer(m)]}) imports {t} ({NAMES[_layer(t)]})"
            for m, targets in graph.items() for t in sorted(targets) if _layer(t) > _layer(m)]


def test_every_module_imports_only_its_own_layer_or_lower():
    upward = _upward(_graph())
    assert not upward, "upward imports:\n" + "\n".join(upward)


@pytest.mark.parametrize("module,target", [
    ("envs.humaneval", "async_rl.ctrl.cases"), ("envs._text", "async_rl.ctrl.env"),
    ("async_rl.sandbox", "async_rl.ctrl.reward"), ("async_rl.demos.text", "async_rl.ctrl.critique"),
    ("envs.prompts", "async_rl.config"), ("async_rl.policies.causal_lm", "envs.humaneval"),
    ("async_rl.config.loader", "async_rl.demos"), ("async_rl.ctrl.reviser", "async_rl.orchestration.runtime"),
])
def test_a_back_up_import_fails(module, target):
    """One import from a lower layer to a higher one, added to the real graph, is reported."""
    graph = _graph()
    assert module in graph and target in graph, (module, target)
    graph[module] = graph[module] | {target}
    assert _upward(graph) == [f"{module} ({NAMES[_layer(module)]}) imports {target} ({NAMES[_layer(target)]})"]


def test_no_import_cycles():
    graph, state, cycles = _graph(), {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("source,expected", [
    ("from async_rl.algo import gae\n", {"async_rl.algo"}),
    ("import envs\nfrom async_rl.orchestration.runtime import Runtime\n", {"envs", "async_rl.orchestration.runtime"}),
])
def test_the_checker_sees_imports(tmp_path, source, expected):
    """The walker itself: a test that cannot see imports could not fail."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert _imports(path, "async_rl.probe", _modules()) == expected
    assert (_layer("async_rl.orchestration.runtime") > _layer("async_rl.ctrl") > _layer("async_rl.demos")
            > _layer("async_rl.config") > _layer("envs") > _layer("async_rl.policies") > _layer("async_rl.algo")
            > _layer("async_rl.errors"))
