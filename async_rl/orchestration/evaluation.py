"""EvaluationPoller: periodic evaluations spread over every evaluator, none of which may end the run.

An evaluation starts every ``eval_interval_epochs`` on an evaluator that is free (round robin), so
a slow evaluation does not block the next one while another evaluator idles. An evaluator that
dies or raises is replaced by a new actor (``health/evaluator_restarts``) and its evaluation is
dropped; results come back in the order they finish."""
from __future__ import annotations

import time
from typing import Any, Optional

import ray
from rich.console import Console

import envs
from async_rl.actors.evaluation import EvaluationWorkerActor
from async_rl.errors import ActorFailedError, ActorTimeoutError
from async_rl.orchestration.actor_group import ActorGroup, failure_reason

console = Console(stderr=True)
HEAL_POLL_S = 1.0  # between two asks whether a restarted inference actor is back


class EvaluationPoller:
    def __init__(self, evaluators: ActorGroup, interval_epochs: int, episodes: int, deterministic: bool,
                 video_interval_evals: int = 0, video_episodes: int = 0) -> None:
        self.evaluators = evaluators
        # Episode media: the 1st, (N+1)th, ... evaluation records video_episodes episodes (0: never).
        self.video_interval, self.video_episodes, self._started = video_interval_evals, video_episodes, 0
        self.interval, self.episodes, self.deterministic = interval_epochs, episodes, deterministic
        self.in_flight: dict[str, ray.ObjectRef] = {}
        self._next = 0  # round-robin position
        self._last_started_epoch: Optional[int] = None

    def poll(self, epoch: int) -> list[dict]:
        """Finished evaluations' results; starts one if ``epoch`` is due and an evaluator is free."""
        results = self._collect(timeout_s=0)
        if epoch % self.interval == 0 and epoch != self._last_started_epoch:
            name = self._free_evaluator()
            if name is not None:
                record = self.video_episodes if self.video_interval and self._started % self.video_interval == 0 else 0
                self._started += 1
                self.in_flight[name] = self.evaluators[name].evaluate.remote(self.episodes, self.deterministic, record)
                self._last_started_epoch = epoch
        return results

    def finish(self, wait_s: float) -> list[dict]:
        """Wait up to ``wait_s`` for the evaluations in flight; the late ones are abandoned (said so)."""
        results = self._collect(timeout_s=wait_s)
        for name in self.in_flight:
            console.print(f"{name} did not finish its evaluation within {wait_s:.0f} s; the run goes on without its figures",
                          style="yellow", markup=False)
        self.in_flight.clear()
        return results

    def _free_evaluator(self) -> Optional[str]:
        names = self.evaluators.names()
        if not names:
            return None
        for offset in range(len(names)):
            name = names[(self._next + offset) % len(names)]
            if name not in self.in_flight:
                self._next = (self._next + offset + 1) % len(names)
                return name
        return None

    def _replace(self, name: str, reason: str) -> None:
        """A new evaluator for a failed one; past actor_max_restarts the run goes on without it."""
        try:
            self.evaluators.restart(name, reason)
        except (ActorFailedError, ActorTimeoutError) as exc:
            self.evaluators.remove(name)
            console.print(f"{exc}; evaluating with the {len(self.evaluators)} other evaluator(s)", style="yellow",
                          markup=False, soft_wrap=True)

    def _collect(self, timeout_s: float) -> list[dict]:
        if not self.in_flight:
            return []
        refs = list(self.in_flight.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        results = []
        for name, ref in list(self.in_flight.items()):
            if ref not in ready:
                continue
            del self.in_flight[name]
            try:
                results.append(ray.get(ref, timeout=0))
            except ray.exceptions.RayError:
                self._replace(name, failure_reason(ref))
        return results


def evaluate_before_training(runtime: Any) -> tuple[list[dict], Optional[dict]]:
    """The initial weights' figures (``eval_before_training``): one periodic evaluation when evaluators run, and
    the env's final evaluation when it registers one (held-out problems, programs, cases), each waited for, the
    workers paused during the latter and collecting again after it. The report's "before" beside its "after".
    Both are waited for as start-up is (``startup_timeout_s``): an evaluation of many long episodes outlasts
    ``actor_timeout_s``, and one abandoned would still run beside the next."""
    cfg, poller = runtime.cfg, runtime.eval_poller
    periodic: list[dict] = []
    if len(runtime.evaluators):
        poller.poll(runtime.epoch)  # epoch 0 is due on every interval
        periodic = poller.finish(cfg.startup_timeout_s)
    return periodic, final_evaluation(runtime, before_training=True)


def final_evaluation(runtime: Any, before_training: bool = False) -> Optional[dict]:
    """The env's registered final evaluation (e.g. CompilerGym's held-out programs) on an evaluator
    with the latest weights, rollouts paused to free the cores (collecting again after it when ``before_training``);
    None if the env registers none."""
    cfg = runtime.cfg
    if envs.final_evaluation_for(cfg.env, runtime.task_set) is None:
        return None
    runtime.workers.call("pause", what="pause")
    try:
        return _held_out_report(runtime, _final_evaluator(runtime), before_training)
    finally:
        if before_training:
            runtime.workers.call("resume", what="resume")


def _final_evaluator(runtime: Any) -> Any:
    """The first periodic evaluator, or (with none) one kept for the final evaluations alone, on the CPUs the
    paused workers leave idle: outside the evaluator group, so that no periodic evaluation runs on it."""
    evaluators = runtime.evaluators
    if len(evaluators):
        return evaluators[evaluators.names()[0]]
    if runtime.final_evaluator is None:
        runtime.final_evaluator = EvaluationWorkerActor.options(num_cpus=0).remote(  # type: ignore[attr-defined]  # an ActorClass: mypy ignores decorators
            0, runtime.task_set, runtime.preprocessor_factory, *runtime.inference_for(0), runtime.cfg)
    return runtime.final_evaluator


def _held_out_report(runtime: Any, evaluator: Any, before_training: bool) -> Optional[dict]:
    """The evaluator's report; a restarted inference actor is healed and asked once more; any other failure is
    one yellow line saying what the run does without it, and None."""
    cfg = runtime.cfg
    for attempt in (1, 2):
        try:
            return ray.get(evaluator.final_evaluation.remote(cfg.env, cfg.seed), timeout=cfg.startup_timeout_s)
        except (ray.exceptions.RayError, ActorTimeoutError) as exc:
            cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
            first = (str(cause).splitlines() or [""])[0]
            if attempt == 1 and isinstance(cause, (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError)):
                # Ray restarted an inference actor mid-evaluation (e.g. the memory monitor killed it):
                # it answers again once it holds the latest weights.
                console.print(f"final evaluation: an actor it used was restarted ({type(cause).__name__}); "
                              "sending the weights again and evaluating once more", style="yellow", markup=False)
                _heal_inference(runtime, cfg.actor_timeout_s)
                continue
            why = f"({type(cause).__name__}: {first})"
            line = (f"the env's evaluation before training failed, training starts without its figures {why}"
                    if before_training else
                    f"final evaluation failed, the run ends without it {why}; the last checkpoint holds the final weights")
            console.print(line, style="yellow", markup=False, soft_wrap=True)
            return None
    return None


def _heal_inference(runtime: Any, timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) until a restarted inference actor is back and has the weights."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not runtime.weight_sync.heal():
        time.sleep(HEAL_POLL_S)
