"""The run configuration's schema: its sections (run, env, policy, objective, scale, timeouts,
supervised) and ``RunConfig``, every key typed with its default and checked across keys.

``async_rl/config/loader.py`` reads YAML files and flags into it (defaults < ``--config`` < flags).
"""
from __future__ import annotations

import copy
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

import pydantic
import torch

from async_rl.algo import (
    advantage_estimator,
    check_advantage,
    check_group_minibatch,
    check_group_size,
    check_objective,
    check_recompute_logp,
    resolve_clip_mode,
)
from async_rl.algo.losses import ClipMode
from async_rl.config.supervised import SupervisedSection
from async_rl.errors import ConfigError, unknown_key_message
from async_rl.policies import POLICIES
from async_rl.process_setup import deepspeed_cpu_supports_fp16, is_device_id
from async_rl.renamed_keys import renamed_run_keys
from async_rl.validation import ConfigSection

Positive = pydantic.PositiveInt
Fraction = Annotated[float, pydantic.Field(ge=0.0, le=1.0)]


def _gpu_id(value: Any) -> Any:
    """A GPU id as CUDA_VISIBLE_DEVICES writes it: 0 and "0" alike, UUIDs and MIG ids as given."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return value  # pydantic names the wrong type
    if not is_device_id(str(value).strip()):
        raise ValueError(f"'{value}' is not a GPU id: an index (0), a GPU UUID (GPU-...) or a MIG id (MIG-...)")
    return str(value).strip()


GpuId = Annotated[str, pydantic.BeforeValidator(_gpu_id)]


_Section = ConfigSection


class RunSection(_Section):
    """Run control, logging, checkpoints and the evaluation schedule."""

    sync: bool = False
    """no overlap: collect -> train -> broadcast -> collect (baseline, debugging)"""
    seed: int = 0
    """seeds torch, numpy and the envs of every actor (each adds its own offset)"""
    log_dir: str = "runs/default"
    """TensorBoard logs, checkpoints, the report and the final evaluation go here"""
    max_epochs: Optional[Positive] = None
    """stop after this many epochs; an epoch: each trainer draws super_batch_size items and makes updates_per_epoch
    passes over them, each pass super_batch_size / (train_batch_size x accumulation_steps) optimiser steps (with the
    LM configs one optimiser step in all, not a pass over the data); null = until max_minutes"""
    max_minutes: Optional[pydantic.PositiveFloat] = None
    """stop training after this many minutes (the final checkpoint and evaluation follow); null = until max_epochs"""
    ray_address: Optional[str] = None
    """join this Ray cluster (host:port) instead of starting a local one"""
    log_interval_seconds: pydantic.PositiveFloat = 10.0
    """seconds between snapshots of the actors' counters (throughput, replay, health) in the logs"""
    swanlab_mode: Literal["offline", "disabled", "local", "cloud"] = "offline"
    """SwanLab logging beside TensorBoard (which always logs)"""
    checkpoint_interval_epochs: Optional[Positive] = 10
    """checkpoints under <log_dir>/checkpoints every N epochs (null = only at the end) and at the end"""
    keep_checkpoints: Positive = 3
    """the newest this many checkpoints are kept, older ones deleted"""
    resume: Optional[str] = None
    """a checkpoint dir (or a dir of them: the newest) to continue from"""
    eval_interval_epochs: Positive = 5
    """the evaluation workers evaluate the current weights every N epochs"""
    eval_episodes: Positive = 2
    """episodes per task in each periodic evaluation"""
    eval_deterministic: bool = True
    """evaluation acts greedily (the likeliest action) instead of sampling"""
    eval_before_training: bool = True
    """evaluate the initial weights once before the first update (a periodic evaluation where evaluators run, and
    the env's final one: held-out problems, programs, cases), logged at epoch 0 as the report's "before"; not on
    --resume, and not counted in --max-minutes"""
    eval_search: str = "none"
    """search at inference time in the env's final evaluation (CompilerGym: none, greedy, best-of-K, beam-K); an env option"""
    eval_search_budget: pydantic.NonNegativeInt = 0
    """its compilations (pass applications) per program; 0 = the env's default (CompilerGym: 16 x the episode length)"""
    video_interval_evals: pydantic.NonNegativeInt = 5
    """record episode videos (TensorBoard eval_video/*, <log_dir>/videos/*.mp4) at the 1st, (N+1)th, ... evaluation; 0 = never"""
    video_episodes: pydantic.NonNegativeInt = 1
    """episodes recorded per such evaluation (the first of each task first)"""
    video_fps: Positive = 20
    """frames per second of the recorded videos"""


