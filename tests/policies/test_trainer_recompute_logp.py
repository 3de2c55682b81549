"""A real trainer rank (DeepSpeed ZeRO-2, gloo) on a tiny causal LM: with recompute_logp the behaviour log-probs
are the trainer's own before the update (the sampler's numerics no longer count as a policy change), and
loss_agg global-token-mean counts each optimiser step's tokens before its micro-batches."""
import functools

import pytest
import ray
import torch
from tensordict import TensorDict
from test_lm_model_families import PROMPTS, save_model

from async_rl.actors.trainer import TrainerActor
from async_rl.config.schema import RunConfig
from async_rl.errors import ConfigError
from async_rl.policies.causal_lm import CausalLMActorCritic, ChatPreprocessor, prepare_causal_lm
from async_rl.weights.rendezvous import find_free_port

SAMPLER_ERROR = 0.5  # what the stored log-probs are off by, as if the sampler computed them otherwise
TIMEOUT = 300


def _cfg(recompute):
    return RunConfig(device="cpu", precision="fp32", num_trainers=1, train_batch_size=2, accumulation_steps=2,
                     super_batch_size=4, replay_capacity=4, updates_per_epoch=1, advantage="grpo", group_size=2,
                     loss_agg="global-token-mean", recompute_logp=recompute, lr_policy=1e-3, warmup_steps=0,
                     trainer_num_cpus=0.5, collective_timeout_s=120.0)


def _records(kwargs):
    policy = CausalLMActorCritic({"text": True}, 1, **kwargs)
    pre = ChatPreprocessor({"text": True}, **kwargs)
    obs = torch.stack([pre({"prompt": p}) for p in PROMPTS])
    torch.manual_seed(3)
    with torch.no_grad():
        out = policy.eval().act(obs, torch.tensor([False] * len(PROMPTS)))
    real = policy.action_mask(out["response"])
    n = len(PROMPTS)
    return TensorDict({"obs": obs, "response": out["response"], "logp": out["logp"] - SAMPLER_ERROR * real,
                       "value": torch.zeros(n), "advantage": torch.tensor([1.0, -1.0, 0.5, -0.5]),
                       "group_id": torch.tensor([0, 0, 1, 1]), "reward": torch.zeros(n),
                       "done": torch.ones(n, dtype=torch.bool), "policy_version": torch.zeros(n, dtype=torch.int64)}, [n])


@pytest.mark.parametrize("recompute", [True, False])
def test_recomputed_behaviour_logp_make_the_first_ratio_one(ray_local, tmp_path, recompute):
    folder = save_model(tmp_path, "llama_generation_config")
    kwargs = prepare_causal_lm({"text": True}, 1, str(folder), {"max_new_tokens": 8, "max_prompt_tokens": 24})
    factory = functools.partial(CausalLMActorCritic, {"text": True}, 1, **kwargs)
    cfg = _cfg(recompute)
    trainer = TrainerActor.options(num_cpus=cfg.trainer_num_cpus).remote(0, 1, "127.0.0.1", find_free_port("127.0.0.1"),
                                                                          cfg, factory, None)
    try:
        ray.get(trainer.setup.remote(), timeout=TIMEOUT)
        metrics = ray.get(trainer._train_on.remote(_records(kwargs), 0), timeout=TIMEOUT)
    finally:
        ray.get(trainer.shutdown.remote(), timeout=60)
        ray.kill(trainer)
    # One optimiser step of two micro-batches: both see the weights the batch was recomputed with.
    if recompute:
        assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert metrics["recompute_logp_abs_diff_mean"] == pytest.approx(SAMPLER_ERROR, abs=1e-3)
        assert metrics["recompute_logp_seconds"] > 0
    else:
        assert metrics["ratio_mean"] > 1.5 and "recompute_logp_seconds" not in metrics


def test_recompute_logp_is_refused_where_the_estimator_needs_the_behaviour_logp():
    with pytest.raises(ConfigError, match="recompute_logp does not apply to advantage 'vtrace'"):
        from async_rl.config import load_config

        load_config(["--advantage", "vtrace", "--recompute-logp"])
