"""The driver: builds the actors, runs warm-up -> epoch -> broadcast -> log, and shuts down.

Every launch script is a config plus ``run(cfg)``.
"""
from __future__ import annotations

import functools
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import ray
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

import envs
from async_rl import checkpoint as ckpt
from async_rl.actors.evaluation import EvaluationWorkerActor
from async_rl.actors.inference import InferenceActor
from async_rl.actors.replay_buffer import ReplayBufferActor
from async_rl.actors.rollout_worker import RolloutWorkerActor
from async_rl.actors.stats import StatsActor
from async_rl.actors.trainer import TrainerActor
from async_rl.config import RunConfig, load_config
from async_rl.errors import ActorFailedError, ActorTimeoutError, ConfigError
from async_rl.logger import MetricsLogger, mean_metrics
from async_rl.policies import build_policy, build_preprocessor, prepare_policy
from async_rl.runtime import check_resources, plan_gpus, pythonpath_with
from async_rl.weight_sync import check_signature, find_free_port

LOCALHOST = "127.0.0.1"
console = Console(stderr=True)
FINAL_EVAL_GRACE_S = 30.0
# An actor that raised may only be reporting a peer's death (a collective fails once the peer's
# socket closes, often before Ray reports the peer dead): wait this long for the root cause.
DEAD_PEER_GRACE_S = 5.0


def get_named(refs: Mapping[str, ray.ObjectRef], timeout_s: float, what: str) -> dict[str, Any]:
    """ray.get of several refs. The first one that fails raises ActorFailedError naming its actor
    (or, when it raised, a dead one among the others: the likelier cause) without waiting out the
    others' timeout; on timeout the error names every actor that did not answer."""
    by_ref = {ref: name for name, ref in refs.items()}
    pending, deadline = list(by_ref), time.monotonic() + timeout_s
    results: dict[str, Any] = {}
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0))
        if not ready:
            names = ", ".join(by_ref[r] for r in pending)
            raise ActorTimeoutError(f"{names} did not answer {what} within {timeout_s:g} s")
        for ref in ready:
            try:
                results[by_ref[ref]] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                dead = None if isinstance(exc, ray.exceptions.RayActorError) else _dead_actor(pending, by_ref)
                if dead is not None:
                    raise ActorFailedError(dead[0], what, dead[1]) from exc
                raise ActorFailedError(by_ref[ref], what, exc) from exc
    return {name: results[name] for name in refs}


