"""The driver: checks the config, starts Ray and the runtime, and runs the loop
(schedule -> train epoch -> broadcast -> evaluate -> log -> checkpoint) until a limit.

Every launch script is a config plus ``main(config, doc)``.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import ray
from ray._private import ray_constants
from rich.console import Console

import envs
from async_rl import checkpoint as ckpt
from async_rl.actors.step_health import SkipNotes, SkippedUpdatesError, check_skipped_updates
from async_rl.algo import check_group_capacity
from async_rl.cluster_probe import probe_cluster
from async_rl.config import load_config
from async_rl.config.schema import RunConfig
from async_rl.errors import ActorFailedError, ActorTimeoutError, ConfigError
from async_rl.orchestration.evaluation import evaluate_before_training, final_evaluation
from async_rl.orchestration.metrics import MetricsReporter, snapshot_scalars, training_scalars
from async_rl.orchestration.placement import LOCALHOST, lost_node_note
from async_rl.orchestration.progress import ProgressDisplay
from async_rl.orchestration.runtime import Runtime, obs_spec_of
from async_rl.orchestration.schedules import schedule_for
from async_rl.orchestration.stop_signals import StopSignals
from async_rl.policies import prepare_policy
from async_rl.policies.initial_weights import check_init_from
from async_rl.process_setup import check_resources, pythonpath_with
from async_rl.report import report_at_end
from async_rl.sandbox import set_sandbox_mode
from envs.base import TaskSet, TokenizedTaskSet

console = Console(stderr=True)
FINAL_EVAL_GRACE_S = 30.0


def prepare(cfg: RunConfig) -> TaskSet:
    """Every check that needs no Ray: builds the task set, checks local resources and the
    policy's kwargs / model path (which may resolve ``cfg.policy_kwargs``, e.g. a default model)."""
    unfit = probe_cluster(cfg.ray_address)  # unreachable, token refused, other Ray/Python: one line, not ray.init's retries
    if unfit:
        raise ConfigError(unfit)
    set_sandbox_mode(cfg.sandbox_mode)  # before a task set or reward dry run starts the sandbox here
    # --eval-search(-budget), when set, are options of the env's final evaluation (the env checks them).
    search = {"eval_search": cfg.eval_search, "eval_search_budget": cfg.eval_search_budget}
    task_set = envs.make_task_set(cfg.env, **{**cfg.env_kwargs, **{k: v for k, v in search.items() if v not in ("none", 0)}})
    check_group_capacity(cfg.group_size, cfg.replay_capacity, task_set.max_episode_steps)
    if not cfg.ray_address:
        check_resources(cfg, float(os.cpu_count() or 1))
    cfg.policy_kwargs = prepare_policy(cfg.policy, obs_spec_of(task_set), task_set.action_dim, cfg.model_path,
                                       cfg.policy_kwargs)
    if cfg.init_from is not None:
        cfg.init_from = check_init_from(cfg.init_from, cfg.policy, cfg.env, cfg.policy_kwargs.get("model_path"))
    if isinstance(task_set, TokenizedTaskSet) and task_set.tokenizer_path is None:
        task_set.tokenizer_path = cfg.policy_kwargs.get("model_path")
    return task_set


def main(default_config: str, description: str = "", argv: Optional[list[str]] = None,
         amend: Optional[Callable[[RunConfig], None]] = None) -> dict[str, Any]:
    """Entry point of the launch scripts: bad input is one line on stderr and exit code 2. ``amend(cfg)``,
    if given, changes the loaded config before it is checked (a launch's own shorthand flags)."""
    try:
        cfg = load_config(argv, default_config, description)
        if amend is not None:
            amend(cfg)
        task_set = prepare(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        summary = run(cfg, task_set)
    except ConfigError as exc:  # found once Ray is up: a cluster's resources (placement.check_cluster)
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ActorFailedError, ActorTimeoutError, SkippedUpdatesError):
        raise SystemExit(1) from None  # run() has printed what failed and the last complete checkpoint
    except KeyboardInterrupt:  # a second Ctrl-C: run() shut everything down on its way out
        print("aborted (second Ctrl-C): no checkpoint of the epoch in progress", file=sys.stderr)
        raise SystemExit(130) from None
    if summary.get("stopped_by"):  # the shell's convention: 128 + the signal's number
        raise SystemExit(128 + signal.Signals[summary["stopped_by"]])
    return summary


