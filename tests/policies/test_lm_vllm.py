"""The causal-LM policy generating with a real vLLM engine on CPU (``generation_engine: vllm``, policies/lm_vllm.py):
a tiny random Llama saved as a Hugging Face folder, LoRA on its projections as an RL run's inference copy holds it.

One engine for the module, started as the inference actor starts it (its start-up: ~20-30 s measured on 2 cores);
the tests that end it come last. Without ``.venv-vllm`` (scripts/setup_vllm.sh) the engine tests skip with that reason; the choice and its errors are
tested either way.
"""
import os
import signal
import tempfile
from pathlib import Path

import pytest
import torch

from async_rl.errors import ConfigError
from async_rl.policies.causal_lm import CausalLMActorCritic, ChatPreprocessor, prepare_causal_lm
from async_rl.policies.lm_options import check_generation_engine
from async_rl.policies.lora import apply_lora
from async_rl.policies.vllm_client import VLLMEngineError, vllm_unavailable_reason

transformers = pytest.importorskip("transformers")
needs_vllm = pytest.mark.skipif(vllm_unavailable_reason() is not None, reason=str(vllm_unavailable_reason()))

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = ["12 + 30 = ?", "What is 7 - 2?", "a"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from test_lm_model_families import SHAPE, char_tokenizer

    folder = tmp_path_factory.mktemp("tiny_llama")
    # head_dim 64: a size vLLM's CPU attention has kernels for.
    config = transformers.LlamaConfig(**{**SHAPE, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1},
                                      initializer_range=0.1)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(folder))
    char_tokenizer().save_pretrained(str(folder))
    return str(folder)


def lm_kwargs(folder, engine, **extra):
    return prepare_causal_lm({"text": True}, 1, folder, {"max_prompt_tokens": 32, "max_new_tokens": NEW_TOKENS,
                                                         "temperature": 0.7, "generation_engine": engine, **extra})


def lora_policy(folder, engine):
    """The inference copy of a LoRA run with adapter-only sync, adapters with non-zero B (a trained state)."""
    torch.manual_seed(0)
    policy = apply_lora(CausalLMActorCritic({"text": True}, 1, **lm_kwargs(folder, engine)).eval(), rank=4, alpha=8.0,
                        target_modules=PROJECTIONS)
    perturb_adapters(policy, seed=1)
    return policy


