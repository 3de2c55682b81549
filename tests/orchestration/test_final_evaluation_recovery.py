"""The env's final evaluation at the end of a run: an inference actor that Ray restarted under it
(seen as ActorUnavailableError inside the evaluator's request) gets the weights again and the
evaluation runs once more; any other failure ends the run without it, in one line, not a traceback.
Before training (eval_before_training) the same evaluation and a periodic one run on the initial weights,
and the workers collect again after it, whatever its outcome."""
import types

import ray

from async_rl.orchestration import evaluation
from async_rl.orchestration.evaluation import EvaluationPoller


@ray.remote(num_cpus=0)
class ScriptedEvaluator:
    """Raises the given errors on its first calls, then returns a report."""

    def __init__(self, failures: list[str]) -> None:
        self.failures, self.calls = list(failures), 0

    def final_evaluation(self, env: str, seed: int) -> dict:
        self.calls += 1
        if self.failures:
            kind = self.failures.pop(0)
            if kind == "inference restarted":
                raise ray.exceptions.ActorUnavailableError("The actor was restarted.", None)
            raise ValueError(kind)
        return {"scalars": {"eval/heldout_reward": 0.5}, "text": "done"}

    def evaluate(self, episodes: int, deterministic: bool, record: int) -> dict:
        return {"tasks": {"reach": {"success_rate": 1.0, "return": 2.0}}, "policy_versions": [0], "record": record}

    def count(self) -> int:
        return self.calls


class Evaluators(dict):
    def names(self) -> list[str]:
        return list(self)


def runtime_with(evaluator) -> types.SimpleNamespace:
    heals = []

    def heal() -> bool:
        heals.append(1)
        return len(heals) >= 2  # the restarted actor answers on the second probe

    cfg = types.SimpleNamespace(env="arithmetic", seed=0, startup_timeout_s=60.0, actor_timeout_s=30.0)
    worker_calls = []
    evaluators = Evaluators({"eval-0": evaluator})
    return types.SimpleNamespace(cfg=cfg, evaluators=evaluators, heals=heals, worker_calls=worker_calls, epoch=0,
                                 eval_poller=EvaluationPoller(evaluators, 5, 1, True, video_interval_evals=1,
                                                              video_episodes=1),
                                 workers=types.SimpleNamespace(call=lambda method, *a, **k: worker_calls.append(method)),
                                 weight_sync=types.SimpleNamespace(heal=heal),
                                 task_set=types.SimpleNamespace(final_evaluation_on=True))


def test_a_restarted_inference_actor_is_healed_and_the_evaluation_runs_again(ray_local, monkeypatch):
    monkeypatch.setattr(evaluation, "HEAL_POLL_S", 0.01)
    evaluator = ScriptedEvaluator.remote(["inference restarted"])
    runtime = runtime_with(evaluator)
    report = evaluation.final_evaluation(runtime)
    assert report is not None and report["scalars"]["eval/heldout_reward"] == 0.5
    assert len(runtime.heals) == 2 and ray.get(evaluator.count.remote()) == 2


def test_another_failure_ends_the_run_without_the_evaluation_in_one_line(ray_local, capsys):
    evaluator = ScriptedEvaluator.remote(["the env raised"])
    runtime = runtime_with(evaluator)
    assert evaluation.final_evaluation(runtime) is None
    assert runtime.heals == [] and ray.get(evaluator.count.remote()) == 1
    err = capsys.readouterr().err
    assert "final evaluation failed" in err and "ValueError: the env raised" in err and "Traceback" not in err


def test_a_second_restart_is_not_retried_forever(ray_local, monkeypatch):
    monkeypatch.setattr(evaluation, "HEAL_POLL_S", 0.01)
    evaluator = ScriptedEvaluator.remote(["inference restarted", "inference restarted"])
    assert evaluation.final_evaluation(runtime_with(evaluator)) is None
    assert ray.get(evaluator.count.remote()) == 2


def test_before_training_one_periodic_and_the_final_evaluation_run_and_the_workers_collect_again(ray_local):
    evaluator = ScriptedEvaluator.remote([])
    runtime = runtime_with(evaluator)
    periodic, report = evaluation.evaluate_before_training(runtime)
    assert [r["policy_versions"] for r in periodic] == [[0]] and periodic[0]["record"] == 1  # the first evaluation films
    assert report["scalars"] == {"eval/heldout_reward": 0.5}
    assert runtime.worker_calls == ["pause", "resume"]
    assert runtime.eval_poller.poll(5) == [] and list(runtime.eval_poller.in_flight) == ["eval-0"]  # the schedule goes on


def test_a_failed_evaluation_before_training_is_one_line_and_training_starts(ray_local, capsys):
    evaluator = ScriptedEvaluator.remote(["the env raised"])
    runtime = runtime_with(evaluator)
    assert evaluation.final_evaluation(runtime, before_training=True) is None
    assert runtime.worker_calls == ["pause", "resume"]
    err = capsys.readouterr().err
    assert "evaluation before training failed, training starts without its figures (ValueError: the env raised)" in err
    assert "checkpoint" not in err and "Traceback" not in err


def test_a_task_set_whose_options_ask_for_none_gets_no_evaluation_and_no_pause(ray_local):
    """LIBERO registers a final evaluation that only runs with held-out initial states named: without them the
    workers are not paused for nothing and the evaluator is not asked."""
    evaluator = ScriptedEvaluator.remote([])
    runtime = runtime_with(evaluator)
    runtime.task_set = types.SimpleNamespace(final_evaluation_on=False)
    assert evaluation.final_evaluation(runtime, before_training=True) is None
    assert runtime.worker_calls == [] and ray.get(evaluator.count.remote(), timeout=30) == 0
