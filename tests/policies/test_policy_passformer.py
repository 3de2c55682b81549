"""Passformer and the per-step categorical MLP on CompilerGym-shaped observations (no server)."""
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from async_rl.errors import ConfigError
from async_rl.policies import build_policy, build_preprocessor
from async_rl.policies.passformer import BOS_ID, EOS_ID, PAD_ID, sequence_mask
from envs.compilergym.features import feature_dim
from envs.compilergym.tokens import PassVocab

FLAGS = [f"-pass{i}" for i in range(12)]
SEQ_LEN = 6


def _spec(mode="sequence"):
    spec = {"autophase_dim": 56, "num_passes": len(FLAGS), "mode": mode, "ir_tokens": 24, "ir_vocab_size": 64,
            "feature_dim": feature_dim(len(FLAGS)), "action_vocab": PassVocab(FLAGS).tokens, "seq_len": SEQ_LEN,
            "max_steps": 4}
    if mode == "per_step":
        spec["num_actions"] = len(FLAGS)
    return spec


def _obs(rng, n):
    return [{"features": rng.random(feature_dim(len(FLAGS))).astype(np.float32),
             "ir_tokens": np.concatenate([rng.integers(2, 64, 16), np.zeros(8, np.int64)])} for _ in range(n)]


def _batch(policy_name, spec, n=5, seed=0):
    pre = build_preprocessor(policy_name, spec)
    return torch.stack([pre(o, "compilergym") for o in _obs(np.random.default_rng(seed), n)])


def test_sequence_mask_ends_after_the_first_eos():
    action = torch.tensor([[5, 6, EOS_ID, PAD_ID], [EOS_ID, PAD_ID, PAD_ID, PAD_ID], [5, 5, 5, 5]])
    assert sequence_mask(action).tolist() == [[True, True, True, False], [True, False, False, False], [True] * 4]


