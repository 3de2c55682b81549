"""Advantage estimators, chosen by name (``--advantage``).

Each estimator owns where its advantages are computed and what a replay item is:

=======  =======  =======  ======  ==================================================================
name     where    unit     critic  how
=======  =======  =======  ======  ==================================================================
gae      worker   step     yes     the worker cuts its stream into pieces and adds advantage and
                                   value_target to each step record (``segmenter``)
vtrace   trainer  segment  yes     the worker ships segments of rollout_steps steps; the trainer
                                   corrects them off-policy with its current weights (``loss_inputs``)
grpo     replay   step     no      group-relative advantages over n rollouts of one start state
rloo     replay   step     no      leave-one-out baseline over the same groups
naive    replay   step     no      the raw outcome, no baseline (PACS; alone, success-filtered RL)
=======  =======  =======  ======  ==================================================================

grpo, rloo and naive need group rollouts (``group_size`` >= 2; naive also 1: ``check_group_size``): the rollout workers take
tickets (group, task, start) at episode start and push whole episodes; the replay buffer's group
assembler (async_rl/actors/groups.py) releases a group into the sampling pool once all its episodes
are in, with ``episode_advantages`` on every step of each episode. Trainers then draw its steps like
any others, except for a loss that compares a group's members inside a minibatch (PACS,
``draws_whole_groups``): its batches are drawn, and cut into minibatches, by whole groups.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol, TypedDict

import torch
from tensordict import TensorDict

from async_rl.algo.advantages import gae, grpo_advantages, naive_advantages, rloo_advantages, vtrace
from async_rl.algo.functional import distributed_normalize, distributed_normalize_by, kl_reward_penalty
from async_rl.algo.losses import ClipMode
from async_rl.algo.objective import LossInputs
from async_rl.errors import ConfigError
from async_rl.experience import segment
from async_rl.registry import Registry

Tensor = torch.Tensor


class AdvantageOptions(Protocol):
    """The run options the estimators read. The algorithms sit below the config layer, so they name the keys they
    need instead of the run config's class: the RunConfig is one such object, a test's namespace another."""

    gamma: float
    gae_lambda: float
    rollout_steps: int
    normalize_advantages: bool
    normalize_group_advantages: bool
    grpo_scale_by_std: bool
    vtrace_clip_rho: Optional[float]
    vtrace_clip_c: Optional[float]
    vtrace_clip_pg_rho: Optional[float]
    kl_ref_coef: float

    # Read-only, so that a config whose keys are Literal types of these strings is one.
    @property
    def normalize_advantages_per(self) -> str: ...

    @property
    def kl_ref_as(self) -> str: ...

    @property
    def kl_ref_estimator(self) -> str: ...


class Segmenter(Protocol):
    """Worker side: turns a stream of step records into replay items."""

    def add(self, record: TensorDict, next_obs: TensorDict) -> Optional[TensorDict]: ...

    def flush(self) -> Optional[TensorDict]:
        """Hand over what can go out now (the worker pauses); None if nothing can."""


@dataclass(frozen=True)
class TrainModel:
    """What a trainer-side estimator may call on the model being trained."""

    evaluate: Callable[[TensorDict, Tensor], tuple[Tensor, Tensor, Tensor]]  # (obs, action) -> logp, entropy, value
    value: Callable[[TensorDict], Tensor]  # obs -> V(obs)
    action_key: str
    reference: Optional[Callable[[TensorDict, Tensor], Tensor]] = None  # (obs, action) -> logp_ref, no gradient
    action_mask: Optional[Callable[[Tensor], Optional[Tensor]]] = None  # action -> its real elements (variable length)


class BatchFields(TypedDict):
    """The optional ``LossInputs`` a minibatch carries (``batch_fields``)."""

    logp_ref: Optional[Tensor]
    group_id: Optional[Tensor]
    success: Optional[Tensor]
    mask: Optional[Tensor]


def batch_fields(steps: TensorDict, model: TrainModel) -> BatchFields:
    """The optional ``LossInputs`` of step records: the reference log-probs (when the model has a
    reference), the group fields (``group_id``, ``success``) where the records carry them, and the
    mask of variable-length actions (a response's tokens) where the policy has one."""
    action = steps[model.action_key]
    if "logp_ref" in steps.keys():  # computed by the sampler (reference_logp_on sampler)
        reference = steps["logp_ref"]
    else:
        reference = None if model.reference is None else model.reference(steps["obs"], action)
    mask = None if model.action_mask is None else model.action_mask(action)
    return {"logp_ref": reference, "group_id": steps.get("group_id", None), "success": steps.get("success", None),
            "mask": mask}


class AdvantageEstimator:
    """Base: the advantage travels in the step records (computed on the worker)."""

    name: str
    where: str = "worker"  # where the advantage is computed: "worker" | "replay" (group assembler) | "trainer"
    unit: str = "step"  # a replay item: "step" (one step record) | "segment" (rollout_steps steps)
    needs_critic: bool = True
    needs_group_rollouts: bool = False
    min_group_size: int = 1  # group estimators that compare a group's members need 2 or more
    rewards_on_trainer: bool = False  # reads the rewards on the trainer: a KL-to-reference reward penalty applies
    center_batch: bool = True  # normalize_advantages subtracts the batch mean (group estimators: their group's is the baseline)

    def segmenter(self, cfg: AdvantageOptions) -> Segmenter:
        raise NotImplementedError

    def normalizes(self, cfg: AdvantageOptions) -> bool:
        """Whether ``prepare`` whitens the advantages over the batch (``normalize_advantages``)."""
        return bool(cfg.normalize_advantages)

    def prepare(self, batch: TensorDict, cfg: AdvantageOptions) -> TensorDict:
        """Trainer side, once per super-batch (every rank calls it: it may hold a collective)."""
        if not self.normalizes(cfg):
            return batch
        batch = batch.copy()
        batch["advantage"] = whiten(batch["advantage"], batch, cfg, self.center_batch)
        return batch

    def loss_inputs(self, mb: TensorDict, model: TrainModel, cfg: AdvantageOptions) -> LossInputs:
        """Trainer side, per minibatch: the current policy's outputs next to the stored fields."""
        logp, entropy, value = model.evaluate(mb["obs"], mb[model.action_key])
        target = mb["value_target"] if self.needs_critic else None
        return LossInputs(logp, mb["logp"], entropy, value, mb["value"], target, mb["advantage"], **batch_fields(mb, model))


def whiten(advantage: torch.Tensor, records: TensorDict, cfg: AdvantageOptions, center: bool = True) -> torch.Tensor:
    """``advantage`` whitened over every rank's batch, or per task (``normalize_advantages_per``: the
    records' ``task`` field, which the workers then fill)."""
    if cfg.normalize_advantages_per == "task":
        return distributed_normalize_by(advantage, records["task"], center=center)
    return distributed_normalize(advantage, center=center)


ESTIMATORS: Registry[type[AdvantageEstimator]] = Registry("advantage estimator")


def register_estimator(cls: type[AdvantageEstimator]) -> type[AdvantageEstimator]:
    ESTIMATORS.add(cls.name, cls)
    return cls


def advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name`` (ConfigError naming the valid ones if none)."""
    return ESTIMATORS.get(name)()


def check_advantage(name: str) -> str:
    """``name`` if it names a registered estimator; otherwise a one-line ConfigError naming the valid ones."""
    advantage_estimator(name)
    return name


def check_group_size(name: str, group_size: int) -> None:
    """Group estimators need groups (``group_size`` >= their ``min_group_size``); the others need none
    (``group_size`` 1)."""
    estimator = advantage_estimator(name)
    grouped = estimator.needs_group_rollouts
    if grouped and group_size < estimator.min_group_size:
        raise ConfigError(f"advantage '{name}' compares the episodes of a group: pass --group-size "
                          f"{estimator.min_group_size} or more "
                          f"(e.g. --group-size 8), got {group_size}")
    if not grouped and group_size != 1:
        kinds = ", ".join(n for n in ESTIMATORS.names() if ESTIMATORS.get(n).needs_group_rollouts)
        raise ConfigError(f"advantage '{name}' makes no use of groups: drop --group-size {group_size} (or pass "
                          f"--group-size 1), or choose a group estimator ({kinds})")


def check_group_capacity(group_size: int, replay_capacity: int, max_episode_steps: int) -> None:
    """A group enters the replay buffer whole, at most ``group_size`` x ``max_episode_steps`` steps:
    a smaller buffer would evict part of it and never hold a whole group (the trainers would wait
    for data until they time out); a one-line ConfigError instead."""
    need = group_size * max_episode_steps
    if group_size > 1 and replay_capacity < need:
        raise ConfigError(f"replay_capacity {replay_capacity} cannot hold a whole group of {group_size} episodes of up to "
                          f"{max_episode_steps} steps ({need} steps): pass --replay-capacity {need} or more, or a smaller "
                          f"--group-size")


def check_objective(name: str, clip: ClipMode, kl_ref_coef: float, kl_ref_as: str) -> None:
    """The estimator ``name`` gives what the objective reads (the clip mode's batch fields; a
    KL-to-reference reward penalty needs rewards on the trainer); else a one-line ConfigError."""
    estimator = advantage_estimator(name)
    if {"group_id", "success"} & clip.reads and not estimator.needs_group_rollouts:
        kinds = ", ".join(n for n in ESTIMATORS.names() if ESTIMATORS.get(n).needs_group_rollouts)
        raise ConfigError(f"clip mode '{clip.name}' compares the episodes of a group (group_id, success): choose a "
                          f"group estimator ({kinds}) with --group-size 2 or more, not advantage '{name}'")
    if kl_ref_coef > 0 and kl_ref_as == "reward" and not estimator.rewards_on_trainer:
        kinds = ", ".join(n for n in ESTIMATORS.names() if ESTIMATORS.get(n).rewards_on_trainer)
        raise ConfigError(f"kl_ref_as 'reward' needs an estimator that reads rewards on the trainer ({kinds}); "
                          f"advantage '{name}' computes them on the workers: use --kl-ref-as loss")


def check_recompute_logp(name: str, recompute_logp: bool) -> None:
    """``recompute_logp`` replaces the batch's behaviour log-probs by the trainer's own: an estimator that corrects
    for the behaviour policy with them (V-trace, on the trainer) would then correct for nothing; a one-line
    ConfigError instead."""
    if recompute_logp and advantage_estimator(name).where == "trainer":
        raise ConfigError(f"recompute_logp does not apply to advantage '{name}': its off-policy correction needs the "
                          "behaviour policy's own log-probs; drop --recompute-logp")


def draws_whole_groups(clip: ClipMode, group_size: int) -> bool:
    """Whether batches must be drawn by whole groups: only for a loss that compares the members of a
    group inside a minibatch (PACS). The group estimators' advantages are on every step already (the
    group assembler puts them there), so their batches are drawn step by step, uniformly: a draw of
    equal steps per member would strand a long episode's steps once its group's shortest member is used up."""
    return group_size > 1 and clip.compares_group_members


def check_group_minibatch(clip: ClipMode, group_size: int, train_batch_size: int) -> None:
    """A loss that compares the members of a group inside a minibatch (PACS) needs groups of 2 or more,
    whole in every minibatch: ``train_batch_size`` a multiple of ``group_size``; else a one-line ConfigError."""
    if not clip.compares_group_members:
        return
    if group_size < 2:
        raise ConfigError(f"clip mode '{clip.name}' compares the members of a group: pass --group-size 2 or more "
                          f"(e.g. --group-size 8), got {group_size}")
    if train_batch_size % group_size:
        lower = train_batch_size // group_size * group_size
        raise ConfigError(f"clip mode '{clip.name}' compares the members of a group within a minibatch: "
                          f"train_batch_size {train_batch_size} must be a multiple of group_size {group_size} "
                          f"(e.g. {max(lower, group_size)} or {lower + group_size}; scale super_batch_size with it)")


# ---- gae ----------------------------------------------------------------------------------------
def with_gae(steps: list[TensorDict], bootstrap_value: float, gamma: float, lam: float) -> TensorDict:
    """Stack a trajectory piece and add ``advantage`` and ``value_target``."""
    traj: TensorDict = TensorDict.stack(steps)
    bootstrap = torch.tensor(bootstrap_value, dtype=traj["value"].dtype)
    traj["advantage"], traj["value_target"] = gae(traj["reward"], traj["value"], traj["done"], bootstrap, gamma, lam)
    return traj


class GaeSegmenter:
    """Cuts a worker's stream of steps into GAE-processed pieces.

    A terminal step closes a piece with bootstrap 0. When ``local_buf + 1`` steps wait, the
    first ``local_buf`` go out bootstrapped from the value of the last one, which starts the
    next piece (its value is the estimate of the state the cut-off piece leads to).
    """

    def __init__(self, local_buf: int, gamma: float, lam: float) -> None:
        self.local_buf, self.gamma, self.lam = local_buf, gamma, lam
        self.steps: list[TensorDict] = []

    def add(self, record: TensorDict, next_obs: TensorDict) -> Optional[TensorDict]:
        self.steps.append(record)
        if bool(record["done"]):
            piece, self.steps = with_gae(self.steps, 0.0, self.gamma, self.lam), []
            return piece
        if len(self.steps) == self.local_buf + 1:
            return self.flush()
        return None

    def flush(self) -> Optional[TensorDict]:
        """Cut now: all steps but the last go out, bootstrapped from the last one's value."""
        if len(self.steps) < 2:
            return None
        piece = with_gae(self.steps[:-1], float(self.steps[-1]["value"]), self.gamma, self.lam)
        self.steps = self.steps[-1:]
        return piece


