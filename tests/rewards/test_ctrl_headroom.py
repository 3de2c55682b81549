"""The reviser's headroom: the approve-all and oracle critics, scored in the sandbox, tell a reviser that acts on
a named fix from one that copies the solution whatever the critique says."""
import re

from async_rl.ctrl.critique import revision_prompt
from async_rl.ctrl.headroom import UNLOCATED, oracle_critiques, reviser_headroom

ADD = "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\""
TESTS = ["assert add(1, 2) == 3", "assert add(5, 0) == 5"]
REFERENCE = "def add(a, b):\n    return a + b"
CASES = [{"task_id": "T/0", "prompt": ADD, "solution": REFERENCE, "tests": TESTS, "prefix": "", "correct": True,
          "source": "canonical"},
         {"task_id": "T/0", "prompt": ADD, "solution": "def add(a, b):\n    return a - b", "tests": TESTS, "prefix": "",
          "correct": False, "source": "mutated:flip_comparison"}]
SOLUTION = re.compile(r"Solution:\n```python\n(.*?)\n```", re.S)
REPLACE = re.compile(r"Replace `(.+?)` with `(.+?)`\.")


def applying_reviser(prompts):
    """Copies the solution, with the critique's suggested replacement made when it names one."""
    out = []
    for prompt in prompts:
        code = SOLUTION.search(prompt).group(1)
        fix = REPLACE.search(prompt)
        out.append("```python\n" + (code.replace(fix.group(1), fix.group(2)) if fix else code) + "\n```")
    return out


def copying_reviser(prompts):
    return ["```python\n" + SOLUTION.search(p).group(1) + "\n```" for p in prompts]


def test_the_reviser_prompt_carries_what_the_fake_revisers_read():
    prompt = revision_prompt(ADD, CASES[1]["solution"], "Replace `return a - b` with `return a + b`.")
    assert applying_reviser([prompt]) == ["```python\n" + REFERENCE + "\n```"]


def test_a_reviser_that_applies_the_named_fix_reaches_every_pass():
    figures = reviser_headroom(CASES, {"T/0": REFERENCE}, applying_reviser)
    assert figures["oracle_critique_pass"] == 1.0 and figures["oracle_fix_rate"] == 1.0
    assert figures["approve_all_pass"] == 0.5  # approval keeps the correct one and fixes nothing
    assert figures["approve_all_regression_rate"] == 0.0 and figures["oracle_regression_rate"] == 0.0
    assert figures["oracle_located"] == 1.0


def test_a_copying_reviser_has_no_headroom():
    figures = reviser_headroom(CASES, {"T/0": REFERENCE}, copying_reviser)
    assert figures["oracle_critique_pass"] == figures["approve_all_pass"] == 0.5
    assert figures["oracle_fix_rate"] == 0.0


def test_a_mutant_without_a_reference_gets_a_right_judgment_and_no_fix():
    critiques = oracle_critiques(CASES, {})
    assert list(critiques.values())[1] == UNLOCATED
    figures = reviser_headroom(CASES, {}, applying_reviser)
    assert figures["oracle_located"] == 0.0 and figures["oracle_fix_rate"] == 0.0


def test_revision_demonstrations_answer_the_oracle_critique_with_the_code_it_asks_for():
    from async_rl.ctrl.revision_sft import revision_demonstrations

    pairs = revision_demonstrations(CASES, {"T/0": REFERENCE})
    assert len(pairs) == 2  # balanced: the correct case and the mutant
    fix = next(p for p in pairs if "Replace `return a - b` with `return a + b`." in p["prompt"])
    keep = next(p for p in pairs if p is not fix)
    assert fix["response"] == keep["response"] == "```python\n" + REFERENCE + "\n```"
    assert "Overall judgment: Correct" in keep["prompt"]
    # A fake reviser that applies the named fix writes exactly what the demonstrations teach.
    assert applying_reviser([fix["prompt"]]) == [fix["response"]]
    assert revision_demonstrations(CASES, {}) == []  # no reference: the mutant's fix is unknown, nothing to balance


def test_a_reviser_path_is_a_model_or_a_causal_lm_export(tmp_path):
    import json

    import pytest

    from async_rl.ctrl.reviser import check_reviser_path, is_policy_export
    from async_rl.errors import ConfigError

    export = tmp_path / "export"
    export.mkdir()
    (export / "policy.json").write_text(json.dumps({"format": "async_rl.policy/1", "policy": "mlp"}))
    (export / "policy.safetensors").write_bytes(b"")
    assert is_policy_export(str(export)) and not is_policy_export(str(tmp_path))
    with pytest.raises(ConfigError, match="'mlp' policy export, not a causal_lm one"):
        check_reviser_path(str(export))
    with pytest.raises(ConfigError, match="--reviser-model-path .*no such file"):
        check_reviser_path(str(tmp_path / "none"))
