"""LoRA on a policy: only adapters (and named heads) train; merged weights reproduce the model."""
import torch
from tensordict import TensorDict

from async_rl.policies import build_policy
from async_rl.policies.lora import apply_lora, merged_named_tensors
from async_rl.weights.signature import first_signature_difference, tensor_signature

SPEC = {"state_dim": 39}


def _lora_policy():
    torch.manual_seed(0)
    model = apply_lora(build_policy("mlp", SPEC, 4), rank=4, alpha=8.0, trainable=["log_std"])
    with torch.no_grad():  # peft starts B at zero; make the adapters do something
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    return model


def test_only_adapters_and_named_parameters_train():
    model = _lora_policy()
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert "log_std" in trainable
    assert all("lora_" in n or n == "log_std" for n in trainable)
    assert any("value_net" in n for n in trainable)  # the value head's layers get adapters too
    value_ids = {id(p) for p in model.value_parameters()}
    assert any(id(p) in value_ids for n, p in model.named_parameters() if "lora_" in n and "value_net" in n)


def test_merged_weights_load_into_the_plain_model_and_give_the_same_outputs():
    model = _lora_policy()
    plain = build_policy("mlp", SPEC, 4)
    merged = merged_named_tensors(model)
    assert first_signature_difference(tensor_signature(merged), tensor_signature(plain.inference_tensors())) is None
    with torch.no_grad():
        for (_, target), (_, value) in zip(plain.inference_tensors(), merged):
            target.copy_(value)
    obs = TensorDict({"state": torch.randn(5, 39)}, [5])
    action = torch.rand(5, 4) * 1.8 - 0.9
    for got, want in zip(plain.evaluate(obs, action)[::2], model.evaluate(obs, action)[::2]):  # logp, value
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    base = dict(model.named_parameters())["policy_net.0.base_layer.weight"]
    assert not torch.allclose(dict(merged)["policy_net.0.weight"], base)  # the delta is really in there


def test_without_lora_inference_tensors_are_the_parameters():
    plain = build_policy("mlp", SPEC, 4)
    names = [n for n, _ in plain.inference_tensors()]
    assert names == [n for n, _ in plain.named_parameters()]