def run(cfg: RunConfig, task_set: Optional[TaskSet] = None,
        inspect: Optional[Callable[[Runtime], Any]] = None) -> dict[str, Any]:
    """Train until ``max_epochs`` or ``max_minutes``; returns a summary of the run.

    ``inspect(runtime)``, if given, runs after training and before shut-down (tests use it to
    look at the live actors); its result is ``summary["inspect"]``.
    """
    started = time.monotonic()
    task_set = task_set if task_set is not None else prepare(cfg)
    init_ray(cfg)
    if cfg.ray_address:
        check_resources(cfg, float(ray.cluster_resources().get("CPU", 0)))
    reporter = MetricsReporter(cfg)
    reporter.log({"sandbox/weak_mode_allowed": float(cfg.sandbox_mode == "weak")}, 0)
    Path(cfg.log_dir, "ray_session.txt").write_text(ray.get_runtime_context().get_node_id() + "\n" + _session_dir() + "\n")
    runtime = Runtime(cfg, task_set)
    deadline = started + 60 * cfg.max_minutes if cfg.max_minutes else float("inf")
    console.print(_where_logs(cfg))
    stop = StopSignals(lambda line: console.print(line, style="yellow", markup=False, soft_wrap=True))
    try:
        with stop:  # after the logger started: SwanLab's own SIGINT handler would swallow the interrupt
            runtime.start()
            info = runtime.info
            console.print(f"[bold]policy[/] {cfg.policy}: {info['params']:,} parameters, {info['trainable']:,} trainable; "
                          f"{cfg.num_trainers} trainer rank(s) under ZeRO-2")
            deadline += _evaluate_before_training(runtime, reporter, stop)
            _train(runtime, reporter, deadline, stop)
            summary = _finish(runtime, reporter, deadline, stop)
        summary["wall_seconds"] = time.monotonic() - started
        if stop.requested:
            summary["stopped_by"] = stop.name
            console.print(f"stopped by {stop.name} at epoch {runtime.epoch}; continue with --resume {cfg.log_dir}",
                          markup=False, soft_wrap=True)
        console.print(f"done: {reporter.status()}; {summary['wall_seconds']:.0f} s")
        console.print(_where_logs(cfg))
        if cfg.policy == "causal_lm":  # the trained model outside the project (async_rl/policies/lm_export.py)
            console.print(f"export: .venv/bin/python launch/export_lm.py --checkpoint {cfg.log_dir} --out DIR "
                          "(a Hugging Face folder, LoRA merged; the peft adapter alone: checkpoints/*/adapter)",
                          markup=False, soft_wrap=True)
        if inspect is not None:
            summary["inspect"] = inspect(runtime)
        return summary
    except (ActorFailedError, ActorTimeoutError, SkippedUpdatesError) as exc:
        lost = "" if isinstance(exc, SkippedUpdatesError) else lost_node_note(cfg, getattr(runtime, "placement", None), exc)
        console.print(f"run stopped: {exc}{lost}; last complete checkpoint: {ckpt.latest_checkpoint(cfg.log_dir) or 'none'}",
                      style="red", markup=False, soft_wrap=True)
        raise
    finally:
        ckpt.discard_staging(ckpt.checkpoint_root(cfg.log_dir))
        reporter.close()
        runtime.shutdown()
        ray.shutdown()
        report_at_end(cfg.log_dir, console)  # plots + report.md; a failure is one yellow line