class EnvSection(_Section):
    """What to train on."""

    env: str = "metaworld"
    """a registered environment (a module in envs/)"""
    env_kwargs: dict[str, Any] = pydantic.Field(default_factory=lambda: {"benchmark": "MT1", "task": "reach-v3"})
    """the env's options (--env.KEY sets one; --print-config lists them)"""
    task_failure_window: Positive = 10
    """episodes per task that weight the workers' task sampling towards failing tasks"""
    sandbox_mode: Literal["strict", "weak"] = "strict"
    """generated code (humaneval, CTRL, code_tests): strict refuses to run it without namespace isolation;
    weak allows running it WITHOUT isolation where namespaces do not work (async_rl/sandbox/)"""


class PolicySection(_Section):
    """The model: which policy, its weights, LoRA and precision."""

    policy: str = "mlp"
    """a registered policy (a module in async_rl/policies/)"""
    policy_kwargs: dict[str, Any] = pydantic.Field(default_factory=dict)
    """the policy's options (--policy.KEY sets one; --print-config lists them)"""
    init_from: Optional[str] = None
    """a policy export (launch/sft.py) whose weights the policy starts from; LoRA, if any, goes on top"""
    model_path: Optional[str] = None
    """local model directory (or, for causal_lm, a .gguf file) for policies that load one (vla, causal_lm); null = their default"""
    lora_rank: pydantic.NonNegativeInt = 0
    """LoRA (peft) on the trainers' copy; 0 = train every parameter"""
    lora_sync: Literal["merged", "adapters"] = "merged"
    """what the inference actors receive with LoRA: the merged weights, or only the adapters (and parameters trained whole) on top of their own frozen base"""
    lora_alpha: pydantic.PositiveFloat = 16.0
    """LoRA scale: the adapters' update is multiplied by lora_alpha / lora_rank"""
    lora_dropout: Fraction = 0.0
    """dropout on the LoRA adapters' input"""
    lora_target_modules: Optional[Union[str, list[str]]] = None
    """null = every nn.Linear; a string is a peft regex"""
    lora_trainable: list[str] = pydantic.Field(default_factory=list)
    """name prefixes kept fully trainable"""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """auto = bf16 on CUDA, fp32 on CPU; fp16 (dynamic loss scaling) needs CUDA, or a CPU where DeepSpeed has fp16"""


