"""The causal-LM policy on small random models of several families, each saved as a Hugging Face folder and
loaded through the project's own path (``prepare_causal_lm``, ``CausalLMActorCritic``): the log-probs recorded
while sampling equal the trainer's before any update (fp32), whatever the model's generation config says and
whatever the model does after its decoder; dropout is off in training by default.

Families: Llama whose generation_config.json asks for a repetition penalty, top-k, min-p, typical-p and an
n-gram ban (none of which the policy asked for); Gemma-2 with final-logit soft-capping; a Qwen2-shaped model
(attention biases, tied embeddings, attention dropout in its config); Cohere (logit scale).

A batch of mixed prompt lengths: no attention call of training, of the reference forward or of generation's
prefill is handed a query row whose keys are all masked, and the real tokens' numbers are those of the 2D mask.
"""
import copy
import json

import pytest
import torch
from attention_masks import AttentionMasks

from async_rl.policies.causal_lm import CausalLMActorCritic, ChatPreprocessor, prepare_causal_lm

transformers = pytest.importorskip("transformers")

CHARS = [chr(c) for c in range(32, 127)]
VOCAB = 128
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]
CHAT = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}"
PROMPTS = ["12 + 30 = ?", "What is 7 - 2?", "a", "Compute 3 * 4 now."]
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=2)
# Larger weights than a trained model's init: logits of several units, so that a processor or a soft-cap the
# trainer missed shows up far above the tolerance.
INIT = 0.3


def char_tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                                bos_token="<bos>", unk_token="<unk>", chat_template=CHAT)


def llama_with_sampling_defaults():
    return transformers.LlamaConfig(**SHAPE, initializer_range=INIT), {
        "repetition_penalty": 1.3, "top_k": 5, "min_p": 0.2, "typical_p": 0.9, "no_repeat_ngram_size": 2,
        "temperature": 0.6, "top_p": 0.8, "do_sample": True}


def gemma2_soft_capped():
    config = transformers.Gemma2Config(**SHAPE, head_dim=8, final_logit_softcapping=3.0, initializer_range=INIT,
                                       sliding_window=64)
    return config, {}


def qwen2_shaped():
    config = transformers.Qwen2Config(**SHAPE, tie_word_embeddings=True, attention_dropout=0.5, initializer_range=INIT)
    return config, {"repetition_penalty": 1.05, "top_k": 20, "top_p": 0.8, "temperature": 0.7}


def cohere_logit_scaled():
    return transformers.CohereConfig(**SHAPE, logit_scale=0.5, initializer_range=INIT), {}


FAMILIES = {"llama_generation_config": llama_with_sampling_defaults, "gemma2_softcap": gemma2_soft_capped,
            "qwen2": qwen2_shaped, "cohere_logit_scale": cohere_logit_scaled}


def save_model(folder, family):
    config, generation = FAMILIES[family]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config = transformers.GenerationConfig(pad_token_id=0, eos_token_id=1, bos_token_id=2)
    model.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    if generation:  # what a released instruct model ships beside its weights
        path = folder / "generation_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **generation}))
    return folder


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_policy(request, tmp_path_factory):
    folder = save_model(tmp_path_factory.mktemp(request.param), request.param)
    # transformers' generate, whose prefill and processors these tests check (with LoRA, auto would take vLLM).
    kwargs = prepare_causal_lm({"text": True}, 1, str(folder), {"max_new_tokens": 12, "max_prompt_tokens": 24,
                                                                "temperature": 1.0, "generation_engine": "hf"})
    torch.manual_seed(1)
    policy = CausalLMActorCritic({"text": True}, 1, **kwargs)
    pre = ChatPreprocessor({"text": True}, **kwargs)
    obs = torch.stack([pre({"prompt": p}) for p in PROMPTS])
    return request.param, policy, obs


def test_recorded_logp_equal_the_trainers_before_any_update(family_policy):
    family, policy, obs = family_policy
    torch.manual_seed(2)
    with torch.no_grad():
        out = policy.eval().act(obs, torch.tensor([False, False, True, False]))
        policy.train()  # the trainer's mode: dropout is off by default, so nothing changes
        logp, _, _ = policy.evaluate(obs, out["response"])
    real = policy.action_mask(out["response"])
    assert int(real.sum()) >= 8, "too few sampled tokens to compare"
    diff = (logp - out["logp"])[real].abs()
    assert diff.max() <= 1e-3, f"{family}: max |logp(train) - logp(sampled)| = {diff.max():.4g}"


