"""Real VLA checkpoint families through ``--model-path``.

Tiny randomly initialised checkpoints written with ``save_pretrained`` (``vla_tiny``): Llava,
Idefics3 (SmolVLM's class, transformers-native) and OpenVLA's Prismatic layout (remote code).
What OpenVLA's public code does and the policy must match: positions that count real tokens
whatever the padding side, the patches right after the BOS token, the prompt
``In: What action should the robot take to {instruction}?\\nOut:`` with the empty token "▁"
(Llama-2's 29871) appended when missing. Then a real LIBERO run trains the Idefics3
checkpoint through ``--model-path``.
"""
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from test_policy_vla import INSTRUCTIONS, LM_LORA, SPEC, _batch, _policy, _raw_obs, family_path  # noqa: F401

from async_rl.errors import ConfigError
from async_rl.policies import build_preprocessor, prepare_policy, vla_layouts
from async_rl.policies.lm_attention import self_attending_pad_mask
from async_rl.policies.vla_tiny import build_tiny_vla

ROOT = Path(__file__).resolve().parents[2]


def _unpadded(obs: TensorDict, i: int) -> TensorDict:
    """Row ``i`` alone, its padding removed."""
    real = obs["attention_mask"][i].bool()
    ids = obs["input_ids"][i][real].unsqueeze(0)
    return TensorDict({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                       "pixel_values": obs["pixel_values"][i : i + 1]}, batch_size=[1])


def _last_real(policy, ids, mask, pixels, index):
    """Last-layer hidden state and logits at prompt position ``index`` (per row, after BOS) of one
    forward pass (OpenVLA's layout adds the patches to the sequence: the index moves by as many)."""
    out = policy._run(ids, mask, policy._pixels(pixels), keep=0)
    rows, index = torch.arange(ids.shape[0]), index % ids.shape[1] + out.logits.shape[1] - ids.shape[1]
    return out.hidden_states[-1][rows, index], out.logits[rows, index]


@pytest.mark.parametrize("family_path", ["idefics3", "prismatic"], indirect=True)  # Llava: positions test below
def test_a_prompt_acts_the_same_alone_and_left_padded_in_a_batch(family_path):  # noqa: F811
    """The batch the workers send (prompts of different lengths, left-padded) gives each row what
    it gives alone: same action logits at every decoding step, same value."""
    policy, obs = _policy("vla_discrete", family_path, seed=1), _batch(family_path, n=2)
    assert obs["attention_mask"][0].sum() != obs["attention_mask"][1].sum()
    det = torch.ones(2, dtype=torch.bool)
    with torch.no_grad():
        batched = policy.act(obs, det)
        alone = [policy.act(_unpadded(obs, i), det[:1]) for i in range(2)]
    for i in range(2):
        for key in ("behaviour_logits", "value", "action_token"):
            torch.testing.assert_close(batched[key][i], alone[i][key][0], rtol=1e-4, atol=1e-4, msg=f"row {i} {key}")


