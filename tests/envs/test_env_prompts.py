"""The prompts env (envs/prompts.py): rows from JSONL, Parquet and datasets folders, chat prompts, held-out
rows that never mix with training, scoring in batches, per-reward values reaching reward/<name>, the final
evaluation, and the checks made before a run starts."""
import json
import pickle

import numpy as np
import pytest
import torch

from async_rl.actors.stats import StatsAggregator
from async_rl.errors import ConfigError
from async_rl.orchestration.metrics import snapshot_scalars
from envs import final_evaluation_for, make_task_set
from envs._prompt_rows import NEEDS_PROMPT, read_rows

TRAIN = [{"prompt": f"What is {a} + 1?", "answer": a + 1, "level": "easy"} for a in range(10)]
HELDOUT = [{"prompt": f"Add one to {a}.", "answer": a + 1, "level": "easy"} for a in range(5)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def files(tmp_path):
    return write_jsonl(tmp_path / "train.jsonl", TRAIN), write_jsonl(tmp_path / "heldout.jsonl", HELDOUT)


def test_jsonl_rows_starts_and_scoring(files):
    train, heldout = files
    ts = make_task_set("prompts", data=train, heldout_data=heldout, rewards=["math"], seed=1)
    assert (ts.task_names, ts.max_episode_steps, ts.heldout_count()) == (["prompts"], 1, 5)
    assert len(pickle.dumps(ts)) < 4000 and ts.obs_spec["text"] and ts.obs_spec["example_prompts"]
    a, b, c = ts.make_env(0, seed=5), ts.make_env(0, seed=5), ts.make_env(0, seed=6)
    assert [a.reset() for _ in range(8)] == [b.reset() for _ in range(8)] != [c.reset() for _ in range(8)]
    assert a.reset(start=13) == c.reset(start=13) == {"prompt": TRAIN[3]["prompt"]}  # a group's members: one row
    assert {a.reset()["prompt"] for _ in range(200)} == {r["prompt"] for r in TRAIN}
    a.reset(start=2)
    obs, reward, terminated, truncated, info = a.step("2 + 1 = 3")
    assert (reward, terminated, truncated, info) == (1.0, True, False, {"success": True, "reason": "correct",
                                                                         "rewards": {"math": 1.0}})
    a.reset(start=2)
    assert a.step("it is 4")[1] == 0.0
    assert a.counters() == {"prompts_correct": 1, "prompts_wrong": 1, "prompts_no_answer": 0, "completions": 2,
                          "completion_tokens": 0}  # text responses count no tokens
    assert a.reward_components() == {"math": [1.0, 0.0], "total": [1.0, 0.0]} and a.reward_components() == {}
    held = make_task_set("prompts", data=train, heldout_data=heldout, split="heldout").make_env(0, seed=0)
    assert {held.reset()["prompt"] for _ in range(100)} == {r["prompt"] for r in HELDOUT}


def test_a_worker_batch_is_scored_in_one_call_per_reward(files, tmp_path, monkeypatch):
    (tmp_path / "counting_rewards.py").write_text(
        "CALLS = []\n"
        "def seen(prompts, completions, level, **kwargs):\n"
        "    CALLS.append(len(completions))\n"
        "    return [float(len(c)) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    train, heldout = files
    ts = make_task_set("prompts", data=train, heldout_data=heldout, rewards=["counting_rewards:seen=0.5", "math"])
    import counting_rewards

    counting_rewards.CALLS.clear()
    envs = [ts.make_env(0, seed=s) for s in range(4)]
    for k, env in enumerate(envs):  # as the rollout worker does: prepare all, then step each
        env.reset(start=k)
        env.prepare_step("x" * (k + 1))
    results = [env.step("x" * (k + 1)) for k, env in enumerate(envs)]
    assert counting_rewards.CALLS == [4]
    assert [r[1] for r in results] == [0.5 * (k + 1) for k in range(4)]
    # The first reward decides success (it gives no reasons: solved / unsolved).
    assert results[0][4]["rewards"] == {"seen": 1.0, "math": 0.0} and results[0][4]["reason"] == "solved"


def test_success_reward_names_a_reward_as_written(files, tmp_path, monkeypatch):
    (tmp_path / "named_rewards.py").write_text("def exact(completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    monkeypatch.chdir(tmp_path)
    train, heldout = files
    rewards = ["math", "named_rewards:exact=2"]
    assert make_task_set("prompts", data=train, heldout_data=heldout, rewards=rewards).success_reward == "math"
    chosen = make_task_set("prompts", data=train, heldout_data=heldout, rewards=rewards, success_reward="exact")
    assert chosen.success_reward == "exact"  # an import path by its function, as reward/exact is logged
    with pytest.raises(ConfigError) as err:  # the options refuse it, before any file is read
        make_task_set("prompts", data=train, heldout_data=heldout, rewards=rewards, success_reward="named_rewards")
    assert str(err.value) == ("success_reward 'named_rewards' is not one of the rewards (math, exact); name one of "
                              "them (an import path by its function) or leave it null for the first")


def test_parquet_and_datasets_folders_and_chat_prompts(tmp_path):
    import datasets

    chat = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in TRAIN]
    datasets.Dataset.from_list(chat).to_parquet(str(tmp_path / "train.parquet"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(TRAIN),
                          "test": datasets.Dataset.from_list(HELDOUT)}).save_to_disk(str(tmp_path / "saved"))

    ts = make_task_set("prompts", data=str(tmp_path / "train.parquet"), heldout_data=str(tmp_path / "saved"))
    env = ts.make_env(0, seed=0)
    assert env.reset(start=1) == {"prompt": chat[1]["prompt"]}  # the messages whole: the preprocessor templates them
    assert env.step("2")[1] == 1.0
    assert ts.heldout.split == "test" and ts.heldout_count() == 5

    folder = make_task_set("prompts", data=str(tmp_path / "saved"))  # the held-out split of the same folder
    assert folder.train.split == "train" and folder.heldout.split == "test"
    assert folder.make_env(0, seed=0).reset(start=0) == {"prompt": TRAIN[0]["prompt"]}
    with pytest.raises(ConfigError, match="split 'validation' is not one of them"):
        make_task_set("prompts", data=str(tmp_path / "saved"), heldout_split="validation")


def test_bad_data_is_one_line_before_anything_runs(files, tmp_path):
    train, heldout = files
    cases = [
        (dict(data=str(tmp_path / "none.jsonl"), heldout_data=heldout), "no such file"),
        (dict(data=train), "pass --heldout-data"),
        (dict(data=write_jsonl(tmp_path / "rows.txt", [{"prompt": "x?"}]), heldout_data=heldout),
         r"option 'data' = .*rows.txt': unknown format .txt; pass a .jsonl file"),
        (dict(data=train, heldout_data=str(tmp_path / "none.parquet")), "option 'heldout_data' = .*: no such file or folder"),
        (dict(data=train, heldout_data=write_jsonl(tmp_path / "h.jsonl", [{"prompt": "What is 9 +  1?", "answer": 10}])),
         "share 1 prompt"),
        (dict(data=train, heldout_data=write_jsonl(tmp_path / "n.jsonl", [{"prompt": "x?"}])),
         r"reward math needs column\(s\) answer, which .*n.jsonl line 1 lacks"),
        (dict(data=write_jsonl(tmp_path / "p.jsonl", [{"question": "x?"}]), heldout_data=heldout), "needs a \"prompt\""),
        (dict(data=train, heldout_data=heldout, rewards=["code_tests"]), "needs column\\(s\\) tests"),
        (dict(data=train, heldout_data=heldout, success_reward="format"), "success_reward 'format'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            make_task_set("prompts", **kwargs)


def test_files_without_rows_are_one_line_naming_the_flag_and_file(tmp_path):
    import datasets

    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    (tmp_path / "folder").mkdir()
    datasets.DatasetDict({"train": datasets.Dataset.from_list(TRAIN)}).save_to_disk(str(tmp_path / "saved"))
    for path, split, problem in (
            ("empty.jsonl", None, "empty.jsonl: no rows in it"),
            ("junk.parquet", None, "junk.parquet: not a readable Parquet file"),
            ("folder", None, "folder: a folder but not one datasets' save_to_disk wrote; pass a .jsonl file"),
            ("saved", "test", r"saved \(split test\): a DatasetDict with splits train; split 'test' is not one of them")):
        with pytest.raises(ConfigError, match=f"^--heldout-data .*{problem}") as caught:
            read_rows(str(tmp_path / path), split, "--heldout-data")
        assert len(str(caught.value).splitlines()) == 1


def test_reward_components_reach_tensorboard_tags():
    stats = StatsAggregator()
    stats.record_reward_components({"math": [1.0, 0.0], "total": [1.0, 0.0]})
    stats.record_reward_components({"math": [1.0, 1.0], "total": [1.0, 1.0]})
    tags = snapshot_scalars({"stats": stats.snapshot(), "replay": {}, "inference": {}})
    assert tags["reward/math"] == tags["reward/total"] == 0.75
    assert tags["reward/math_std"] == pytest.approx(np.std([1, 0, 1, 1]))
    assert "reward/math" not in snapshot_scalars({"stats": stats.snapshot(), "replay": {}, "inference": {}})


def test_final_evaluation_reports_each_reward(files):
    train, heldout = files
    ts = make_task_set("prompts", data=train, heldout_data=heldout, rewards=["math", "length=0.5"], heldout_size=3)
    index = {r["prompt"]: i for i, r in enumerate(HELDOUT)}
    answers = [str(r["answer"]) for r in HELDOUT]
    answers[1] = "wrong"

    def preprocess(obs, task_name):  # the policy's input: which held-out prompt it was asked
        return torch.tensor([index[obs["prompt"]]])

    def act(batch, deterministic):  # a policy that answers text (the env decodes token ids otherwise)
        assert deterministic
        return [answers[int(i)] for i in batch[:, 0]]

    report = final_evaluation_for("prompts")(ts, act, preprocess, 0)
    assert report["scalars"]["eval/heldout_reward/math"] == pytest.approx(2 / 3)
    assert report["scalars"]["eval/heldout_reward/length"] == 0.0
    assert report["scalars"]["eval/heldout_success"] == pytest.approx(2 / 3)
    rows = report["files"]["eval_problems.json"]
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in HELDOUT[:3]] and rows[1]["rewards"]["math"] == 0.0


@pytest.mark.parametrize("line, problem", [
    ('{"prompt": "  ", "answer": 1}', "an empty prompt"),
    ('{"prompt": [{"role": "user", "content": "1 + 1?"}, {"role": "system", "content": "Be brief."}]}',
     "a chat prompt is an optional system message, then messages ending with the user's; got roles ['user', 'system']"),
    ('{"question": "x?", "answer": 1}',
     NEEDS_PROMPT + " (its keys: question, answer; another column is named with --env.prompt-column NAME)"),
    ('{"prompt": [], "answer": 1}', NEEDS_PROMPT),
    ('{"prompt": [{"role": "user"}], "answer": 1}', NEEDS_PROMPT),
    ('{"prompt": 7, "answer": 1}', NEEDS_PROMPT),
    ('["x?", 1]', 'a row must be a JSON object with a "prompt"'),
])
def test_a_row_the_schema_refuses_is_one_line_naming_the_flag_file_line_and_fix(tmp_path, line, problem):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "fine?", "answer": 1}\n' + line + "\n")
    with pytest.raises(ConfigError) as err:
        read_rows(str(path), None, "--heldout-data")
    assert str(err.value) == f"--heldout-data {path} line 2: {problem}"


def test_a_rows_other_columns_and_message_keys_are_kept(tmp_path):
    row = {"prompt": [{"role": "user", "content": "1 + 1?", "name": "u"}], "answer": 2, "meta": {"level": 1}}
    assert read_rows(write_jsonl(tmp_path / "rows.jsonl", [row])).rows == (row,)


def _launch():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("ds_lm_grpo_bad_input", Path(__file__).resolve().parents[2] / "launch" / "ds_lm_grpo.py")
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    return launch


def test_the_launchs_shorthands_are_the_prompts_envs_option_flags(files, tmp_path, monkeypatch):
    from async_rl.config import load_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "2024").mkdir()
    (tmp_path / "2024" / "dataset_dict.json").write_text("{}")  # a saved DatasetDict folder named 2024

    launch, (train, heldout) = _launch(), files
    rest = launch.expand_shorthands(["--data", train, "--reward", "math", "--max-epochs", "1", "--reward", "length=0.5",
                                     "--heldout-data", heldout])
    cfg = load_config(rest, str(launch.CONFIG))
    assert (cfg.env, cfg.max_epochs, cfg.log_dir) == ("prompts", 1, "runs/lm_prompts")  # configs/lm_prompts.yaml
    assert {k: cfg.env_kwargs[k] for k in ("data", "heldout_data", "rewards")} == {
        "data": train, "heldout_data": heldout, "rewards": ["math", "length=0.5"]}
    assert load_config(launch.expand_shorthands(["--data", "2024", "--env", "prompts"]),
                       str(launch.CONFIG)).env_kwargs["data"] == "2024"  # a path, whatever YAML makes of it
    assert launch.expand_shorthands(["--env", "humaneval", "--max-epochs", "1"]) == ["--env", "humaneval", "--max-epochs", "1"]


def test_the_launch_refuses_bad_input_in_one_line_before_ray(files, tmp_path, monkeypatch, capsys):
    import ray

    launch = _launch()
    train, heldout = files
    system = [{"prompt": [{"role": "user", "content": "1 + 1?"}, {"role": "system", "content": "Be brief."}], "answer": 2}]
    (tmp_path / "broken_rewards.py").write_text("import a_module_that_is_not_installed\n")
    monkeypatch.chdir(tmp_path)
    cases = [
        (["--data", "missing.jsonl", "--heldout-data", heldout], "no such file"),
        (["--data", train], "no held-out rows; pass --heldout-data FILE"),
        (["--data", train, "--heldout-data", write_jsonl(tmp_path / "q.jsonl", [{"prompt": "x?"}])], "needs column(s) answer"),
        (["--data", train, "--heldout-data", heldout, "--reward", "maths"], "unknown reward 'maths'"),
        (["--data", train, "--heldout-data", heldout, "--reward", "broken_rewards:f"], "does not import"),
        (["--data", train, "--heldout-data", train], "share 10 prompt(s)"),
        (["--heldout-data", heldout, "--reward", "math"],
         "env prompts needs its training rows: --data FILE (JSONL, Parquet or a datasets folder)"),
        (["--env", "prompts", "--env-kwargs", "{data: null}"], "env prompts needs its training rows: --data FILE"),
        (["--env", "humaneval", "--data", train], "--data, --heldout-data and --reward are options of --env prompts, "
                                                  "not --env humaneval"),
        (["--data", write_jsonl(tmp_path / "s.jsonl", system), "--heldout-data", heldout],
         "s.jsonl line 1: a chat prompt is an optional system message, then messages ending with the user's"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_:
            launch.main([*argv, "--log-dir", str(tmp_path / "run")])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


# ---- TRL's arguments reach the env's rewards; data options ----
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def tiny_model_folder(tmp_path):
    """A model folder with only a character tokenizer and a chat template that writes each message's role."""
    from test_lm_model_families import char_tokenizer

    tokenizer = char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(str(tmp_path / "tiny"))
    return str(tmp_path / "tiny"), tokenizer


def test_env_rewards_get_completion_ids_and_the_policy_version(files, tiny_model_folder, tmp_path, monkeypatch):
    (tmp_path / "step_rewards.py").write_text(
        "SEEN = []\n"
        "def recorder(completions, completion_ids, trainer_state, answer, **kwargs):\n"
        "    SEEN.append((list(completion_ids), trainer_state.global_step, list(answer)))\n"
        "    return [float(len(ids)) for ids in completion_ids]\n")
    monkeypatch.chdir(tmp_path)
    folder, tokenizer = tiny_model_folder
    train, heldout = files
    ts = make_task_set("prompts", data=train, heldout_data=heldout, rewards=["step_rewards:recorder"],
                       tokenizer_path=folder)
    import step_rewards

    step_rewards.SEEN.clear()
    env = ts.make_env(0, seed=0)
    env.set_policy_version(7)  # as the rollout worker does with each answer's policy_version
    env.reset(start=4)
    ids = tokenizer("5", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert env.step(np.array(ids + [-1, -1]))[1] == 2.0  # the action's ids, padding dropped, eos kept
    env.set_policy_version(8)
    env.reset(start=1)
    assert env.step("2 + 0")[1] == 5.0  # text: tokenized by the policy's tokenizer
    assert step_rewards.SEEN == [([ids], 7, [5]), ([tokenizer("2 + 0", add_special_tokens=False)["input_ids"]], 8, [2])]


def test_the_rollout_worker_tells_its_envs_the_policy_version_that_acted(files, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from async_rl.actors.rollout_worker import RolloutWorker

    (tmp_path / "version_rewards.py").write_text(
        "def step(completions, trainer_state, **kwargs):\n"
        "    return [float(trainer_state.global_step)] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    train, heldout = files
    ts = make_task_set("prompts", data=train, heldout_data=heldout, rewards=["version_rewards:step"])
    slots = [SimpleNamespace(env=ts.make_env(0, seed=s), task=0) for s in range(2)]
    for k, slot in enumerate(slots):
        slot.env.reset(start=k)
    worker = SimpleNamespace(preprocess=lambda obs, task_name: obs, task_names=["prompts"])
    results, _ = RolloutWorker._step_in_thread(worker, slots, np.array(["1", "2"]), [12, 12])
    assert [r[1] for r in results] == [12.0, 12.0]

def test_a_chat_prompts_system_message_reaches_the_chat_template(tiny_model_folder):
    from async_rl.policies.causal_lm import ChatPreprocessor

    folder, tokenizer = tiny_model_folder
    preprocess = ChatPreprocessor({"text": True}, folder, max_prompt_tokens=96, system_prompt="Think.")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 1?"}]

    def text(obs):  # one character a token: the template's output as it was tokenized
        return "".join(tokenizer.convert_ids_to_tokens(obs["input_ids"][obs["attention_mask"].bool()].tolist()))

    assert text(preprocess({"prompt": chat})) == "<system>Be brief.|<user>1 + 1?|<assistant>"
    assert text(preprocess({"prompt": chat[1:]})) == "<system>Think.|<user>1 + 1?|<assistant>"
    assert text(preprocess({"prompt": "1 + 1?"})) == "<system>Think.|<user>1 + 1?|<assistant>"


def test_chat_rows_with_a_system_message_are_kept_whole(files, tmp_path):
    chat = [{"prompt": [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": r["prompt"]}],
             "answer": r["answer"]} for r in TRAIN]
    ts = make_task_set("prompts", data=write_jsonl(tmp_path / "chat.jsonl", chat), heldout_data=files[1])
    env = ts.make_env(0, seed=0)
    assert env.reset(start=3) == {"prompt": chat[3]["prompt"]}
    assert env.step("4")[4]["rewards"] == {"math": 1.0}
    assert chat[9]["prompt"] in ts.obs_spec["example_prompts"]  # the policy checks they fit, system message included


def test_the_prompt_column_option_names_the_prompt(tmp_path, monkeypatch):
    (tmp_path / "column_rewards.py").write_text(
        "def exact(completions, solution, **kwargs):\n"
        "    assert 'question' not in kwargs and 'prompt' not in kwargs\n"
        "    return [float(c == s) for c, s in zip(completions, solution)]\n")
    monkeypatch.chdir(tmp_path)
    rows = [{"question": f"{a} + 1?", "solution": str(a + 1)} for a in range(6)]
    train, heldout = write_jsonl(tmp_path / "q.jsonl", rows[:4]), write_jsonl(tmp_path / "qh.jsonl", rows[4:])
    ts = make_task_set("prompts", data=train, heldout_data=heldout, rewards=["column_rewards:exact"],
                       prompt_column="question")
    env = ts.make_env(0, seed=0)
    assert env.reset(start=2) == {"prompt": "2 + 1?"}
    assert env.step("3")[1] == 1.0
    with pytest.raises(ConfigError) as err:
        make_task_set("prompts", data=train, heldout_data=heldout, rewards=["column_rewards:exact"])
    assert str(err.value) == (f"--data {train} line 1: {NEEDS_PROMPT} (its keys: question, solution; another column "
                              "is named with --env.prompt-column NAME)")
    with pytest.raises(ConfigError) as err:
        make_task_set("prompts", data=train, heldout_data=heldout, rewards=["column_rewards:exact"], prompt_column="query")
    assert str(err.value) == (f"--data {train} line 1: has no prompt column 'query' (its keys: question, solution); "
                              "name the prompt column with --env.prompt-column NAME")
    with pytest.raises(ConfigError) as err:  # TRL's (completions, solution, **kwargs) shape: the same clear line
        make_task_set("prompts", data=write_jsonl(tmp_path / "p.jsonl", TRAIN), heldout_data=write_jsonl(
            tmp_path / "ph.jsonl", HELDOUT), rewards=["column_rewards:exact"])
    assert str(err.value).startswith("reward exact needs column(s) solution, which ")
    assert str(err.value).endswith(" line 1 lacks (its columns: answer, level)")


def test_the_held_out_split_is_found_or_named_in_one_line(tmp_path):
    import datasets

    def saved(name, **splits):
        datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(str(tmp_path / name))
        return str(tmp_path / name)

    validation = saved("v", train=TRAIN, validation=HELDOUT)
    ts = make_task_set("prompts", data=validation)
    assert (ts.train.split, ts.heldout.split, ts.heldout_count()) == ("train", "validation", 5)
    both = saved("b", train=TRAIN, validation=HELDOUT[:2], test=HELDOUT)
    assert make_task_set("prompts", data=both).heldout.split == "test"
    assert make_task_set("prompts", data=both, heldout_split="validation").heldout_count() == 2
    other = saved("o", train=TRAIN, dev=HELDOUT)
    with pytest.raises(ConfigError) as err:
        make_task_set("prompts", data=other)
    assert str(err.value) == (f"--data {other}: a DatasetDict with splits train, dev and no held-out split (test or "
                              "validation); set --env.heldout-split NAME or pass --heldout-data FILE")
    assert make_task_set("prompts", data=other, heldout_split="dev").heldout.split == "dev"
