"""Reward functions (async_rl/rewards): the built-ins' values, names and weights parsed into specs, user
functions imported by path, and the one-line errors of a reward that raises or returns the wrong shape."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.errors import ConfigError
from async_rl.rewards import REWARDS
from async_rl.rewards.functions import parse_reward_specs, required_columns
from async_rl.rewards.scoring import RewardFunctionError, RewardSet, TrainerState, dry_run

ROOT = Path(__file__).resolve().parents[2]


def _call(name, completions, **columns):
    return REWARDS.get(name)()(prompts=["q"] * len(completions), completions=completions, **columns)


def test_math_reads_answers_as_written():
    texts = ["17 + 25 = 42", "The answer is 42. Check: 40 + 2.", "42.0", "$\\boxed{42}$", "17 + 25 = 32",
             "I do not know", "forty-two"]
    assert _call("math", texts, answer=[42] * len(texts)) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    # A sign detached from its number, and a unicode minus, are the number's sign (issue 48, item 8).
    negatives = ["63 - 88 = - 25", "63 - 88 = \u221225", "- 25", "63 - 88 = 25"]
    assert _call("math", negatives, answer=[-25] * 4) == [1.0, 1.0, 1.0, 0.0]
    # Restating the question is no answer: math-verify alone evaluates "49 - 19" and scores it right.
    assert _call("math", ["To evaluate 49 - 19, we need to find the difference", "49 - 19 = 30", "(3) * (4)"],
                 answer=[30, 30, 12]) == [0.0, 1.0, 0.0]
    # LaTeX fractions against a plain answer, and an answer given as LaTeX.
    assert _call("math", ["so $\\frac{1}{2}$", "0.5", "\\boxed{\\frac{2}{3}}"], answer=["1/2", "0.5", "\\frac{2}{3}"]) == \
        [1.0, 1.0, 1.0]
    math = REWARDS.get("math")()
    math(prompts=["q"] * 3, completions=["5", "6", "no"], answer=[5, 5, 5])
    assert math.last_reasons == ["correct", "wrong", "no_answer"]
    # TRL's conversational form: the completion is a list of messages.
    assert _call("math", [[{"role": "assistant", "content": "It is 7."}]], answer=[7]) == [1.0]


def test_format_and_length():
    assert _call("format", ["so \\boxed{3}", "3"]) == [1.0, 0.0]
    strict = REWARDS.get("format")(pattern=r"<answer>\d+</answer>", full_match=True)
    assert strict(prompts=["q"] * 2, completions=["<answer>3</answer>", "x <answer>3</answer>"]) == [1.0, 0.0]
    length = REWARDS.get("length")(max_chars=10, buffer_chars=4)
    assert length(prompts=["q"] * 4, completions=["a" * 6, "a" * 8, "a" * 10, "a" * 30]) == [0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ConfigError, match="pattern"):
        parse_reward_specs(["format"], {"format": {"pattern": "("}})


def test_code_tests_runs_each_row_against_its_own_tests():
    fn = REWARDS.get("code_tests")(timeout_s=20.0)  # generous: this machine is shared
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    half = "```python\ndef add(a, b):\n    return 3\n```"
    tests = [["assert add(1, 2) == 3", "assert add(2, 2) == 4"]] * 3 + [["assert sub(3, 1) == 2"]]
    values = fn(prompts=["q"] * 4, completions=[good, half, "no code", "```python\ndef sub(a, b):\n    return a - b\n```"],
                tests=tests, prefix=[None, None, None, "import math"])
    assert values == [1.0, 0.5, 0.0, 1.0]
    assert fn.last_reasons[2] == "no_code"


def test_specs_names_weights_and_user_functions(tmp_path, monkeypatch):
    (tmp_path / "byo_rewards_mod.py").write_text(
        "def exact(prompts, completions, answer, **kwargs):\n    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]\n"
        "def loose(prompts, completions, **kwargs):\n    return [0.5] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    specs = parse_reward_specs(["math=2", "byo_rewards_mod:exact", "byo_rewards_mod:loose=-0.5"])
    assert [(s.name, s.weight) for s in specs] == [("math", 2.0), ("exact", 1.0), ("loose", -0.5)]
    assert specs[1].search_dir == str(tmp_path)  # where a Ray worker finds the module again
    rewards = RewardSet(specs)
    assert rewards.missing_columns(["prompt"]) == {"math": ["answer"], "exact": ["answer"]}
    totals, values = rewards.score(["q", "q"], ["4", "5"], [{"prompt": "q", "answer": 4}] * 2, ["row 0", "row 1"])
    assert values == {"math": [1.0, 0.0], "exact": [1.0, 0.0], "loose": [0.5, 0.5]}
    assert totals == [2.0 + 1.0 - 0.25, -0.25]

    for bad, message in ((["maths"], "unknown reward 'maths'"), (["no_such_module_x:f"], "does not import"),
                         (["byo_rewards_mod:missing"], "has no function missing"), (["math=high"], "must be a number"),
                         (["math", "math"], "also the name of"), ([], "no reward given")):
        with pytest.raises(ConfigError, match=message):
            parse_reward_specs(bad)


def test_required_columns_come_from_the_signature():
    def needs(prompts, completions, answer, tests, hint=None, **kwargs):
        return []

    def trl_shape(completions, solution, completion_ids, trainer_state, **kwargs):
        return []

    assert required_columns(needs) == ["answer", "tests"]
    assert required_columns(trl_shape) == ["solution"]
    assert required_columns(REWARDS.get("code_tests")()) == ["tests"]
    assert required_columns(REWARDS.get("format")()) == []


def _set_of(fn):
    rewards = RewardSet([])
    rewards.specs, rewards.functions, rewards.names = [type("S", (), {"name": fn.__name__, "weight": 1.0})()], [fn], [fn.__name__]
    return rewards


@pytest.mark.parametrize("fn, message", [
    (lambda prompts, completions, **kw: [1.0], "returned 1 values for 4 completions"),
    (lambda prompts, completions, **kw: 1.0, "returned float"),
    (lambda prompts, completions, **kw: [float("nan")] * len(completions), "nan"),
    (lambda prompts, completions, **kw: ["1"] * len(completions), "'1'"),
])
def test_a_wrong_shape_names_the_function_and_the_row(fn, message):
    rows = [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}]
    with pytest.raises(RewardFunctionError, match=message) as err:
        dry_run(_set_of(fn), rows, ["data.jsonl line 1", "data.jsonl line 2"])
    assert "reward <lambda>" in str(err.value) and "data.jsonl line 1" in str(err.value)


def test_a_raising_reward_names_the_row_it_raised_on():
    def picky(prompts, completions, answer, **kwargs):
        return [1.0 / (a - 2) for a in answer]

    rows = [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}]
    with pytest.raises(RewardFunctionError, match=r"reward picky raised ZeroDivisionError: .* on data.jsonl line 2$"):
        dry_run(_set_of(picky), rows, ["data.jsonl line 1", "data.jsonl line 2"])


def test_discovering_the_rewards_and_envs_imports_no_heavy_package():
    code = ("import sys\n"
            "from envs import available_envs\n"
            "from async_rl.rewards import REWARDS\n"
            "assert {'math', 'code_tests', 'format', 'length'} <= set(REWARDS.names()) and 'prompts' in available_envs()\n"
            "assert not REWARDS.broken_modules, REWARDS.broken_modules\n"
            "heavy = [m for m in ('math_verify', 'sympy', 'datasets', 'pyarrow', 'ray') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


# ---- TRL 1.x's GRPOTrainer calling convention: reward functions written for TRL, used unchanged ----
TRL_REWARDS = '''
import asyncio
import numpy as np
import torch

SEEN = {}

def lengths(completions, **kwargs):
    SEEN["lengths"] = {k: kwargs[k] for k in ("prompts", "completion_ids", "trainer_state")}
    return [float(len(ids)) for ids in kwargs["completion_ids"]]

def accuracy(completions, solution, **kwargs):
    return [None if s is None else float(c.strip() == s) for c, s in zip(completions, solution)]

def explicit(prompts, completions, completion_ids, trainer_state, solution):
    return [trainer_state.global_step + 0.5 * trainer_state.epoch for _ in completions]

def kinds(completions, **kwargs):
    return [True, np.float32(0.25), torch.tensor(2.0), np.int64(3)][:len(completions)]

async def slow(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]

def never(completions, **kwargs):
    return [None] * len(completions)
'''


@pytest.fixture
def trl_rewards(tmp_path, monkeypatch):
    (tmp_path / "trl_style_rewards.py").write_text(TRL_REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "trl_style_rewards", raising=False)  # this test's file, imported afresh
    yield lambda *names: RewardSet(parse_reward_specs([f"trl_style_rewards:{n}" for n in names]))
    sys.modules.pop("trl_style_rewards", None)


ROWS = [{"prompt": "a?", "solution": "4"}, {"prompt": "b?", "solution": None}, {"prompt": "c?", "solution": "x"}]
WHERE = ["data.jsonl line 1", "data.jsonl line 2", "data.jsonl line 3"]


def test_trl_style_rewards_get_prompts_completion_ids_trainer_state_and_columns(trl_rewards):
    rewards = trl_rewards("lengths", "accuracy=2", "explicit")
    import trl_style_rewards

    state = TrainerState.at(7)
    totals, values = rewards.score(["a?", "b?", "c?"], ["4", "5", "y"], ROWS, WHERE,
                                   completion_ids=[[11, 12, 1], [13], []], trainer_state=state)
    assert trl_style_rewards.SEEN["lengths"] == {"prompts": ["a?", "b?", "c?"], "completion_ids": [[11, 12, 1], [13], []],
                                                 "trainer_state": state}
    assert values == {"lengths": [3.0, 1.0, 0.0], "accuracy": [1.0, None, 0.0], "explicit": [10.5, 10.5, 10.5]}
    # accuracy's None (no solution for the row) is left out of the weighted sum, as TRL's nansum does.
    assert totals == [3.0 + 2.0 + 10.5, 1.0 + 10.5, 0.0 + 0.0 + 10.5]


def test_bools_numpy_and_tensor_values_and_async_rewards(trl_rewards):
    totals, values = trl_rewards("kinds", "slow").score(["q"] * 4, ["a", "bb", "ccc", ""], [{"prompt": "q"}] * 4,
                                                        ["row"] * 4)
    assert values == {"kinds": [1.0, 0.25, 2.0, 3.0], "slow": [1.0, 2.0, 3.0, 0.0]}
    assert totals == [2.0, 2.25, 5.0, 3.0]


def test_an_async_reward_is_awaited_from_a_thread_that_runs_an_event_loop(trl_rewards):
    import asyncio

    async def inside_a_loop():
        return trl_rewards("slow").score(["q"], ["abc"], [{"prompt": "q"}], ["row"])[0]

    assert asyncio.run(inside_a_loop()) == [3.0]


def test_a_row_every_reward_skips_is_one_line_naming_it(trl_rewards):
    with pytest.raises(RewardFunctionError) as err:
        trl_rewards("never", "accuracy").score(["a?", "b?"], ["4", "4"], ROWS[:2], WHERE[:2])
    assert str(err.value) == ("every reward (never, accuracy) returned None on data.jsonl line 2; "
                              "at least one must score each row")


@pytest.mark.parametrize("name", ["accuracy", "explicit"])  # TRL's (completions, solution, **kwargs) and explicit names
def test_a_missing_column_is_one_line_for_every_signature(trl_rewards, name):
    rewards = trl_rewards(name)
    assert rewards.missing_columns(["prompt", "answer"]) == {name: ["solution"]}
    with pytest.raises(RewardFunctionError) as err:
        rewards.score(["a?"], ["4"], [{"prompt": "a?", "answer": 4}], ["data.jsonl line 1"])
    assert str(err.value) == f"reward {name} needs column(s) solution, which data.jsonl line 1 lacks (its columns: answer)"


def test_the_dry_run_passes_stand_in_completion_ids(trl_rewards):
    dry_run(trl_rewards("lengths"), [{"prompt": "a?", "answer": 42}], ["data.jsonl line 1"])
    import trl_style_rewards

    assert trl_style_rewards.SEEN["lengths"]["completion_ids"] == [[], [52, 50]]  # "" and "42" as UTF-8 bytes
    assert trl_style_rewards.SEEN["lengths"]["trainer_state"].global_step == 0


def test_the_built_in_rewards_are_listed_from_one_place():
    """The launch help and the docs name exactly the registered built-ins (the registry is the one list)."""
    from async_rl.rewards import builtin_rewards
    from launch.ds_lm_grpo import usage

    names = builtin_rewards()
    assert {"math", "code_tests", "format", "length"} <= set(names)
    help_list = re.search(r"a built-in \(([^)]*)\) or module:function", usage()).group(1)
    assert help_list.split(", ") == names
    docs = (Path(__file__).resolve().parents[2] / "docs" / "language_models.md").read_text()
    docs_line = re.search(r"\*\*Rewards\*\* \(`async_rl/rewards/`\): (.*?) or\s+`module:function`", docs, re.S).group(1)
    assert sorted(re.findall(r"`(\w+)`", docs_line)) == names