def test_passformer_sequence_log_prob_matches_between_act_and_evaluate():
    torch.manual_seed(0)
    spec = _spec()
    net = build_policy("passformer", spec, SEQ_LEN)
    obs = _batch("passformer", spec)
    out = net.act(obs)
    action = out["action"]
    assert action.shape == (5, SEQ_LEN) and action.dtype == torch.int64
    assert out["logp"].shape == (5, 1) and out["value"].shape == (5,)
    # Only pass tokens and <eos> are generated; after <eos> only padding.
    mask = sequence_mask(action)
    generated = action[mask]
    assert ((generated == EOS_ID) | (generated >= 4)).all() and (action[~mask] == PAD_ID).all()
    logp, entropy, value = net.evaluate(obs, action)
    torch.testing.assert_close(logp, out["logp"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(value, out["value"])
    assert entropy.shape == (5, 1) and (entropy > 0).all()
    # The sequence log-prob is the masked sum of token log-probs: pad tokens after <eos> change nothing.
    padded = action.clone()
    padded[~mask] = PAD_ID
    torch.testing.assert_close(net.evaluate(obs, padded)[0], logp)


def test_passformer_records_the_log_prob_of_the_tempered_distribution_it_samples():
    spec = _spec()
    obs = _batch("passformer", spec, n=32, seed=5)
    torch.manual_seed(6)
    cold = build_policy("passformer", spec, SEQ_LEN, temperature=0.4)
    plain = build_policy("passformer", spec, SEQ_LEN)
    plain.load_state_dict(cold.state_dict())  # the same weights, temperature 1
    out = cold.act(obs)
    logp, entropy, _ = cold.evaluate(obs, out["action"])
    # What the trainer recomputes equals what the behaviour policy recorded...
    torch.testing.assert_close(logp, out["logp"], atol=1e-4, rtol=1e-4)
    # ... and differs from the untempered log-prob (what used to be recorded).
    logp_t1, entropy_t1, _ = plain.evaluate(obs, out["action"])
    assert (logp - logp_t1).abs().max() > 0.1 and (entropy < entropy_t1).all()
    # The samples follow that tempered distribution: first-token frequencies over 4000 draws.
    one = torch.stack([obs[0]] * 4000)
    with torch.no_grad():
        states, mask = cold.encode(one[:1])
        probs = torch.softmax(cold._decode(states, mask, torch.full((1, 1), BOS_ID))[0][0, -1], -1)
        probs_t1 = torch.softmax(plain._decode(states, mask, torch.full((1, 1), BOS_ID))[0][0, -1], -1)
    freq = torch.bincount(cold.act(one)["action"][:, 0], minlength=probs.numel()).float() / 4000
    assert 0.5 * (freq - probs).abs().sum() < 0.05 < 0.5 * (freq - probs_t1).abs().sum()
    with pytest.raises(ConfigError, match="temperature"):
        build_policy("passformer", spec, SEQ_LEN, temperature=0)


def test_passformer_greedy_is_deterministic_and_gradients_reach_every_part():
    torch.manual_seed(1)
    spec = _spec()
    net = build_policy("passformer", spec, SEQ_LEN)
    obs = _batch("passformer", spec, n=3, seed=1)
    a = net.act(obs, deterministic=torch.ones(3, dtype=torch.bool))["action"]
    b = net.act(obs, deterministic=torch.ones(3, dtype=torch.bool))["action"]
    assert torch.equal(a, b)
    logp, entropy, value = net.evaluate(obs, a)
    (logp.sum() + value.sum()).backward()
    for name in ("feature_proj.weight", "seq2seq.model.encoder.layers.0.fc1.weight",
                 "seq2seq.model.decoder.layers.0.fc1.weight", "value_head.0.weight"):
        grad = dict(net.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_passformer_loads_a_pretrained_checkpoint(tmp_path):
    torch.manual_seed(2)
    spec = _spec()
    net = build_policy("passformer", spec, SEQ_LEN)
    net.seq2seq.save_pretrained(tmp_path / "ckpt")
    loaded = build_policy("passformer", spec, SEQ_LEN, model_path=str(tmp_path / "ckpt"))
    for name, tensor in net.seq2seq.state_dict().items():
        torch.testing.assert_close(loaded.seq2seq.state_dict()[name], tensor, msg=name)
    with pytest.raises(ConfigError, match="model_path"):
        build_policy("passformer", spec, SEQ_LEN, model_path=str(tmp_path / "missing"))


def test_passformer_needs_ir_observations():
    with pytest.raises(ConfigError, match="ir_tokens"):
        build_preprocessor("passformer", {**_spec(), "ir_tokens": 0})


def test_mlp_on_a_discrete_action_space_is_categorical():
    torch.manual_seed(3)
    spec = _spec("per_step")
    net = build_policy("mlp", spec, 1)
    obs = _batch("mlp", spec, n=7)
    assert obs["features"].shape == (7, feature_dim(len(FLAGS)))
    out = net.act(obs)
    assert out["action"].shape == (7, 1) and out["action"].dtype == torch.int64
    assert ((out["action"] >= 0) & (out["action"] < len(FLAGS))).all()
    logp, entropy, value = net.evaluate(obs, out["action"])
    torch.testing.assert_close(logp, out["logp"])
    assert logp.shape == entropy.shape == (7, 1) and value.shape == (7,)
    # Near-uniform at initialisation (small output gain).
    assert torch.allclose(entropy, torch.full_like(entropy, np.log(len(FLAGS))), atol=0.05)
    greedy = net.act(obs, deterministic=torch.ones(7, dtype=torch.bool))["action"].squeeze(-1)
    assert torch.equal(greedy, out["logits"].argmax(-1))
    # Still the tanh-Gaussian MLP for continuous observation specs.
    assert type(build_policy("mlp", {"state_dim": 39}, 4)).__name__ == "MLPActorCritic"


def test_wire_round_trip_keeps_integer_actions():
    from async_rl.experience import from_wire, to_wire

    spec = _spec()
    net = build_policy("passformer", spec, SEQ_LEN)
    out = net.act(_batch("passformer", spec, n=2))
    back = from_wire(to_wire(TensorDict(dict(out.items()), batch_size=[2])))
    assert back["action"].dtype == torch.int64 and torch.equal(back["action"], out["action"])


def test_passformer_lora_merged_weights_reproduce_the_adapted_model():
    from async_rl.policies.lora import apply_lora

    torch.manual_seed(4)
    spec = _spec()
    adapted = apply_lora(build_policy("passformer", spec, SEQ_LEN), 4, 16.0, trainable=["value_head", "feature_proj"])
    for name, param in adapted.named_parameters():
        if "lora_B" in name:  # non-zero adapters, as after some training
            torch.nn.init.normal_(param, std=0.1)
    plain = build_policy("passformer", spec, SEQ_LEN)  # the inference copy
    merged = dict(adapted.inference_tensors())
    assert list(merged) == [name for name, _ in plain.inference_tensors()]
    with torch.no_grad():
        for name, tensor in plain.inference_tensors():
            tensor.copy_(merged[name])
    obs = _batch("passformer", spec)
    action = adapted.act(obs)["action"]
    torch.testing.assert_close(plain.evaluate(obs, action)[0], adapted.evaluate(obs, action)[0])