def _train(runtime: Runtime, reporter: MetricsReporter, deadline: float, stop: StopSignals) -> None:
    """The loop: one epoch per turn until a limit or a stop signal; metrics, evaluations and checkpoints on
    their intervals."""
    cfg, schedule = runtime.cfg, schedule_for(runtime.cfg)
    console.print(f"collecting a first super-batch of {cfg.super_batch_size} ...")
    if not wait_for_warmup(runtime, deadline, stop):
        console.print("stop signal during warm-up" if stop.requested else "time limit reached during warm-up")
    last_log, notes = 0.0, SkipNotes()
    with ProgressDisplay(console, cfg.max_epochs, runtime.epoch, deadline, cfg.log_interval_seconds) as progress:
        while ((cfg.max_epochs is None or runtime.epoch < cfg.max_epochs) and time.monotonic() < deadline
               and not stop.requested):
            if not schedule.before_epoch(runtime, deadline):
                break
            metrics = runtime.train_epoch()
            scalars = training_scalars(metrics, runtime.policy_version)
            runtime.check_workers()
            for result in runtime.eval_poller.poll(runtime.epoch):
                scalars.update(reporter.evaluation(result, runtime.epoch))  # scalars; videos logged
            if time.monotonic() - last_log >= cfg.log_interval_seconds:
                scalars.update(snapshot_scalars(runtime.snapshot()))
                last_log = time.monotonic()
            reporter.log(scalars, runtime.epoch)
            reporter.histogram("rollout/policy_lag", runtime.lag_values, runtime.epoch)
            progress.update(runtime.epoch, reporter.status())
            note = notes.line(metrics, runtime.epoch)
            if note:
                console.print(note, style="yellow", markup=False, soft_wrap=True)
            check_skipped_updates(metrics, cfg.max_skipped_updates_in_a_row)  # logged first: TensorBoard shows it
            if cfg.checkpoint_interval_epochs and runtime.epoch % cfg.checkpoint_interval_epochs == 0:
                runtime.save_checkpoint()


def _finish(runtime: Runtime, reporter: MetricsReporter, deadline: float, stop: StopSignals) -> dict[str, Any]:
    """Last checkpoint, the evaluations in flight (bounded past --max-minutes), the env's final
    evaluation and the last snapshot; returns the summary. After a stop signal, only the evaluations
    already done and no final evaluation: whoever stops a run wants it to end now."""
    cfg = runtime.cfg
    if runtime.checkpointer.epoch != runtime.epoch:
        runtime.save_checkpoint()
    final = snapshot_scalars(runtime.snapshot())
    wait_s = 0.0 if stop.requested else min(cfg.actor_timeout_s, max(deadline - time.monotonic(), 0.0) + FINAL_EVAL_GRACE_S)
    for result in runtime.eval_poller.finish(wait_s):
        final.update(reporter.evaluation(result, runtime.epoch))
    report = None if stop.requested else final_evaluation(runtime)
    if report is not None:
        final.update(report["scalars"])
        _show_env_evaluation(runtime, reporter, report, before_training=False)
    reporter.log(final, runtime.epoch)
    summary: dict[str, Any] = dict(reporter.latest)
    summary["epochs"] = runtime.epoch
    summary["broadcast_seconds_mean"] = sum(runtime.weight_sync.seconds) / max(len(runtime.weight_sync.seconds), 1)
    summary["checkpoint"] = str(runtime.checkpointer.last) if runtime.checkpointer.last else None
    if report is not None:
        summary["final_evaluation"] = {k: v for k, v in report.items() if k != "files"}
    return summary


def _evaluate_before_training(runtime: Runtime, reporter: MetricsReporter, stop: StopSignals) -> float:
    """``eval_before_training`` on a fresh run: the initial weights' evaluations, logged at epoch 0 (the report's
    "before"); returns the seconds they took, which the deadline adds (--max-minutes is training time)."""
    cfg = runtime.cfg
    if (not cfg.eval_before_training or runtime.epoch != 0 or stop.requested
            or not (len(runtime.evaluators) or envs.final_evaluation_for(cfg.env, runtime.task_set) is not None)):
        return 0.0
    began = time.monotonic()
    console.print("evaluating the initial weights (eval_before_training) ...")
    periodic, report = evaluate_before_training(runtime)
    scalars: dict[str, float] = {}
    for result in periodic:
        scalars.update(reporter.evaluation(result, 0))
    if report is not None:
        scalars.update(report["scalars"])
        _show_env_evaluation(runtime, reporter, report, before_training=True)
    reporter.log_before_training(scalars)
    return time.monotonic() - began