class ObjectiveSection(_Section):
    """Advantages, the loss and its optimiser."""

    advantage: str = "gae"
    """a registered advantage estimator (async_rl/algo/estimators.py): gae, vtrace, or a group one (grpo, rloo, ...)"""
    group_size: Positive = 1
    """episodes per group started from the same initial state (group estimators need >= 2; 1 = no groups)"""
    max_group_version_spread: pydantic.NonNegativeInt = 4
    """a group whose members' start versions span more than this is dropped; an incomplete one is given up \
this many versions plus an episode's span after its last ticket (actors/groups.py)"""

    @pydantic.field_validator("advantage")
    @classmethod
    def _usable_advantage(cls, value: str) -> str:
        return check_advantage(value)

    clip_mode: str = "clip"
    """the policy loss (async_rl/algo/losses.py): clip (PPO), cispo, pacs, ...; its params in clip_params"""
    clip_params: dict[str, Any] = pydantic.Field(default_factory=dict)
    """params of the clip mode (or --clip-config FILE)"""
    lr_policy: pydantic.PositiveFloat = 3e-4
    """the policy's peak learning rate"""
    lr_value: pydantic.PositiveFloat = 1e-3
    """the critic's peak learning rate"""
    warmup_steps: pydantic.NonNegativeInt = 10
    """optimiser steps of linear learning-rate warm-up"""
    lr_decay_steps: Positive = 10_000
    """optimiser step at which the cosine decay reaches min_lr_ratio"""
    min_lr_ratio: Fraction = 0.1
    """the learning rate after the decay, as a fraction of the peak"""
    weight_decay: pydantic.NonNegativeFloat = 0.0
    """AdamW's weight decay"""
    max_grad_norm: pydantic.PositiveFloat = 1.0
    """gradients are clipped to this global norm"""
    gamma: Fraction = 0.99
    """discount factor"""
    gae_lambda: Fraction = 0.95
    """GAE's lambda (bias against variance of the advantages)"""
    reward_scale: pydantic.PositiveFloat = 0.1
    """rewards are multiplied by this before the advantages"""
    value_coef: pydantic.NonNegativeFloat = 0.5
    """weight of the value loss"""
    value_clip_eps: Optional[pydantic.PositiveFloat] = None
    """clip the value prediction's change to this range (PPO's value clipping); null = off"""
    critic_warmup_epochs: pydantic.NonNegativeInt = 0
    """the first N epochs train the critic alone (value loss only; the policy's weights and optimiser state stay
    as they are, its learning-rate schedule starts after them): a fresh critic's advantages are noise. A
    critic-free estimator (grpo, rloo, ...) has nothing to warm up and ignores it"""
    entropy_coef: pydantic.NonNegativeFloat = 0.0
    """weight of the entropy bonus"""
    kl_coef: pydantic.NonNegativeFloat = 0.0
    """k3 KL penalty to the behaviour policy (the one that collected the batch), not to a reference"""
    kl_ref_coef: pydantic.NonNegativeFloat = 0.0
    """KL to the reference policy (LoRA: the model with adapters off; else a frozen copy of the initial weights); 0 = off"""
    kl_ref_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Schulman's estimators of KL(pi || pi_ref): k1 = log(pi/pi_ref), k2 = log^2/2, k3 = (r - 1) - log r"""
    kl_ref_as: Literal["loss", "reward"] = "loss"
    """the KL to the reference as a loss term, or as a per-step reward penalty (estimators reading rewards on the trainer)"""
    reference_logp_on: Literal["trainer", "sampler"] = "trainer"
    """where the reference policy's log-probs are computed: a no-gradient forward on the trainer per minibatch, or on
    the inference actor right after sampling, with its adapters off (LoRA with lora_sync adapters; it holds the same
    base): that forward then overlaps training instead of lengthening it (a third of the trainer's time in the
    causal-LM GRPO profile)"""
    loss_agg: Literal["global-token-mean", "minibatch-token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                      "token-mean"] = "minibatch-token-mean"
    """how the per-token terms of variable-length actions (a response) become one loss, named for what they are \
divided by: the real tokens of the whole optimiser step (every accumulation step and rank; verl's and DAPO's \
token mean), the real tokens of each micro-batch (TRL's bnpo; token-mean is its old name), each sequence's own \
length then the sequences, or the token budget (Dr. GRPO)"""
    grpo_scale_by_std: bool = True
    """grpo divides by the group's std; false = centring only (Dr. GRPO)"""
    ratio_threshold: Optional[pydantic.PositiveFloat] = None
    """ratio guard: skip an optimiser step when every minibatch's mean ratio exceeds this; null = off"""
    max_skipped_updates_in_a_row: pydantic.NonNegativeInt = 5
    """stop the run (one line, exit 1) once this many optimiser steps in a row were skipped: by the ratio guard, by a
    non-finite loss in every minibatch, or by DeepSpeed's overflow check (non-finite gradients); such a run learns
    nothing. 0: never stop"""
    normalize_advantages: bool = True
    """whiten the advantages over the batch (gae, vtrace); group estimators follow normalize_group_advantages"""
    normalize_group_advantages: bool = False
    """group estimators (grpo, rloo, naive): divide their advantages by the batch's RMS as well (no centring); off: the
    group's own advantages reach the loss, as in TRL and verl"""
    recompute_logp: bool = False
    """recompute the behaviour log-probs with the trainer's weights before each epoch's update (verl's
    recompute_log_prob): the sampler's numerics (bf16, other kernels and batch shapes) then no longer count as a
    policy change; the ratio then measures the change from the epoch's start, not from a lagging sampler.
    One forward pass over the super-batch, no gradient"""
    normalize_advantages_per: Literal["batch", "task"] = "batch"
    """whiten over the whole batch, or over each task's steps apart (multi-task runs: a task whose episodes succeed more
    no longer makes every step of the others look worse than average)"""
    vtrace_clip_rho: Optional[pydantic.PositiveFloat] = 1.0
    """V-trace's rho-bar (clip of the importance weights in the value targets); null = no clip"""
    vtrace_clip_c: Optional[pydantic.PositiveFloat] = 1.0
    """V-trace's c-bar (clip of the trace-cutting weights); null = no clip"""
    vtrace_clip_pg_rho: Optional[pydantic.PositiveFloat] = 1.0
    """clip of the importance weights in V-trace's policy gradient; null = no clip"""


class ScaleSection(_Section):
    """How many of each actor, batch sizes, replay, and resources (named as in ds_libero_ppo.py); defaults fit
    a 2-core machine. Sizes count steps (PPO) or segments of ``rollout_steps`` steps (V-trace)."""

    num_trainers: Positive = 2
    """trainer ranks (DeepSpeed data parallel)"""
    num_inference_actors: Positive = 1
    """actors holding a copy of the policy that answer the rollout workers"""
    num_rollout_workers: Positive = 2
    """actors stepping envs to collect experience"""
    num_eval_workers: pydantic.NonNegativeInt = 1
    """actors running the periodic evaluations; 0 = none"""
    envs_per_worker: Positive = 4
    """envs each rollout worker steps (LM: prompts in flight)"""
    env_groups: Positive = 1
    """a worker's envs step in this many lock-step groups, one inference request each: while one group
    steps, the others' forward passes run (pays where the inference actor has a core to itself)"""
    inline_env_steps: bool = False
    """step the envs on the worker's event loop, not its env thread: saves two thread hand-offs per round;
    for envs whose round takes milliseconds (a blocked loop answers pings and pause calls a round late)"""
    rollout_steps: Positive = 64
    """steps each env takes before its worker ships them: PPO's rollout length (GAE runs over them, bootstrapped
    at the cut), V-trace's segment"""
    inference_batch: Positive = 2
    """requests an inference actor batches into one forward pass (or generate call)"""
    inference_timeout_ms: pydantic.PositiveFloat = 2.0
    """longest wait to fill an inference batch"""
    inference_forward_thread: Optional[bool] = None
    """forward in a thread (true) or on the actor's event loop (false); null = a thread for GPU models
    and CPU models over 20 M parameters"""
    shared_memory: Literal["auto", "off"] = "auto"
    """rollout workers on their inference actor's node send observations and get answers through shared
    memory instead of a Ray call per step (auto); off = every request over Ray"""

    @pydantic.field_validator("shared_memory", mode="before")
    @classmethod
    def _bare_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads a bare off as false

    replay_capacity: Positive = 4096
    """items the replay buffer holds; the oldest are evicted"""
    train_batch_size: Positive = 256
    """items in one micro-batch of a trainer rank (LM: completions)"""
    accumulation_steps: Positive = 2
    """micro-batches whose gradients make one optimiser step"""
    super_batch_size: Positive = 512
    """steps a trainer rank draws per epoch; advantages are whitened over them. A multiple of
    train_batch_size x accumulation_steps: each such slice is one optimiser step (PPO's minibatches)"""
    updates_per_epoch: Positive = 4
    """passes over the super-batch per epoch"""
    replay_sampling: Literal["consume", "reuse"] = "consume"
    """consume: sampled experience leaves the buffer (each step trains in one epoch); reuse: it stays
    and may be drawn again (as in the original ds_libero_ppo.py framework), so trainers never wait for data"""
    max_sample_reuse: Optional[pydantic.PositiveFloat] = None
    """bounded update-to-data ratio: trainers wait for fresh data while the items drawn so far, each
    trained updates_per_epoch times, would exceed this many uses per item collected
    (health/data_wait_*, replay/reuse_refusals); null = no bound"""
    max_policy_lag: Optional[pydantic.NonNegativeInt] = None
    """experience more than this many policy versions older than the trainer's is dropped when sampled
    (replay/dropped_stale); null = keep all"""
    max_untrained_items: Optional[pydantic.NonNegativeInt] = None
    """backpressure (consume mode, asynchronous): rollout workers generate nothing while the replay buffer holds
    this many items no trainer has drawn, so generation never outruns training into evictions (health/backpressure_*;
    replay/evicted_untrained counts what was generated for nothing). null = for group estimators (grpo, rloo, ...: an
    item is a sampled episode, e.g. an LM response) replay_capacity less two pushes of every worker, at least a
    super-batch per trainer; for gae / vtrace no bound (workers run ahead, the oldest steps are evicted); 0 = no bound.
    Each super-batch held adds a policy version of lag: one or two super-batches keep the data fresh"""
    prefetch_batches: pydantic.NonNegativeInt = 1
    """super-batches a trainer fetches ahead while it trains (each adds a policy version of lag);
    0 = fetch when an epoch starts"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """where the models run; auto = CUDA where there is a GPU"""
    trainer_num_cpus: pydantic.NonNegativeFloat = 0.5
    """Ray CPUs reserved per trainer rank"""
    inference_num_cpus: pydantic.NonNegativeFloat = 0.25
    """Ray CPUs reserved per inference actor"""
    worker_num_cpus: pydantic.NonNegativeFloat = 0.25
    """Ray CPUs reserved per rollout or evaluation worker"""
    torch_threads: Positive = 1
    """torch threads per actor"""
    trainer_gpu_ids: Optional[list[GpuId]] = None
    """GPUs pinned by hand, one per trainer rank (one host only): indices, GPU UUIDs or MIG ids as
    CUDA_VISIBLE_DEVICES writes them"""
    inference_gpu_ids: Optional[list[GpuId]] = None
    """GPUs the inference actors share round-robin, pinned by hand (ids as trainer_gpu_ids)"""
    placement_strategy: Literal["PACK", "SPREAD"] = "PACK"
    """Ray placement groups of the trainers and of the inference actors: PACK fills few nodes, SPREAD
    one rank / actor per node where it can"""


class TimeoutsSection(_Section):
    """Every cross-actor wait has a timeout; killed actors are restarted a bounded number of times."""

    actor_timeout_s: pydantic.PositiveFloat = 120.0
    """longest wait on another actor's call"""
    collective_timeout_s: pydantic.PositiveFloat = 120.0
    """longest wait in a collective (weight broadcast, gradient all-reduce)"""
    startup_timeout_s: pydantic.PositiveFloat = 600.0
    """longest wait for the actors to start (models loaded)"""
    actor_max_restarts: pydantic.NonNegativeInt = 3
    """Ray restarts a killed rollout worker or inference actor up to this many times"""


# Section name -> its typed view; every config key is in exactly one (tests/config/test_config.py checks).
SECTIONS: dict[str, type[_Section]] = {
    "run": RunSection, "env": EnvSection, "policy": PolicySection, "objective": ObjectiveSection,
    "scale": ScaleSection, "timeouts": TimeoutsSection, "supervised": SupervisedSection,
}


def _check_sampler_reference(policy: str, lora_rank: int, lora_sync: str, lora_trainable: list[str],
                            needs_reference: bool) -> None:
    """``reference_logp_on: sampler`` applies where the inference actor's model with adapters off is the reference:
    LoRA, adapter-only sync (with merged sync it holds no base), and no parameter trained whole that the log-probs
    read (the policy's ``logp_free_prefixes``); and only where the objective reads a reference. Else one ConfigError."""
    if not needs_reference:
        raise ConfigError("reference_logp_on sampler: nothing reads the reference policy (kl_ref_coef is 0 and the "
                          "clip mode reads none); drop --reference-logp-on")
    if lora_rank == 0 or lora_sync != "adapters":
        raise ConfigError("reference_logp_on sampler needs LoRA with --lora-sync adapters (the inference actor then holds "
                          "the frozen base, the reference); pass --lora-rank N --lora-sync adapters or --reference-logp-on trainer")
    free = tuple(getattr(POLICIES.entry(policy).obj, "logp_free_prefixes", ()))
    read = [prefix for prefix in lora_trainable if not prefix.startswith(free)]
    if read:
        raise ConfigError(f"reference_logp_on sampler: lora_trainable '{read[0]}' is trained whole and may enter the "
                          f"log-probs, so adapters off is not the reference there; use --reference-logp-on trainer")


class RunConfig(SupervisedSection, TimeoutsSection, ScaleSection, ObjectiveSection, PolicySection, EnvSection, RunSection):
    """Every knob of a run, flat (``cfg.gamma``); ``cfg.section("objective")`` is one section, frozen."""

    model_config = pydantic.ConfigDict(frozen=False, validate_assignment=True)
    # Keys of earlier versions: a config that still uses one is refused with its new spelling.
    renamed_keys: ClassVar[dict[str, str]] = renamed_run_keys()
    _clip: Optional[ClipMode] = pydantic.PrivateAttr(default=None)

    @property
    def clip(self) -> ClipMode:
        """``clip_mode`` with ``clip_params``, resolved once when the config is checked (every change of a key
        checks it again); what the objective, the trainers and the replay buffer read."""
        if self._clip is None:  # built without the checks (model_construct)
            self._clip = resolve_clip_mode(self.clip_mode, self.clip_params)
        return self._clip

    @property
    def optimizer_steps_per_update(self) -> int:
        """Optimiser steps in one pass over a super-batch (its train_batch_size x accumulation_steps slices)."""
        return self.super_batch_size // (self.train_batch_size * self.accumulation_steps)

    def section(self, name: str) -> _Section:
        """A frozen copy of section ``name`` (run, env, policy, objective, scale, timeouts, supervised)."""
        if name not in SECTIONS:
            raise KeyError(unknown_key_message(name, SECTIONS, "config section"))
        cls = SECTIONS[name]
        return cls.model_construct(**{key: copy.deepcopy(getattr(self, key)) for key in cls.model_fields})

    def sectioned(self) -> dict[str, dict[str, Any]]:
        """The config as {section: {key: JSON-able value}} (what ``--print-config`` prints)."""
        flat = self.model_dump(mode="json")
        return {name: {key: flat[key] for key in cls.model_fields} for name, cls in SECTIONS.items()}

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        if self.super_batch_size % (self.train_batch_size * self.accumulation_steps):
            raise ValueError(
                f"super_batch_size ({self.super_batch_size}) must be a multiple of train_batch_size x accumulation_steps "
                f"({self.train_batch_size} x {self.accumulation_steps} = {self.train_batch_size * self.accumulation_steps}), "
                "one optimiser step each"
            )
        if self.super_batch_size > self.replay_capacity:
            raise ValueError(
                f"super_batch_size ({self.super_batch_size}) exceeds replay_capacity ({self.replay_capacity}); "
                "raise replay_capacity"
            )
        if self.envs_per_worker % self.env_groups:
            raise ValueError(f"envs_per_worker ({self.envs_per_worker}) must be a multiple of env_groups "
                             f"({self.env_groups}); each group steps as many envs")
        if self.normalize_advantages_per == "task" and not advantage_estimator(self.advantage).normalizes(self):
            # Per-task whitening is a kind of whitening; with whitening off it would silently do nothing.
            key = "normalize_group_advantages" if advantage_estimator(self.advantage).needs_group_rollouts else "normalize_advantages"
            raise ValueError(f"normalize_advantages_per task needs {key} true for advantage '{self.advantage}'; "
                             f"drop --normalize-advantages-per or pass --{key.replace('_', '-')}")
        clip = self._clip = resolve_clip_mode(self.clip_mode, self.clip_params)
        check_group_size(self.advantage, self.group_size)
        check_objective(self.advantage, clip, self.kl_ref_coef, self.kl_ref_as)
        check_recompute_logp(self.advantage, self.recompute_logp)
        if self.reference_logp_on == "sampler":
            _check_sampler_reference(self.policy, self.lora_rank, self.lora_sync, self.lora_trainable, self.kl_ref_coef > 0
                                    or "logp_ref" in clip.reads)
        check_group_minibatch(clip, self.group_size, self.train_batch_size)
        if self.policy == "causal_lm":
            from async_rl.policies.lm_options import check_generation_engine  # noqa: PLC0415

            check_generation_engine(self.policy_kwargs)
        return self

    @pydantic.model_validator(mode="after")
    def _fp16_needs_cuda(self) -> "RunConfig":
        # DeepSpeed's engine refuses fp16 where its accelerator says no ("Type fp16 is not supported on your
        # device"): asked here, before Ray. Its CPU accelerator says yes only where oneDNN has fp16 kernels.
        # device auto on a driver without a GPU counts as CPU unless a cluster address is given.
        if self.precision == "fp16" and (self.device == "cpu" or (
                self.device == "auto" and not self.ray_address and not _cuda_visible())):
            if not deepspeed_cpu_supports_fp16():
                raise ValueError("precision fp16 needs a CUDA device here (DeepSpeed's CPU accelerator has no fp16 on "
                                 "this CPU); use --precision bf16 on CPU, or --device cuda on a GPU machine")
        return self

    @pydantic.model_validator(mode="after")
    def _untrained_bound_fits(self) -> "RunConfig":
        bound, least = self.max_untrained_items, self.num_trainers * self.super_batch_size
        if not bound:  # null (derived) or 0 (off)
            return self
        if self.replay_sampling != "consume":
            raise ValueError(f"max_untrained_items ({bound}) applies only to replay_sampling consume (reuse keeps drawn "
                             "items); pass --max-untrained-items 0")
        if not least <= bound <= self.replay_capacity:
            raise ValueError(f"max_untrained_items ({bound}) must be between num_trainers x super_batch_size ({least}: "
                             f"the trainers could never draw) and replay_capacity ({self.replay_capacity})")
        return self

    @pydantic.model_validator(mode="after")
    def _reuse_bound_is_async(self) -> "RunConfig":
        # Synchronous mode trains on each collected super-batch once; the bound would be silently ignored.
        if self.sync and self.max_sample_reuse is not None:
            raise ValueError(f"max_sample_reuse ({self.max_sample_reuse:g}) applies only to asynchronous mode; "
                             "drop --sync or pass --max-sample-reuse null")
        return self


def _cuda_visible() -> bool:
    return torch.cuda.is_available()
