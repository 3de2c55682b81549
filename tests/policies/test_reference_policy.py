"""The reference policy: a frozen copy of the initial weights, or the LoRA model with its adapters off."""
import copy

import numpy as np
import torch
from tensordict import TensorDict

from async_rl.algo import LossInputs, Objective
from async_rl.experience import from_wire, to_wire
from async_rl.policies import build_policy, build_preprocessor
from async_rl.policies.lora import adapters_disabled, apply_lora
from async_rl.policies.reference import ReferencePolicy, frozen_copy
from async_rl.policies.vla_tiny import tiny_vla_path

SPEC = {"state_dim": 6}


def _batch():
    g = torch.Generator().manual_seed(1)
    return TensorDict({"state": torch.randn(5, 6, generator=g)}, [5]), torch.rand(5, 3, generator=g) * 1.8 - 0.9


def test_frozen_copy_keeps_the_initial_weights_while_the_model_trains():
    torch.manual_seed(0)
    model = build_policy("mlp", SPEC, 3, hidden_sizes=(8,))
    initial = copy.deepcopy(model)
    frozen = frozen_copy(model)
    with torch.no_grad():  # DeepSpeed may change the weights before the reference is built (rank 0's broadcast)
        model.log_std.add_(0.3)
    reference = ReferencePolicy(model, frozen)
    with torch.no_grad():  # training goes on
        for p in model.parameters():
            p.add_(0.1)
    obs, action = _batch()
    got = reference(obs, action)
    with torch.no_grad():  # the weights as they were when the reference was built
        initial.log_std.add_(0.3)
        want = initial.evaluate(obs, action)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not got.requires_grad and all(not p.requires_grad for p in frozen.parameters())
    assert not torch.allclose(got, model.evaluate(obs, action)[0])


def test_lora_reference_is_the_base_model_without_a_copy():
    torch.manual_seed(0)
    plain = build_policy("mlp", SPEC, 3, hidden_sizes=(8,))
    model = apply_lora(copy.deepcopy(plain), rank=2, alpha=4.0, trainable=["log_std"])
    with torch.no_grad():  # trained adapters (peft starts B at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    assert frozen_copy(model) is None
    reference = ReferencePolicy(model, None)
    trainable = {n: p.requires_grad for n, p in model.named_parameters()}
    model.train()
    obs, action = _batch()
    with_adapters = model.evaluate(obs, action)[0]
    got = reference(obs, action)
    torch.testing.assert_close(got, plain.evaluate(obs, action)[0], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got, with_adapters)
    # afterwards: adapters on, same trainability, training mode, gradients reach the adapters
    torch.testing.assert_close(model.evaluate(obs, action)[0], with_adapters, rtol=0, atol=0)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == trainable and model.training
    model.evaluate(obs, action)[0].sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n and "policy_net" in n)
    with adapters_disabled(plain):  # no LoRA layers: nothing to switch off
        torch.testing.assert_close(plain.evaluate(obs, action)[0], got, rtol=1e-6, atol=1e-6)


def test_the_reference_call_leaves_every_module_in_the_mode_it_found():
    """A reference call must not switch dropout on (or off) anywhere: each module's own mode comes back, also a
    mixed one (a trainer in train mode whose decoder a caller put in eval mode)."""
    torch.manual_seed(0)
    model = apply_lora(build_policy("mlp", SPEC, 3, hidden_sizes=(8,)), rank=2, alpha=4.0, dropout=0.5)
    reference = ReferencePolicy(model, None)
    obs, action = _batch()
    for setting in ("train", "eval", "mixed"):
        model.train(setting != "eval")
        if setting == "mixed":
            for name, module in model.named_modules():
                if "lora_dropout" in name or name.endswith("policy_net"):
                    module.eval()
        before = {name: module.training for name, module in model.named_modules()}
        assert len(set(before.values())) == (2 if setting == "mixed" else 1)
        reference(obs, action)
        assert {name: module.training for name, module in model.named_modules()} == before, setting


def test_lora_reference_keeps_the_start_values_of_parameters_trained_whole():
    # lora_trainable parameters (here log_std; an action head in the LIBERO configs) are trained in place:
    # switching the adapters off does not undo them, so the reference puts their start values in place.
    torch.manual_seed(0)
    plain = build_policy("mlp", SPEC, 3, hidden_sizes=(8,))
    model = apply_lora(copy.deepcopy(plain), rank=2, alpha=4.0, trainable=["log_std"])
    reference = ReferencePolicy(model, None)
    with torch.no_grad():  # training moves the adapters and the whole-trained log_std
        for name, p in model.named_parameters():
            if "lora_B" in name or name == "log_std":
                p.add_(0.4)
    trained_log_std = model.log_std.detach().clone()
    obs, action = _batch()
    model.train()
    logp = model.evaluate(obs, action)[0]  # a minibatch's current-policy forward comes first, its graph kept
    got = reference(obs, action)
    torch.testing.assert_close(got, plain.evaluate(obs, action)[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model.log_std.detach(), trained_log_std, rtol=0, atol=0)  # the trained value is back
    (logp - got).sum().backward()  # the reference left the graph intact (no in-place write on log_std)
    assert model.log_std.grad is not None and model.log_std.requires_grad


def test_vla_reference_is_the_policy_lora_went_on_and_its_kl_trains_the_adapters_and_head():
    # LIBERO's PPO: LoRA on the language model, the heads trained whole, init_from the SFT export: the
    # reference (adapters off, heads at their start values) is the fine-tuned policy RL started from.
    spec, kwargs = {"image_size": 64, "cameras": ["agentview"], "proprio_dim": 8}, {"cameras": ["agentview"], "max_log_std": -2.3}
    path = str(tiny_vla_path())
    torch.manual_seed(0)
    plain = build_policy("vla", spec, 7, model_path=path, **kwargs).eval()
    model = apply_lora(copy.deepcopy(plain), rank=4, alpha=8.0, trainable=["action_head", "value_head"],
                       target_modules=r".*(language_model|text_model).*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)")
    reference = ReferencePolicy(model, frozen_copy(model))
    with torch.no_grad():  # RL moved the adapters and the action head
        for name, p in model.named_parameters():
            if "lora_B" in name or name.startswith("action_head"):
                p.add_(torch.randn_like(p) * 0.05)
    pre = build_preprocessor("vla", spec, model_path=path, **kwargs)
    rng = np.random.default_rng(0)
    rows = [pre({"agentview": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "proprio": rng.standard_normal(8).astype(np.float32),
                 "instruction": "put the black bowl on the plate"}, "task") for _ in range(3)]
    obs = from_wire(to_wire(torch.stack(rows)))
    with torch.no_grad():
        action = plain.act(obs)["action"]
    model.train()
    logp, entropy, value = model.evaluate(obs, action)
    logp_ref = reference(obs, action)
    torch.testing.assert_close(logp_ref, plain.evaluate(obs, action)[0], rtol=1e-5, atol=1e-4)
    zeros = torch.zeros(3)
    out = Objective("clip", kl_ref_coef=0.1)(LossInputs(logp, logp.detach(), entropy, value, zeros, zeros, zeros,
                                                        logp_ref=logp_ref))
    assert out.terms["kl_ref"] > 0 and out.terms["policy_loss"] == 0  # no advantage: the KL alone pulls
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "lora_B" in n or n.startswith("action_head"))
