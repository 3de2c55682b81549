"""The objective built once from the config: total loss, named terms, skip decisions."""
from __future__ import annotations

import math

import pytest
import torch

from async_rl.algo import LossInputs, Objective, compute_policy_loss, kl_penalty, value_loss
from async_rl.algo import losses as losses_module

F64 = torch.float64


def _inputs(advantage=(1.0, -2.0), logp_shift=0.1, target=(0.5, -0.5)):
    logp = torch.tensor([[-1.0, -0.5], [-2.0, -0.2]], dtype=F64, requires_grad=True)
    return LossInputs(
        logp=logp, logp_old=logp.detach() - logp_shift, entropy=torch.tensor([[0.3, 0.4], [0.1, 0.2]], dtype=F64),
        value=torch.tensor([0.2, 0.1], dtype=F64, requires_grad=True), value_old=torch.tensor([0.0, 0.0], dtype=F64),
        value_target=None if target is None else torch.tensor(target, dtype=F64),
        advantage=torch.tensor(advantage, dtype=F64))


def test_total_loss_is_the_weighted_sum_of_its_named_terms():
    obj = Objective("clip", {"clip_eps": 0.2}, value_coef=0.5, value_clip_eps=0.1, entropy_coef=0.01, kl_coef=0.2)
    x = _inputs()
    out = obj(x)
    pl, _ = compute_policy_loss("clip", x.logp, x.logp_old, x.advantage.unsqueeze(-1), params={"clip_eps": 0.2})
    vl = value_loss(x.value, x.value_old, x.value_target, 0.1)
    kl = kl_penalty(x.logp, x.logp_old, "k3").mean()
    ent = x.entropy.sum(-1).mean()
    expected = pl + 0.5 * vl - 0.01 * ent + 0.2 * kl
    torch.testing.assert_close(out.loss, expected)
    # value loss by hand: clip(v, 0 +- 0.1) = (0.1, 0.1); max((0.2-0.5)^2, (0.1-0.5)^2) = 0.16, (0.1+0.5)^2 = 0.36
    assert out.terms["value_loss"] == pytest.approx(0.5 * (0.16 + 0.36) / 2)
    assert out.terms["entropy"] == pytest.approx(0.5)
    for key, value in {"policy_loss": pl, "value_loss": vl, "kl": kl, "loss": expected}.items():
        assert out.terms[key] == pytest.approx(value.item()), key
    assert out.skip is None and out.terms["ratio_guard_skipped"] == 0.0 and out.terms["nonfinite_loss_skipped"] == 0.0
    out.loss.backward()
    assert x.logp.grad is not None and x.value.grad is not None


@pytest.mark.parametrize("mode, own", [("clip", ()), ("sapo", ("sapo_gate_weight_mean", "sapo_gate_saturation_frac")),
                                       ("soft_clip", ("soft_clip_coeff_mean",))])
def test_every_diagnostic_of_the_clip_mode_is_a_named_term(mode, own):
    out = Objective(mode)(_inputs())
    common = {"clip_frac", "dead_grad_frac", "ess", "ratio_mean", "ratio_max", "ratio_min", "approx_kl",
              "policy_loss", "value_loss", "entropy", "loss", "ratio_guard_skipped", "nonfinite_loss_skipped"}
    assert set(out.terms) == common | set(own)
    assert out.terms["ratio_min"] == pytest.approx(math.exp(0.1))
    assert all(isinstance(v, float) for v in out.terms.values())


def test_no_critic_no_value_term():
    out = Objective("clip")(_inputs(target=None))
    assert "value_loss" not in out.terms and "kl" not in out.terms


def test_ratio_guard_and_non_finite_loss_skip_the_minibatch():
    guarded = Objective("clip", ratio_threshold=1.05)(_inputs(logp_shift=0.1))  # ratio e^0.1 = 1.105
    assert guarded.skip == "ratio_guard" and guarded.terms["ratio_guard_skipped"] == 1.0
    assert Objective("clip", ratio_threshold=1.2)(_inputs(logp_shift=0.1)).skip is None
    broken = Objective("clip", ratio_threshold=1.05)(_inputs(advantage=(float("nan"), 1.0)))
    assert broken.skip == "nonfinite_loss" and broken.terms["nonfinite_loss_skipped"] == 1.0
    assert broken.terms["ratio_guard_skipped"] == 0.0


def test_clip_params_are_resolved_once_at_construction(monkeypatch):
    obj = Objective("soft_clip_alpha-2", {"clip_eps": 0.3})
    assert obj.policy_loss.params.soft_clip_alpha == 2.0 and obj.policy_loss.params.clip_eps == 0.3

    def fail(*args, **kwargs):
        raise AssertionError("clip params resolved again")

    monkeypatch.setattr(losses_module, "resolve_policy_loss_params", fail)
    for _ in range(3):
        obj(_inputs())


def test_a_run_resolves_its_clip_mode_once_when_the_config_is_checked(monkeypatch):
    """RunConfig.clip is resolved by the config check; the trainer's objective and its batch draws, and a copy
    of the config as Ray ships it, take it as it is (the registry and the params are not read again)."""
    import pickle

    from async_rl.algo import draws_whole_groups
    from async_rl.config import load_config

    cfg = load_config(["--advantage", "grpo", "--group-size", "4", "--clip-mode", "pacs", "--train-batch-size", "8",
                       "--super-batch-size", "16", "--replay-capacity", "4096"])
    assert cfg.clip.name == "pacs" and cfg.clip.compares_group_members
    cfg.clip_params = {"beta": 2}  # a change of a key is checked again, and resolved again
    assert cfg.clip.params.beta == 2.0

    def fail(*args, **kwargs):
        raise AssertionError("clip mode resolved again")

    monkeypatch.setattr(losses_module, "resolve_policy_loss_params", fail)
    monkeypatch.setattr(losses_module, "_mode_spec", fail)
    shipped = pickle.loads(pickle.dumps(cfg))
    assert Objective.from_config(shipped).policy_loss.params.beta == 2.0
    assert draws_whole_groups(shipped.clip, shipped.group_size)