def _dead_actor(refs: list[ray.ObjectRef], names: Mapping[ray.ObjectRef, str]) -> Optional[tuple[str, BaseException]]:
    """(name, error) of an actor among ``refs`` that died, if Ray says so within DEAD_PEER_GRACE_S."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=DEAD_PEER_GRACE_S) if refs else ([], [])
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return names[ref], exc
        except ray.exceptions.RayError:
            pass
    return None


def obs_spec_of(task_set: Any) -> dict[str, Any]:
    return dict(getattr(task_set, "obs_spec", None) or {"state_dim": task_set.obs_dim})


class Runtime:
    """All actors of one run and the loop that drives them."""

    def __init__(self, cfg: RunConfig, task_set: Any) -> None:
        self.cfg = cfg
        self.task_set = task_set
        obs_spec = obs_spec_of(task_set)
        self.policy_factory = functools.partial(build_policy, cfg.policy, obs_spec, task_set.action_dim, **cfg.policy_kwargs)
        self.preprocessor_factory = functools.partial(build_preprocessor, cfg.policy, obs_spec, **cfg.policy_kwargs)
        self.policy_version = 0
        self.epoch = 0
        self._eval_ref: Optional[ray.ObjectRef] = None
        self.last_eval: Optional[dict] = None
        self.broadcast_seconds: list[float] = []
        self.restarts: dict[str, int] = {}  # per actor name
        self.pids: dict[str, int] = {}
        self.last_checkpoint: Optional[Path] = None
        self.checkpoint_epoch = -1
        self.lag_values: list[int] = []  # behaviour-policy lag of every item of the last epoch

    # ---- start-up -----------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        trainer_gpus, inference_gpus = plan_gpus(cfg)
        self.replay = ReplayBufferActor.options(num_cpus=0, name=None).remote(cfg.replay_capacity, cfg.seed)
        self.stats = StatsActor.options(num_cpus=0).remote()
        # Ray restarts a killed worker or inference actor (the driver re-joins / re-runs it);
        # a trainer rank is never restarted: its ZeRO-2 partition would be gone.
        restartable = {"max_restarts": cfg.actor_max_restarts, "max_task_retries": 0}
        self.inference = {
            f"inference-{i}": InferenceActor.options(num_cpus=cfg.inference_num_cpus, **restartable).remote(
                i, self.policy_factory, cfg.inference_batch, cfg.inference_timeout_ms,
                gpu, cfg.seed, cfg.torch_threads, cfg.precision, cfg.inference_forward_thread, cfg.actor_timeout_s,
            )
            for i, gpu in enumerate(inference_gpus)
        }
        master_port = find_free_port()
        self.trainers = {
            f"trainer-{r}": TrainerActor.options(num_cpus=cfg.trainer_num_cpus).remote(
                r, cfg.num_trainers, LOCALHOST, master_port, cfg, self.policy_factory, self.replay, gpu
            )
            for r, gpu in enumerate(trainer_gpus)
        }
        info = get_named({n: t.setup.remote() for n, t in self.trainers.items()}, cfg.startup_timeout_s, "DeepSpeed set-up")
        console.print(f"[bold]policy[/] {cfg.policy}: {info['trainer-0']['params']:,} parameters, "
                      f"{info['trainer-0']['trainable']:,} trainable; {cfg.num_trainers} trainer rank(s) under ZeRO-2")
        if cfg.resume:
            self.restore(Path(cfg.resume))
        self._join_weight_sync()
        self.broadcast()  # inference starts from the trainers' weights (version 0, or the checkpoint's)
        self.evaluators = {
            f"eval-{i}": EvaluationWorkerActor.options(num_cpus=cfg.worker_num_cpus).remote(
                i, self.task_set, self.preprocessor_factory, *self._inference_for(i), cfg
            )
            for i in range(cfg.num_eval_workers)
        }
        # Held here for the run: a restarted worker is built from the same stored arguments.
        self._task_set_ref = ray.put(self.task_set)
        self.workers = {
            f"worker-{i}": RolloutWorkerActor.options(num_cpus=cfg.worker_num_cpus, **restartable).remote(
                i, self._task_set_ref, self.preprocessor_factory, *self._inference_for(i), self.replay, self.stats, cfg
            )
            for i in range(cfg.num_rollout_workers)
        }
        self.worker_runs = {name: w.run.remote() for name, w in self.workers.items()}
        pids = {**{n: a.pid.remote() for n, a in self.inference.items()}, **{n: w.pid.remote() for n, w in self.workers.items()}}
        self.pids = get_named(pids, cfg.startup_timeout_s, "pid")

    def _inference_for(self, i: int) -> tuple[Any, str]:
        name = list(self.inference)[i % len(self.inference)]
        return self.inference[name], name

    def _join_weight_sync(self) -> None:
        cfg = self.cfg
        rank0 = self.trainers["trainer-0"]
        ours = ray.get(rank0.weight_signature.remote(), timeout=cfg.actor_timeout_s)
        theirs = get_named({n: a.weight_signature.remote() for n, a in self.inference.items()}, cfg.actor_timeout_s,
                           "weight_signature")
        for name, sig in theirs.items():
            check_signature(ours, sig, name)
        names = ["trainer-0", *self.inference]
        port = find_free_port()
        joins = {"trainer-0": rank0.join_weight_sync.remote(len(names), LOCALHOST, port, cfg.collective_timeout_s, names)}
        for rank, (name, actor) in enumerate(self.inference.items(), start=1):
            joins[name] = actor.join_weight_sync.remote(rank, len(names), LOCALHOST, port, cfg.collective_timeout_s, names)
        get_named(joins, cfg.collective_timeout_s + 10, "joining the weight-sync group")

    def broadcast(self) -> float:
        """Send rank 0's weights to every inference actor (both sides in flight before waiting).

        If an inference actor failed (killed and restarted by Ray, or not answering within
        ``collective_timeout_s``), the group is rebuilt with the live members and the weights
        sent again; a trainer's failure propagates."""
        refs = self._broadcast_refs()
        what = f"weight broadcast v{self.policy_version}"
        try:
            seconds = get_named(refs, self.cfg.collective_timeout_s + 10, what)["trainer-0"]
        except (ActorFailedError, ActorTimeoutError) as exc:
            console.print(f"{what} failed: {exc}; rebuilding the weight-sync group", style="red", markup=False,
                          soft_wrap=True)
            self._rebuild_weight_sync(refs)
            seconds = get_named(self._broadcast_refs(), self.cfg.collective_timeout_s + 10, what)["trainer-0"]
        self.broadcast_seconds.append(seconds)
        return seconds

    def _broadcast_refs(self) -> dict[str, ray.ObjectRef]:
        refs = {"trainer-0": self.trainers["trainer-0"].broadcast_weights.remote()}
        for name, actor in self.inference.items():
            refs[name] = actor.receive_weights.remote(self.policy_version)
        return refs

    def _rebuild_weight_sync(self, failed: Mapping[str, ray.ObjectRef]) -> None:
        """Let the failed broadcast end everywhere, restart what died, and form a new group."""
        cfg = self.cfg
        trainer_ref = failed["trainer-0"]
        ray.wait([trainer_ref], timeout=cfg.collective_timeout_s + 10)  # its side ends by timeout or error
        try:
            ray.get(trainer_ref, timeout=0)
        except ray.exceptions.RayActorError as exc:
            raise ActorFailedError("trainer-0", "the weight broadcast", exc) from exc
        except (ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError):
            pass  # expected: the collective failed on the sender's side too
        for name, actor in self.inference.items():
            if self._pid(name, actor) != self.pids.get(name):
                self._restart(name, actor, "its process died", "inference_restarts")
        self._join_weight_sync()

    def wait_for_warmup(self, deadline: float) -> bool:
        """Block until the replay buffer holds a super-batch; False if the deadline passed first.
        Raises if ``startup_timeout_s`` passes first (the workers deliver nothing usable)."""
        give_up = time.monotonic() + self.cfg.startup_timeout_s
        while time.monotonic() < deadline:
            size = ray.get(self.replay.size.remote(), timeout=self.cfg.actor_timeout_s)
            if size >= self.cfg.super_batch_size:
                return True
            if time.monotonic() > give_up:
                stats = ray.get(self.stats.snapshot.remote(), timeout=self.cfg.actor_timeout_s)
                raise ActorTimeoutError(
                    f"the rollout workers did not fill a super-batch ({size}/{self.cfg.super_batch_size} items) within "
                    f"startup_timeout_s={self.cfg.startup_timeout_s:g} s ({stats['total_env_steps']} env steps, "
                    f"{stats['health'].get('dropped_episodes', 0)} episodes dropped for non-finite numbers)")
            self._check_workers()
            time.sleep(0.5)
        return False

    def _check_workers(self) -> None:
        """Restart a worker whose run ended (its env raised, or its process died) and run it again."""
        for name, ref in list(self.worker_runs.items()):
            if not ray.wait([ref], timeout=0)[0]:
                continue
            try:
                ray.get(ref)
                reason = "its run returned before the run ended"
            except ray.exceptions.RayActorError as exc:
                reason = f"its process died ({type(exc).__name__})"
            except ray.exceptions.RayTaskError as exc:
                reason = f"it raised {type(exc.cause).__name__}: {str(exc.cause).splitlines()[0] if str(exc.cause) else ''}"
            self._restart(name, self.workers[name], reason, "worker_restarts")
            self.worker_runs[name] = self.workers[name].run.remote()

    def _pid(self, name: str, actor: Any) -> Optional[int]:
        """The actor's process id; None if its process is dead. One that is alive but does not
        answer within ``actor_timeout_s`` stops the run with an error naming it."""
        try:
            return ray.get(actor.pid.remote(), timeout=self.cfg.actor_timeout_s)
        except ray.exceptions.RayActorError:
            return None
        except ray.exceptions.GetTimeoutError:
            raise ActorTimeoutError(f"{name} did not answer within actor_timeout_s={self.cfg.actor_timeout_s:g} s "
                                    "(alive but stuck?)") from None

    def _restart(self, name: str, actor: Any, reason: str, counter: str) -> None:
        """Have Ray restart ``actor`` (if its process still lives) and wait until the new process answers."""
        cfg = self.cfg
        count = self.restarts[name] = self.restarts.get(name, 0) + 1
        if count > cfg.actor_max_restarts:
            raise ActorFailedError(name, "the run", RuntimeError(f"{reason}; restarted {cfg.actor_max_restarts} times "
                                                                 "already (actor_max_restarts)"))
        console.print(f"{name} failed: {reason}; restarting it ({count}/{cfg.actor_max_restarts})", style="yellow",
                      markup=False)
        old_pid = self.pids.get(name)
        try:
            same_process = self._pid(name, actor) == old_pid
        except ActorTimeoutError:
            same_process = True  # alive but stuck
        if same_process:  # kill the process so Ray starts a fresh one
            ray.kill(actor, no_restart=False)
        deadline = time.monotonic() + cfg.actor_timeout_s
        while True:
            try:
                pid = ray.get(actor.pid.remote(), timeout=max(deadline - time.monotonic(), 0.1))
                if pid != old_pid:
                    break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise ActorTimeoutError(f"{name} did not come back within {cfg.actor_timeout_s:g} s after "
                                            f"a restart ({type(exc).__name__})") from None
            time.sleep(0.2)
        self.pids[name] = pid
        self.stats.record_health.remote(counter)

    # ---- synchronous mode ---------------------------------------------------------------
    def collect_synchronously(self, deadline: float) -> bool:
        """Have every worker collect its share of a fresh super-batch per trainer and pause;
        False if the deadline came first."""
        cfg = self.cfg
        needed = cfg.num_trainers * cfg.super_batch_size
        # Leftovers of the last collection were made by an older policy: not "collect, then train".
        ray.get(self.replay.drop_older_than.remote(self.policy_version), timeout=cfg.actor_timeout_s)
        counters = ray.get(self.replay.counters.remote(), timeout=cfg.actor_timeout_s)
        start, collected = counters["added"], False
        while not collected and time.monotonic() < deadline:
            steps = worker_share(cfg, needed - (counters["added"] - start))
            get_named({n: w.resume.remote(steps) for n, w in self.workers.items()}, cfg.actor_timeout_s, "resume")
            self._wait_until_paused(steps, deadline)
            counters = ray.get(self.replay.counters.remote(), timeout=cfg.actor_timeout_s)
            collected = counters["added"] - start >= needed and counters["size"] >= needed
        get_named({n: w.pause.remote() for n, w in self.workers.items()}, cfg.actor_timeout_s, "pause")
        return collected

    def _wait_until_paused(self, steps: int, deadline: float) -> None:
        """Wait (until ``deadline``) for every worker to pause after its ``steps``; raises naming the
        workers still collecting after ``actor_timeout_s``."""
        paused = {n: w.wait_paused.remote() for n, w in self.workers.items()}
        give_up = time.monotonic() + self.cfg.actor_timeout_s
        while time.monotonic() < deadline:
            if len(ray.wait(list(paused.values()), num_returns=len(paused), timeout=0.2)[0]) == len(paused):
                return
            self._check_workers()  # a restarted worker is collecting again: wait for it too
            if time.monotonic() > give_up:
                late = [n for n, ref in paused.items() if not ray.wait([ref], timeout=0)[0]]
                raise ActorTimeoutError(f"{', '.join(late)} did not collect {steps} env steps and pause within "
                                        f"actor_timeout_s={self.cfg.actor_timeout_s:g} s")

    # ---- one epoch ----------------------------------------------------------------------
    def train_epoch(self) -> dict[str, float]:
        cfg = self.cfg
        results = get_named({n: t.train_epoch.remote(self.policy_version) for n, t in self.trainers.items()},
                            cfg.actor_timeout_s + 60, f"train_epoch {self.epoch}")
        self.policy_version += 1
        seconds = self.broadcast()
        self.epoch += 1
        rows = list(results.values())
        self.lag_values = [v for r in rows for v in r.pop("policy_lag_values")]
        metrics = mean_metrics(rows)
        metrics["policy_lag_max"] = max(r["policy_lag_max"] for r in rows)  # the worst rank, not the mean
        metrics["broadcast_seconds"] = seconds
        return metrics

    def poll_eval(self, force: bool = False, wait_s: Optional[float] = None) -> Optional[dict]:
        """Start an evaluation every ``eval_interval_epochs``; return a finished one's result.
        ``force`` starts none and waits up to ``wait_s`` (default ``actor_timeout_s``) for the one in flight."""
        if not self.evaluators:
            return None
        result = None
        name, evaluator = next(iter(self.evaluators.items()))
        if self._eval_ref is not None:
            timeout = (self.cfg.actor_timeout_s if wait_s is None else wait_s) if force else 0
            ready, _ = ray.wait([self._eval_ref], timeout=timeout)
            if ready:
                result, self._eval_ref = ray.get(self._eval_ref), None
                self.last_eval = result
            elif force:
                console.print(f"{name} did not finish its evaluation within {timeout:.0f} s; the run ends without it",
                              style="yellow", markup=False)
        if self._eval_ref is None and not force and self.epoch % self.cfg.eval_interval_epochs == 0:
            self._eval_ref = evaluator.evaluate.remote(self.cfg.eval_episodes, self.cfg.eval_deterministic)
        return result

    def snapshot(self) -> dict[str, Any]:
        cfg = self.cfg
        stats = ray.get(self.stats.snapshot.remote(), timeout=cfg.actor_timeout_s)
        replay = ray.get(self.replay.counters.remote(), timeout=cfg.actor_timeout_s)
        inference = get_named({n: a.stats.remote() for n, a in self.inference.items()}, cfg.actor_timeout_s, "stats")
        rows = [s for s in inference.values() if s.get("batches")]
        return {"stats": stats, "replay": replay,
                "inference": {k: sum(r[k] for r in rows) / len(rows) for k in ("batch_size", "forward_ms")} if rows else {}}

    # ---- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the whole run into a temp dir, then commit it by rename."""
        cfg = self.cfg
        root = ckpt.checkpoint_root(cfg.log_dir)
        staging = ckpt.staging_dir(root, self.epoch)
        try:
            # Trainers stop fetching, so the replay buffer and their untrained batches match.
            get_named({n: t.hold_prefetch.remote() for n, t in self.trainers.items()}, cfg.actor_timeout_s, "hold_prefetch")
            ray.get(self.replay.save.remote(str(staging / "replay.safetensors")), timeout=cfg.actor_timeout_s)
            get_named({n: t.save_checkpoint.remote(str(staging)) for n, t in self.trainers.items()},
                      cfg.actor_timeout_s, "save_checkpoint")
            stats = ray.get(self.stats.state_dict.remote(), timeout=cfg.actor_timeout_s)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # nothing partial stays
            raise
        meta = {"format": ckpt.FORMAT, "epoch": self.epoch, "policy_version": self.policy_version,
                "config": self.cfg.model_dump(mode="json"), "stats": stats, "restarts": self.restarts,
                "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.last_checkpoint = ckpt.commit(staging, meta, cfg.keep_checkpoints)
        self.checkpoint_epoch = self.epoch
        console.print(f"checkpoint (epoch {self.epoch}, policy v{self.policy_version}): {self.last_checkpoint}",
                      markup=False, soft_wrap=True)
        return self.last_checkpoint

    def restore(self, path: Path) -> None:
        """Load a checkpoint into the trainers, replay buffer and stats (before the first broadcast)."""
        cfg = self.cfg
        meta = ckpt.read_meta(path)
        loaded = get_named({n: t.load_checkpoint.remote(str(path)) for n, t in self.trainers.items()},
                           cfg.actor_timeout_s, "load_checkpoint")
        size = ray.get(self.replay.load.remote(str(path / "replay.safetensors")), timeout=cfg.actor_timeout_s)
        ray.get(self.stats.load_state_dict.remote(meta["stats"]), timeout=cfg.actor_timeout_s)
        self.epoch, self.policy_version = int(meta["epoch"]), int(meta["policy_version"])
        self.checkpoint_epoch = self.epoch
        pending = sum(r["pending"] for r in loaded.values())
        console.print(f"resumed from {path}: epoch {self.epoch}, policy v{self.policy_version}, "
                      f"global step {loaded['trainer-0']['global_step']}, replay {size} items, "
                      f"{pending} untrained super-batch(es)")

    # ---- shut-down ----------------------------------------------------------------------
    def shutdown(self) -> None:
        timeout = self.cfg.actor_timeout_s
        for name, worker in getattr(self, "workers", {}).items():
            worker.stop.remote()
        if getattr(self, "worker_runs", None):
            ray.wait(list(self.worker_runs.values()), num_returns=len(self.worker_runs), timeout=timeout)
        for group in ("evaluators", "trainers", "inference"):
            actors = getattr(self, group, {})
            ray.wait([a.shutdown.remote() for a in actors.values()], num_returns=len(actors), timeout=timeout)
        for group in ("workers", "evaluators", "trainers", "inference"):
            for actor in getattr(self, group, {}).values():
                ray.kill(actor)
        for name in ("replay", "stats"):
            if hasattr(self, name):
                ray.kill(getattr(self, name))


def init_ray(cfg: RunConfig) -> None:
    """Join ``--ray-address`` or start a local cluster bound to 127.0.0.1."""
    env_vars = {"PYTHONPATH": pythonpath_with(Path(__file__).resolve().parents[1])}
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, runtime_env={"env_vars": env_vars}, log_to_driver=True)
        return
    # Ray resolves 127.0.0.1 to the machine's address unless told this node is not part of a
    # cluster; then every Ray server (GCS, raylet, workers, agents) listens on loopback only.
    from ray._private import ray_constants  # noqa: PLC0415

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by the processes Ray starts
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported it already
    # address="local": a new cluster even when another one (`ray start`) runs on this machine.
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address=LOCALHOST,
             runtime_env={"env_vars": env_vars}, log_to_driver=True, logging_level="WARNING")


