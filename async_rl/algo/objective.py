"""The training objective, built once from the config: policy loss (clip mode), value loss, entropy
bonus, optional behaviour KL, optional KL to a reference policy, and the guards that skip a
minibatch (ratio guard, non-finite loss).

Every term and diagnostic comes back by name, so whatever a loss reports reaches the logs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

import torch

from async_rl.algo.functional import (
    KL_ESTIMATORS,
    StepCounts,
    aggregate,
    kl_penalty,
    loss_aggregation,
    ratio_guard,
    value_loss,
)
from async_rl.algo.losses import ClipMode, PolicyLoss, PolicyLossParams

Tensor = torch.Tensor

SKIP_REASONS = ("ratio_guard", "nonfinite_loss")


@dataclass
class LossInputs:
    """One minibatch as the objective reads it (an advantage estimator fills it in)."""

    logp: Tensor  # [B, A] current policy, with gradient
    logp_old: Tensor  # [B, A] behaviour policy
    entropy: Tensor  # [B, A] current policy, with gradient
    value: Tensor  # [B] current critic, with gradient
    value_old: Tensor  # [B] behaviour critic (anchor of the value clip)
    value_target: Optional[Tensor]  # [B]; None: no critic is trained
    advantage: Tensor  # [B]
    logp_ref: Optional[Tensor] = None  # [B, A] reference policy (no gradient); None: not computed
    group_id: Optional[Tensor] = None  # [B] int64: the group of the step's episode (group rollouts)
    success: Optional[Tensor] = None  # [B] the episode's outcome (0/1), on every step of it
    mask: Optional[Tensor] = None  # [B, A] bool: the action's real elements (a response's tokens); None: all
    step_counts: Optional[StepCounts] = None  # loss_agg global-token-mean: the optimiser step's (the trainer's count)


@dataclass
class ObjectiveOut:
    loss: Tensor
    terms: dict[str, float]  # every term and diagnostic, by name
    skip: Optional[str]  # one of SKIP_REASONS: this minibatch must not reach the optimiser


class ObjectiveOptions(Protocol):
    """The run options an Objective is built from (the algorithms sit below the config layer: the RunConfig is
    one such object)."""

    value_coef: float
    value_clip_eps: Optional[float]
    entropy_coef: float
    kl_coef: float
    ratio_threshold: Optional[float]
    kl_ref_coef: float

    # Read-only, so that the config's own types (Literal types of these strings, a property) are these.
    @property
    def clip(self) -> ClipMode: ...

    @property
    def kl_ref_estimator(self) -> str: ...

    @property
    def kl_ref_as(self) -> str: ...

    @property
    def loss_agg(self) -> str: ...


class Objective:
    """``objective(inputs)`` -> total loss, named terms, and whether to skip the minibatch."""

    def __init__(self, clip: ClipMode | str, clip_params: Mapping[str, Any] | PolicyLossParams | None = None, *,
                 value_coef: float = 0.5, value_clip_eps: Optional[float] = None, entropy_coef: float = 0.0,
                 kl_coef: float = 0.0, ratio_threshold: Optional[float] = None, kl_ref_coef: float = 0.0,
                 kl_ref_estimator: str = "k3", kl_ref_as: str = "loss", loss_agg: str = "minibatch-token-mean") -> None:
        """``clip``: a resolved clip mode (``RunConfig.clip``), or a mode's name resolved here with ``clip_params``.
        ``kl_coef``: KL to the behaviour policy (the one that collected the batch); ``kl_ref_coef``:
        KL to the reference policy (``x.logp_ref``), a loss term (``kl_ref_as="loss"``) or only logged
        (``"reward"``: the estimator subtracts it from the rewards, ``kl_reward_penalty``).
        ``loss_agg``: how a masked action's per-token terms (policy, entropy, KL) become one number
        (``functional.aggregate``); it applies where a minibatch carries a mask (variable-length actions)."""
        if kl_ref_estimator not in KL_ESTIMATORS or kl_ref_as not in ("loss", "reward"):
            raise ValueError(f"kl_ref_estimator '{kl_ref_estimator}' / kl_ref_as '{kl_ref_as}': "
                             f"valid {', '.join(KL_ESTIMATORS)} / loss, reward")
        self.loss_agg = loss_aggregation(loss_agg)
        self.policy_loss = PolicyLoss(clip, clip_params, loss_agg)
        self.value_coef, self.value_clip_eps = value_coef, value_clip_eps
        self.entropy_coef, self.kl_coef, self.ratio_threshold = entropy_coef, kl_coef, ratio_threshold
        self.kl_ref_coef, self.kl_ref_estimator, self.kl_ref_as = kl_ref_coef, kl_ref_estimator, kl_ref_as

    @classmethod
    def from_config(cls, cfg: ObjectiveOptions) -> "Objective":
        """From the objective keys of a config (its resolved ``clip``, ``*_coef``, ...)."""
        return cls(cfg.clip, value_coef=cfg.value_coef, value_clip_eps=cfg.value_clip_eps,
                   entropy_coef=cfg.entropy_coef, kl_coef=cfg.kl_coef, ratio_threshold=cfg.ratio_threshold,
                   kl_ref_coef=cfg.kl_ref_coef, kl_ref_estimator=cfg.kl_ref_estimator, kl_ref_as=cfg.kl_ref_as,
                   loss_agg=cfg.loss_agg)

    @property
    def needs_reference(self) -> bool:
        """Whether a minibatch must carry the reference policy's log-probs (``LossInputs.logp_ref``)."""
        return self.kl_ref_coef > 0 or "logp_ref" in self.policy_loss.reads

    def _per_action(self, x: Tensor, mask: Optional[Tensor], counts: Optional[StepCounts]) -> Tensor:
        """A term of a whole action: the sum over its dimensions, averaged over the batch (a joint
        Gaussian's entropy); for a masked (variable-length) action the per-token terms aggregated
        as ``loss_agg`` says."""
        return x.sum(-1).mean() if mask is None else self._per_element(x, mask, counts)

    def _per_element(self, x: Tensor, mask: Optional[Tensor], counts: Optional[StepCounts]) -> Tensor:
        if mask is None:
            return x.mean()
        return aggregate(x, mask, self.loss_agg, None if counts is None else counts.tokens)

    def __call__(self, x: LossInputs, critic_only: bool = False) -> ObjectiveOut:
        """``critic_only`` (a critic warm-up): the loss is the value term alone; the other terms are still
        reported (and the guards still apply)."""
        if critic_only and x.value_target is None:
            raise ValueError("critic_only: the minibatch has no value targets (the estimator trains no critic)")
        if self.needs_reference and x.logp_ref is None:
            raise ValueError("the objective reads the reference policy (kl_ref_coef > 0 or clip mode pacs) but the "
                             "minibatch has no logp_ref")
        policy_loss, terms = self.policy_loss(x.logp, x.logp_old, x.advantage.unsqueeze(-1), x.mask, logp_ref=x.logp_ref,
                                              group_id=x.group_id, success=x.success, counts=x.step_counts)
        entropy = self._per_action(x.entropy, x.mask, x.step_counts)
        parts = {"policy_loss": policy_loss, "entropy": entropy}
        loss = policy_loss - self.entropy_coef * entropy
        if x.value_target is not None:
            parts["value_loss"] = value_loss(x.value, x.value_old, x.value_target, self.value_clip_eps)
            loss = loss + self.value_coef * parts["value_loss"]
        if self.kl_coef > 0:  # k3 estimate of KL(current || behaviour) on the behaviour's samples
            parts["kl"] = self._per_element(kl_penalty(x.logp, x.logp_old.detach(), "k3"), x.mask, x.step_counts)
            loss = loss + self.kl_coef * parts["kl"]
        if self.kl_ref_coef > 0:  # KL(current || reference) of the whole action, on the behaviour's samples
            assert x.logp_ref is not None  # needs_reference: checked above
            parts["kl_ref"] = self._per_action(kl_penalty(x.logp, x.logp_ref.detach().to(x.logp.dtype), self.kl_ref_estimator),
                                               x.mask, x.step_counts)
            if self.kl_ref_as == "loss":
                loss = loss + self.kl_ref_coef * parts["kl_ref"]
        if critic_only:
            loss = self.value_coef * parts["value_loss"]
        parts["loss"] = loss
        values = torch.stack([v.detach().to(torch.float64).reshape(()) for v in parts.values()]).tolist()
        terms.update(zip(parts, values))
        skip = None
        if not math.isfinite(terms["loss"]):
            skip = "nonfinite_loss"
        elif ratio_guard(terms["ratio_mean"], self.ratio_threshold):
            skip = "ratio_guard"
        terms.update({f"{reason}_skipped": float(skip == reason) for reason in SKIP_REASONS})
        return ObjectiveOut(loss, terms, skip)
