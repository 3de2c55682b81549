"""The ctrl_humaneval env as a rollout worker drives it: prepare_step on every env, then step. The revisions
of all envs go to the reviser in ONE call (here a reviser that answers hand-written revisions, so that the
rewards are known), critiques without a judgment line are not revised, the sandbox scores each revision,
a repeated revision is answered by the cache, and the counters say so. Bad options are ConfigErrors."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.errors import ConfigError
from envs import make_task_set

ROOT = Path(__file__).resolve().parents[2]
TASK = "HumanEval/23"  # strlen(string) -> int, a training problem
RIGHT = "```python\ndef strlen(string: str) -> int:\n    return len(string)\n```"
WRONG = "```python\ndef strlen(string: str) -> int:\n    return len(string) + 1\n```"
CRITIQUES = {
    "fix": "Analysis: off by one.\nImprovement suggestions: return len(string).\nOverall judgment: Incorrect",
    "same fix": "Analysis: it adds one.\nImprovement suggestions: drop the + 1.\nOverall judgment: Incorrect",
    "break": "Analysis: fine.\nImprovement suggestions: none.\nOverall judgment: Correct",
    "no line": "Analysis: fine.\nImprovement suggestions: none.",
}


@pytest.fixture(scope="module")
def task_set():
    return make_task_set("ctrl_humaneval", task_ids=[TASK], heldout_cases=2)


def test_revisions_of_all_envs_go_to_the_reviser_in_one_call(task_set):
    calls = []

    def revise(prompts):
        calls.append(len(prompts))
        return [WRONG if "Overall judgment: Correct" in p else RIGHT for p in prompts]

    envs = [task_set.make_env(0, seed=k, revise=revise) for k in range(4)]
    queue = envs[0].queue
    for env in envs[1:]:
        env._queue = queue  # one process, one queue: as the envs of a rollout worker share it
    for env in envs:
        env.reset(start=0)
    actions = [CRITIQUES[k] for k in ("fix", "same fix", "break", "no line")]
    for env, action in zip(envs, actions):
        env.prepare_step(action)
    results = [env.step(action) for env, action in zip(envs, actions)]
    assert calls == [3]  # one call for the three critiques with a judgment line
    rewards = [r[1] for r in results]
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert [r[4]["reason"] for r in results] == ["ok", "ok", "ok", "no_judgment"]
    counts = {}
    for env in envs:
        for key, n in env.counters().items():
            counts[key] = counts.get(key, 0) + n
    assert counts["ctrl_cache_lookups"] == 3 and counts["ctrl_cache_hits"] >= 1  # "same fix" revised the same code
    assert counts["ctrl_no_judgment"] == 1 and counts["ctrl_judgment_missing"] == 1
    case_correct = envs[0].cases[0]["correct"]
    assert counts["ctrl_judgment_right"] == (1 if case_correct else 2)


def test_format_check_off_revises_critiques_without_a_judgment_line():
    task_set = make_task_set("ctrl_humaneval", task_ids=[TASK], format_check=False, heldout_cases=2)
    env = task_set.make_env(0, seed=0, revise=lambda prompts: [RIGHT] * len(prompts))
    env.reset(start=0)
    _, reward, done, _, info = env.step(CRITIQUES["no line"])
    assert (reward, done, info["reason"], info["judgment"]) == (1.0, True, "ok", None)


@pytest.mark.parametrize("options, message", [
    ({"ctrl_reward": "half"}, "option 'ctrl_reward' = 'half': Input should be 'all_pass' or 'pass_rate'"),
    ({"missing_judgment_reward": 1.0}, "option 'missing_judgment_reward' = 1.0: Input should be less than or equal to 0"),
    ({"reviser_batch": 0}, "option 'reviser_batch' = 0: Input should be greater than 0"),
    ({"reviser_model_path": "/no/such/model"}, "--reviser-model-path /no/such/model: no such file or directory"),
    ({"task_ids": ["HumanEval/23", "HumanEval/0", "HumanEval/999"]},  # a held-out id is never trained on
     "option 'task_ids' = ['HumanEval/23', 'HumanEval/0', 'HumanEval/999']: ['HumanEval/0', 'HumanEval/999'] are not "
     "HumanEval training problems (HumanEval/0..163, less every 5th id: those are held out); name training ids, e.g. "
     "HumanEval/23"),
    ({"max_prompt_chars": 10}, "no training or no held-out case left"),
])
def test_bad_options(options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_task_set("ctrl_humaneval", **options)


def test_the_launch_says_a_bad_shorthand_flag_in_one_line_before_ray():
    done = subprocess.run([sys.executable, str(ROOT / "launch" / "ds_ctrl_grpo.py"), "--ctrl-reward", "half"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.strip() == ("error: ctrl_humaneval env option 'ctrl_reward' = 'half': "
                                                            "Input should be 'all_pass' or 'pass_rate'")