def training_scalars(epoch_metrics: Mapping[str, float], runtime: Runtime) -> dict[str, float]:
    m = epoch_metrics
    out = {f"train/{k}": m[k] for k in ("policy_loss", "value_loss", "entropy", "clip_frac", "dead_grad_frac", "ess",
                                          "approx_kl", "ratio_mean", "ratio_max", "lr_policy", "lr_value", "loss",
                                          "epoch_seconds", "global_step") if k in m}
    out["health/skipped_updates"] = m.get("skipped_updates", 0)
    out.update({f"train/{k}": v for k, v in m.items() if k.startswith(("sapo_", "soft_clip_"))})
    out["rollout/policy_lag"] = m["policy_lag_mean"]
    out["rollout/policy_lag_max"] = m["policy_lag_max"]
    out["sync/broadcast_seconds"] = m["broadcast_seconds"]
    out["sync/policy_version"] = runtime.policy_version
    return out


def snapshot_scalars(snap: Mapping[str, Any]) -> dict[str, float]:
    stats, out = snap["stats"], {}
    out["rollout/env_steps_per_sec"] = stats["env_steps_per_sec"]
    out["rollout/total_env_steps"] = stats["total_env_steps"]
    for key in ("episode_return", "episode_length", "success_rate"):
        if key in stats:
            out[f"rollout/{key}"] = stats[key]
    for task, row in stats["tasks"].items():
        out[f"rollout_task/{task}/success_rate"] = row["success_rate"]
        out[f"rollout_task/{task}/episode_return"] = row["episode_return"]
    out.update({f"replay/{k}": v for k, v in snap["replay"].items()})
    for key in ("worker_restarts", "inference_restarts", "dropped_episodes"):
        out[f"health/{key}"] = stats.get("health", {}).get(key, 0)
    out.update({f"env/{k}": v for k, v in stats.get("env_counters", {}).items()})
    out.update({f"inference/{k}": v for k, v in snap["inference"].items()})
    return out


