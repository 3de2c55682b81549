"""CTRL's critique format and reward on hand-written critiques and revisions, run in the real sandbox: the
judgment line, the reward modes, the result cache (same result as a run, without running again), and
revisions that fork-bomb or loop forever (score 0, the next one is scored as usual)."""
import time

import pytest

from async_rl.ctrl.critique import critic_prompt, parse_judgment, revision_prompt
from async_rl.ctrl.reward import ResultCache, cache_key, critique_reward, score_revision
from async_rl.sandbox import SandboxPool, run_tests

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"]
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"  # passes add(0, 0) only
CRITIQUE_RIGHT = ("Analysis: the function subtracts instead of adding.\nImprovement suggestions: return a + b.\n"
                  "Overall judgment: Incorrect")


@pytest.mark.parametrize("text, judgment", [
    (CRITIQUE_RIGHT, False),
    ("Analysis: fine.\nImprovement suggestions: none.\nOverall judgment: Correct", True),
    ("**Overall judgment:** incorrect.", False),
    ("Overall Judgment: Correct\n... on reflection ...\nOverall judgment: Incorrect", False),  # the last line counts
    ("Analysis: the code is correct.\nImprovement suggestions: none.", None),  # no judgment line
    ("The judgment: Correct", None),
    ("", None),
])
def test_judgment_line(text, judgment):
    assert parse_judgment(text) is judgment


def test_prompts_hold_the_problem_solution_and_critique():
    prompt = critic_prompt("def add(a, b):\n    '''Sum.'''", "def add(a, b):\n    return a - b")
    assert "return a - b" in prompt and "Overall judgment: Correct" in prompt and "Overall judgment: Incorrect" in prompt
    revise = revision_prompt("def add(a, b):", "def add(a, b):\n    return a - b", CRITIQUE_RIGHT)
    assert CRITIQUE_RIGHT in revise and "```python" in revise
    assert "Critique" not in revision_prompt("def add(a, b):", "return a - b", None)


def _score(critique, revision, mode="all_pass", missing=0.0, format_check=True, cache=None, pool=None):
    cache = cache or ResultCache()
    future, _ = score_revision(revision, TESTS, "", cache, pool)
    return critique_reward(critique, future.result(), mode, missing, format_check)


def test_reward_on_hand_written_critiques():
    assert _score(CRITIQUE_RIGHT, RIGHT)[0] == 1.0
    reward, info = _score(CRITIQUE_RIGHT, WRONG)
    assert reward == 0.0 and info["passed"] == 1 and info["total"] == 3 and info["judgment"] is False
    assert _score(CRITIQUE_RIGHT, WRONG, mode="pass_rate")[0] == pytest.approx(1 / 3)
    # No judgment line: the configured reward whatever the revision does, unless the format check is off.
    no_line = "Analysis: it subtracts. Improvement suggestions: add."
    assert _score(no_line, RIGHT) == (0.0, {"judgment": None, "reason": "no_judgment", "success": False,
                                             "passed": 0, "total": 3})
    assert _score(no_line, RIGHT, missing=-1.0)[0] == -1.0
    assert _score(no_line, RIGHT, format_check=False)[0] == 1.0
    # A revision without a code block scores 0 (reason no_code).
    assert _score(CRITIQUE_RIGHT, "I would return a + b.")[1]["reason"] == "no_code"


def test_the_key_is_the_exact_text_and_the_run_settings():
    a = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x  # sum\n    return total\n"
    assert cache_key(a, TESTS) == cache_key(str(a), list(TESTS))
    # Programs that differ only in a local's name, a docstring, a comment or layout may behave apart
    # (a program can read its own names and text): each its own key.
    for other in (a.replace("total", "s"), a.replace("    total = 0", "    'Sum.'\n    total = 0"),
                  a.replace("  # sum", ""), a + "\n"):
        assert cache_key(other, TESTS) != cache_key(a, TESTS)
    assert cache_key(a, TESTS) != cache_key(a, TESTS[:2])
    assert cache_key(a, TESTS) != cache_key(a, TESTS, prefix="import os")
    assert cache_key(a, TESTS) != cache_key(a, TESTS, timeout_s=2.0) != cache_key(a, TESTS, entry_point="f")
    # No two splits of the same characters share a key (tests, prefix and code are not just joined).
    assert cache_key("x = 1", ["assert x", "assert 1"]) != cache_key("x = 1", ["assert x\0assert 1"])
    assert cache_key("x = 1\0", TESTS, prefix="") != cache_key("x = 1", TESTS, prefix="\0")


def test_the_cache_returns_the_runs_result_without_running_again():
    cache = ResultCache()
    code = "def add(a, b):\n    return a - b\n"
    ran = run_tests(code, TESTS)
    first = cache.submit(None, code, TESTS).result()
    assert (first.passed, first.total, first.reason) == (ran.passed, ran.total, ran.reason) == (1, 3, "ok")
    commented = "def add(a, b):\n    # same code\n    return a - b"
    cache.submit(None, commented, TESTS).result()  # another text: runs (a program can read its own text)
    started = time.monotonic()
    again = cache.submit(None, code, TESTS).result()
    assert again is first and time.monotonic() - started < 0.05  # answered, not run (a sandbox run takes ~50+ ms)
    assert (cache.lookups, cache.hits) == (3, 1) and cache.hit_rate() == pytest.approx(1 / 3)


def test_fork_bomb_and_infinite_loop_revisions_score_zero_and_scoring_goes_on():
    fork_bomb = "```python\nimport os\ndef add(a, b):\n    while True:\n        os.fork()\n```"
    fork_bomb_at_import = "```python\nimport os\nwhile True:\n    os.fork()\ndef add(a, b):\n    return a + b\n```"
    endless = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    cache = ResultCache()
    with SandboxPool(2) as pool:
        started = time.monotonic()
        for revision in (fork_bomb, fork_bomb_at_import, endless):
            reward, info = _score(CRITIQUE_RIGHT, revision, cache=cache, pool=pool)
            assert reward == 0.0 and not info["success"], info
        assert time.monotonic() - started < 60
        assert _score(CRITIQUE_RIGHT, RIGHT, cache=cache, pool=pool)[0] == 1.0  # the next revision scores as usual
