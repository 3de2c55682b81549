"""What every policy provides to the runtime."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Protocol

import torch
from tensordict import TensorDict

from async_rl.errors import ConfigError
from async_rl.policies.lora import merged_named_tensors

ObsSpec = Mapping[str, Any]  # e.g. {"state_dim": 39}; what the env tells the policy about observations


class Preprocessor(Protocol):
    """Runs on rollout workers: raw env observation -> a TensorDict of model inputs (no batch dim)."""

    def __call__(self, obs: Any, task_name: str) -> TensorDict: ...


class ActorCritic(torch.nn.Module):
    """Actor-critic interface used by the inference actor and the trainer.

    ``act`` returns, per sample: ``action`` (the normalised action that is trained on),
    ``env_action`` (what the environment receives), ``logp`` (behaviour log-prob per action
    dimension), ``value`` and possibly behaviour statistics (e.g. ``mu``/``log_std`` or ``logits``).
    """

    action_key = "action"  # the experience key the trainer passes to ``evaluate`` (e.g. "action_token")
    # Behaviour statistics of ``act`` that training reads, so they are shipped and stored in the
    # experience record (async_rl/experience.py); the rest of ``act``'s answer is dropped by the
    # inference actor. None today: the ratio uses the stored ``logp``.
    behaviour_stats: tuple[str, ...] = ()
    # Name prefixes of parameters that no log-prob reads (a value head): trained whole under LoRA, they leave the
    # reference policy as it was, so the sampler's model with its adapters off computes it (reference_logp_on sampler).
    logp_free_prefixes: tuple[str, ...] = ()
    # The attribute holding a Hugging Face model that LoRA adapts (``lm``, ``backbone``), or "" for none: a
    # checkpoint's adapter/ folder is written relative to it, so PeftModel.from_pretrained(that model) loads it.
    hf_model_attr: str = ""
    # Whether ``evaluate`` computes each distinct observation prefix once (the causal LM's prompts): the trainer then
    # keeps a group's rows in one minibatch (``actors/groups.py`` ``group_contiguous_order``).
    share_prompts: bool = False

    def act(self, obs: TensorDict, deterministic: bool | torch.Tensor = False) -> TensorDict:
        """Sample (or, where ``deterministic`` [B] is true, take the mode of) actions for a batch."""
        raise NotImplementedError

    def evaluate(self, obs: TensorDict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logp per action dimension, entropy per action dimension, value) of ``action``."""
        raise NotImplementedError

    def action_mask(self, action: torch.Tensor) -> Optional[torch.Tensor]:
        """Which elements of a batch of stored actions are real ([B, A] bool), for policies whose
        actions vary in length (a response of tokens); None: every element is."""
        return None

    def forward(self, obs: TensorDict, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # The DeepSpeed engine calls forward; training evaluates stored actions.
        return self.evaluate(obs, action)

    def imitation_loss(self, obs: TensorDict, env_action: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Behaviour cloning's loss for demonstrated env actions, and its logged terms
        (``algo.behaviour_cloning``); policies that cannot learn from demonstrations do not implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not learn from demonstrations")

    def value(self, obs: TensorDict) -> torch.Tensor:
        """State value ``[B]``."""
        raise NotImplementedError

    def value_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters of the value head (their own optimiser group and learning rate)."""
        raise NotImplementedError

    has_critic = True  # False after drop_critic(): an estimator that needs no critic (grpo, rloo, ...)

    def drop_critic(self) -> "ActorCritic":
        """No critic for this run: the value parameters are frozen (no value loss trains them, no
        optimiser state), left out of ``inference_tensors`` (not broadcast), and the inference
        actor serves value 0. Call it again after LoRA: the value head's adapters freeze too."""
        self.has_critic = False
        for p in self.value_parameters():
            p.requires_grad_(False)
        return self

    def prepare_sampling(self) -> None:
        """Start, without waiting, what sampling needs outside the module (a causal LM's vLLM engine), so that it
        overlaps the run's start rather than delaying the first batch; nothing for most policies. The inference
        actor calls it once it holds the policy."""

    def close(self) -> None:
        """Release what the policy started outside its module (a causal LM's vLLM engine process and its weights'
        folder in shared memory); nothing for most policies. The inference actor calls it at shut-down."""

    # LoRA with adapter-only sync (``lora_sync: adapters``): the inference copy holds the same frozen base
    # and adapters, and only the trained tensors travel. Set on both sides by trainer_setup.training_model.
    sync_adapters_only = False
    # The tensors adapter-only sync sends, fixed where the trainable set is final (``training_model``):
    # ``requires_grad`` cannot say it, since the reference forward (adapters off) clears it for a while,
    # and a weight signature asked then (a heal after an inference restart, mid-epoch) would list none.
    synced_names: "frozenset[str] | None" = None

    def inference_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Named tensors the inference copy needs, in a fixed order (what the weight sync sends);
        with LoRA, the adapters are merged into the base weights under the plain names, or with
        ``sync_adapters_only`` only the trained tensors (adapters, parameters trained whole) are
        sent. Without a critic the value head's tensors are left out."""
        if self.sync_adapters_only:  # the frozen critic's tensors are not trainable either
            if self.synced_names is None:
                return [(n, p) for n, p in self.named_parameters() if p.requires_grad]
            return [(n, p) for n, p in self.named_parameters() if n in self.synced_names]

        tensors = merged_named_tensors(self)
        if self.has_critic:
            return tensors
        value_ids = {id(p) for p in self.value_parameters()}
        # Under LoRA a value weight lives at <layer>.base_layer.<leaf>; merged, it is <layer>.<leaf>.
        value_names = {n.replace(".base_layer.", ".") for n, p in self.named_parameters() if id(p) in value_ids}
        return [(n, t) for n, t in tensors if n not in value_names]


def check_env_prompts_fit(encode: Callable[[str], Any], prompts: Iterable[str]) -> None:
    """Every prompt the env shows in its obs_spec, encoded as the policy will (``encode`` raises a ValueError
    naming the prompt limit and the fix when one is too long): a ConfigError in the driver, before Ray starts,
    instead of a failure in every actor."""
    for prompt in prompts:
        try:
            encode(prompt)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
