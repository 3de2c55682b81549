"""How each VLM checkpoint family takes a VLA's camera images and prompt.

Three layouts, chosen from the checkpoint's config (``checkpoint_layout``):

- ``image_tokens`` (Llava and most ``AutoModelForImageTextToText`` classes): the prompt holds
  image placeholder tokens that the processor expands and the model fills with image features;
  images go in flat, ``[batch * cameras, C, H, W]``.
- ``idefics3`` (Idefics3 / SmolVLM): placeholder tokens too, images per row
  ``[batch, cameras, C, H, W]``.
- ``prismatic`` (OpenVLA, remote code): no image tokens; the patch embeddings go right after
  the BOS token. OpenVLA's own ``forward`` inserts them at position 0 whatever is there, takes
  no ``position_ids`` and decodes with a cache one row at a time, so a left-padded batch would
  put the patches after a pad token and shift every position. This layout composes the
  checkpoint's ``vision_backbone``, ``projector`` and ``language_model`` itself: patches after
  each row's BOS, positions counted over real tokens only, batched cached decoding.

In every layout the positions come from the attention mask (``cumsum - 1``), so a prompt
gives the same outputs alone or left-padded in a batch.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from async_rl.policies.lm_attention import self_attending_pad_mask

IMAGES_PER_ROW = ("idefics3", "smolvlm")  # model types that take pixel_values [B, images, C, H, W]


def checkpoint_layout(model_path: str | Path) -> str:
    """The layout of the checkpoint at ``model_path`` (its config.json, read without transformers)."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    if "AutoModelForVision2Seq" in (config.get("auto_map") or {}):
        return "prismatic"
    return "idefics3" if config.get("model_type") in IMAGES_PER_ROW else "image_tokens"


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only (pads, left or right, repeat their neighbour's)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def patch_order(mask: torch.Tensor, num_patches: int) -> torch.Tensor:
    """Index into ``[tokens (L); patches (P)]`` that puts the patches right after each row's first
    real token (its BOS): ``[pads, BOS, patches, rest of the prompt]``, shape ``[B, L + P]``."""
    length = mask.shape[1]
    bos = (mask.long().cumsum(-1) == 0).sum(-1, keepdim=True)  # index of the first real token
    j = torch.arange(length + num_patches, device=mask.device).unsqueeze(0)
    return torch.where(j <= bos, j, torch.where(j <= bos + num_patches, length + j - bos - 1, j - num_patches))


def flat_pixels(layout: str, pixels: torch.Tensor) -> torch.Tensor:
    """Normalised ``[B, cameras, C, H, W]`` -> what the family's model takes."""
    return pixels if layout == "idefics3" else pixels.flatten(0, 1)


def run_backbone(layout: str, backbone: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 pixel_values: Optional[torch.Tensor], past: Any, keep: int, hidden: bool, keep_logits: bool) -> Any:
    """One forward pass: the prompt (with ``pixel_values``), or, with ``past``, new tokens whose
    ``attention_mask`` covers everything before them too. Returns the model output (logits of
    the last ``keep`` positions when the model can trim them, ``hidden_states`` if ``hidden``)."""
    kwargs = {"logits_to_keep": keep} if keep_logits else {}
    common = dict(cache=past, use_cache=past is not None or not hidden, output_hidden_states=hidden,
                  return_dict=True, **kwargs)
    if layout != "prismatic":
        pos = positions(attention_mask)[:, -input_ids.shape[1]:]
        return backbone(input_ids=input_ids, attention_mask=_prompt_mask(backbone, attention_mask, past),
                        pixel_values=pixel_values, position_ids=pos, **common)
    lm = backbone.language_model
    embeds = lm.get_input_embeddings()(input_ids)
    if pixel_values is not None:  # the prompt: cameras' patches side by side, after BOS
        patches = backbone.projector(backbone.vision_backbone(pixel_values))
        patches = patches.reshape(input_ids.shape[0], -1, patches.shape[-1]).to(embeds.dtype)
        order = patch_order(attention_mask, patches.shape[1])
        embeds = torch.cat([embeds, patches], 1).gather(1, order.unsqueeze(-1).expand(-1, -1, embeds.shape[-1]))
    else:  # decoding: the cache holds the patches too
        num_patches = past.get_seq_length() - (attention_mask.shape[1] - input_ids.shape[1])
        order = patch_order(attention_mask, num_patches)
    mask = torch.cat([attention_mask, attention_mask.new_ones(order.shape[0], order.shape[1] - attention_mask.shape[1])], 1)
    mask = mask.gather(1, order)
    return lm(inputs_embeds=embeds, attention_mask=_prompt_mask(lm, mask, past),
              position_ids=positions(mask)[:, -embeds.shape[1]:], **common)


def _prompt_mask(model: Any, mask: torch.Tensor, past: Any) -> Any:
    """The attention mask of a forward over a left-padded prompt: pad positions attend to themselves only, so that
    no query row has every key masked (``lm_attention``); once the cache holds the prompt (decoding: every query is a
    real token) the 2D mask as it is."""
    if past is not None and past.get_seq_length() > 0:
        return mask
    return self_attending_pad_mask(model.config.get_text_config(), mask, model.get_input_embeddings().weight.dtype)
