"""A tiny model in OpenVLA's (Prismatic's) checkpoint layout, loaded as remote code.

Test fixture: ``vla_tiny`` copies this file next to a tiny checkpoint and names its classes in
the config's ``auto_map``, as OpenVLA's checkpoints ship ``modeling_prismatic.py``. It shares
with OpenVLA's public code the interface the policy relies on, not the code: the submodules
``vision_backbone`` (pixels -> patch features), ``projector`` (-> the language model's width)
and ``language_model`` (a causal LM), and ``config.text_config`` / ``config.norm_stats``. Its
``forward`` keeps the limits of OpenVLA's: the patch embeddings go right after position 0
(meant to be the BOS token, whatever padding put there), there is no ``position_ids``
argument, and cached decoding takes one row only. Those limits are why the policy composes
the three submodules itself (``vla_layouts.PrismaticLayout``).

Self-contained on purpose (torch and transformers only): transformers imports it from the
checkpoint directory. Named with a leading underscore so the policy registry skips it.
"""
from typing import Any, Optional

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast


class TinyPrismaticConfig(PretrainedConfig):
    model_type = "openvla"

    def __init__(self, text_config: Any = None, image_size: int = 64, patch_size: int = 16,
                 vision_hidden_size: int = 32, norm_stats: Optional[dict] = None, n_action_bins: int = 256, **kwargs):
        if isinstance(text_config, dict):
            text_config = AutoConfig.for_model(**text_config)
        self.text_config = text_config
        self.image_size, self.patch_size, self.vision_hidden_size = image_size, patch_size, vision_hidden_size
        self.norm_stats, self.n_action_bins = norm_stats, n_action_bins
        super().__init__(**kwargs)


class TinyPatchEncoder(nn.Module):
    """Pixels [B, 3, H, W] -> patch features [B, (H/p)*(W/p), D]: patchify, position embedding, MLP."""

    def __init__(self, config: TinyPrismaticConfig) -> None:
        super().__init__()
        d, p = config.vision_hidden_size, config.patch_size
        self.patchify = nn.Conv2d(3, d, kernel_size=p, stride=p)
        self.position = nn.Parameter(torch.zeros(1, (config.image_size // p) ** 2, d))
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.embed_dim = d

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patchify(pixel_values).flatten(2).transpose(1, 2) + self.position
        return x + self.mlp(x)


class TinyPrismaticForActionPrediction(PreTrainedModel):
    config_class = TinyPrismaticConfig
    base_model_prefix = "prismatic"

    def __init__(self, config: TinyPrismaticConfig) -> None:
        super().__init__(config)
        hidden = config.text_config.hidden_size
        self.vision_backbone = TinyPatchEncoder(config)
        self.projector = nn.Sequential(nn.Linear(config.vision_hidden_size, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.language_model = AutoModelForCausalLM.from_config(config.text_config)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, TinyPatchEncoder):
            nn.init.normal_(module.position, std=0.02)

    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.get_input_embeddings()

    def forward(self, input_ids: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                pixel_values: Optional[torch.Tensor] = None, past_key_values=None, use_cache: Optional[bool] = None,
                output_hidden_states: Optional[bool] = None, return_dict: Optional[bool] = None) -> CausalLMOutputWithPast:
        if past_key_values is not None and input_ids.shape[1] == 1:  # cached decoding, one row only
            if input_ids.shape[0] != 1:
                raise ValueError("cached generation takes batch size 1")
            return self.language_model(input_ids=input_ids, cache=past_key_values, use_cache=use_cache,
                                       output_hidden_states=output_hidden_states, return_dict=True)
        embeds = self.get_input_embeddings()(input_ids)
        if pixel_values is not None:  # patches after position 0
            patches = self.projector(self.vision_backbone(pixel_values))
            embeds = torch.cat([embeds[:, :1], patches, embeds[:, 1:]], dim=1)
            if attention_mask is not None:
                ones = attention_mask.new_ones(patches.shape[:2])
                attention_mask = torch.cat([attention_mask[:, :1], ones, attention_mask[:, 1:]], dim=1)
        return self.language_model(inputs_embeds=embeds, attention_mask=attention_mask, cache=past_key_values,
                                   use_cache=use_cache, output_hidden_states=output_hidden_states, return_dict=True)
