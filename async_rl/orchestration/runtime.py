"""Runtime: every actor of one run, built once, and the few operations the loop composes
(train an epoch, check the workers, snapshot, checkpoint, shut down)."""
from __future__ import annotations

import functools
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import ray

from async_rl import checkpoint as ckpt
from async_rl.actors.evaluation import EvaluationWorkerActor
from async_rl.actors.inference import InferenceActor
from async_rl.actors.peers import SharedValue
from async_rl.actors.rollout_worker import RolloutWorkerActor, WorkerPeers
from async_rl.actors.stats import StatsActor
from async_rl.actors.trainer import TrainerActor
from async_rl.actors.trainer_setup import training_model
from async_rl.algo import advantage_estimator
from async_rl.logger import mean_metrics
from async_rl.orchestration.actor_group import ActorGroup, failure_reason, get_named
from async_rl.orchestration.checkpointer import Checkpointer
from async_rl.orchestration.evaluation import EvaluationPoller
from async_rl.orchestration.placement import Placement, on_driver_node
from async_rl.orchestration.replay import ReplaySupervisor
from async_rl.orchestration.weight_sync_coordinator import WeightSyncCoordinator
from async_rl.policies import build_policy, build_preprocessor
from async_rl.policies.initial_weights import with_initial_weights

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig
    from envs.base import TaskSet


SUPERVISE_INTERVAL_S = 2.0  # how often a wait on the trainers checks the workers and inference actors


def _raised(ref: ray.ObjectRef) -> bool:
    """Whether a finished task raised (its actor died or its method failed)."""
    try:
        ray.get(ref, timeout=0)
        return False
    except ray.exceptions.RayError:
        return True


def critic_free(factory: Any) -> Any:
    """The policy ``factory`` builds, without its critic (``ActorCritic.drop_critic``)."""
    return factory().drop_critic()


def obs_spec_of(task_set: TaskSet) -> dict[str, Any]:
    return dict(getattr(task_set, "obs_spec", None) or {"state_dim": task_set.obs_dim})


def epoch_on_every_rank(trainers: ActorGroup, version: int, epoch: int,
                        wait: Callable[..., dict[str, Any]],
                        wait_in_collectives: Optional[Callable[..., dict[str, Any]]] = None) -> dict[str, Any]:
    """One epoch on every trainer rank: each takes its super-batch first, and only then do they train,
    so no rank enters the epoch's collectives while another still waits for data (that rank would
    time out after ``collective_timeout_s`` whenever collection is slower than that; seen on a loaded
    2-core machine, one worker refilling stale rows for two ranks). ``wait(refs, what=...)`` awaits
    the ranks' answers by name; ``wait_in_collectives`` (default ``wait``) awaits the training itself
    when several ranks run the training group's collectives."""
    if len(trainers) > 1:
        wait(trainers.submit("ready_batch", version), what=f"ready_batch {epoch}")
        wait = wait_in_collectives or wait
    return wait(trainers.submit("train_epoch", version), what=f"train_epoch {epoch}")


def start_rollout_workers(rt: "Runtime", count: Any) -> ActorGroup:
    """The rollout workers (restartable by Ray), resuming a checkpoint's curriculum if any."""
    cfg = rt.cfg
    # Restartable workers find the task set and their peers by name (async_rl/actors/peers.py).
    rt.shared_task_set = SharedValue.options(name=rt.named("task-set"), **on_driver_node()).remote(rt.task_set)  # type: ignore[attr-defined]  # an ActorClass: mypy ignores decorators
    workers = ActorGroup("worker", {
        f"worker-{i}": RolloutWorkerActor.options(num_cpus=cfg.worker_num_cpus, max_restarts=cfg.actor_max_restarts,  # type: ignore[attr-defined]  # an ActorClass: mypy ignores decorators
                                                  max_task_retries=0).remote(
            i, WorkerPeers(rt.named("task-set"), rt.named(rt.inference_for(i)[1]), rt.named("replay"), rt.named("stats")),
            rt.preprocessor_factory, cfg)
        for i in range(cfg.num_rollout_workers)}, cfg.actor_timeout_s, cfg.actor_max_restarts, on_restart=count)
    if cfg.resume:  # submitted before run(), so applied before the first episode
        saved = ckpt.read_meta(Path(cfg.resume)).get("curriculum", {})
        for name, worker in workers.items():
            worker.load_curriculum_state.remote(saved.get(name))
    return workers


