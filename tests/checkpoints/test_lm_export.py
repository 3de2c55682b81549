"""A trained causal LM taken away from the project: the checkpoint's adapter/ folder loads with peft's own call
(every tensor, onto the base its config names), and launch/export_lm.py writes a merged folder that plain
transformers loads; both give the trained policy's greedy answers. Small random models saved as Hugging Face
folders (tests/policies/test_lm_model_families.py), one with tied embeddings; the real model after a real run is
checked in tests/e2e/test_e2e_lm.py."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_lm_model_families import PROMPTS, save_model

from async_rl import checkpoint as ckpt
from async_rl.policies.causal_lm import CausalLMActorCritic, prepare_causal_lm
from async_rl.policies.lm_checkpoint import answer, load_lm_policy
from async_rl.policies.lora import apply_lora

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
ROOT = Path(__file__).resolve().parents[2]
NEW_TOKENS = 10


def trained_checkpoint(tmp_path: Path, family: str) -> Path:
    """A checkpoint as a run of a causal LM with LoRA writes it, its adapters moved away from zero."""
    (tmp_path / "base").mkdir()
    base = save_model(tmp_path / "base", family)
    kwargs = prepare_causal_lm({"text": True}, 1, str(base), {"max_new_tokens": NEW_TOKENS, "max_prompt_tokens": 24})
    torch.manual_seed(0)
    policy = CausalLMActorCritic({"text": True}, 1, **kwargs).drop_critic()
    policy = apply_lora(policy, 4, 8.0, 0.0, None, []).drop_critic()  # as trainer_setup.training_model builds it
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    config = {"policy": "causal_lm", "policy_kwargs": kwargs, "model_path": str(base), "advantage": "grpo",
              "lora_rank": 4, "lora_alpha": 8.0, "lora_dropout": 0.0, "lora_target_modules": None, "lora_trainable": []}
    staging = ckpt.staging_dir(tmp_path / "run" / "checkpoints", 1)
    ckpt.save_model(policy, staging)
    return ckpt.commit(staging, {"format": ckpt.FORMAT, "epoch": 1, "policy_version": 1, "config": config}, keep=2)


def greedy_by_transformers(model, tokenizer, prompts, max_new_tokens=NEW_TOKENS, stop_ids=None):
    """Greedy answers (token ids) of a plain transformers model to the chat-templated prompts, one prompt at a
    time, to ``stop_ids`` (default: the tokenizer's eos). Plain greedy decoding: a model's generation config may
    ship a repetition penalty (a family here does), which generate would apply and the policy's answers do not;
    a PeftModel's generate reads its base model's config."""
    plain = model.get_base_model() if isinstance(model, peft.PeftModel) else model
    plain.generation_config = transformers.GenerationConfig(eos_token_id=stop_ids or tokenizer.eos_token_id,
                                                            pad_token_id=tokenizer.pad_token_id)
    out = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        with torch.inference_mode():
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens)
        out.append([int(t) for t in seq[0, ids.shape[1]:]])
    return out


def strip_after_stop(rows, stop):
    """Tokens up to and including the first stop token (the policy pads after it, generate may too)."""
    return [row[:row.index(stop) + 1] if stop in row else row for row in rows]


@pytest.mark.parametrize("family", ["qwen2", "llama_generation_config"])
def test_both_exports_load_with_the_ecosystems_calls_and_answer_as_the_policy(tmp_path, family):
    directory = trained_checkpoint(tmp_path, family)
    policy, preprocess, _ = load_lm_policy(checkpoint=str(directory))
    expected = strip_after_stop(answer(policy, preprocess, PROMPTS, greedy=True), 1)
    assert any(expected), "no tokens generated: nothing to compare"

    adapter = directory / "adapter"
    meta = json.loads((adapter / "adapter_config.json").read_text())
    assert meta["base_model_name_or_path"] == str(tmp_path / "base")
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    # Relative to the Hugging Face model (no "lm." of the policy's own), the policy's value head left out.
    assert saved and all(name.startswith(("base_model.model.model.layers.", "base_model.model.lm_head.")) for name in saved)
    base = transformers.AutoModelForCausalLM.from_pretrained(meta["base_model_name_or_path"], dtype=torch.float32)
    with_adapter = peft.PeftModel.from_pretrained(base, str(adapter)).eval()
    loaded = {n: p for n, p in with_adapter.named_parameters() if "lora_B" in n}
    assert len(loaded) == sum("lora_B" in n for n in saved) and all(p.abs().sum() > 0 for p in loaded.values())
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "base"))
    assert strip_after_stop(greedy_by_transformers(with_adapter, tokenizer, PROMPTS), 1) == expected

    out = tmp_path / "exported"
    done = subprocess.run([sys.executable, str(ROOT / "launch" / "export_lm.py"), "--checkpoint", str(tmp_path / "run"),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    exported_tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert exported_tokenizer.chat_template == tokenizer.chat_template
    assert (out / "generation_config.json").is_file()
    assert strip_after_stop(greedy_by_transformers(merged, exported_tokenizer, PROMPTS), 1) == expected
    # The project's own evaluation of the exported folder is the base loading path: the same answers again.
    again, again_pre, _ = load_lm_policy(model_path=str(out), overrides={"max_new_tokens": NEW_TOKENS})
    assert strip_after_stop(answer(again, again_pre, PROMPTS, greedy=True), 1) == expected


def test_export_refuses_an_existing_folder_and_a_missing_checkpoint_in_one_line(tmp_path):
    (tmp_path / "taken").mkdir()
    for argv, message in ((["--checkpoint", str(tmp_path / "none"), "--out", str(tmp_path / "new")], "no such directory"),
                          (["--checkpoint", str(tmp_path), "--out", str(tmp_path / "taken")], "already exists")):
        done = subprocess.run([sys.executable, str(ROOT / "launch" / "export_lm.py"), *argv], capture_output=True,
                              text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