def test_the_models_own_sampling_fields_do_not_reach_generate(family_policy):
    family, policy, _ = family_policy
    config = policy.lm.generation_config
    for field in ("repetition_penalty", "top_k", "top_p", "min_p", "typical_p", "no_repeat_ngram_size", "temperature"):
        assert getattr(config, field) in (None, transformers.GenerationConfig()._get_default_generation_params().get(field)), \
            (family, field, getattr(config, field))
    assert policy.stop_ids == [1]


def test_training_log_probs_apply_what_the_model_does_after_its_decoder(family_policy):
    """The trainer's log-probs are the model's own forward's (soft-capping, logit scale), within fp32 noise."""
    family, policy, obs = family_policy
    response = torch.randint(3, VOCAB - 1, (len(PROMPTS), 12))
    with torch.no_grad():
        logp, _, _ = policy.eval().evaluate(obs, response)
        tokens = torch.cat([obs["input_ids"], response], dim=1)
        mask = torch.cat([obs["attention_mask"], torch.ones_like(response)], dim=1)
        positions = (mask.cumsum(1) - 1).clamp_min(0)
        logits = policy.lm(input_ids=tokens, attention_mask=mask, position_ids=positions).logits.float()
        full = torch.log_softmax(logits[:, obs["input_ids"].shape[1] - 1:-1], -1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
    assert (logp - full).abs().max() <= 1e-4, family


def test_dropout_is_off_in_training_unless_asked(tmp_path):
    folder = save_model(tmp_path, "qwen2")  # attention_dropout 0.5 in its config
    kwargs = prepare_causal_lm({"text": True}, 1, str(folder), {"max_new_tokens": 6, "max_prompt_tokens": 24})
    pre = ChatPreprocessor({"text": True}, **kwargs)
    obs = torch.stack([pre({"prompt": p}) for p in PROMPTS[:2]])
    response = torch.randint(3, VOCAB - 1, (2, 6))
    with torch.no_grad():
        off = CausalLMActorCritic({"text": True}, 1, **kwargs).train()
        assert torch.equal(off.evaluate(obs, response)[0], off.evaluate(obs, response)[0])
        on = CausalLMActorCritic({"text": True}, 1, **kwargs, disable_dropout=False).train()
        assert not torch.equal(on.evaluate(obs, response)[0], on.evaluate(obs, response)[0])  # the config's dropout acts


# ---- attention over a left-padded batch of mixed prompt lengths (policies/lm_attention.py) ----------------------
def mixed_batch(policy, obs):
    """A response per prompt, of mixed lengths (-1 after the end); the prompts' lengths differ too."""
    torch.manual_seed(3)
    response = torch.randint(3, VOCAB - 1, (len(PROMPTS), 12))
    response[0, 5:], response[2, 9:] = -1, -1
    assert len(set(obs["attention_mask"].sum(1).tolist())) > 1
    return response


def two_d_masks(monkeypatch):
    """The masks as they were: the 2D padding mask handed to the decoder and to generate's own prefill."""
    import async_rl.policies.causal_lm as causal_lm

    monkeypatch.setattr(causal_lm, "self_attending_pad_mask", lambda config, mask, dtype: mask)


def test_no_attention_row_is_fully_masked_in_training_reference_or_prefill(family_policy, monkeypatch):
    from async_rl.policies.lora import apply_lora
    from async_rl.policies.reference import ReferencePolicy

    family, base, obs = family_policy
    policy = apply_lora(copy.deepcopy(base), rank=2, alpha=4.0, target_modules=["q_proj", "v_proj"])
    response = mixed_batch(policy, obs)
    spy = AttentionMasks(policy)
    policy.train()
    with spy:  # the training forward and backward of a minibatch, its value, the supervised loss
        logp, _, value = policy.evaluate(obs, response)
        (logp.sum() + value.sum()).backward()
        policy.value(obs)
        policy.imitation_loss(obs, response)
    assert spy.empty_rows() == 0, family
    assert all(torch.isfinite(p.grad).all() for n, p in policy.named_parameters() if "lora_" in n)
    with spy:  # the reference: this model with its adapters off
        ReferencePolicy(policy, None)(obs, response)
    assert spy.empty_rows() == 0, family
    with spy, torch.no_grad():  # sampling: generate's prefill of the prompts, greedy and sampled rows
        policy.eval().act(obs, torch.tensor([False, True, False, True]))
    assert spy.empty_rows() == 0, family
    two_d_masks(monkeypatch)  # the check sees the rows the 2D mask gives
    with spy, torch.no_grad():
        policy.evaluate(obs, response)
    assert spy.empty_rows() > 0, family


def test_real_tokens_log_probs_are_those_of_the_2d_mask(family_policy, monkeypatch):
    """What pad positions attend to changes nothing for a real token: training's log-probs, entropies and values
    (fp32) within 1e-6 of the 2D mask's, and of each row's forward alone (no padding) within fp32 noise; the same
    greedy responses and recorded log-probs from the prefill."""
    family, policy, obs = family_policy
    response = mixed_batch(policy, obs)
    greedy = torch.tensor([True] * len(PROMPTS))
    with torch.no_grad():
        policy.eval()
        now, sampled_now = policy.evaluate(obs, response), policy.act(obs, greedy)
        alone = [policy.evaluate(obs[i:i + 1], response[i:i + 1]) for i in range(len(PROMPTS))]  # no padding at all
        two_d_masks(monkeypatch)
        before, sampled_before = policy.evaluate(obs, response), policy.act(obs, greedy)
    for got, want in zip(now, before):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=family)
    assert torch.equal(sampled_now["response"], sampled_before["response"]), family
    # The prefill's last prompt column now runs inside generate, beside the cache of the others: fp32 rounding
    # (measured up to 1.2e-6 on these logits of several units), not a change of distribution.
    torch.testing.assert_close(sampled_now["logp"], sampled_before["logp"], rtol=0, atol=5e-6, msg=family)
    for got, want in zip(now, (torch.cat(parts) for parts in zip(*alone))):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=family)