@register_estimator
class Gae(AdvantageEstimator):
    name = "gae"

    def segmenter(self, cfg: AdvantageOptions) -> Segmenter:
        return GaeSegmenter(cfg.rollout_steps, cfg.gamma, cfg.gae_lambda)


# ---- vtrace -------------------------------------------------------------------------------------
class VtraceSegmenter:
    """Cuts the stream into fixed-length segments (crossing episode ends) for V-trace."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.steps: list[TensorDict] = []

    def add(self, record: TensorDict, next_obs: TensorDict) -> Optional[TensorDict]:
        self.steps.append(record)
        if len(self.steps) < self.length:
            return None
        item, self.steps = segment(self.steps, next_obs), []
        return item

    def flush(self) -> Optional[TensorDict]:
        return None  # segments have a fixed length; a partial one waits


@register_estimator
class Vtrace(AdvantageEstimator):
    name = "vtrace"
    where = "trainer"
    unit = "segment"
    rewards_on_trainer = True

    def segmenter(self, cfg: AdvantageOptions) -> Segmenter:
        return VtraceSegmenter(cfg.rollout_steps)

    def prepare(self, batch: TensorDict, cfg: AdvantageOptions) -> TensorDict:
        return batch  # advantages come per minibatch, from the current weights

    def loss_inputs(self, mb: TensorDict, model: TrainModel, cfg: AdvantageOptions) -> LossInputs:
        steps = mb["steps"]
        b, t = steps.batch_size
        flat = steps.reshape(b * t)
        logp, entropy, value = model.evaluate(flat["obs"], flat[model.action_key])
        fields = batch_fields(flat, model)
        rewards = flat["reward"]
        if cfg.kl_ref_coef > 0 and cfg.kl_ref_as == "reward":  # r_t - coef * KL_t(behaviour || reference)
            if fields["logp_ref"] is None:
                raise ValueError("kl_ref_as 'reward': the minibatch has no logp_ref (the model has no reference)")
            rewards = kl_reward_penalty(rewards, flat["logp"], fields["logp_ref"], cfg.kl_ref_coef, cfg.kl_ref_estimator)
        with torch.no_grad():
            bootstrap = model.value(mb["bootstrap_obs"]).float()
        # Targets and advantages in float32 whatever the model's precision (vtrace computes in the values' dtype).

        def time_major(x: Tensor) -> Tensor:
            return x.reshape(b, t).transpose(0, 1).float()

        log_rhos = time_major((logp.detach().float() - flat["logp"]).sum(-1))
        discounts = cfg.gamma * (1.0 - time_major(flat["done"]))
        vs, pg_adv = vtrace(log_rhos, discounts, time_major(rewards), time_major(value.detach()), bootstrap,
                            cfg.vtrace_clip_rho, cfg.vtrace_clip_c, cfg.vtrace_clip_pg_rho)

        def flat_major(x: Tensor) -> Tensor:
            return x.transpose(0, 1).reshape(b * t)

        adv = flat_major(pg_adv)
        if cfg.normalize_advantages:  # a collective: every rank calls it once per minibatch
            adv = whiten(adv, flat, cfg)
        return LossInputs(logp, flat["logp"], entropy, value, flat["value"], flat_major(vs), adv, **fields)


# ---- group-relative (group rollouts: async_rl/actors/groups.py) ---------------------------------
class EpisodeSegmenter:
    """Group estimators: an episode leaves the worker whole, at its end (``take``), never in pieces:
    its advantage needs the returns of the other members of its group."""

    def __init__(self) -> None:
        self.steps: list[TensorDict] = []

    def add(self, record: TensorDict, next_obs: TensorDict) -> Optional[TensorDict]:
        self.steps.append(record)
        return None

    def flush(self) -> Optional[TensorDict]:
        return None  # a pause keeps the episode; it goes out when it ends

    def take(self) -> Optional[TensorDict]:
        """The finished episode's steps ``[T]`` (None if it has none); the next episode starts empty."""
        steps, self.steps = self.steps, []
        return TensorDict.stack(steps) if steps else None


