"""Policy losses: one registry, one signature, one function per clip mode.

Every mode maps (``PolicyInputs``: ratio r, advantage A, ...; params) to a per-element loss ``l``
plus two boolean masks used for diagnostics: where a hard clip is active and where the gradient
is exactly zero because of that clip. ``compute_policy_loss`` does the shared work around it: the
ratio at the chosen level (``ratio_level``: per element, or one per action), broadcasting,
masking, the mean and the metrics.

Adding a mode is one function and one ``@register_policy_loss`` line.
"""
from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Mapping, Optional

import pydantic
import torch
import yaml

from async_rl.algo.advantages import group_relative, group_sum
from async_rl.algo.functional import StepCounts, aggregate, loss_aggregation, per_action
from async_rl.errors import ConfigError
from async_rl.registry import Registry
from async_rl.validation import validate_model

Tensor = torch.Tensor


def _given_or(name: str, fallback: str) -> property:
    """A read-only attribute: field ``name``, or attribute ``fallback`` where ``name`` is None."""

    def value(self: Any) -> float:
        given = getattr(self, name)
        return float(getattr(self, fallback) if given is None else given)

    return property(value)


class PolicyLossParams(pydantic.BaseModel):
    """Hyper-parameters shared by the clip modes (``--clip-config`` loads these)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, strict=True)
    # Keys of earlier versions: a clip config that still uses one is refused with its new spelling.
    renamed_keys: ClassVar[dict[str, str]] = {
        "reward_method": "'score': reward_method 1 is score: log_ratio, reward_method 2 is score: mean_logp"}

    clip_eps: float = pydantic.Field(0.2, gt=0.0, lt=1.0)
    clip_eps_low: Optional[float] = pydantic.Field(None, gt=0.0, lt=1.0)
    clip_eps_high: Optional[float] = pydantic.Field(None, gt=0.0)
    dual_clip_c: Optional[float] = pydantic.Field(None, gt=1.0)
    soft_clip_alpha: float = pydantic.Field(1.0, ge=0.0)
    tau_pos: float = pydantic.Field(1.0, gt=0.0)
    tau_neg: float = pydantic.Field(1.05, gt=0.0)
    beta1: float = pydantic.Field(0.75, ge=0.0)
    beta2: float = pydantic.Field(1.0, ge=0.0)
    is_eps_low: Optional[float] = pydantic.Field(None, ge=0.0)
    """CISPO's lower IS bound 1 - is_eps_low; >= 1 means no lower bound (MiniMax-M1)"""
    is_eps_high: Optional[float] = pydantic.Field(None, ge=0.0)
    ratio_level: Literal["token", "sequence", "geometric"] = "token"
    """token: one ratio per action element (dimension / token); sequence: the joint ratio of the whole
    action (sum of its log-ratios); geometric: their mean (GSPO). The last two need advantages [B, 1]."""
    # PACS: an action's score, compared within its group (adv_estimator), is the logit of its success.
    beta: float = pydantic.Field(1.0, gt=0.0)
    score: Literal["log_ratio", "mean_logp"] = "log_ratio"
    """PACS: log_ratio = beta * sum(log pi - log pi_anchor) over the action; mean_logp = beta * mean(log pi)"""
    score_against: Literal["behaviour", "reference"] = "behaviour"
    """PACS score log_ratio: the anchor pi_anchor of the score. behaviour: the policy before this update (the
    batch's logp_old, recorded at sampling or recomputed with --recompute-logp), as the PACS reference code
    does (old_log_probs); reference: the frozen reference policy (adapters off / initial weights)"""
    adv_estimator: Literal["rloo", "grpo", "naive"] = "rloo"
    use_weight: bool = False
    weight_mode: Literal["question", "only_positive", "only_negative"] = "question"

    # strict=True refuses ints for floats; integers are fine for every float key here.
    @pydantic.field_validator("*", mode="before")
    @classmethod
    def _int_to_float(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and info.field_name is not None \
                and float in _types(cls.model_fields[info.field_name]):
            return float(value)
        return value

    # The bounds in use: a side that is not given takes the general value.
    eps_low = _given_or("clip_eps_low", "clip_eps")
    eps_high = _given_or("clip_eps_high", "clip_eps")
    is_low = _given_or("is_eps_low", "eps_low")
    is_high = _given_or("is_eps_high", "eps_high")


def _types(info: Any) -> tuple[Any, ...]:
    annotation = info.annotation
    return typing.get_args(annotation) or (annotation,)


@dataclass
class PolicyInputs:
    """What a clip mode reads. ``ratio``/``adv``/``mask`` are at the ratio level (per element, or
    ``[B, 1]`` per action); ``logp`` (with gradient), ``logp_ref`` and ``element_mask`` per element;
    ``group_id``/``success`` ``[B]`` where the batch has them."""

    ratio: Tensor
    adv: Tensor
    mask: Optional[Tensor]
    logp: Tensor
    element_mask: Optional[Tensor]
    log_ratio: Tensor  # log of ``ratio`` (its level), with gradient: log pi - log pi_behaviour
    logp_ref: Optional[Tensor] = None
    group_id: Optional[Tensor] = None
    success: Optional[Tensor] = None


@dataclass
class LossTerms:
    """What a clip mode returns, per element (broadcast shape of logp and advantages)."""

    loss: Tensor
    clipped: Tensor  # bool: a hard clip / cut is active
    dead_grad: Tensor  # bool: gradient exactly zero because of clipping
    extra: dict[str, Tensor] = field(default_factory=dict)  # per-element diagnostics to average


LossFn = Callable[[PolicyInputs, PolicyLossParams], LossTerms]


@dataclass(frozen=True)
class _ModeSpec:
    fn: LossFn
    fixed: Mapping[str, Any]
    dual_clip: bool
    per_action: bool  # one loss per action (its ratio at the sequence level whatever ratio_level says)
    reads: Callable[[PolicyLossParams], frozenset[str]]  # params -> batch fields besides the ratio and advantage


_REGISTRY: Registry[_ModeSpec] = Registry("clip mode")  # modes and aliases
_CANONICAL: dict[str, str] = {}  # every name (mode or alias) -> canonical mode


def register_policy_loss(
    name: str,
    aliases: Mapping[str, Mapping[str, Any]] | tuple[str, ...] = (),
    dual_clip: bool = False,
    per_action: bool = False,
    reads: tuple[str, ...] | Callable[[PolicyLossParams], tuple[str, ...]] = (),
) -> Callable[[LossFn], LossFn]:
    """Register a clip mode under ``name``.

    ``aliases`` is a tuple of extra names, or a mapping alias -> params that alias fixes
    (e.g. ``{"soft_clip_alpha-2": {"soft_clip_alpha": 2.0}}``). ``dual_clip`` says whether
    ``dual_clip_c`` applies to this mode; ``per_action`` that it scores whole actions (``ratio_level``
    does not apply); ``reads`` the batch fields it needs (``logp_ref``, ``group_id``, ``success``), or a function
    of its params that says which (a reference is computed only where one is read).
    """
    alias_map = dict(aliases) if isinstance(aliases, Mapping) else {a: {} for a in aliases}
    reads_of = (lambda p: frozenset(reads(p))) if callable(reads) else (lambda p, fixed=frozenset(reads): fixed)

    def wrap(fn: LossFn) -> LossFn:
        for mode_name, fixed in {name: {}, **alias_map}.items():
            _REGISTRY.add(mode_name, _ModeSpec(fn, fixed, dual_clip, per_action, reads_of))  # twice: ValueError
            _CANONICAL[mode_name] = name
        return fn

    return wrap


def policy_loss_modes() -> list[str]:
    """Every valid ``clip_mode`` (modes and aliases)."""
    return _REGISTRY.names()


def _mode_spec(clip_mode: str) -> _ModeSpec:
    if clip_mode not in _REGISTRY:  # all names listed: there are more than unknown_key_message lists
        raise ConfigError(f"unknown clip mode '{clip_mode}'; valid modes and aliases: {', '.join(policy_loss_modes())}")
    return _REGISTRY.get(clip_mode)


def resolve_policy_loss_params(
    clip_mode: str, params: Mapping[str, Any] | PolicyLossParams | None = None
) -> PolicyLossParams:
    """Validate ``params`` for ``clip_mode`` (unknown key, type, range, conflicts)."""
    spec = _mode_spec(clip_mode)
    if isinstance(params, PolicyLossParams):
        params = params.model_dump(exclude_unset=True)
    params = dict(params or {})
    for key, value in spec.fixed.items():
        given = params.get(key, value)
        if isinstance(given, bool) or not isinstance(given, (int, float)) or float(given) != float(value):
            raise ConfigError(
                f"clip mode '{clip_mode}' fixes {key}={value} but the clip config sets {key}={params[key]!r}; "
                f"use mode '{_CANONICAL[clip_mode]}' to choose {key} freely"
            )
        params[key] = value
    try:
        resolved = validate_model(PolicyLossParams, params, "clip param")
    except ConfigError as exc:
        if "valid keys:" in str(exc):
            raise
        raise ConfigError(f"{exc}; valid keys: {', '.join(PolicyLossParams.model_fields)}") from None
    if resolved.dual_clip_c is not None and not spec.dual_clip:
        dual_modes = sorted({_CANONICAL[m] for m in _REGISTRY.names() if _REGISTRY.get(m).dual_clip})
        raise ConfigError(
            f"clip param 'dual_clip_c' does not apply to clip mode '{clip_mode}'; "
            f"it applies to: {', '.join(dual_modes)}; remove it from the clip config"
        )
    if spec.per_action and resolved.ratio_level != "token":
        raise ConfigError(f"clip param 'ratio_level' does not apply to clip mode '{clip_mode}' (it scores whole "
                          "actions); remove it from the clip config")
    return resolved


@dataclass(frozen=True)
class ClipMode:
    """A clip mode resolved once (``resolve_clip_mode``): its name, its checked params, its loss and the batch
    fields it reads. A run's is ``RunConfig.clip``, resolved when the config is checked; every user takes it there."""

    name: str
    params: PolicyLossParams
    fn: LossFn
    per_action: bool  # one loss per action: its ratio at the sequence level whatever ratio_level says
    reads: frozenset[str]  # batch fields besides log-probs and advantages (logp_ref, group_id, success)

    @property
    def compares_group_members(self) -> bool:
        """Whether the loss compares the members of a group inside a minibatch (PACS)."""
        return "group_id" in self.reads


def resolve_clip_mode(name: str, params: Mapping[str, Any] | PolicyLossParams | None = None) -> ClipMode:
    """Clip mode ``name`` with ``params`` checked (``resolve_policy_loss_params``); a one-line ConfigError else."""
    spec = _mode_spec(name)
    resolved = resolve_policy_loss_params(name, params)
    return ClipMode(name, resolved, spec.fn, spec.per_action, spec.reads(resolved))


def load_clip_config(path: str | Path | None) -> dict[str, Any]:
    """Read a ``--clip-config`` file (YAML or JSON; JSON is valid YAML) into a dict."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--clip-config {path}: no such file; pass a YAML or JSON file of clip params")
    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"--clip-config {path}: cannot parse ({exc.__class__.__name__}: {exc}".replace("\n", " ") + ")") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--clip-config {path}: expected a mapping of clip params, got {type(data).__name__}")
    return data


def _dual_clip(loss: Tensor, adv: Tensor, c: Optional[float]) -> tuple[Tensor, Tensor]:
    """Bound the loss of negative-advantage elements by -c*A; returns (loss, where active)."""
    if c is None:
        return loss, torch.zeros_like(loss, dtype=torch.bool)
    bound = -c * adv
    active = (adv < 0) & (loss > bound)
    return torch.where(active, bound, loss), active


def _straight_through(ratio: Tensor) -> Tensor:
    """r / sg(r): forward value 1, gradient that of r."""
    return ratio / ratio.detach()


@register_policy_loss("clip", dual_clip=True)
def _clip_loss(x: PolicyInputs, p: PolicyLossParams) -> LossTerms:
    ratio, adv = x.ratio, x.adv
    low, high = 1.0 - p.eps_low, 1.0 + p.eps_high
    unclipped = -ratio * adv
    clipped = -ratio.clamp(low, high) * adv
    loss = torch.maximum(unclipped, clipped)
    loss, dual_active = _dual_clip(loss, adv, p.dual_clip_c)
    outside = (ratio < low) | (ratio > high)
    # The clipped branch wins (and is flat) exactly when the ratio left the region on the
    # side the advantage pushes towards.
    flat = ((adv > 0) & (ratio > high)) | ((adv < 0) & (ratio < low))
    return LossTerms(loss, clipped=outside | dual_active, dead_grad=flat | dual_active)


@register_policy_loss(
    "soft_clip",
    aliases={"soft_clip_alpha-1": {"soft_clip_alpha": 1.0}, "soft_clip_alpha-2": {"soft_clip_alpha": 2.0}},
)
def _soft_clip_loss(x: PolicyInputs, p: PolicyLossParams) -> LossTerms:
    ratio, adv = x.ratio, x.adv
    # (1/max(r, 1/r))^alpha shrinks the gradient of far-off ratios without ever zeroing it.
    coeff = (1.0 / torch.maximum(ratio, 1.0 / ratio)).detach() ** p.soft_clip_alpha
    loss = -ratio * adv * coeff
    none = torch.zeros_like(loss, dtype=torch.bool)
    return LossTerms(loss, clipped=none, dead_grad=none, extra={"soft_clip_coeff_mean": coeff.expand_as(loss)})


@register_policy_loss("sapo", aliases=("sapo_soft_clip", "sapo_gate"))
def _sapo_loss(x: PolicyInputs, p: PolicyLossParams) -> LossTerms:
    ratio, adv = x.ratio, x.adv
    tau = torch.where(adv > 0, ratio.new_tensor(p.tau_pos), ratio.new_tensor(p.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(4.0 / tau) * gate * adv
    # d loss / d r = -4 sigma (1 - sigma) A: the gate's weight on the plain PG gradient (1 at r=1).
    gate_weight = (4.0 * gate * (1.0 - gate)).detach()
    none = torch.zeros_like(loss, dtype=torch.bool)
    return LossTerms(
        loss,
        clipped=none,
        dead_grad=none,
        extra={"sapo_gate_weight_mean": gate_weight, "sapo_gate_saturation_frac": (gate_weight < 0.1).to(loss.dtype)},
    )


@register_policy_loss("ce-gppo_clip", dual_clip=True)
def _ce_gppo_loss(x: PolicyInputs, p: PolicyLossParams) -> LossTerms:
    ratio, adv = x.ratio, x.adv
    low, high = 1.0 - p.eps_low, 1.0 + p.eps_high
    st = _straight_through(ratio)
    below = (adv < 0) & (ratio < low)
    above = (adv > 0) & (ratio > high)
    # Outside the trust region the forward value is the clip bound, but a scaled gradient
    # survives (beta1 / beta2) instead of vanishing.
    loss = torch.where(
        below,
        -p.beta1 * low * st * adv,
        torch.where(above, -p.beta2 * high * st * adv, -ratio * adv),
    )
    loss, dual_active = _dual_clip(loss, adv, p.dual_clip_c)
    dead = dual_active | (below & (p.beta1 == 0.0)) | (above & (p.beta2 == 0.0))
    return LossTerms(loss, clipped=below | above | dual_active, dead_grad=dead)


@register_policy_loss("cispo", aliases=("cispo_clip", "is_clip", "is_weight_clip"))
def _cispo_loss(x: PolicyInputs, p: PolicyLossParams) -> LossTerms:
    ratio, adv = x.ratio, x.adv
    # is_eps_low >= 1: the lower bound 1 - is_eps_low <= 0 never binds (a ratio is > 0): no lower bound.
    weight = ratio.clamp(1.0 - p.is_low, 1.0 + p.is_high).detach()
    loss = -weight * adv * _straight_through(ratio)
    clipped = (ratio < 1.0 - p.is_low) | (ratio > 1.0 + p.is_high)
    return LossTerms(loss, clipped=clipped, dead_grad=torch.zeros_like(clipped))


def _pacs_reads(p: PolicyLossParams) -> tuple[str, ...]:
    against_reference = p.score == "log_ratio" and p.score_against == "reference"
    return ("group_id", "success", *(("logp_ref",) if against_reference else ()))


@register_policy_loss("pacs", per_action=True, reads=_pacs_reads)
def _pacs_loss(x: PolicyInputs, p: PolicyLossParams) -> LossTerms:
    """PACS ("PACS: Implicit Actor Critic Coupling via a Supervised Learning Framework for RLVR", arXiv
    2509.02522): the action's score, compared within its group, is the logit of a binary cross-entropy against
    the episode's success. Score ``log_ratio`` is beta x the response's log-ratio to the policy before this
    update (``score_against: behaviour``, the default: the authors' code, github.com/ritzz-ai/PACS,
    ``src/pacs/pacs_core_algos.py`` ``compute_reward``, is called with ``old_log_probs``, the actor's own
    log-probs recomputed before the update; their reference policy enters only an optional KL loss) or to the
    frozen reference (``score_against: reference``); score ``mean_logp`` is beta x its mean log-prob."""
    against_reference = p.score_against == "reference"
    if x.group_id is None or x.success is None or (p.score == "log_ratio" and against_reference and x.logp_ref is None):
        raise ValueError("clip mode 'pacs' needs group_id and success in the batch (group rollouts) and, with "
                         "score log_ratio and score_against reference, the reference log-probs")
    if p.score == "log_ratio" and against_reference:
        assert x.logp_ref is not None  # checked above
        score = p.beta * per_action(x.logp - x.logp_ref.detach(), x.element_mask, "sum")
    elif p.score == "log_ratio":  # the ratio is at the sequence level (per_action): log_ratio is the summed one
        score = p.beta * x.log_ratio
    else:
        score = p.beta * per_action(x.logp, x.element_mask, "mean")
    score = score.to(torch.promote_types(score.dtype, torch.float32))  # group statistics of bf16 scores drift
    valid = torch.ones_like(x.ratio, dtype=torch.bool) if x.mask is None else x.mask
    group_id = x.group_id.reshape(score.shape)
    logit = group_relative(score.flatten(), group_id.flatten(), p.adv_estimator, valid=valid.flatten()).reshape(score.shape)
    label = x.success.reshape(score.shape).to(score.dtype)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, label, reduction="none")
    if p.use_weight:
        loss = loss * _class_weights(label > 0.5, group_id, valid, p.weight_mode).to(loss.dtype)
    none = torch.zeros_like(loss, dtype=torch.bool)
    return LossTerms(loss, clipped=none, dead_grad=none,
                     extra={"pacs_loss": loss.detach(), "pacs_pos_frac": label, "pacs_score_mean": score.detach()})


def _class_weights(positive: Tensor, group_id: Tensor, valid: Tensor, mode: str) -> Tensor:
    """PACS sample weights: ``question`` balances the classes within each group present (sklearn's
    'balanced': n / (classes * count of its class)); ``only_positive`` / ``only_negative`` keep one class."""
    if mode == "only_positive":
        return positive.float()
    if mode == "only_negative":
        return (~positive).float()
    ids, v = group_id.flatten(), valid.flatten().float()
    n = group_sum(v, ids)
    k = group_sum(v * positive.flatten().float(), ids)
    classes = (k > 0).float() + (k < n).float()
    own = torch.where(positive.flatten(), k, n - k)
    return (n / (classes * own).clamp_min(1.0)).reshape(positive.shape)


class PolicyLoss:
    """A resolved clip mode; calling it is the loss and its diagnostics of one minibatch."""

    def __init__(self, clip: ClipMode | str, params: Mapping[str, Any] | PolicyLossParams | None = None,
                 agg: str = "minibatch-token-mean") -> None:
        """``clip``: a resolved clip mode (a run's ``RunConfig.clip``), or a mode's name resolved here with
        ``params`` (a loss built by hand); ``agg``: how the masked per-element losses become one
        (``functional.aggregate``)."""
        if isinstance(clip, ClipMode) and params is not None:
            raise TypeError("PolicyLoss: a resolved ClipMode carries its params; pass none beside it")
        self.clip = clip if isinstance(clip, ClipMode) else resolve_clip_mode(clip, params)
        self.params, self.agg = self.clip.params, loss_aggregation(agg)

    @property
    def reads(self) -> frozenset[str]:
        """Batch fields the mode needs besides log-probs and advantages (``logp_ref``, ``group_id``, ``success``)."""
        return self.clip.reads

    def __call__(
        self, logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Optional[Tensor] = None, *,
        logp_ref: Optional[Tensor] = None, group_id: Optional[Tensor] = None, success: Optional[Tensor] = None,
        counts: Optional[StepCounts] = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """See ``compute_policy_loss``; ``counts``: the optimiser step's, for ``global-token-mean``."""
        log_ratio = logp - logp_old.detach()
        adv = advantages.detach().to(log_ratio.dtype)
        try:
            shape = torch.broadcast_shapes(log_ratio.shape, adv.shape)  # type: ignore[no-untyped-call]  # torch declares no types for it
        except RuntimeError:
            shape = None
        if shape != log_ratio.shape:
            raise ValueError(f"advantages of shape {tuple(adv.shape)} must broadcast to logp's shape {tuple(log_ratio.shape)}")
        if mask is not None and mask.shape != log_ratio.shape:
            raise ValueError(f"mask of shape {tuple(mask.shape)} must have logp's shape {tuple(log_ratio.shape)}")
        level = "sequence" if self.clip.per_action else self.params.ratio_level
        element_mask = mask
        if level != "token":  # one ratio per action: the joint (sum of log-ratios) or geometric (mean) one
            if log_ratio.dim() < 2 or (adv.dim() > 0 and adv.shape[-1] != 1):
                raise ValueError(f"ratio level '{level}' needs logp [B, A] and one advantage per action [B, 1]; got "
                                 f"logp {tuple(log_ratio.shape)}, advantages {tuple(adv.shape)}")
            log_ratio = per_action(log_ratio, mask, "sum" if level == "sequence" else "mean")
            mask = None if mask is None else mask.bool().any(-1, keepdim=True)
            shape = log_ratio.shape
        ratio = torch.exp(log_ratio)
        inputs = PolicyInputs(ratio, adv.expand(shape), mask, logp, element_mask, log_ratio, logp_ref, group_id, success)
        terms = self.clip.fn(inputs, self.params)
        # A term per token is divided by the step's tokens, a term per action by its actions.
        divisor = None if counts is None else counts.tokens if level == "token" else counts.actions
        return aggregate(terms.loss, mask, self.agg, divisor), _diagnostics(ratio, log_ratio, terms, mask)


def _diagnostics(ratio: Tensor, log_ratio: Tensor, terms: LossTerms, mask: Optional[Tensor]) -> dict[str, float]:
    """Clip fractions, ratio statistics, k3 KL and the mode's own diagnostics (one device sync)."""
    with torch.no_grad():
        r = ratio.detach()
        valid = torch.ones_like(r, dtype=torch.bool) if mask is None else mask.bool()
        n = valid.sum().clamp_min(1).to(torch.float64)
        r64 = torch.where(valid, r.to(torch.float64), 0.0)
        lr64 = torch.where(valid, log_ratio.detach().to(torch.float64), 0.0)

        def frac(b: Tensor) -> Tensor:
            return (b & valid).sum().to(torch.float64) / n

        stats = {
            "clip_frac": frac(terms.clipped),
            "dead_grad_frac": frac(terms.dead_grad),
            "ess": r64.sum() ** 2 / (n * (r64**2).sum()).clamp_min(torch.finfo(torch.float64).tiny),
            "ratio_mean": r64.sum() / n,
            "ratio_max": torch.where(valid, r64, -torch.inf).max() if valid.any() else r64.new_tensor(0.0),
            "ratio_min": torch.where(valid, r64, torch.inf).min() if valid.any() else r64.new_tensor(0.0),
            # k3 estimator of KL(old || new): unbiased, always >= 0.
            "approx_kl": torch.where(valid, (r64 - 1.0) - lr64, 0.0).sum() / n,
        }
        for key, value in terms.extra.items():
            stats[key] = torch.where(valid, value.to(torch.float64), 0.0).sum() / n
        names = list(stats)
        values = torch.stack([stats[k].to(torch.float64).reshape(()) for k in names]).tolist()  # one device sync
    return dict(zip(names, values))


def compute_policy_loss(
    clip_mode: str,
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Optional[Tensor] = None,
    params: Mapping[str, Any] | PolicyLossParams | None = None,
    *,
    logp_ref: Optional[Tensor] = None,
    group_id: Optional[Tensor] = None,
    success: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, float]]:
    """Policy loss of ``clip_mode`` and its diagnostics (validates ``params`` on every call: a loop
    builds a ``PolicyLoss`` once instead).

    ``logp``/``logp_old``: log-probs of the taken actions (any shape; ``[B, A]`` for a ratio level
    other than token); ``advantages`` broadcasts to that shape; ``mask`` (shape of ``logp``) marks
    valid elements. ``logp_ref`` (shape of ``logp``), ``group_id`` and ``success`` ``[B]``
    for the modes that read them (pacs). Gradients flow through ``logp`` only. Returns the masked
    mean loss and a dict of floats.
    """
    return PolicyLoss(clip_mode, params)(logp, logp_old, advantages, mask, logp_ref=logp_ref, group_id=group_id,
                                         success=success)