def worker_share(cfg: RunConfig, items: int) -> int:
    """Env steps each rollout worker takes in synchronous mode so that together they push at least
    ``items`` replay items (steps with GAE; with V-trace, whole segments of ``rollout_local_buf``
    steps in each of a worker's lock-stepped envs)."""
    per_worker = -(-max(items, 1) // cfg.num_rollout_workers)
    rounds = -(-per_worker // cfg.envs_per_worker)  # lock-step: every env steps each round
    if cfg.advantage == "vtrace":
        return rounds * cfg.rollout_local_buf * cfg.envs_per_worker
    # GAE: a pause holds back each env's last step (it bootstraps the cut), hence one more round.
    return (rounds + 1) * cfg.envs_per_worker


def eval_scalars(result: Mapping[str, Any]) -> dict[str, float]:
    tasks = result["tasks"]
    out = {f"eval_task/{t}/success_rate": r["success_rate"] for t, r in tasks.items()}
    out["eval/success_rate"] = sum(r["success_rate"] for r in tasks.values()) / len(tasks)
    out["eval/return"] = sum(r["return"] for r in tasks.values()) / len(tasks)
    return out


def prepare(cfg: RunConfig) -> Any:
    """Every check that needs no Ray: builds the task set, checks local resources and the
    policy's kwargs / model path (which may resolve ``cfg.policy_kwargs``, e.g. a default model)."""
    task_set = envs.make_task_set(cfg.env, **cfg.env_kwargs)
    if not cfg.ray_address:
        check_resources(cfg, float(os.cpu_count() or 1))
    cfg.policy_kwargs = prepare_policy(cfg.policy, obs_spec_of(task_set), task_set.action_dim, cfg.model_path,
                                       cfg.policy_kwargs)
    return task_set


def main(default_config: str, description: str = "", argv: Optional[list[str]] = None,
         inspect: Optional[Callable[[Runtime], Any]] = None) -> dict[str, Any]:
    """Entry point of the launch scripts: bad input is one line on stderr and exit code 2.
    ``inspect`` as in ``run`` (e.g. a held-out evaluation with the final weights)."""
    try:
        cfg = load_config(argv, default_config, description)
        task_set = prepare(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        return run(cfg, task_set, inspect)
    except (ActorFailedError, ActorTimeoutError):
        raise SystemExit(1) from None  # run() has printed what failed and the last complete checkpoint


def run(cfg: RunConfig, task_set: Any = None, inspect: Optional[Callable[[Runtime], Any]] = None) -> dict[str, Any]:
    """Run training until ``max_epochs`` or ``max_minutes``; returns a summary of the run.

    ``inspect(runtime)``, if given, runs after training and before shut-down (tests use it to
    look at the live actors); its result is ``summary["inspect"]``.
    """
    started = time.monotonic()
    task_set = task_set if task_set is not None else prepare(cfg)
    init_ray(cfg)
    if cfg.ray_address:
        check_resources(cfg, float(ray.cluster_resources().get("CPU", 0)))
    logger = MetricsLogger(cfg.log_dir, cfg.swanlab_mode, cfg.model_dump())
    Path(cfg.log_dir, "ray_session.txt").write_text(ray.get_runtime_context().get_node_id() + "\n" + _session_dir() + "\n")
    runtime = Runtime(cfg, task_set)
    deadline = started + 60 * cfg.max_minutes if cfg.max_minutes else float("inf")
    summary: dict[str, Any] = {}
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[line]}"),
                        TimeElapsedColumn(), console=console, transient=False)
    console.print(_where_logs(cfg))
    try:
        runtime.start()
        console.print(f"collecting a first super-batch of {cfg.super_batch_size} ...")
        if not runtime.wait_for_warmup(deadline):
            console.print("time limit reached during warm-up")
        last_log = 0.0
        with progress:
            bar = progress.add_task("epochs", total=cfg.max_epochs, completed=runtime.epoch, line="")
            while (cfg.max_epochs is None or runtime.epoch < cfg.max_epochs) and time.monotonic() < deadline:
                if cfg.sync and not runtime.collect_synchronously(deadline):
                    break
                metrics = runtime.train_epoch()
                runtime._check_workers()
                scalars = training_scalars(metrics, runtime)
                result = runtime.poll_eval()
                if result is not None:
                    scalars.update(eval_scalars(result))
                if time.monotonic() - last_log >= cfg.log_interval_seconds:
                    scalars.update(snapshot_scalars(runtime.snapshot()))
                    last_log = time.monotonic()
                logger.log(scalars, runtime.epoch)
                logger.histogram("rollout/policy_lag", runtime.lag_values, runtime.epoch)
                summary.update(scalars)
                progress.update(bar, advance=1, line=_status_line(summary))
                if cfg.checkpoint_interval_epochs and runtime.epoch % cfg.checkpoint_interval_epochs == 0:
                    runtime.save_checkpoint()
        if runtime.checkpoint_epoch != runtime.epoch:
            runtime.save_checkpoint()
        # The evaluation in flight may finish at most FINAL_EVAL_GRACE_S past --max-minutes.
        result = runtime.poll_eval(force=True, wait_s=min(cfg.actor_timeout_s,
                                                          max(deadline - time.monotonic(), 0.0) + FINAL_EVAL_GRACE_S))
        final = snapshot_scalars(runtime.snapshot())
        if result is not None:
            final.update(eval_scalars(result))
        logger.log(final, runtime.epoch)
        summary.update(final)
        summary["epochs"] = runtime.epoch
        summary["broadcast_seconds_mean"] = sum(runtime.broadcast_seconds) / max(len(runtime.broadcast_seconds), 1)
        summary["wall_seconds"] = time.monotonic() - started
        summary["checkpoint"] = str(runtime.last_checkpoint) if runtime.last_checkpoint else None
        console.print(f"done: {_status_line(summary)}; {summary['wall_seconds']:.0f} s")
        console.print(_where_logs(cfg))
        if inspect is not None:
            summary["inspect"] = inspect(runtime)
        return summary
    except (ActorFailedError, ActorTimeoutError) as exc:
        last = ckpt.latest_checkpoint(cfg.log_dir)
        console.print(f"run stopped: {exc}; last complete checkpoint: {last or 'none'}", style="red", markup=False,
                      soft_wrap=True)
        raise
    finally:
        ckpt.discard_staging(ckpt.checkpoint_root(cfg.log_dir))
        logger.close()
        runtime.shutdown()
        ray.shutdown()


def _session_dir() -> str:
    try:
        return ray._private.worker._global_node.get_session_dir_path()  # noqa: SLF001 (for the no-leftover check)
    except AttributeError:
        return ""


def _where_logs(cfg: RunConfig) -> str:
    swanlab = "" if cfg.swanlab_mode == "disabled" else f"; SwanLab ({cfg.swanlab_mode}) under {Path(cfg.log_dir, 'swanlab')}"
    return f"logs: {cfg.log_dir} (TensorBoard: tensorboard --logdir {cfg.log_dir}){swanlab}"


def _status_line(s: Mapping[str, Any]) -> str:
    parts = [f"v{int(s.get('sync/policy_version', 0))}"]
    for key, fmt in (("rollout/env_steps_per_sec", "{:.0f} steps/s"), ("rollout/success_rate", "success {:.2f}"),
                     ("eval/success_rate", "eval {:.2f}"), ("rollout/episode_return", "return {:.1f}"),
                     ("train/policy_loss", "pl {:.3f}"), ("rollout/policy_lag", "lag {:.1f}")):
        if key in s:
            parts.append(fmt.format(s[key]))
    return "  ".join(parts)