def perturb_adapters(policy, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # in place, as the weight sync copies: the engine sees the version counters move
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def batch(folder, prompts):
    pre = ChatPreprocessor({"text": True}, **lm_kwargs(folder, "hf"))
    return torch.stack([pre({"prompt": p}) for p in prompts])


@pytest.fixture(scope="module")
def policy(tiny_llama):
    if vllm_unavailable_reason() is not None:
        pytest.skip(vllm_unavailable_reason())
    policy = lora_policy(tiny_llama, "vllm")
    policy.prepare_sampling()  # as the inference actor does: the engine starts before any batch asks for it
    policy._engine_starter.join(timeout=900)
    assert policy._vllm is not None and policy._vllm.client.alive
    yield policy
    policy.close_engine()


def act(policy, obs, greedy):
    with torch.inference_mode():
        return policy.act(obs, torch.tensor(greedy))


@needs_vllm
def test_sampled_log_probs_are_the_trainers_before_an_update(policy, tiny_llama, capsys):
    obs = batch(tiny_llama, PROMPTS * 2)
    out = act(policy, obs, [False] * 6)
    said = capsys.readouterr().err
    assert "vLLM's sampled log-probs against this policy's recomputation on its first batch: max |diff|" in said
    assert policy._vllm.logp_gap < 1e-3 and "--recompute-logp" not in said  # said once, with advice only beyond 1e-3
    assert policy._vllm.loads == 1  # every weight sent once, before the first batch
    response = out["response"]
    real = policy.action_mask(response)
    assert response.shape == (6, NEW_TOKENS) and torch.equal(out["env_action"], response)
    for row, flags in zip(response, real):
        n = int(flags.sum())
        assert n >= 1 and bool(flags[:n].all())  # real tokens first, then PAD_ACTION only
        ends = torch.isin(row[:n], torch.tensor(policy.stop_ids))
        assert not bool(ends[:-1].any()) and (n == NEW_TOKENS or bool(ends[-1]))  # it ends at its stop token
    assert bool((out["logp"][~real] == 0).all()) and bool((out["logp"][real] < 0).all())
    with torch.inference_mode():
        recomputed, _, _ = policy.evaluate(obs, response)
    diff = (recomputed - out["logp"])[real].abs()
    print(f"vLLM vs trainer log-probs (fp32, LoRA): max {diff.max():.2e} mean {diff.mean():.2e} over {len(diff)} tokens")
    assert diff.max() < 1e-3, diff


@needs_vllm
def test_greedy_rows_are_transformers_greedy_rows(policy, tiny_llama):
    obs = batch(tiny_llama, PROMPTS)
    mixed = act(policy, obs, [True, False, True])
    with torch.inference_mode():
        hf, _ = policy._hf_generate(obs["input_ids"], obs["attention_mask"], torch.ones(3, dtype=torch.bool))
    assert torch.equal(mixed["response"][[0, 2]], hf[[0, 2]])


@needs_vllm
def test_a_group_of_one_prompt_is_one_request_with_n_completions(policy, tiny_llama, monkeypatch):
    sent = []
    call = policy._vllm.client.call

    def spy(cmd, **kw):
        if cmd == "generate":
            sent.append(kw)
        return call(cmd, **kw)

    monkeypatch.setattr(policy._vllm.client, "call", spy)
    out = act(policy, batch(tiny_llama, [PROMPTS[0]] * 4 + [PROMPTS[1]] * 2), [False] * 4 + [True] * 2)
    requests = sent[0]["requests"]
    assert [(r["n"], r["greedy"]) for r in requests] == [(4, False), (1, True)]
    sampled = {tuple(row.tolist()) for row in out["response"][:4]}
    assert len(sampled) > 1  # four draws, not one copied
    assert torch.equal(out["response"][4], out["response"][5])  # one greedy completion, given to both rows


@needs_vllm
def test_min_new_tokens_holds_every_response_to_its_length(policy, tiny_llama, monkeypatch):
    monkeypatch.setattr(policy, "min_new_tokens", NEW_TOKENS)
    out = act(policy, batch(tiny_llama, PROMPTS), [False, False, False])
    assert bool(policy.action_mask(out["response"]).all())


@needs_vllm
def test_a_lora_update_changes_greedy_responses_and_its_merged_weights_serve_it(policy, tiny_llama, monkeypatch):
    import safetensors.torch

    obs = batch(tiny_llama, PROMPTS)
    before = act(policy, obs, [True] * 3)["response"]
    loads = policy._vllm.loads
    assert torch.equal(act(policy, obs, [True] * 3)["response"], before)
    assert policy._vllm.loads == loads  # no change, nothing sent
    sent = []
    save = safetensors.torch.save_file
    monkeypatch.setattr(safetensors.torch, "save_file", lambda tensors, path: sent.append(set(tensors)) or save(tensors, path))
    perturb_adapters(policy, seed=2)
    after = act(policy, obs, [True] * 3)["response"]
    assert policy._vllm.loads == loads + 1 and list(policy._vllm._folder.iterdir()) == []  # the file is gone once loaded
    # The adapted layers' merged weights (their attention and MLP blocks), not the embeddings or the final norm.
    assert sent[0] == {f"model.layers.{i}.{block}.{p}.weight" for i in range(policy.lm.config.num_hidden_layers)
                       for block, p in [("self_attn", p) for p in PROJECTIONS[:4]] + [("mlp", p) for p in PROJECTIONS[4:]]}
    assert not torch.equal(after, before)
    with torch.inference_mode():
        hf, _ = policy._hf_generate(obs["input_ids"], obs["attention_mask"], torch.ones(3, dtype=torch.bool))
    assert torch.equal(after, hf)  # the engine generates with the new weights, as the policy does


@needs_vllm
def test_a_base_weight_change_is_followed_too(policy, tiny_llama):
    """A full-weight or merged sync changes base weights: the engine gets them as it gets LoRA's."""
    obs = batch(tiny_llama, PROMPTS)
    before = act(policy, obs, [True] * 3)["response"]
    with torch.no_grad():
        for name, param in policy.lm.named_parameters():
            if "mlp.down_proj.base_layer" in name:
                param.add_(torch.randn_like(param) * 0.5)
    after = act(policy, obs, [True] * 3)["response"]
    sampled = act(policy, obs, [False] * 3)
    with torch.inference_mode():
        hf, _ = policy._hf_generate(obs["input_ids"], obs["attention_mask"], torch.ones(3, dtype=torch.bool))
        recomputed, _, _ = policy.evaluate(obs, sampled["response"])
    assert not torch.equal(after, before) and torch.equal(after, hf)
    real = policy.action_mask(sampled["response"])
    assert (recomputed - sampled["logp"])[real].abs().max() < 1e-3  # sampled with the new weights' distribution


@needs_vllm
def test_a_killed_engine_is_a_named_error_not_a_hang(policy, tiny_llama):
    pid = policy._vllm.client.pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(VLLMEngineError, match=r"the vLLM engine \(pid \d+\) (exited|died|is unreachable)") as error:
        act(policy, batch(tiny_llama, PROMPTS[:1]), [True])
    kept = Path(tempfile.gettempdir()) / f"vllm-engine-{pid}.log"
    assert f"the end of its log (all of it: {kept})" in str(error.value) and kept.stat().st_size > 0
    kept.unlink()


def test_without_vllm_installed_auto_generates_with_transformers_and_vllm_is_an_error(tiny_llama, monkeypatch, capsys):
    monkeypatch.setenv("ASYNC_RL_VLLM_SITE", "/nonexistent")
    obs = batch(tiny_llama, PROMPTS[:1])
    auto = lora_policy(tiny_llama, "auto")
    assert act(auto, obs, [True])["response"].shape == (1, NEW_TOKENS) and auto.generation_engine == "hf"
    assert "scripts/setup_vllm.sh" in capsys.readouterr().err
    with pytest.raises(VLLMEngineError, match="vLLM is not installed in /nonexistent; run bash scripts/setup_vllm.sh"):
        act(lora_policy(tiny_llama, "vllm"), obs, [True])
    started_early = lora_policy(tiny_llama, "vllm")
    started_early.prepare_sampling()  # the start fails in its thread: the first batch raises it, every later one too
    started_early._engine_starter.join(timeout=120)
    assert isinstance(started_early._engine_error, VLLMEngineError)  # kept by the thread, not met by act's own start
    for _ in range(2):
        with pytest.raises(VLLMEngineError, match="vLLM is not installed in /nonexistent"):
            act(started_early, obs, [True])


def test_an_unforeseen_start_failure_is_the_named_engine_error_and_auto_falls_back(tiny_llama, monkeypatch, capsys):
    """Not only the engine's own errors: an OSError from its start (a full /dev/shm, say) is kept by the start's
    thread and raised by the first batch as a VLLMEngineError naming it, and ``auto`` generates with transformers."""
    import async_rl.policies.causal_lm as causal_lm

    def full_disk(*_, **__):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(causal_lm, "VLLMGeneration", full_disk)
    monkeypatch.setattr(causal_lm, "engine_unsupported_reason", lambda lm: None)  # supported, installed or not
    obs = batch(tiny_llama, PROMPTS[:1])
    started_early = lora_policy(tiny_llama, "vllm")
    started_early.prepare_sampling()
    started_early._engine_starter.join(timeout=120)
    assert isinstance(started_early._engine_error, VLLMEngineError)  # kept by the thread, which did not die of it
    named = r"the vLLM engine did not start: OSError: \[Errno 28\] No space left on device"
    with pytest.raises(VLLMEngineError, match=named):
        act(started_early, obs, [True])
    monkeypatch.setattr(causal_lm, "AUTO_ON_CPU", None)  # auto as on a GPU: it tries the engine
    auto = lora_policy(tiny_llama, "auto")
    assert act(auto, obs, [True])["response"].shape == (1, NEW_TOKENS) and auto.generation_engine == "hf"
    err = capsys.readouterr().err
    assert "OSError: [Errno 28] No space left on device" in err


def test_vllm_asked_for_where_it_is_not_installed_is_one_config_error(monkeypatch):
    monkeypatch.setenv("ASYNC_RL_VLLM_SITE", "/nonexistent")
    with pytest.raises(ConfigError, match="not installed in /nonexistent; run bash scripts/setup_vllm.sh"):
        check_generation_engine({"generation_engine": "vllm"})
    check_generation_engine({"generation_engine": "auto"})  # auto: the policy decides, no error


@needs_vllm
def test_auto_leaves_a_policy_on_cpu_to_transformers(tiny_llama, capsys):
    policy = lora_policy(tiny_llama, "auto")
    out = act(policy, batch(tiny_llama, PROMPTS[:1]), [True])
    assert policy.generation_engine == "hf" and policy._vllm is None and out["response"].shape == (1, NEW_TOKENS)
    assert "auto takes transformers' generate" in capsys.readouterr().err


def test_a_log_prob_gap_beyond_1e_3_is_said_with_its_fix(tiny_llama, capsys):
    """What a bf16 engine shows (lm_engines.md: max 0.25): the run is told once, and how the loss corrects it."""
    policy = lora_policy(tiny_llama, "hf")
    obs = batch(tiny_llama, PROMPTS)
    out = act(policy, obs, [False] * 3)
    greedy = torch.tensor([False, False, True])
    assert policy._engine_logp_gap(obs, out["response"], out["logp"], greedy) < 1e-3  # the same weights: no gap
    assert "--recompute-logp" not in capsys.readouterr().err
    assert policy._engine_logp_gap(obs, out["response"], out["logp"] - 0.01, greedy) > 9e-3
    assert "above 0.001: pass --recompute-logp" in capsys.readouterr().err