class GroupEstimator(AdvantageEstimator):
    """No critic: the advantage of a rollout compares its return with the others of its group."""

    where = "replay"
    needs_critic = False
    needs_group_rollouts = True
    min_group_size = 2
    # Batch normalisation only scales: centering over the batch would add a baseline that naive leaves out
    # on purpose (grpo's and rloo's advantages already have mean 0 in every group).
    center_batch = False

    def normalizes(self, cfg: AdvantageOptions) -> bool:
        """Only when asked (``normalize_group_advantages``): a group's advantages are already on their scale
        (grpo divides by the group's std; Dr. GRPO leaves it out on purpose), and dividing them again by the
        batch's RMS would vary their size from batch to batch and weaken a KL term beside them. TRL and verl
        apply nothing on top."""
        return bool(cfg.normalize_group_advantages)

    @staticmethod
    def group_advantages(returns: Tensor, /) -> Tensor:
        """Returns ``[G, n]`` (G groups of n rollouts) -> advantages ``[G, n]``."""
        raise NotImplementedError

    def episode_advantages(self, returns: Tensor, cfg: AdvantageOptions) -> Tensor:
        """One group's returns ``[n]`` -> one outcome advantage per episode ``[n]`` (the group assembler
        puts it on every step of the episode)."""
        return self.group_advantages(returns.unsqueeze(0)).squeeze(0)

    def segmenter(self, cfg: AdvantageOptions) -> Segmenter:
        return EpisodeSegmenter()


@register_estimator
class Grpo(GroupEstimator):
    name = "grpo"
    group_advantages = staticmethod(grpo_advantages)

    def episode_advantages(self, returns: Tensor, cfg: AdvantageOptions) -> Tensor:
        # grpo_scale_by_std false: centring only (Dr. GRPO)
        return grpo_advantages(returns.unsqueeze(0), scale_by_std=cfg.grpo_scale_by_std).squeeze(0)


@register_estimator
class Rloo(GroupEstimator):
    name = "rloo"
    group_advantages = staticmethod(rloo_advantages)


@register_estimator
class Naive(GroupEstimator):
    name = "naive"
    min_group_size = 1  # the outcome alone, no comparison: episodes of their own (success-filtered RL) or groups (PACS)
    group_advantages = staticmethod(naive_advantages)