def _language_model_inputs(policy, monkeypatch):
    """Records the (position_ids, 2D padding mask) of each forward of the Llama language model. A padded prompt's
    model gets lm_attention's mask (pad positions attend to themselves: a 4D one), so the 2D mask is the one
    run_backbone handed ``self_attending_pad_mask`` for that forward."""
    seen, padding = [], []

    def recorded(config, mask, dtype):
        padding.append(mask)
        return self_attending_pad_mask(config, mask, dtype)

    def record(_, args, kwargs):
        mask = kwargs["attention_mask"]
        seen.append((kwargs["position_ids"], mask if torch.is_tensor(mask) and mask.dim() == 2 else padding[-1]))

    monkeypatch.setattr(vla_layouts, "self_attending_pad_mask", recorded)
    lm = next(m for m in policy.backbone.modules() if type(m).__name__ == "LlamaModel")
    lm.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def _padded(rows: list[TensorDict], side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unpadded one-row prompts batched with ``side`` padding: ids, mask, index of each last real token."""
    lengths = [r["input_ids"].shape[1] for r in rows]
    width = max(lengths) + 3
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        span = slice(width - n, width) if side == "left" else slice(0, n)
        ids[i, span], mask[i, span] = rows[i]["input_ids"][0], 1
    return ids, mask, torch.tensor([width - 1] * len(rows) if side == "left" else [n - 1 for n in lengths])


def test_positions_count_real_tokens_with_either_padding_side(family_path, monkeypatch):  # noqa: F811
    """Each real token (image features included) is at its place in the unpadded prompt, and
    the last real token gives what the prompt gives alone. (Llama's rotary positions hide a
    constant shift in the outputs, so the positions are checked where the model receives them.)"""
    policy, obs = _policy("vla", family_path, seed=2), _batch(family_path, n=2)
    rows = [_unpadded(obs, i) for i in range(2)]
    seen = _language_model_inputs(policy, monkeypatch)
    with torch.no_grad():
        alone = [_last_real(policy, r["input_ids"], r["attention_mask"], r["pixel_values"], torch.tensor([-1])) for r in rows]
        for side in ("left", "right"):
            ids, mask, last = _padded(rows, side)
            seen.clear()
            hidden, logits = _last_real(policy, ids, mask, obs["pixel_values"], last)
            (position_ids, lm_mask), = seen
            for i, (want_hidden, want_logits) in enumerate(alone):
                real = lm_mask[i].bool()
                torch.testing.assert_close(position_ids[i][real], torch.arange(int(real.sum())), rtol=0, atol=0,
                                           msg=f"{side} row {i}")
                torch.testing.assert_close(hidden[i], want_hidden[0], rtol=1e-4, atol=1e-4, msg=f"{side} row {i}")
                torch.testing.assert_close(logits[i], want_logits[0], rtol=1e-4, atol=1e-4, msg=f"{side} row {i}")


@pytest.mark.parametrize("family_path", ["prismatic"], indirect=True)
def test_openvla_patches_go_after_bos_as_in_its_own_forward(family_path):  # noqa: F811
    """One unpadded prompt: the composed forward is the checkpoint's own (OpenVLA's semantics). In
    a left-padded batch its own forward puts the patches after a pad: the shorter row changes."""
    policy = _policy("vla", family_path, seed=4)
    pre = build_preprocessor("vla", SPEC, model_path=family_path, cameras=["agentview"])
    rng = np.random.default_rng(3)
    obs = torch.stack([pre(_raw_obs(rng, text), "t") for text in INSTRUCTIONS])
    pixels = policy._pixels(obs["pixel_values"])
    with torch.no_grad():
        row = _unpadded(obs, 0)
        ours = policy._run(row["input_ids"], row["attention_mask"], pixels[:1], keep=0)
        theirs = policy.backbone(input_ids=row["input_ids"], attention_mask=row["attention_mask"], pixel_values=pixels[:1],
                                 output_hidden_states=True)
        torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.hidden_states[-1], theirs.hidden_states[-1], rtol=1e-5, atol=1e-5)
        padded = policy.backbone(input_ids=obs["input_ids"], attention_mask=obs["attention_mask"], pixel_values=pixels)
        batched = policy._run(obs["input_ids"], obs["attention_mask"], pixels, keep=1)
    assert obs["attention_mask"][0, 0] == 0  # row 0 is the shorter, left-padded one
    torch.testing.assert_close(batched.logits[0, -1], ours.logits[0, -1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(padded.logits[0, -1], ours.logits[0, -1], atol=1e-3)


@pytest.mark.parametrize("family_path", ["prismatic"], indirect=True)
def test_openvla_prompt_bos_first_and_empty_token_last(family_path):  # noqa: F811
    pre = build_preprocessor("vla", SPEC, model_path=family_path, cameras=["agentview"])
    tokenizer = pre.processor.tokenizer
    empty = tokenizer.convert_tokens_to_ids("\u2581")
    prompt = "In: What action should the robot take to {instruction}?\nOut:"
    text = prompt.format(instruction=INSTRUCTIONS[0])
    assert tokenizer(text)["input_ids"][-1] != empty  # the tokenizer alone ends with ":", as Llama-2's does
    row = pre(_raw_obs(np.random.default_rng(0), INSTRUCTIONS[0]), "t")
    ids = row["input_ids"][row["attention_mask"].bool()].tolist()
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert ids[-1] == empty and ids[-2] != empty
    # A prompt that already ends with the empty token ("Out: ") gets no second one.
    spaced = build_preprocessor("vla", SPEC, model_path=family_path, cameras=["agentview"], prompt=prompt + " ")
    again = spaced(_raw_obs(np.random.default_rng(0), INSTRUCTIONS[0]), "t")
    assert again["input_ids"].tolist() == row["input_ids"].tolist()
    with pytest.raises(ConfigError, match="trust_remote_code: true"):  # remote code is the user's explicit choice
        prepare_policy("vla", SPEC, 7, family_path, {})


@pytest.mark.parametrize("family, policy", [("idefics3", "vla")])
def test_native_checkpoint_trains_through_model_path(tmp_path, family, policy):
    """The LIBERO launch with ``--model-path`` pointing at a tiny Idefics3 checkpoint (LoRA
    targets named for its ``text_model``): two epochs, the inference actor holding the trained
    weights."""
    pytest.importorskip("libero", reason="LIBERO is not installed (make setup installs it)")
    from test_e2e_libero import _inspect

    from async_rl.config import load_config  # the runtime: only the real run needs it
    from async_rl.driver import run

    path = build_tiny_vla(tmp_path / family, family=family)
    cfg = load_config(["--model-path", str(path), "--init-from", "null", "--lora-target-modules", LM_LORA, "--log-dir", str(tmp_path / "run"),
                       "--max-epochs", "2", "--max-minutes", "null", "--swanlab-mode", "disabled",
                       "--num-rollout-workers", "1", "--num-eval-workers", "0",
                       "--env-kwargs", "{suite: libero_spatial, tasks: [0], image_size: 64, cameras: [agentview], "
                                       "max_episode_steps: 10, settle_steps: 2}",
                       "--rollout-steps", "8", "--train-batch-size", "4", "--accumulation-steps", "2",
                       "--super-batch-size", "8", "--updates-per-epoch", "1",
                       "--critic-warmup-epochs", "0"],  # the policy trains from the first epoch (the check below)
                      str(ROOT / "configs" / f"libero_ppo{'_discrete' if policy == 'vla_discrete' else ''}.yaml"))
    summary = run(cfg, inspect=_inspect)
    seen = summary["inspect"]
    assert summary["epochs"] == 2 and summary["sync/policy_version"] == 2
    assert seen["status"]["global_step"] == 2 and np.isfinite(summary["train/policy_loss"])
    for name, value in seen["trainer"].items():
        torch.testing.assert_close(seen["inference"][name], value, rtol=0, atol=0, msg=name)
    # LoRA trained Idefics3's text model (merged into the broadcast weights); its vision tower is frozen.
    from safetensors.torch import load_file

    initial = load_file(str(path / "model.safetensors"))
    q_proj, vision = "model.text_model.layers.0.self_attn.q_proj.weight", "model.vision_model.embeddings.patch_embedding.weight"
    assert not torch.equal(seen["inference"][f"backbone.{q_proj}"], initial[q_proj])
    assert torch.equal(seen["inference"][f"backbone.{vision}"], initial[vision])
