"""A run's trained causal LM as a plain Hugging Face model folder: the LoRA deltas merged into the base
weights, with the base's config, tokenizer (chat template included) and generation config, so that
``AutoModelForCausalLM.from_pretrained(folder)`` and any tool that reads such folders (vLLM, TGI, the hub)
use the trained model without this project. The checkpoint's ``adapter/`` folder is the other export
(async_rl/checkpoint.py ``save_adapter``): peft loads it onto the base that its config names."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from async_rl.errors import ConfigError
from async_rl.policies.causal_lm import load_tokenizer
from async_rl.policies.lm_checkpoint import load_lm_policy
from async_rl.policies.lora import ADAPTER, named_lora_layers


def export_merged_lm(checkpoint: str, out: Path) -> str:
    """Write the newest weights of ``checkpoint`` (a run's log dir, its checkpoints/ dir or an epoch dir) to
    ``out`` as a Hugging Face folder; returns the base model's folder. ``out`` must not exist (nothing of a
    user's is overwritten); ConfigError for bad paths, before any weights load."""
    if out.exists():
        raise ConfigError(f"--out {out}: already exists; name a new folder (nothing is overwritten)")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: its parent folder does not exist")
    from transformers import AutoModelForCausalLM  # seconds to import

    policy, _, _ = load_lm_policy(checkpoint=checkpoint)
    base = policy.lm.name_or_path
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    # Every name of the plain model's state dict, tied twins included: LoRA on one of two tied weights (lm_head
    # under tied embeddings) makes them differ, and the export then unties them.
    layers = named_lora_layers(policy.lm)
    merged = {name: merged_tensor(policy.lm, layers, name) for name in model.state_dict()}
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied and not torch.equal(merged["lm_head.weight"], merged[_embedding_name(model)]):
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
    model.load_state_dict(merged, strict=True)
    out.mkdir()
    model.save_pretrained(str(out))  # with the base's generation_config.json as the model shipped it
    load_tokenizer(base).save_pretrained(str(out))
    return str(base)


def merged_tensor(lm: torch.nn.Module, layers: dict[str, Any], name: str) -> torch.Tensor:
    """The trained value of ``name`` (a plain model's state-dict name) in ``lm`` (``layers``: its LoRA layers by
    name): a LoRA layer's base weight plus its delta, else the tensor itself."""
    owner, _, leaf = name.rpartition(".")
    module: Any = lm.get_submodule(owner)  # a LoRA layer is peft's: its methods are not torch's
    with torch.no_grad():
        if owner in layers:
            tensor = getattr(module.base_layer, leaf)
            return tensor + module.get_delta_weight(ADAPTER).to(tensor.dtype) if leaf == "weight" else tensor.clone()
        return getattr(module, leaf).detach().clone()

def _embedding_name(model: Any) -> str:
    embeddings = model.get_input_embeddings()
    return next(f"{name}.weight" for name, module in model.named_modules() if module is embeddings)
