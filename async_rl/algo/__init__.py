"""The maths of the system: policy losses, advantage estimators and loss pieces."""
from async_rl.algo.advantages import gae, grpo_advantages, rloo_advantages, vtrace
from async_rl.algo.estimators import (
    ESTIMATORS,
    AdvantageEstimator,
    TrainModel,
    advantage_estimator,
    check_advantage,
)
from async_rl.algo.functional import (
    categorical_entropy,
    distributed_normalize,
    kl_penalty,
    masked_mean,
    masked_whiten,
    ratio_guard,
    tanh_gaussian_entropy,
    tanh_gaussian_log_prob,
    value_loss,
)
from async_rl.algo.losses import (
    LossTerms,
    PolicyLoss,
    PolicyLossParams,
    compute_policy_loss,
    load_clip_config,
    policy_loss_modes,
    register_policy_loss,
    resolve_policy_loss_params,
)
from async_rl.algo.objective import LossInputs, Objective, ObjectiveOut

__all__ = [
    "ESTIMATORS",
    "AdvantageEstimator",
    "LossInputs",
    "LossTerms",
    "Objective",
    "ObjectiveOut",
    "PolicyLoss",
    "PolicyLossParams",
    "TrainModel",
    "advantage_estimator",
    "categorical_entropy",
    "check_advantage",
    "compute_policy_loss",
    "distributed_normalize",
    "gae",
    "grpo_advantages",
    "kl_penalty",
    "load_clip_config",
    "masked_mean",
    "masked_whiten",
    "policy_loss_modes",
    "ratio_guard",
    "register_policy_loss",
    "resolve_policy_loss_params",
    "rloo_advantages",
    "tanh_gaussian_entropy",
    "tanh_gaussian_log_prob",
    "value_loss",
    "vtrace",
]