def _show_env_evaluation(runtime: Runtime, reporter: MetricsReporter, report: dict, before_training: bool) -> None:
    """An env's final-evaluation report: its text on the console and as TensorBoard's ``eval/final`` (or
    ``eval/before_training``), its files under the log dir (before training, named ``before_training_<file>``)."""
    prefix = "before_training_" if before_training else ""
    console.print(("before training:\n" if before_training else "") + report["text"], markup=False, soft_wrap=True)
    reporter.text("eval/before_training" if before_training else "eval/final", f"```\n{report['text']}\n```",
                  runtime.epoch)
    for file, content in report.get("files", {}).items():
        Path(runtime.cfg.log_dir, prefix + file).write_text(json.dumps(content, indent=1))


def wait_for_warmup(runtime: Runtime, deadline: float, stop: StopSignals) -> bool:
    """Block until the replay buffer holds a super-batch; False if the deadline or a stop signal came first.
    Raises if ``startup_timeout_s`` passes first (the workers deliver nothing usable)."""
    cfg = runtime.cfg
    give_up = time.monotonic() + cfg.startup_timeout_s
    while time.monotonic() < deadline and not stop.requested:
        size = runtime.replay_supervisor.call("size")
        if size >= cfg.super_batch_size:
            return True
        if time.monotonic() > give_up:
            stats = ray.get(runtime.stats.snapshot.remote(), timeout=cfg.actor_timeout_s)
            raise ActorTimeoutError(
                f"the rollout workers did not fill a super-batch ({size}/{cfg.super_batch_size} items) within "
                f"startup_timeout_s={cfg.startup_timeout_s:g} s ({stats['total_env_steps']} env steps, "
                f"{stats['health'].get('dropped_episodes', 0)} episodes dropped for non-finite numbers)")
        runtime.check_workers()
        time.sleep(0.5)
    return False


def init_ray(cfg: RunConfig) -> None:
    """Join ``--ray-address`` or start a local cluster bound to 127.0.0.1."""
    env_vars = {"PYTHONPATH": pythonpath_with(Path(__file__).resolve().parents[1]),
                "ASYNC_RL_SANDBOX_MODE": cfg.sandbox_mode}  # every worker's sandbox: strict unless allowed weak
    if not sys.stdout.isatty():  # actor-prefix colour codes are noise in a redirected log
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, runtime_env={"env_vars": env_vars}, log_to_driver=True)
        return
    # Ray resolves 127.0.0.1 to the machine's address unless told this node is not part of a
    # cluster; then every Ray server (GCS, raylet, workers, agents) listens on loopback only.
    # Set only while Ray starts its processes (they read it then): a `ray start` this process runs
    # later, e.g. to join or make a real cluster, must not inherit it.
    old, old_constant = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported it already
    # Every server of this cluster listens on loopback only, so Ray's advice about token
    # authentication (a WARNING at every start) does not apply to it.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    try:
        # address="local": a new cluster even when another one (`ray start`) runs on this machine.
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address=LOCALHOST,
                 runtime_env={"env_vars": env_vars}, log_to_driver=True, logging_level=logging.WARNING)
    finally:
        if old is None:
            del os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = old
        ray_constants.ENABLE_RAY_CLUSTER = old_constant


def _session_dir() -> str:
    try:
        return ray._private.worker._global_node.get_session_dir_path()  # type: ignore[attr-defined]  # Ray's private node: set once ray.init ran; for the no-leftover check
    except AttributeError:
        return ""


def _where_logs(cfg: RunConfig) -> str:
    swanlab = "" if cfg.swanlab_mode == "disabled" else f"; SwanLab ({cfg.swanlab_mode}) under {Path(cfg.log_dir, 'swanlab')}"
    return f"logs: {cfg.log_dir} (TensorBoard: tensorboard --logdir {cfg.log_dir}){swanlab}"
