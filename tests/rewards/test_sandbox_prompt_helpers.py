"""The prompt's helpers and the function under test reach the sandbox's judge on the trusted path, from
every caller that scores code: CTRL's case labels, the ``code_tests`` reward and HumanEval's
``code_reward``. A candidate that redefines a helper the prompt defines (HumanEval/38's
``encode_cyclic``) changes only its own calls; an entry point that shadows a builtin is still the
candidate's function; a prefix that holds the function's stub does not replace the candidate's function.
"""
import pytest

from async_rl.ctrl import cases as ctrl_cases
from async_rl.rewards.code_tests import make_code_tests
from async_rl.sandbox import SandboxPool, isolation_mode

# HumanEval/38 asks for decode_cyclic; its prompt defines encode_cyclic, which the test calls. An
# answer that makes both the identity passes only if the test uses the answer's encode_cyclic.
FORGED_HELPER = "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n"


@pytest.fixture(scope="module")
def pool():
    if isolation_mode() != "namespaces":
        pytest.skip("needs the namespace sandbox")
    with SandboxPool(workers=2) as p:
        yield p


@pytest.fixture(scope="module")
def problem_38():
    from envs.humaneval import humaneval_problems

    return next(p for split in ("train", "heldout") for p in humaneval_problems(split) if p["task_id"] == "HumanEval/38")


class _Recording:
    """A pool that records what each label was asked with, and runs it in the real one."""

    def __init__(self, pool):
        self.pool, self.calls = pool, []

    def submit(self, code, tests, **options):
        self.calls.append((code, options))
        return self.pool.submit(code, tests, **options)


def test_a_sampled_answer_that_redefines_a_prompt_helper_is_labelled_wrong(pool, problem_38, monkeypatch):
    import async_rl.policies.causal_lm as causal_lm
    import async_rl.policies.lm_checkpoint as lm_checkpoint

    text = f"```python\n{FORGED_HELPER}```"
    monkeypatch.setattr(lm_checkpoint, "load_lm_policy", lambda **_: (None, type("P", (), {"model_path": "m"}), None))
    monkeypatch.setattr(lm_checkpoint, "answer", lambda policy, pre, prompts, **_: [text for _ in prompts])
    monkeypatch.setattr(causal_lm, "load_tokenizer", lambda path: type("T", (), {"decode": lambda self, ids, **_: ids})())
    recording = _Recording(pool)
    cases = ctrl_cases.sampled_cases([problem_38], samples=1, model_path=None, seed=0, pool=recording, timeout_s=3.0)
    assert [c["correct"] for c in cases] == [False]
    code, options = recording.calls[0]
    assert options.get("prefix") == problem_38["prefix"] and options.get("entry_point") == "decode_cyclic"
    assert problem_38["prefix"].strip() not in code  # the helpers travel apart from the candidate's code


def test_canonical_and_mutated_labels_take_the_helpers_from_the_prompt(pool, problem_38):
    recording = _Recording(pool)
    cases = ctrl_cases.mutated_cases([problem_38], seed=0, per_problem=1, pool=recording, timeout_s=3.0)
    assert any(c["source"] == "canonical" and c["correct"] for c in cases)
    assert all(c["entry_point"] == "decode_cyclic" for c in cases)
    assert {c["solution"] for c in cases} <= {code for code, _ in recording.calls}  # the solution alone, as run
    for _, options in recording.calls:
        assert options.get("prefix") == problem_38["prefix"] and options.get("entry_point") == "decode_cyclic"


def test_the_ctrl_reward_judges_a_forged_helper_as_the_prompts(pool, problem_38):
    from async_rl.ctrl.reward import ResultCache, score_revision

    future, _ = score_revision(f"```python\n{FORGED_HELPER}```", problem_38["tests"], problem_38["prefix"],
                               ResultCache(), pool, 3.0, entry_point="decode_cyclic")
    assert future.result().passed == 0


def test_code_tests_reward_asks_the_candidate_for_its_entry_point(pool):
    reward = make_code_tests(timeout_s=3.0)
    wrong_max = "```python\ndef max(xs):\n    return 0\n```"  # shadows a builtin: the tests must not call the builtin
    honest_add = "```python\ndef add(a, b):\n    return a + b\n```"
    stub = 'def add(a, b):\n    """Return a + b."""\n'  # a prompt passed whole as the prefix: the stub is not the answer
    scores = reward(prompts=["p", "p"], completions=[wrong_max, honest_add],
                    tests=[["assert max([1, 5, 2]) == 5", "assert max([3]) == 3"], ["assert add(1, 2) == 3"]],
                    prefix=["", stub], entry_point=["max", "add"])
    assert scores == [0.0, 1.0], reward.last_reasons
    # Without an entry point column (a data set that has none), nothing changes for plain rows.
    assert reward(prompts=["p"], completions=[honest_add], tests=[["assert add(1, 2) == 3"]]) == [1.0]


def test_humaneval_code_reward_takes_the_entry_point(pool, problem_38):
    from envs.humaneval import code_reward

    text = f"```python\n{FORGED_HELPER}```"
    result = code_reward(text, problem_38["tests"], pool, prefix=problem_38["prefix"], entry_point="decode_cyclic")
    assert result.passed == 0
    honest = "```python\ndef max(xs):\n    return sorted(xs)[-1]\n```"
    assert code_reward(honest, ["assert max([1, 5, 2]) == 5"], pool, entry_point="max").passed == 1
    assert code_reward("```python\ndef max(xs):\n    return 0\n```", ["assert max([1, 5, 2]) == 5"], pool,
                       entry_point="max").passed == 0