class Runtime:
    """Actor groups ``trainers``, ``inference``, ``workers``, ``evaluators``; the replay buffer and
    stats actor; the weight-sync coordinator, checkpointer and evaluation poller over them."""

    def __init__(self, cfg: RunConfig, task_set: TaskSet) -> None:
        self.cfg, self.task_set = cfg, task_set
        obs_spec = obs_spec_of(task_set)
        self.policy_factory = with_initial_weights(
            functools.partial(build_policy, cfg.policy, obs_spec, task_set.action_dim, **cfg.policy_kwargs), cfg.init_from)
        if not advantage_estimator(cfg.advantage).needs_critic:  # trainers and inference actors alike
            self.policy_factory = functools.partial(critic_free, self.policy_factory)
        self.preprocessor_factory = functools.partial(build_preprocessor, cfg.policy, obs_spec, **cfg.policy_kwargs)
        # Adapter-only weight sync: the inference copy is built as the trainers' is (same frozen base,
        # same adapters), so that only the trained tensors need to travel.
        self.inference_factory = (functools.partial(training_model, cfg, self.policy_factory)
                                  if cfg.lora_rank > 0 and cfg.lora_sync == "adapters" else self.policy_factory)
        self.policy_version = self.epoch = 0
        self.tag = f"run-{uuid.uuid4().hex[:8]}"  # actor names are unique to this run
        self.lag_values: list[int] = []  # behaviour-policy lag of every item of the last epoch
        self.final_evaluator: Optional[Any] = None  # the env's final evaluations' own evaluator, where none is periodic
        self.shared_task_set: Optional[Any] = None  # the actor holding the task set for the workers (start_rollout_workers)

    # ---- start-up -----------------------------------------------------------------------
    def start(self) -> None:
        cfg, timeout = self.cfg, self.cfg.actor_timeout_s
        self.stats = StatsActor.options(num_cpus=0, name=self.named("stats"), **on_driver_node()).remote()  # type: ignore[attr-defined]  # an ActorClass: mypy ignores decorators

        def count(counter: str, n: int = 1) -> None:  # restarts and lost items, counted by the stats actor
            self.stats.record_health.remote(counter, n)

        self.replay_supervisor = ReplaySupervisor(cfg, self.named("replay"), count, self.named("stats"))
        self.replay = self.replay_supervisor.actor
        self.placement = Placement(cfg)
        # Ray restarts a killed worker or inference actor (the runtime re-joins / re-runs it);
        # a trainer rank is never restarted: its ZeRO-2 partition would be gone.
        restartable = {"max_restarts": cfg.actor_max_restarts, "max_task_retries": 0}
        self.inference = ActorGroup("inference", {
            f"inference-{i}": InferenceActor.options(**self.placement.inference_options(i), name=self.named(f"inference-{i}"),  # type: ignore[attr-defined]  # an ActorClass: mypy ignores decorators
                                                         **restartable).remote(
                i, self.inference_factory, cfg.inference_batch, cfg.inference_timeout_ms, self.placement.inference_gpu(i),
                cfg.seed, cfg.torch_threads, cfg.precision, cfg.inference_forward_thread, cfg.actor_timeout_s,
                cfg.reference_logp_on == "sampler")
            for i in range(cfg.num_inference_actors)}, timeout, cfg.actor_max_restarts, on_restart=count)
        self.trainers = ActorGroup("trainer", {
            f"trainer-{r}": TrainerActor.options(**self.placement.trainer_options(r)).remote(  # type: ignore[attr-defined]  # an ActorClass: mypy ignores decorators
                r, cfg.num_trainers, None, None, cfg, self.policy_factory, self.replay, self.placement.trainer_gpu(r))
            for r in range(cfg.num_trainers)}, timeout)
        # The workers' and evaluators' processes start (and import their envs) while DeepSpeed sets the
        # trainers up; the workers collect only once the inference actors hold the trainers' weights.
        self.evaluators = ActorGroup.create("eval", cfg.num_eval_workers, self._new_evaluator, timeout_s=timeout,
                                            max_restarts=cfg.actor_max_restarts, restart_counter="evaluator_restarts",
                                            on_restart=count)
        self.eval_poller = EvaluationPoller(self.evaluators, cfg.eval_interval_epochs, cfg.eval_episodes,
                                            cfg.eval_deterministic, cfg.video_interval_evals, cfg.video_episodes)
        self.workers = start_rollout_workers(self, count)
        self.worker_runs: dict[str, ray.ObjectRef] = {}
        self.placement.rank0 = self.trainers["trainer-0"]  # its node hosts the training and weight-sync stores
        master = self.placement.training_master()
        self.info = self.trainers.call("setup", *master, timeout_s=cfg.startup_timeout_s,
                                       what="DeepSpeed set-up")["trainer-0"]
        self.checkpointer = Checkpointer(cfg, self.trainers, self.replay_supervisor.call, self.stats)
        if cfg.resume:
            self.epoch, self.policy_version = self.checkpointer.restore(Path(cfg.resume))
        self.weight_sync = WeightSyncCoordinator(self.trainers, self.inference, self.placement.weight_sync_rendezvous,
                                                 cfg.collective_timeout_s, timeout)
        self.weight_sync.join()
        self.weight_sync.broadcast(self.policy_version)  # inference starts from the trainers' weights
        self.worker_runs = self.workers.submit("run")
        # The workers' and evaluators' first answer waits for their processes to start and import the
        # envs (over a minute on a loaded machine).
        for group in (self.inference, self.workers, self.evaluators):
            group.record_pids(cfg.startup_timeout_s)

    def named(self, role: str) -> str:
        return f"{self.tag}:{role}"

    def inference_for(self, i: int) -> tuple[Any, str]:
        name = self.inference.names()[i % len(self.inference)]
        return self.inference[name], name

    def _new_evaluator(self, name: str) -> Any:
        i = int(name.rsplit("-", 1)[1])
        return EvaluationWorkerActor.options(num_cpus=self.cfg.worker_num_cpus).remote(  # type: ignore[attr-defined]  # an ActorClass: mypy ignores decorators
            i, self.task_set, self.preprocessor_factory, *self.inference_for(i), self.cfg)

    # ---- the loop's operations ----------------------------------------------------------
    def train_epoch(self) -> dict[str, float]:
        """Every rank trains on a super-batch, then rank 0's weights go to the inference actors."""
        wait = functools.partial(self._supervised, timeout_s=self.cfg.actor_timeout_s + 60)
        # Trainer rank 0 drives two communicators, the training group's and the weight-sync group's: used
        # from two threads in no fixed order, two NCCL groups can wait on each other for ever. So the weight
        # group runs only at step boundaries: no heal while several ranks are in the epoch's collectives
        # (the broadcast right after the epoch re-forms the group if an inference actor was restarted).
        results = epoch_on_every_rank(self.trainers, self.policy_version, self.epoch, wait,
                                      functools.partial(wait, heal=False))
        self.policy_version += 1
        seconds = self.weight_sync.broadcast(self.policy_version)
        self.epoch += 1
        rows = list(results.values())
        self.lag_values = [v for r in rows for v in r.pop("policy_lag_values")]
        metrics = mean_metrics(rows)
        metrics["policy_lag_max"] = max(r["policy_lag_max"] for r in rows)  # the worst rank, not the mean
        metrics["broadcast_seconds"] = seconds
        return metrics

    def _supervised(self, refs: dict[str, ray.ObjectRef], timeout_s: float, what: str, heal: bool = True) -> dict[str, Any]:
        """get_named(refs) that keeps the trainers' data flowing while they wait for it: a worker
        whose run ended is restarted, and an inference actor Ray restarted (e.g. its node died)
        gets the current weights (else workers and trainers would wait on each other); not with
        ``heal`` False (the trainers hold their data and run their collectives)."""
        deadline, pending = time.monotonic() + timeout_s, list(refs.values())
        while pending and time.monotonic() < deadline:
            ready, pending = ray.wait(pending, num_returns=len(pending),
                                      timeout=min(SUPERVISE_INTERVAL_S, max(deadline - time.monotonic(), 0)))
            if any(_raised(ref) for ref in ready):
                break  # get_named names the failure
            if pending:
                self.check_workers()
                if heal:
                    self.weight_sync.heal()
        return get_named(refs, max(deadline - time.monotonic(), 0.1), what, waited_s=timeout_s)

    def check_workers(self) -> None:
        """Restart a worker whose run ended (its env raised, or its process died) and run it again."""
        for name, ref in list(self.worker_runs.items()):
            if ray.wait([ref], timeout=0)[0]:
                self.workers.restart(name, failure_reason(ref))
                self.worker_runs[name] = self.workers[name].run.remote()

    def snapshot(self) -> dict[str, Any]:
        timeout = self.cfg.actor_timeout_s
        stats = ray.get(self.stats.snapshot.remote(), timeout=timeout)
        # Nice to have: an inference actor whose node just died (or that Ray is restarting) is left out
        # here; the supervision (weight_sync.heal) brings it back, a metrics snapshot must not end the run.
        rows = [s for s in self.inference.gather("stats").values() if s and s.get("batches")]
        inference = {k: sum(r[k] for r in rows) / len(rows) for k in ("batch_size", "forward_ms")} if rows else {}
        return {"stats": stats, "replay": self.replay_supervisor.counters(), "inference": inference}

    def save_checkpoint(self) -> Path:
        return self.checkpointer.save(self.epoch, self.policy_version, {"restarts": self.restarts,
                                                                         # a worker being restarted starts afresh
                                                                         "curriculum": self.workers.gather("curriculum_state")})

    # ---- views kept for inspection (tests, benchmarks) ------------------------------------
    @property
    def pids(self) -> dict[str, int]:
        return {**self.inference.pids, **self.workers.pids, **self.evaluators.pids}

    @property
    def restarts(self) -> dict[str, int]:
        return {**self.inference.restarts, **self.workers.restarts, **self.evaluators.restarts}

    # ---- shut-down ----------------------------------------------------------------------
    def shutdown(self) -> None:
        timeout = self.cfg.actor_timeout_s
        if hasattr(self, "workers"):
            self.workers.submit("stop")
            if self.worker_runs:  # empty when start-up failed before the workers were set to collect
                ray.wait(list(self.worker_runs.values()), num_returns=len(self.worker_runs), timeout=timeout)
        if self.final_evaluator is not None:  # its envs closed (CompilerGym's servers) before the kill below
            ray.wait([self.final_evaluator.shutdown.remote()], timeout=timeout)
            ray.kill(self.final_evaluator)
        for group in ("evaluators", "trainers", "inference"):
            if hasattr(self, group):
                refs = list(getattr(self, group).submit("shutdown").values())
                ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for group in ("workers", "evaluators", "trainers", "inference"):
            if hasattr(self, group):
                getattr(self, group).kill_all()
        for name in ("replay", "stats", "shared_task_set"):
            if hasattr(self, name):
                ray.kill(getattr(self, name))
        if hasattr(self, "placement"):
            self.placement.remove()
