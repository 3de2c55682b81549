"""Mixed precision (``precision: bf16``, what ``auto`` picks on CUDA) for every policy, on CPU.

Per policy: the bf16 model takes float32 inputs and returns float32 statistics (in process: cheap).
The real bf16 runs (local Ray, DeepSpeed with bf16 on, inference actor in bf16, real env: finite losses, no
skipped update, the inference actor holding exactly trainer rank 0's bf16 weights after the last broadcast)
are runs of other files, each formerly a second real run of the same env and policy here: the MLP's is the
MetaWorld sync-mode run of tests/e2e/test_e2e_metaworld.py (two ZeRO-2 ranks), BART's the Passformer run of
tests/e2e/test_e2e_compilergym.py, the VLA's (LoRA over a backbone) the continuous LIBERO launch's run of
tests/e2e/test_e2e_libero.py (which also restores the bf16 weights from its checkpoint).
"""
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from async_rl.algo import tanh_gaussian_log_prob
from async_rl.policies import build_policy, build_preprocessor
from async_rl.policies.nets import cast_parameters

POLICIES = ["mlp", "categorical_mlp", "passformer", "vla", "vla_discrete"]  # checked in bf16 and fp16 in process
# Real bf16 runs for the three kinds of model: an MLP (tests/e2e/test_e2e_metaworld.py's sync-mode run), BART
# (float32 buffers beside bf16 parameters: tests/e2e/test_e2e_compilergym.py's Passformer run) and the VLA (LoRA
# over a backbone: tests/e2e/test_e2e_libero.py's continuous run). categorical_mlp and vla_discrete differ from
# these only in the head, which the in-process test checks in bf16; a real run of each would add ~75 s to
# the suite, not a new path.


# ---- in process: the bf16 model itself ---------------------------------------------------------
@pytest.fixture(scope="module")
def vla_path(tmp_path_factory):
    from async_rl.policies.vla_tiny import build_tiny_vla

    return str(build_tiny_vla(tmp_path_factory.mktemp("tiny_vla")))


def _policy_and_obs(name, vla_path, **kwargs):
    """A policy and a batch of 3 preprocessed observations shaped like its env's."""
    rng = np.random.default_rng(0)
    if name == "mlp":
        return build_policy(name, {"state_dim": 39}, 4), TensorDict({"state": torch.randn(3, 39)}, [3])
    if name in ("categorical_mlp", "passformer"):
        spec = {"feature_dim": 80, "num_actions": 12, "max_steps": 4, "ir_tokens": 24, "ir_vocab_size": 64,
                "action_vocab": ["<pad>", "<bos>", "<eos>", "<unk>", *[f"-p{i}" for i in range(12)]]}
        raw = [{"features": rng.random(80).astype(np.float32),
                "ir_tokens": np.concatenate([rng.integers(2, 64, 16), np.zeros(8, np.int64)])} for _ in range(3)]
        action_dim = 6 if name == "passformer" else 1
    else:
        spec = {"image_size": 64, "cameras": ["agentview"]}
        raw = [{"agentview": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "instruction": "open the drawer"}] * 3
        return (build_policy(name, spec, 7, model_path=vla_path, **kwargs),
                torch.stack([build_preprocessor(name, spec, model_path=vla_path)(o, "t") for o in raw]))
    pre = build_preprocessor(name, spec)
    return build_policy(name, spec, action_dim), torch.stack([pre(o, "t") for o in raw])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", POLICIES)
def test_bf16_policy_returns_float32_statistics(name, vla_path, dtype):
    """fp16 too: on CPU only this in-process check (DeepSpeed trains fp16 on CUDA only, tests/gpu)."""
    torch.manual_seed(0)
    policy, obs = _policy_and_obs(name, vla_path)
    policy = cast_parameters(policy, dtype)  # as DeepSpeed and the inference actor cast it
    out = policy.act(obs)  # float32 observations into bf16 weights
    floats = {k: v for k, v in out.items() if v.is_floating_point()}
    assert {k: v.dtype for k, v in floats.items()} == {k: torch.float32 for k in floats}
    assert all(torch.isfinite(v).all() for v in floats.values()), floats
    logp, entropy, value = policy.evaluate(obs, out[policy.action_key])
    for t in (logp, entropy, value):
        assert t.dtype == torch.float32 and torch.isfinite(t).all()
    # The trainer re-computes the behaviour log-prob from the same bf16 weights: same numbers.
    torch.testing.assert_close(logp, out["logp"], atol=0.05, rtol=0.05)
    (logp.sum() + entropy.sum() + value.sum()).backward()
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_tanh_gaussian_log_prob_is_finite_at_the_bounds_in_bf16():
    mu = torch.zeros(4, dtype=torch.bfloat16)
    action = torch.tensor([-1.0, -0.99999, 0.99999, 1.0], dtype=torch.bfloat16)  # bf16 rounds these to +-1
    logp = tanh_gaussian_log_prob(mu, torch.zeros_like(mu), action)
    assert logp.dtype == torch.float32 and torch.isfinite(logp).all(), logp


def test_vla_with_a_bf16_backbone_and_float32_heads(vla_path):
    """``policy_kwargs dtype: bfloat16`` loads only the backbone in bf16; the heads stay float32."""
    mixed, obs = _policy_and_obs("vla", vla_path, dtype="bfloat16")
    assert next(mixed.backbone.parameters()).dtype == torch.bfloat16
    assert next(mixed.value_head.parameters()).dtype == torch.float32
    out = mixed.act(obs)
    logp, entropy, value = mixed.evaluate(obs, out["action"])
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in (out["logp"], logp, entropy, value))
