"""What the attention modules of a model are handed: every mask, and its query rows that see no key."""
from __future__ import annotations

import torch


def empty_rows(mask) -> int:
    """Query rows of an attention mask with no visible key: a boolean mask's rows without True, an additive
    mask's rows at the dtype's minimum throughout (None: the causal default, every row sees itself)."""
    if mask is None:
        return 0
    if mask.dtype == torch.bool:
        return int((~mask.any(dim=-1)).sum())
    return int((mask <= torch.finfo(mask.dtype).min / 2).all(dim=-1).sum())


class AttentionMasks:
    """Every mask a decoder's attention modules are handed while entered, whatever their implementation
    (SDPA, eager): a pre-hook on each self-attention module reads its ``attention_mask`` argument."""

    def __init__(self, model):
        self.modules = [m for name, m in model.named_modules() if name.endswith("self_attn")]
        self.masks, self.handles = [], []

    def _record(self, module, args, kwargs):
        self.masks.append(kwargs.get("attention_mask"))

    def __enter__(self):
        self.masks.clear()
        self.handles = [m.register_forward_pre_hook(self._record, with_kwargs=True) for m in self.modules]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def empty_rows(self) -> int:
        assert self.masks, "no attention call seen"
        return sum(empty_rows(mask) for mask in self.masks)
