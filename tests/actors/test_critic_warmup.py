"""Critic warm-up (``critic_warmup_epochs``): the first epochs train the value head alone. The policy's
weights and its AdamW state stay exactly as they were (weight decay would move a stepped weight even
with a zero gradient) and its learning-rate schedule starts after the warm-up. Two real trainer ranks
(DeepSpeed ZeRO-2 over gloo) driven with hand-made super-batches; the objective and the config check."""
import functools

import pytest
import ray
import torch
from trainer_batches import ACTIONS, SPEC, mlp_step_records

from async_rl.actors.trainer import TrainerActor
from async_rl.actors.trainer_setup import warmup_cosine
from async_rl.algo import LossInputs, Objective
from async_rl.config import load_config
from async_rl.config.schema import RunConfig
from async_rl.errors import ConfigError
from async_rl.policies import build_policy
from async_rl.weights.rendezvous import find_free_port

CFG = RunConfig(device="cpu", precision="fp32", num_trainers=2, train_batch_size=4, accumulation_steps=2,
                super_batch_size=8, replay_capacity=8, updates_per_epoch=2, weight_decay=0.1, lr_policy=1e-2,
                lr_value=1e-2, warmup_steps=3, critic_warmup_epochs=1, trainer_num_cpus=0.5, collective_timeout_s=60.0)
TIMEOUT = 180


def _adam_steps(trainer):
    """{group name: AdamW's step count of this rank's flat partition (None: no state)}."""
    def read(self):
        out = {}
        for group in self.optimizer.param_groups:
            state = self.optimizer.state.get(group["params"][0], {})
            out[group["name"]] = float(state["step"]) if state else None
        return out
    return ray.get(trainer.__ray_call__.remote(read), timeout=60)


@pytest.mark.parametrize("cfg", [CFG, RunConfig.model_validate({**CFG.model_dump(), "train_batch_size": 2})],
                         ids=["one_step_per_pass", "two_minibatches_per_pass"])
def test_warmup_epoch_steps_only_the_critic_then_the_policy_starts_fresh(ray_local, cfg):
    steps = cfg.updates_per_epoch * cfg.optimizer_steps_per_update  # optimiser steps per epoch: 2, then 4
    factory = functools.partial(build_policy, "mlp", SPEC, ACTIONS)
    policy = factory()
    value_ids = {id(p) for p in policy.value_parameters()}
    value_names = {n for n, p in policy.named_parameters() if id(p) in value_ids}
    port = find_free_port("127.0.0.1")
    trainers = [TrainerActor.options(num_cpus=cfg.trainer_num_cpus).remote(r, 2, "127.0.0.1", port, cfg, factory, None)
                for r in range(2)]
    trainer = trainers[0]

    def train(weights, seed, version):
        return ray.get([t._train_on.remote(mlp_step_records(weights, seed + r), version) for r, t in enumerate(trainers)],
                       timeout=TIMEOUT)[0]

    try:
        ray.get([t.setup.remote() for t in trainers], timeout=TIMEOUT)
        before = ray.get(trainer.weights.remote(), timeout=60)
        warm = train(before, 1, 0)  # version 0 < critic_warmup_epochs: a warm-up epoch
        after = ray.get(trainer.weights.remote(), timeout=60)
        assert warm["critic_warmup"] == 1.0 and warm["loss"] == pytest.approx(CFG.value_coef * warm["value_loss"])
        for name in before.keys() - value_names:
            assert torch.equal(after[name], before[name]), name
        assert any(not torch.equal(after[n], before[n]) for n in value_names)
        for t in trainers:  # the policy's AdamW untouched on every rank
            assert _adam_steps(t) == {"policy": None, "value": float(steps)}
        assert warm["lr_policy"] == pytest.approx(CFG.lr_policy / 3)  # its schedule has not started

        trained = train(after, 3, 1)
        final = ray.get(trainer.weights.remote(), timeout=60)
        assert trained["critic_warmup"] == 0.0 and trained["loss"] != pytest.approx(CFG.value_coef * trained["value_loss"])
        assert all(not torch.equal(final[n], after[n]) for n in before.keys() - value_names)
        assert [_adam_steps(t) for t in trainers] == [{"policy": float(steps), "value": 2.0 * steps}] * 2
        schedule = warmup_cosine(CFG.warmup_steps, CFG.lr_decay_steps, CFG.min_lr_ratio)
        assert trained["lr_policy"] == pytest.approx(CFG.lr_policy * schedule(steps))  # one epoch into its own schedule
        assert trained["lr_value"] == pytest.approx(CFG.lr_value * schedule(2 * steps))
    finally:
        ray.get([t.shutdown.remote() for t in trainers], timeout=60)
        for t in trainers:
            ray.kill(t)


def test_critic_only_objective_is_the_value_term_alone():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(6, 3, generator=g).requires_grad_()
    value = torch.randn(6, generator=g).requires_grad_()
    x = LossInputs(logp, logp.detach() - 0.1, torch.rand(6, 3, generator=g), value, torch.zeros(6),
                   torch.randn(6, generator=g), torch.randn(6, generator=g), logp_ref=logp.detach() + 0.2)
    objective = Objective("clip", value_coef=0.5, entropy_coef=0.01, kl_coef=0.1, kl_ref_coef=0.1)
    out = objective(x, critic_only=True)
    assert out.terms["loss"] == pytest.approx(0.5 * out.terms["value_loss"]) and out.terms["policy_loss"] != 0
    out.loss.backward()
    assert logp.grad is None and value.grad is not None
    with pytest.raises(ValueError, match="no value targets"):
        objective(LossInputs(logp, logp.detach(), x.entropy, value, x.value_old, None, x.advantage,
                             logp_ref=x.logp_ref), critic_only=True)


def test_config_key_and_its_checks():
    assert RunConfig().critic_warmup_epochs == 0
    assert load_config(["--critic-warmup-epochs", "20"]).critic_warmup_epochs == 20
    with pytest.raises(ConfigError, match="^config key 'critic_warmup_epochs' = -1: "):
        load_config(["--critic-warmup-epochs", "-1"])
    # A critic-free estimator has nothing to warm up: the key is accepted (the PPO config serves a GRPO comparison).
    assert load_config(["--critic-warmup-epochs", "5", "--advantage", "grpo", "--group-size", "4"]).advantage == "grpo"


def test_a_super_batch_of_several_minibatches_is_accepted():
    cfg = load_config(["--super-batch-size", "64", "--train-batch-size", "16", "--accumulation-steps", "2"])
    assert cfg.optimizer_steps_per_update == 2
    assert load_config(["--super-batch-size", "32", "--train-batch-size", "16"]).optimizer_steps_per_update == 1
