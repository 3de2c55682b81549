"""The VLA actor-critic on the tiny VLAs: shapes, log-probs and LoRA merging on each checkpoint
family (Llava, Idefics3/SmolVLM, OpenVLA's remote-code layout), action (un)normalisation, the
save_pretrained -> model_path path and model_path errors."""
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from attention_masks import AttentionMasks

from async_rl.config import load_config
from async_rl.errors import ConfigError
from async_rl.experience import from_wire, to_wire
from async_rl.policies import build_policy, build_preprocessor, prepare_policy
from async_rl.policies.lora import apply_lora, merged_named_tensors
from async_rl.policies.vla_heads import NUM_BINS, ActionNormalizer, normalized_to_tokens, tokens_to_normalized
from async_rl.policies.vla_layouts import run_backbone
from async_rl.policies.vla_loading import check_model_dir, load_backbone
from async_rl.policies.vla_tiny import build_tiny_vla, tiny_vla_components
from async_rl.weights.signature import first_signature_difference, tensor_signature

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"image_size": 64, "cameras": ["agentview", "wrist"], "proprio_dim": 8}
LM_LORA = r".*(language_model|text_model).*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
FAMILIES = ["llava", "idefics3", "prismatic"]
INSTRUCTIONS = ["put the black bowl on the plate", "open the top drawer of the cabinet and put the bowl inside"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(build_tiny_vla(tmp_path_factory.mktemp("tiny_vla")))


@pytest.fixture(scope="module", params=FAMILIES)
def family_path(request, tmp_path_factory):
    """A tiny checkpoint of each family, written with save_pretrained."""
    return str(build_tiny_vla(tmp_path_factory.mktemp(request.param), family=request.param))


def _raw_obs(rng, instruction):
    return {"agentview": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            "wrist": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            "proprio": rng.standard_normal(8).astype(np.float32), "instruction": instruction}


def _batch(model_path, n=4, cameras=("agentview", "wrist")):
    """Preprocessed observations of two tasks, through the wire format the workers use."""
    pre = build_preprocessor("vla", SPEC, model_path=model_path, cameras=list(cameras))
    rng = np.random.default_rng(0)
    rows = [pre(_raw_obs(rng, INSTRUCTIONS[i % 2]), "task") for i in range(n)]
    return from_wire(to_wire(torch.stack(rows)))


def _policy(name, model_path, seed=0, **kwargs):
    torch.manual_seed(seed)
    return build_policy(name, SPEC, 7, model_path=model_path, cameras=["agentview", "wrist"], trust_remote_code=True,
                        **kwargs).eval()


def test_preprocessor_gives_fixed_shape_uint8_rows_without_weights(model_path):
    pre = build_preprocessor("vla", SPEC, model_path=model_path, cameras=["agentview", "wrist"])
    assert not any(isinstance(v, torch.nn.Module) for v in vars(pre).values())
    rng = np.random.default_rng(1)
    a, b = pre(_raw_obs(rng, INSTRUCTIONS[0]), "t0"), pre(_raw_obs(rng, INSTRUCTIONS[1]), "t1")
    assert a["pixel_values"].dtype == torch.uint8 and a["pixel_values"].shape == (2, 3, 64, 64)
    assert a["input_ids"].shape == b["input_ids"].shape == (64,)
    # Left padding: the prompt ends at the last position; the longer instruction has more real tokens.
    assert a["attention_mask"][-1] == 1 and a["attention_mask"][0] == 0
    assert b["attention_mask"].sum() > a["attention_mask"].sum()
    assert torch.cat([torch.stack([a, b]), torch.stack([b])]).batch_size == (3,)
    # A different render size is resized by the processor and stays uint8.
    small = pre({**_raw_obs(rng, INSTRUCTIONS[0]), "agentview": np.zeros((32, 32, 3), np.uint8)}, "t0")
    assert small["pixel_values"].shape == (2, 3, 64, 64) and small["pixel_values"].dtype == torch.uint8
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        build_preprocessor("vla", SPEC, model_path=model_path, max_prompt_tokens=8)(_raw_obs(rng, INSTRUCTIONS[0]), "t")


@pytest.mark.parametrize("name", ["vla", "vla_discrete"])
def test_forward_shapes(family_path, name):
    policy, obs = _policy(name, family_path), _batch(family_path)
    # A deprecated transformers argument warns at every forward (the KV cache is `cache` now, not
    # `past_key_values`): hundreds of lines in a run's output. Errors here, so the cause is fixed.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = policy.act(obs)
        logp, entropy, value = policy.evaluate(obs, out[policy.action_key])
    assert out["env_action"].shape == out["logp"].shape == logp.shape == entropy.shape == (4, 7)
    assert out["value"].shape == value.shape == policy.value(obs).shape == (4,)
    if name == "vla":
        assert policy.action_key == "action"
        assert out["action"].abs().max() <= 1 and out["mu"].shape == out["log_std"].shape == (4, 7)
    else:
        assert policy.action_key == "action_token" and "action" not in out.keys()
        assert out["behaviour_logits"].shape == (4, 7, NUM_BINS)
        tokens = out["action_token"]
        assert tokens.dtype == torch.int64
        assert ((tokens >= policy.vocab_end - NUM_BINS) & (tokens < policy.vocab_end)).all()
    # The gripper reaches the env binarised (OpenVLA's LIBERO handling).
    assert set(out["env_action"][:, -1].tolist()) <= {-1.0, 1.0}


@pytest.mark.parametrize("name", ["vla", "vla_discrete"])
def test_logp_of_stored_actions_equals_sampling_logp(family_path, name):
    """Unchanged weights: what the trainer recomputes from the stored action is what inference saw
    (for the discrete head: batched cached decoding vs one teacher-forced pass)."""
    policy, obs = _policy(name, family_path, seed=3), _batch(family_path, n=6)
    with torch.no_grad():  # spread the heads so the check is not on a near-uniform policy
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
        out = policy.act(obs)
        logp, _, value = policy.evaluate(obs, out[policy.action_key])
    torch.testing.assert_close(logp, out["logp"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(value, out["value"], rtol=1e-5, atol=1e-5)
    assert out["logp"].std() > 0  # samples differ in probability: the comparison has teeth
    if name == "vla_discrete":  # and the stored logits are the ones the tokens were drawn from
        index = (out["action_token"] - (policy.vocab_end - NUM_BINS)).unsqueeze(-1)
        stored = torch.log_softmax(out["behaviour_logits"], -1).gather(-1, index).squeeze(-1)
        torch.testing.assert_close(stored, out["logp"])


@pytest.mark.parametrize("name", ["vla", "vla_discrete"])
def test_no_attention_row_is_fully_masked_and_the_outputs_are_the_2d_masks(family_path, name, monkeypatch):
    """Two instructions of different lengths, left-padded: no attention call of training or of sampling's prefill
    sees a query row without a visible key (policies/lm_attention.py); log-probs and values as with the 2D mask."""
    import async_rl.policies.vla_layouts as layouts

    policy, obs = _policy(name, family_path, seed=3), _batch(family_path)
    assert len(set(obs["attention_mask"].sum(1).tolist())) == 2
    spy = AttentionMasks(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
        with spy:
            torch.manual_seed(4)
            out = policy.act(obs)
        assert spy.empty_rows() == 0
        with spy:
            torch.manual_seed(5)  # the squashed Gaussian's entropy is a sampled estimate
            now = policy.evaluate(obs, out[policy.action_key])
        assert spy.empty_rows() == 0
        monkeypatch.setattr(layouts, "self_attending_pad_mask", lambda config, mask, dtype: mask)
        with spy:
            torch.manual_seed(5)
            before = policy.evaluate(obs, out[policy.action_key])
        assert spy.empty_rows() > 0  # the check sees the rows the 2D mask gives
    for got, want in zip(now, before):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_deterministic_actions_are_the_mode(model_path):
    for name in ("vla", "vla_discrete"):
        policy, obs = _policy(name, model_path), _batch(model_path)
        with torch.no_grad():
            a, b = policy.act(obs, torch.ones(4, dtype=torch.bool)), policy.act(obs, torch.ones(4, dtype=torch.bool))
        torch.testing.assert_close(a["env_action"], b["env_action"])
        if name == "vla":
            torch.testing.assert_close(a["action"], torch.tanh(a["mu"]))


def test_action_unnormalisation_round_trip_and_openvla_formula():
    q01 = [-0.5, -0.2, -1.0, -0.1, -0.3, -0.05, 0.0]
    q99 = [0.9, 0.6, 0.4, 0.1, 0.2, 0.35, 1.0]
    norm = ActionNormalizer(q01, q99, mask=[True] * 6 + [False], gripper="none")
    a = torch.rand(100, 7) * 2 - 1
    raw = norm.unnormalize(a)
    torch.testing.assert_close(norm.normalize(raw), a, rtol=1e-5, atol=1e-5)
    # OpenVLA: 0.5 * (a + 1) * (q99 - q01) + q01 where mask, else a.
    expected = np.where([True] * 6 + [False], 0.5 * (a.numpy() + 1) * (np.array(q99) - q01) + q01, a.numpy())
    np.testing.assert_allclose(raw.numpy(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm.unnormalize(-torch.ones(7))[:6], torch.tensor(q01[:6]))
    torch.testing.assert_close(norm.unnormalize(torch.ones(7))[:6], torch.tensor(q99[:6]))
    # Gripper (OpenVLA's LIBERO eval): [0, 1] -> [-1, 1], sign, then invert: 0.8 (open) -> -1.
    libero = ActionNormalizer(q01, q99, mask=[True] * 6 + [False])
    grip = libero.to_env(torch.tensor([[0.0] * 6 + [0.8], [0.0] * 6 + [0.2]]))[:, -1]
    assert grip.tolist() == [-1.0, 1.0]


def test_action_tokens_round_trip_openvla_bins():
    vocab_end = 1000
    a = torch.linspace(-0.99, 0.99, 301)
    tokens = normalized_to_tokens(a, vocab_end)
    assert tokens.min() >= vocab_end - NUM_BINS and tokens.max() < vocab_end
    assert (tokens[1:] <= tokens[:-1]).all()  # OpenVLA: larger actions get smaller ids
    back = tokens_to_normalized(tokens, vocab_end)
    assert (back - a).abs().max() <= 2.0 / 255 + 1e-6  # within one bin


@pytest.mark.parametrize("family_path", ["llava", "idefics3"], indirect=True)  # prismatic's LM is named as Llava's
def test_lora_on_the_language_model_and_merged_weights_give_trainer_outputs(family_path):
    """The trainers' LoRA copy (apply_lora as the runtime does) vs a fresh inference copy
    that receives merged_named_tensors, as the weight broadcast delivers them."""
    for name in ("vla", "vla_discrete"):
        trainer = apply_lora(_policy(name, family_path, seed=5), rank=4, alpha=8.0, target_modules=LM_LORA,
                             trainable=["action_head", "value_head"])
        lora_names = [n for n, _ in trainer.named_parameters() if "lora_" in n]
        assert lora_names and not any("vision" in n for n in lora_names)  # none on the vision tower
        trainable = {n for n, p in trainer.named_parameters() if p.requires_grad}
        assert trainable == set(lora_names) | {n for n, _ in trainer.named_parameters() if n.startswith(("action_head", "value_head"))}
        value_ids = {id(p) for p in trainer.value_parameters()}
        assert value_ids == {id(p) for n, p in trainer.named_parameters() if n.startswith("value_head")}
        with torch.no_grad():
            for n, p in trainer.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, 0.2)
        inference = _policy(name, family_path, seed=6)  # different head init: the copy must overwrite it
        merged = merged_named_tensors(trainer)
        assert first_signature_difference(tensor_signature(merged), tensor_signature(inference.inference_tensors())) is None
        with torch.no_grad():
            for (_, target), (_, value) in zip(inference.inference_tensors(), merged):
                target.copy_(value)
        obs = _batch(family_path)
        det = torch.ones(4, dtype=torch.bool)
        with torch.no_grad():
            want, got = trainer.eval().act(obs, det), inference.act(obs, det)
            plain = _policy(name, family_path, seed=5).act(obs, det)  # same base weights, no adapters
        for key in ("env_action", "logp", "value"):
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4, msg=f"{name} {key}")
        assert not torch.allclose(plain["logp"], want["logp"], atol=1e-3)  # the adapters changed the policy


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_save_pretrained_then_model_path_reload_is_identical(tmp_path, family):
    model, processor, stats = tiny_vla_components(seed=7, family=family)
    directory = build_tiny_vla(tmp_path / "tiny", seed=7, family=family)
    assert json.loads((directory / "dataset_statistics.json").read_text()) == stats
    loaded = load_backbone(directory, trust_remote_code=True).eval()
    reference = {n: t for n, t in model.state_dict().items()}
    assert reference.keys() == loaded.state_dict().keys()
    obs = _batch(str(directory), n=2)
    policy = _policy("vla", str(directory))
    args = (obs["input_ids"], obs["attention_mask"], policy._pixels(obs["pixel_values"]), None, 0, True, policy._keep_logits)
    with torch.no_grad():
        a, b = run_backbone(policy.layout, model.eval(), *args), run_backbone(policy.layout, loaded, *args)
        c = policy._run(*args[:3], keep=0)
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)
    torch.testing.assert_close(a.hidden_states[-1], c.hidden_states[-1], rtol=0, atol=0)
    # Building twice with one seed gives one model (the cache key is the spec).
    again = tiny_vla_components(seed=7, family=family)[0]
    assert all(torch.equal(t, again.state_dict()[n]) for n, t in reference.items())


def test_default_without_model_path_uses_the_cached_tiny_vla(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kwargs = prepare_policy("vla", SPEC, 7, None, {"cameras": ["agentview"]})
    assert kwargs["model_path"].startswith(str(tmp_path / "async_rl" / "tiny_vla"))
    assert prepare_policy("vla", SPEC, 7, None, kwargs) == kwargs  # idempotent: the resolved path is kept
    policy = build_policy("vla", SPEC, 7, **kwargs)
    assert 100_000 < sum(p.numel() for p in policy.parameters()) < 5_000_000


def test_bad_model_path_and_kwargs_are_config_errors(tmp_path, model_path):
    with pytest.raises(ConfigError, match="no such directory"):
        prepare_policy("vla", SPEC, 7, str(tmp_path / "missing"), {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        check_model_dir(tmp_path / "empty")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read its config"):
        prepare_policy("vla_discrete", SPEC, 7, str(tmp_path / "broken"), {})
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text('{"foo": 1}')
    with pytest.raises(ConfigError, match="cannot read its config"):
        check_model_dir(tmp_path / "unknown")
    (tmp_path / "text_only").mkdir()
    (tmp_path / "text_only" / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ConfigError, match="not a vision-language model"):
        check_model_dir(tmp_path / "text_only")
    with pytest.raises(ConfigError, match="unknown vla policy option 'hidden_sizes'"):
        prepare_policy("vla", SPEC, 7, model_path, {"hidden_sizes": [64]})
    with pytest.raises(ConfigError, match="cameras"):
        prepare_policy("vla", SPEC, 7, model_path, {"cameras": ["frontview"]})
    with pytest.raises(ConfigError, match=r"^policy 'mlp' loads no model; drop --model-path \(or use a policy that does"):
        load_config(["--policy", "mlp", "--model-path", str(model_path)])  # refused when the config loads
    with pytest.raises(ConfigError, match="more than max_prompt_tokens=8; raise policy_kwargs max_prompt_tokens"):
        prepare_policy("vla", {**SPEC, "instructions": INSTRUCTIONS}, 7, model_path, {"max_prompt_tokens": 8})


@pytest.mark.parametrize("name", ["libero_ppo", "libero_ppo_discrete", "libero_ppo_gpu_preset", "libero_ppo_discrete_gpu_preset"])
def test_libero_configs_load(name):
    cfg = load_config(["--lora-target-modules", LM_LORA], str(ROOT / "configs" / f"{name}.yaml"))
    assert cfg.policy == ("vla_discrete" if "discrete" in name else "vla")
    assert cfg.lora_rank > 0 and cfg.lora_target_modules == LM_LORA and "value_head" in cfg.lora_trainable
    if "gpu" in name:  # the scale of the original ds_libero_ppo.py framework
        assert (cfg.num_trainers, cfg.num_inference_actors, cfg.num_rollout_workers) == (4, 1, 40)
        assert (cfg.train_batch_size, cfg.accumulation_steps, cfg.super_batch_size) == (20, 13, 260)


def test_bad_model_path_exits_2_before_ray(tmp_path, capsys):
    from async_rl.driver import main

    log_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(None, argv=["--policy", "vla", "--model-path", str(tmp_path / "nope"), "--log-dir", str(log_dir),
                         "--env-kwargs", "{benchmark: MT1, task: reach-v3}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model-path" in err[0] and "no such directory" in err[0]
    assert not log_dir.exists()


def test_action_statistics_key_is_chosen_or_refused_in_one_line(tmp_path):
    """OpenVLA keeps statistics per data set: one set is taken as is, a LIBERO suite's name finds its
    ``_no_noops`` set, and a missing or unknown ``unnorm_key`` is refused naming the sets there."""
    from async_rl.policies.vla_loading import NORM_STATS_FILE, load_norm_stats

    action = {"action": {"q01": [-1.0], "q99": [1.0], "mask": [True]}}
    (tmp_path / NORM_STATS_FILE).write_text(json.dumps({"a": action}))
    assert load_norm_stats(tmp_path)["q99"] == [1.0]
    (tmp_path / NORM_STATS_FILE).write_text(json.dumps({"a": action, "libero_goal_no_noops": action}))
    assert load_norm_stats(tmp_path, "libero_goal")["q01"] == [-1.0]
    for key, message in ((None, r"for \['a', 'libero_goal_no_noops'\]; choose one"),
                         ("b", r"for \['a', 'libero_goal_no_noops'\], not 'b'; choose one with policy_kwargs unnorm_key")):
        with pytest.raises(ConfigError, match=message):
            load_norm_stats(tmp_path, key)
