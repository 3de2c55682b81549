"""The attention mask of a left-padded causal-LM batch in which no query row is fully masked.

A batch of prompts of several lengths is left-padded: with the usual 2D padding mask, a pad position's
query sees only earlier pad positions, all masked, so its row of the attention mask is empty. Such rows
never reach a loss, but on recent GPUs (H100/H200, torch >= 2.11) masked SDPA's cuDNN backend returns NaN
in the query gradient for them while the forward stays finite (PyTorch issue 196678, TRL issue 7181), and
the LoRA weights' gradients sum over every row. Transformers 5 no longer patches those rows.

``self_attending_pad_mask`` builds the mask the decoder layers read, with one change to the 2D one: a pad
position also attends to itself. A real token's row is exactly as before (causal, pad keys masked, a
sliding window where the layer has one), so the real tokens' hidden states, log-probs and values are
unchanged; a pad position's output is now its own value instead of an average over masked keys, and is
used by nothing. The mask is made by transformers' own mask builders (``create_causal_mask`` and
``create_sliding_window_causal_mask``, with this rule as their ``and_mask_function``), so it is in the form
the attention implementation reads (a boolean tensor for SDPA, additive floats for eager, a block mask for
flex attention) and a model with sliding-window layers gets one mask per layer type, as its forward expects.
Flash attention takes the 2D mask as it is: it drops pad positions from its inputs (no empty rows to give).
"""
from __future__ import annotations

from typing import Any, Callable, Union

import torch

# Attention implementations whose masks transformers builds as dense or block masks, hence where an empty
# row can occur and the rule below applies. Others (flash attention) unpad and need the 2D mask.
DENSE_MASK_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention")
# Layer types whose masks this module knows how to build (a model listing another, e.g. linear attention,
# keeps the 2D mask).
MASKED_LAYER_TYPES = ("full_attention", "sliding_attention")


def real_or_diagonal(real: torch.Tensor) -> Callable[[Any, Any, Any, Any], Any]:
    """A mask function (transformers' index-based signature): key ``kv_idx`` is visible to query ``q_idx`` of row
    ``batch_idx`` when it is a real token, or when it is the query's own position."""
    def visible(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
        return real[batch_idx, kv_idx] | (q_idx == kv_idx)
    return visible


def self_attending_pad_mask(config: Any, mask: torch.Tensor, dtype: torch.dtype) -> Union[torch.Tensor, dict, Any]:
    """What to hand a decoder of ``config`` as ``attention_mask`` for the 2D padding mask ``mask`` ``[B, T]`` (1:
    real) of a forward without a cache: the mask with pad positions attending to themselves (a tensor, or one per
    layer type when ``config`` lists ``layer_types``), or ``mask`` itself when no position is padding or the
    attention implementation takes the 2D mask (flash attention). ``dtype``: the model's compute dtype (eager's
    additive mask is made in it)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    layer_types = getattr(config, "layer_types", None)
    if (bool(mask.bool().all()) or config._attn_implementation not in DENSE_MASK_IMPLEMENTATIONS
            or not set(layer_types or ()) <= set(MASKED_LAYER_TYPES)):
        return mask
    rows, width = mask.shape
    shape_only = torch.empty((rows, width, 0), dtype=dtype, device=mask.device)  # what the builders read: B, T, dtype
    # No 2D mask and no position ids given to the builders: the rule carries the padding, and position ids that
    # repeat (every pad position is 0) would be read as packed sequences.
    kwargs = dict(config=config, inputs_embeds=shape_only, attention_mask=None, cache=None, position_ids=None,
                  and_mask_function=real_or_diagonal(mask.bool()))
    if layer_types is None:
        return create_causal_mask(**kwargs)
    builders = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
    return {kind: builders[kind](**kwargs) for kind in set(layer_types)}


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    """Position ids ``[B, T]`` of a left-padded batch: counted from each row's first real token (pad positions 0),
    so a row's real tokens have the positions they have alone."""
    return (mask.cumsum(dim=1) - 1).clamp_min(0)
