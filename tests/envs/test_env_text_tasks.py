"""The built-in text tasks, arithmetic and humaneval (the prompts env over generated rows): splits, seeding,
group starts, scoring, counters."""
import pickle

import numpy as np
import pytest

from async_rl.errors import ConfigError
from async_rl.rewards.code_tests import shared_pool
from envs import available_envs, make_task_set
from envs.arithmetic import arithmetic_reward, heldout_capacity, heldout_problems, is_heldout
from envs.humaneval import HELDOUT_TASK_IDS, code_reward, humaneval_problems


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A tiny byte-level BPE tokenizer saved as a Hugging Face folder (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["17 + 25 = 42", "def add(a, b):\n    return a + b", "```python\n```"], trainer)
    folder = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>").save_pretrained(folder)
    return str(folder)


def _ids(tokenizer_dir, text, pad=4):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return np.array(ids + [-1] * pad, dtype=np.int64)  # the eos is skipped, the padding dropped


def test_registered_and_picklable():
    assert {"arithmetic", "humaneval"} <= set(available_envs())
    for name in ("arithmetic", "humaneval"):
        ts = make_task_set(name, split="heldout", seed=3)
        assert (ts.task_names, ts.obs_dim, ts.action_dim, ts.max_episode_steps, ts.obs_spec) == \
            ([name], 0, 1, 1, {"text": True})
        assert len(pickle.dumps(ts)) < 2000
    with pytest.raises(ConfigError, match="split"):
        make_task_set("arithmetic", split="test")
    with pytest.raises(ConfigError, match="difficulty"):
        make_task_set("arithmetic", difficulty=9)
    with pytest.raises(ConfigError, match="heldout_sizes"):
        make_task_set("humaneval", heldout_sizes=3)


def test_arithmetic_splits_never_mix():
    for difficulty in (1, 2, 5):
        held = heldout_problems(200, difficulty)
        assert len({p["expr"] for p in held}) == 200 and all(is_heldout(p["expr"]) for p in held)
        assert heldout_problems(50, difficulty) == held[:50]  # a fixed list
        env = make_task_set("arithmetic", difficulty=difficulty, seed=1).make_env(0, seed=7)
        prompts = {env.reset()["prompt"] for _ in range(1000)} | {env.reset(start=s)["prompt"] for s in range(1000)}
        assert not prompts & {p["prompt"] for p in held}
    # and across difficulties: the split is a property of the expression alone
    train_1 = make_task_set("arithmetic", difficulty=1).make_env(0, seed=0)
    assert not {train_1.reset()["prompt"] for _ in range(2000)} & {p["prompt"] for p in heldout_problems(200, 2)}


def test_arithmetic_heldout_size_is_bounded_by_the_difficulty():
    assert heldout_capacity(1) == 497 and len(heldout_problems(497, 1)) == 497  # the whole pool is drawn
    assert heldout_capacity(5) > 10**6  # a large level's pool is half its expected share: never in the way
    with pytest.raises(ConfigError) as err:  # the options refuse it: one line before anything is built
        make_task_set("arithmetic", difficulty=1, heldout_size=498)
    message = str(err.value)
    assert "\n" not in message and message.startswith("arithmetic heldout_size 498: difficulty 1 has only 497")
    assert "set heldout_size <= 497 or raise the difficulty" in message
    with pytest.raises(ValueError, match=r"n must be 1\.\.497 at difficulty 1, got 498"):
        heldout_problems(498, 1)


def test_arithmetic_seeding_and_group_starts():
    ts = make_task_set("arithmetic", difficulty=3)
    a, b, c = ts.make_env(0, seed=5), ts.make_env(0, seed=5), ts.make_env(0, seed=6)
    seq_a, seq_b, seq_c = ([e.reset()["prompt"] for _ in range(20)] for e in (a, b, c))
    assert seq_a == seq_b and seq_a != seq_c
    assert a.reset(start=11) == c.reset(start=11) and a.reset(start=11) != a.reset(start=12)
    held = make_task_set("arithmetic", split="heldout", heldout_size=30).make_env(0, seed=0)
    assert held.reset(start=31)["prompt"] == heldout_problems(30, 2)[1]["prompt"]


def test_arithmetic_scoring_by_text_and_by_token_ids(tokenizer_dir):
    assert arithmetic_reward("17 + 25 = 42.", 42) == 1.0 and arithmetic_reward("-8", -8) == 1.0
    assert arithmetic_reward("1,234", 1234) == 1.0 and arithmetic_reward("63 - 88 = \u221225", -25) == 1.0
    assert arithmetic_reward("17 + 25 = 42", 42) == 1.0 and arithmetic_reward("42.0", "42") == 1.0
    assert arithmetic_reward("17 + 25 = 32", 42) == 0.0 and arithmetic_reward("forty-two", 42) == 0.0
    # Issue 48 item 8: a sign detached from its number; an answer followed by a check of it.
    assert arithmetic_reward("63 - 88 = - 25", -25) == 1.0 and arithmetic_reward("63 - 88 = - 25", 25) == 0.0
    assert arithmetic_reward("The answer is 42. Check: 40 + 2.", 42) == 1.0

    env = make_task_set("arithmetic", tokenizer_path=tokenizer_dir).make_env(0, seed=0)
    env.reset()
    env.problem.update(answer=42)  # pin the answer for the texts below
    obs, reward, terminated, truncated, info = env.step(_ids(tokenizer_dir, "17 + 25 = 42"))
    assert (reward, terminated, truncated, info["success"], info["reason"]) == (1.0, True, False, True, "correct")
    assert set(obs) == {"prompt"}
    env.reset()
    env.problem.update(answer=42)
    assert env.step("17 + 25 = 32")[1] == 0.0
    env.reset()
    assert env.step("I do not know")[4]["reason"] == "no_answer"
    assert env.counters() == {"arithmetic_correct": 1, "arithmetic_wrong": 1, "arithmetic_no_answer": 1, "completions": 3,
                              "completion_tokens": len(_ids(tokenizer_dir, "17 + 25 = 42")) - 4}  # ids less padding
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")
    no_tok = make_task_set("arithmetic").make_env(0, seed=0)
    no_tok.reset()
    with pytest.raises(ConfigError, match="tokenizer_path"):
        no_tok.step(np.array([1, 2], dtype=np.int64))


