"""The reference policy of a KL-to-reference term or of PACS: log-probs of stored actions, no gradient.

With LoRA it is the trained model itself with its adapters off (no second copy); parameters that
LoRA trains whole (``lora_trainable``: an action head, ``log_std``) are not undone by switching the
adapters off, so their start values are kept (small) and put in place for the reference's forward.
Otherwise a frozen copy of the initial weights, built once on the trainer and never updated.

``reference_logp_on: sampler`` computes the same log-probs on the inference actor right after sampling
(``sampler_reference_logp``): it holds the same frozen base under the same adapters (``lora_sync: adapters``),
so its model with the adapters off is the reference wherever no parameter trained whole enters the log-probs.
"""
from __future__ import annotations

import copy
from typing import Optional, cast

import torch
from tensordict import TensorDict

from async_rl.policies.base import ActorCritic
from async_rl.policies.lora import adapters_disabled, is_lora_name, named_lora_layers


def frozen_copy(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    """A frozen copy of ``model`` for the reference, or None when it has LoRA layers (it needs none).
    Take it before DeepSpeed wraps the model (its hooks are not to be copied)."""
    if named_lora_layers(model):
        return None
    frozen = copy.deepcopy(model).eval()
    frozen.requires_grad_(False)
    return frozen


class ReferencePolicy:
    """``reference(obs, action)`` -> log pi_ref(action | obs) ``[B, A]``, without gradient."""

    def __init__(self, trained: torch.nn.Module, frozen: Optional[torch.nn.Module]) -> None:
        """``trained``: the model being trained (after DeepSpeed set it up); ``frozen``: from
        ``frozen_copy`` (None with LoRA)."""
        if frozen is not None:
            # The trained tensors as they start (rank 0's, broadcast by DeepSpeed), in their dtype and device.
            start = dict([*trained.named_parameters(), *trained.named_buffers()])
            for name, tensor in [*frozen.named_parameters(), *frozen.named_buffers()]:
                tensor.data = start[name].detach().clone()
        self.trained, self.frozen = trained, frozen
        # LoRA: the start values of the parameters trained whole (not adapters), which the adapters' switch leaves
        # as trained; put in place by functional_call, which swaps the tensors (writing the trained parameters
        # in place would break the autograd graph of the minibatch's current-policy forward).
        self.whole_at_start = {} if frozen is not None else {
            name: param.detach().clone() for name, param in trained.named_parameters()
            if param.requires_grad and not is_lora_name(name)}

    @torch.no_grad()
    def __call__(self, obs: TensorDict, action: torch.Tensor) -> torch.Tensor:
        if self.frozen is not None:
            return cast(ActorCritic, self.frozen).evaluate(obs, action)[0]
        with adapters_disabled(self.trained):  # forward is evaluate (ActorCritic); an empty dict swaps nothing
            return torch.func.functional_call(self.trained, self.whole_at_start, (obs, action), strict=False)[0]


def sampler_reference_logp(model: torch.nn.Module, obs: TensorDict, action: torch.Tensor,
                           sampled: torch.Tensor) -> torch.Tensor:
    """On the inference actor: log pi_ref(action | obs) ``[B, A]`` of the rows ``sampled`` [B] (bool), 0 elsewhere
    (greedy answers are evaluations, never trained on), computed by ``model`` with its LoRA adapters off."""
    logp_ref = torch.zeros(action.shape, dtype=torch.float32, device=action.device)
    rows = sampled.to(torch.bool).reshape(-1).nonzero().flatten().to(action.device)
    if len(rows):
        with torch.no_grad(), adapters_disabled(model):
            logp_ref[rows] = cast(ActorCritic, model).evaluate(obs[rows], action[rows])[0].float()
    return logp_ref