# ---- one forward per distinct prompt (policies/lm_shared_prompt.py) ---------------------------------------------
def test_a_shared_prompt_forward_gives_the_log_probs_values_and_gradients_of_one_forward_per_row(family_policy,
                                                                                              monkeypatch):
    """A minibatch of GRPO groups (each prompt 3 times, mixed prompt and response lengths, rows interleaved), under
    LoRA: the forward that computes each distinct prompt once gives the log-probs, entropies and values of the
    forward per row (fp32 noise) and the same adapter gradients; a family it cannot serve (Gemma-2's sliding
    layers) takes the forward per row."""
    import async_rl.policies.causal_lm as causal_lm
    from async_rl.policies.lm_shared_prompt import sharing_unsupported_reason
    from async_rl.policies.lora import apply_lora

    family, base, obs = family_policy
    policy = apply_lora(copy.deepcopy(base), rank=2, alpha=4.0, target_modules=["q_proj", "v_proj"]).train()
    with torch.no_grad():  # adapters away from zero, so that their gradients and outputs mean something
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    rows = torch.tensor([0, 1, 2, 3] * 3)
    grouped = obs[rows]
    torch.manual_seed(4)
    response = torch.randint(3, VOCAB - 1, (len(rows), 12))
    for i, end in enumerate([5, 12, 9, 2, 12, 7, 1, 11, 12, 3, 8, 10]):
        response[i, end:] = -1
    shared_calls = []
    shared = causal_lm.shared_prompt_hidden
    monkeypatch.setattr(causal_lm, "shared_prompt_hidden", lambda *a: (shared_calls.append(out := shared(*a)), out)[1])

    def stats(share):
        policy.share_prompts = share
        policy.zero_grad()
        logp, entropy, value = policy.evaluate(grouped, response)
        (logp.sum() + 0.1 * entropy.sum() + value.sum()).backward()
        grads = torch.cat([p.grad.flatten() for n, p in policy.named_parameters() if "lora_" in n])
        return logp.detach(), entropy.detach(), value.detach(), grads

    per_row, once = stats(False), stats(True)
    serves = sharing_unsupported_reason(policy.lm) is None
    assert serves == (family != "gemma2_softcap"), (family, sharing_unsupported_reason(policy.lm))
    assert len(shared_calls) == 1 and (shared_calls[0] is not None) == serves, family
    for got, want in zip(once[:3], per_row[:3]):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5, msg=family)
    assert bool((once[0][response < 0] == 0).all())
    assert per_row[3].norm() > 0 and (once[3] - per_row[3]).norm() <= 1e-5 * per_row[3].norm(), family