def test_humaneval_splits_and_starts():
    held, train = humaneval_problems("heldout"), humaneval_problems("train")
    assert len(held) == len(HELDOUT_TASK_IDS) == 33 and len(train) == 131
    assert {p["task_id"] for p in held} == set(HELDOUT_TASK_IDS)
    assert not {p["task_id"] for p in held} & {p["task_id"] for p in train}
    ts = make_task_set("humaneval")
    a, b = ts.make_env(0, seed=1), ts.make_env(0, seed=2)
    assert a.reset(start=140) == b.reset(start=140) == {"prompt": train[140 % 131]["prompt"]}
    seen = {a.reset()["prompt"] for _ in range(300)}
    assert not seen & {p["prompt"] for p in held}
    assert "```python" in train[0]["prompt"] and all(p["tests"] for p in held + train)


def test_humaneval_canonical_solutions_pass_every_assert():
    problems = humaneval_problems("train") + humaneval_problems("heldout")
    jobs = [(p["prefix"] + "\n\n" + p["code_prompt"] + p["canonical_solution"], p["tests"]) for p in problems]
    results = shared_pool().map(jobs, timeout_s=20.0)  # generous: this machine is shared
    failed = [(p["task_id"], r) for p, r in zip(problems, results) if (r.passed, r.reason) != (r.total, "ok")]
    assert not failed


def test_humaneval_scoring(tokenizer_dir):
    problem = humaneval_problems("train")[0]  # HumanEval/1: separate_paren_groups
    right = f"```python\n{problem['code_prompt']}{problem['canonical_solution']}```"
    wrong = "Here:\n```python\ndef separate_paren_groups(paren_string):\n    return [paren_string]\n```"
    assert code_reward(right, problem["tests"], prefix=problem["prefix"]).fraction == 1.0
    result = code_reward(wrong, problem["tests"], shared_pool(), problem["prefix"])
    assert result.reason == "ok" and result.fraction < 1.0
    assert code_reward("no code here", problem["tests"]).reason == "no_code"

    env = make_task_set("humaneval", tokenizer_path=tokenizer_dir).make_env(0, seed=0)
    env.reset(start=0)
    assert env.step(_ids(tokenizer_dir, right))[1:3] == (1.0, True)
    env.reset(start=0)
    _, reward, _, _, info = env.step(wrong)
    assert 0.0 <= reward < 1.0 and not info["success"] and info["rewards"] == {"code_tests": reward}
    env.reset(start=0)
    assert env.step("I would write a loop.")[4]["reason"] == "no_code"
    env.reset(start=0)
    env.prepare_step("```python\ndef separate_paren_groups(:\n```")  # as the rollout worker does
    assert env.step("```python\ndef separate_paren_groups(:\n```")[1] == 0.0
    counts = env.counters()
    assert (counts["humaneval_ok"], counts["humaneval_no_code"], counts["humaneval_syntax_error"]) == (2, 1, 1)
    assert counts["humaneval_timeout"] == 0


def test_a_missing_tokenizer_path_is_one_line(tmp_path):
    from envs._text import load_tokenizer

    with pytest.raises(ConfigError, match=r"tokenizer_path .*none: no such directory; pass the model's folder or its "
                                          r"\.gguf file"):
        load_tokenizer(str(tmp_path / "none"))


def test_arithmetic_final_evaluation_answers_every_heldout_problem_greedily():
    """The arithmetic env's final evaluation (the prompts env's, over the generated held-out problems): each
    problem answered once, greedily, scored by value; what a run logs as eval/heldout_*."""
    import torch

    from envs import final_evaluation_for

    held = heldout_problems(4, 1)
    index = {p["prompt"]: i for i, p in enumerate(held)}
    answers = [str(p["answer"]) for p in held]
    answers[2] = "I think it is 1000"

    def preprocess(obs, task_name):  # which held-out prompt the policy was asked
        return torch.tensor([index[obs["prompt"]]])

    def act(batch, deterministic):
        assert deterministic
        return [answers[int(i)] for i in batch[:, 0]]

    ts = make_task_set("arithmetic", difficulty=1, heldout_size=4)
    report = final_evaluation_for("arithmetic")(ts, act, preprocess, 0)
    assert report["scalars"]["eval/heldout_reward"] == pytest.approx(3 / 4)
    assert report["scalars"]["eval/heldout_success"] == pytest.approx(3 / 4)
    rows = report["files"]["eval_problems.json"]
    assert [r["prompt"] for r in rows] == [p["prompt"] for p in held] and rows[2]["reward"] == 0.0
