"""CTRL on HumanEval: the policy is a critic; its reward is whether the frozen reviser, given its critique,
turns the initial solution into code that passes the tests.

An episode is one case (``async_rl/ctrl/cases.py``: a problem with a canonical, mutated or sampled
solution); the observation is the critic's prompt (``async_rl/ctrl/critique.py``), the action the critique.
Scoring a step: the rollout worker calls ``prepare_step`` on all its envs first; each queues its revision
prompt in the process's ``RevisionQueue`` (a critique without a judgment line is not revised: its reward is
``missing_judgment_reward``). The first ``step`` sends the whole queue to the ReviserActor in ONE call, and
every revision's code goes to the sandbox pool at once, through the result cache (``async_rl/ctrl/reward.py``).
Group rollouts (GRPO) give the members of a group the same case: n critiques per (problem, solution).

Counters (``env/``): how scoring ended (``ctrl_<reason>``, ``ctrl_no_judgment``), revisions whose sandbox
channels were over a cap or malformed (``ctrl_channel_violations``), judgments right and
wrong against the case's label, cache lookups and hits (hit rate = hits / lookups), milliseconds waited on
the reviser. The final evaluation critiques a balanced set of held-out cases greedily.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union

import numpy as np
import pydantic

from async_rl.ctrl.cases import balanced, build_cases
from async_rl.ctrl.critique import critic_prompt, parse_judgment, revision_prompt
from async_rl.ctrl.evaluate import evaluate
from async_rl.ctrl.reward import REWARD_MODES, ResultCache, critique_reward, score_revision
from async_rl.errors import ConfigError
from async_rl.rewards.code_tests import shared_pool
from async_rl.sandbox import CHANNEL_VIOLATIONS, REASONS, SandboxResult
from envs import register_env
from envs._text import EVAL_BATCH, PreparedStepEnv, TextEnvOptions, TextTaskSetBase, action_key, response_text
from envs.humaneval import TRAIN_TASK_IDS

TextFn = Callable[[list[str]], list[str]]


class RevisionQueue:
    """The revision prompts of a process's envs, sent to the reviser in one batch when the first result
    is asked for; each revision is then scored by its env's ``score`` callback (which starts its sandbox
    run), so all of a worker's sandbox runs start together."""

    def __init__(self, revise: TextFn, spans: bool = False) -> None:
        """``spans``: ``revise`` also takes the wall-clock span in which the batch's critiques were generated
        (the ReviserActor keeps it: the overlap of revising and generating is read from both)."""
        self.revise, self.spans = revise, spans
        self._waiting: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.waited_ms = 0

    def add(self, prompt: str, score: Callable[[str], "Future[SandboxResult]"],
            generated: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
        ticket = {"prompt": prompt, "score": score, "result": None, "generated": generated}
        with self._lock:
            self._waiting.append(ticket)
        return ticket

    def result(self, ticket: dict[str, Any]) -> SandboxResult:
        with self._lock:
            if ticket["result"] is None:
                batch, self._waiting = self._waiting, []
                started = time.monotonic()
                prompts = [t["prompt"] for t in batch]
                try:
                    if self.spans:
                        span = (min(t["generated"][0] for t in batch), max(t["generated"][1] for t in batch))
                        texts = self.revise(prompts, span)  # type: ignore[call-arg]  # with spans the reviser takes the span too; TextFn names the plain one
                    else:
                        texts = self.revise(prompts)
                except BaseException as exc:  # every env of the batch gets the error, not a missing result
                    for waiting in batch:
                        failed: Future[list[str]] = Future()
                        waiting["result"] = failed
                        failed.set_exception(exc)
                    raise
                self.waited_ms += int(1000 * (time.monotonic() - started))
                for waiting, text in zip(batch, texts):
                    waiting["result"] = waiting["score"](text)
        return ticket["result"].result()


_QUEUES: dict[str, RevisionQueue] = {}
_CACHE = ResultCache()  # one per process: the envs of a worker share what their revisions scored


def remote_reviser(task_set: "CTRLTaskSet") -> TextFn:
    """Revisions by the run's ReviserActor (created by the first env that asks), bounded by
    ``reviser_timeout_s``. The actor shares the fate of the worker that created it: when that worker died
    (and Ray restarted it), the first call fails and the next caller creates the reviser again."""
    import ray

    from async_rl.ctrl.reviser import reviser_handle

    def handle() -> Any:
        return reviser_handle(task_set.reviser_name, *task_set.reviser_args())

    current = [handle()]

    def revise(prompts: list[str], generated: Optional[tuple[float, float]] = None) -> list[str]:
        for attempt in range(2):
            try:
                # A future, not ray.get: this runs in the worker's env thread, not on the async actor's event
                # loop, which ray.get would warn about.
                ref = current[0].revise.remote(prompts, generated, os.getpid())
                return ref.future().result(timeout=task_set.options.reviser_timeout_s)
            except concurrent.futures.TimeoutError:
                raise RuntimeError(f"the CTRL reviser did not revise {len(prompts)} prompts within "
                                   f"reviser_timeout_s={task_set.options.reviser_timeout_s:g} s") from None
            except ray.exceptions.RayActorError:
                if attempt:
                    raise
                current[0] = handle()
        raise AssertionError("unreachable")
    return revise


def local_reviser(task_set: "CTRLTaskSet") -> TextFn:
    """Revisions in this process (no Ray: unit tests, evaluation scripts)."""
    from async_rl.ctrl.reviser import load_writer

    return load_writer(None, *task_set.reviser_args()).write


def revision_queue(task_set: "CTRLTaskSet") -> RevisionQueue:
    if task_set.reviser_name not in _QUEUES:
        import ray

        remote = ray.is_initialized()
        _QUEUES[task_set.reviser_name] = RevisionQueue(remote_reviser(task_set) if remote else local_reviser(task_set),
                                                       spans=remote)
    return _QUEUES[task_set.reviser_name]


def heldout_set(task_set: "CTRLTaskSet") -> list[dict[str, Any]]:
    """The balanced held-out cases every evaluation of a config uses (drawn with seed 0 whatever the run's
    seed, so that runs and benchmarks compare on the same cases)."""
    return balanced(task_set.heldout, task_set.options.heldout_cases, 0)


def ctrl_final_evaluation(task_set: "CTRLTaskSet", act: Any, preprocess: Any, seed: int) -> dict[str, Any]:
    """The final weights critique a balanced set of held-out cases greedily; the reviser revises."""
    import torch

    cases = heldout_set(task_set)

    def critique(prompts: list[str]) -> list[str]:
        out = []
        for first in range(0, len(prompts), EVAL_BATCH):
            chunk = prompts[first:first + EVAL_BATCH]
            actions = act(torch.stack([preprocess({"prompt": p}, "ctrl") for p in chunk]), True)
            out += [response_text(a, task_set.tokenizer_path, "ctrl") for a in actions]
        return out

    figures = evaluate(cases, critique, revision_queue(task_set).revise, task_set.options.timeout_s,
                       alone=False)
    rows = figures.pop("rows")
    scalars = {f"eval/{k}": float(figures[k]) for k in ("critic_pass", "judgment_accuracy", "regression_rate",
                                                        "critic_format_rate", "initial_pass")}
    text = (f"ctrl: {len(cases)} held-out cases ({figures['n_correct']} correct), greedy critiques: revisions pass "
            f"{figures['critic_pass']:.3f} (initial {figures['initial_pass']:.3f}), judgment accuracy "
            f"{figures['judgment_accuracy']:.3f}, regressions {figures['regression_rate']:.3f}, "
            f"format {figures['critic_format_rate']:.3f}")
    return {"scalars": scalars, "text": text, "files": {"eval_cases.json": rows}, **figures}


class CTRLOptions(TextEnvOptions):
    """CTRL critique training on HumanEval: the critic writes a critique, the frozen reviser revises, the tests score."""

    timeout_s: pydantic.PositiveFloat = 3.0
    """wall seconds for a revision's tests"""
    ctrl_reward: Literal[REWARD_MODES] = "all_pass"  # type: ignore[valid-type]  # a Literal of a constant's values: pydantic reads them, mypy does not
    """a critique's reward: 1 if the revision passes every test, or the fraction it passes"""
    missing_judgment_reward: float = pydantic.Field(default=0.0, ge=-1.0, le=0.0)
    """the reward of a critique without its judgment line (0; -1 punishes it)"""
    format_check: bool = True
    """false revises and scores critiques without a judgment line too (a base model never taught the format
    writes none, so no reward would ever differ)"""
    reviser_model_path: Optional[str] = None
    """the frozen reviser: a model, or a policy export of launch/sft.py; null = the policy's base model"""
    reviser_max_new_tokens: pydantic.PositiveInt = 256
    """the reviser's longest revision"""
    reviser_max_prompt_tokens: pydantic.PositiveInt = 1536
    """the reviser's longest prompt (problem, solution, critique)"""
    reviser_batch: pydantic.PositiveInt = 8
    """revisions per reviser call"""
    reviser_timeout_s: pydantic.PositiveFloat = 900.0
    """longest wait for one batch of revisions"""
    mutations: pydantic.NonNegativeInt = 2
    """verified-failing mutants per problem"""
    samples: pydantic.NonNegativeInt = 0
    """the base model's own solutions per problem (generated once, cached)"""
    max_prompt_chars: Optional[pydantic.PositiveInt] = None
    """drop cases whose critic prompt is longer (CPU runs); null = keep all"""
    task_ids: Optional[list[str]] = None
    """only these training problems (e.g. [HumanEval/23]); null = all"""
    heldout_cases: Optional[int] = pydantic.Field(default=16, ge=2)
    """the balanced held-out set of the final evaluation (half correct, half not); null = as many as balance allows"""

    @pydantic.field_validator("task_ids")
    @classmethod
    def _training_problems(cls, task_ids: Optional[list[str]]) -> Optional[list[str]]:
        not_training = [t for t in task_ids or () if t not in TRAIN_TASK_IDS]
        if not_training:  # else dropped quietly: a typo would train on fewer problems than asked
            raise ValueError(f"{not_training} are not HumanEval training problems (HumanEval/0..163, less every 5th "
                             "id: those are held out); name training ids, e.g. HumanEval/23")
        return task_ids


@register_env("ctrl_humaneval", options=CTRLOptions, final_evaluation=ctrl_final_evaluation)
def ctrl_humaneval_task_set(options: CTRLOptions) -> "CTRLTaskSet":
    """CTRL critique training on HumanEval: the cases of both splits, built before Ray starts."""
    from async_rl.policies.lm_loading import resolve_lm_path

    reviser_model_path = options.reviser_model_path
    if reviser_model_path is not None:  # a bad path is one line here, before Ray starts
        from async_rl.ctrl.reviser import check_reviser_path

        reviser_model_path = check_reviser_path(reviser_model_path)
    sample_model = None
    if options.samples:
        sample_model = str(resolve_lm_path(options.tokenizer_path))  # the base model the critic starts from
    built = {s: build_cases(s, options.seed, options.mutations, options.samples, sample_model, options.timeout_s,
                            options.task_ids if s == "train" else None)
             for s in ("train", "heldout")}
    if options.max_prompt_chars is not None:
        built = {s: [c for c in cases if len(critic_prompt(c["prompt"], c["solution"])) <= options.max_prompt_chars]
                 for s, cases in built.items()}
    if not built["train"] or not built["heldout"]:
        raise ConfigError(f"ctrl_humaneval has no training or no held-out case left (task_ids {options.task_ids}, "
                          f"max_prompt_chars {options.max_prompt_chars}); widen them")
    longest = [max((critic_prompt(c["prompt"], c["solution"]) for c in cases), key=len) for cases in built.values()]
    return CTRLTaskSet(split=options.split, tokenizer_path=options.tokenizer_path, seed=options.seed,
                       options=options.model_copy(update={"reviser_model_path": reviser_model_path}),
                       train=built["train"], heldout=built["heldout"], obs_spec={"text": True, "example_prompts": longest})


@dataclass
class CTRLTaskSet(TextTaskSetBase):
    """The cases of both splits travel with it (~1 MB): every process scores the same cases. ``options`` are
    the ones it was built from, the reviser's path resolved (scoring and the reviser read them); ``split``,
    ``tokenizer_path`` and ``seed`` are the base's, which the driver sets per use."""

    options: CTRLOptions = field(default_factory=CTRLOptions)
    train: list = field(default_factory=list)
    heldout: list = field(default_factory=list)
    reviser_name: str = field(default_factory=lambda: f"ctrl-reviser-{uuid.uuid4().hex[:8]}")  # unique to the run
    task_names: list[str] = field(default_factory=lambda: ["ctrl_humaneval"])

    def reviser_args(self) -> tuple[Optional[str], int, int, int]:
        """What the reviser is loaded with (``load_writer``'s model path, max new tokens, max prompt tokens, batch
        size): its own model, else the critic's base model (the driver's model path), and its limits."""
        o = self.options
        return (o.reviser_model_path or self.tokenizer_path, o.reviser_max_new_tokens, o.reviser_max_prompt_tokens,
                o.reviser_batch)

    def heldout_count(self) -> int:
        return len(self.heldout)

    def make_env(self, task_index: int, seed: int, revise: Optional[TextFn] = None) -> "CTRLEnv":
        if task_index != 0:
            raise IndexError(f"task_index {task_index} out of range: ctrl_humaneval has one task")
        queue = RevisionQueue(revise) if revise is not None else None
        return CTRLEnv(self, self.train if self.split == "train" else self.heldout,
                       seed=int(seed) + 1_000_003 * self.seed, queue=queue)


class CTRLEnv(PreparedStepEnv):
    task_name = "ctrl"
    reason_names = ("no_judgment",) + REASONS

    def __init__(self, task_set: CTRLTaskSet, cases: list, seed: int, queue: Optional[RevisionQueue] = None) -> None:
        super().__init__(task_set.tokenizer_path, seed)
        self.task_set, self.cases = task_set, cases
        self._queue = queue  # None: the process's queue to the run's reviser, made on first use
        self._pending: Optional[tuple[Any, Optional[dict[str, Any]]]] = None
        self._asked = 0.0
        self.extra = {"ctrl_judgment_right": 0, "ctrl_judgment_wrong": 0, "ctrl_judgment_missing": 0, "ctrl_cache_lookups": 0,
                      "ctrl_cache_hits": 0, "ctrl_reviser_wait_ms": 0, "ctrl_channel_violations": 0}

    @property
    def queue(self) -> RevisionQueue:
        if self._queue is None:
            self._queue = revision_queue(self.task_set)
        return self._queue

    def _problem(self, start: Optional[int]) -> dict:
        self._pending = None
        case = self.cases[int(self.rng.integers(len(self.cases))) if start is None else start % len(self.cases)]
        self._asked = time.time()  # the worker sends the prompt to the inference actor after this reset
        return {"prompt": critic_prompt(case["prompt"], case["solution"]), "case": case}

    def _score_revision(self, revision: str) -> "Future[SandboxResult]":
        case = self.problem["case"]
        future, hit = score_revision(revision, case["tests"], case["prefix"], _CACHE, shared_pool(),
                                     self.task_set.options.timeout_s, case.get("entry_point"))
        if hit is not None:  # None: no code, nothing looked up
            self.extra["ctrl_cache_lookups"] += 1
            self.extra["ctrl_cache_hits"] += int(hit)
        return future

    def prepare_step(self, action: Union[str, np.ndarray]) -> None:
        """Queue the revision of this critique (see the module docstring); ``step`` collects its result."""
        if self.problem is None:
            return
        text = response_text(action, self.tokenizer_path, self.task_name)
        case = self.problem["case"]
        ticket = None
        if parse_judgment(text) is not None or not self.task_set.options.format_check:
            ticket = self.queue.add(revision_prompt(case["prompt"], case["solution"], text), self._score_revision,
                                    (self._asked, time.time()))
        self._pending = (action_key(action), ticket)

    def score(self, text: str) -> tuple[float, dict[str, Any]]:
        pending, self._pending = self._pending, None
        if pending is None:  # scored without prepare_step (the caller passed text)
            self.prepare_step(text)
            pending, self._pending = self._pending, None
        ticket = pending[1]
        waited = self.queue.waited_ms
        result = None if ticket is None else self.queue.result(ticket)
        self.extra["ctrl_reviser_wait_ms"] += self.queue.waited_ms - waited
        options = self.task_set.options
        reward, info = critique_reward(text, result, options.ctrl_reward, options.missing_judgment_reward,
                                       options.format_check)
        if info["reason"] in CHANNEL_VIOLATIONS:  # a revision over a cap or forging answers: hacking shows here
            self.extra["ctrl_channel_violations"] += 1
        if info["judgment"] is None:
            self.extra["ctrl_judgment_missing"] += 1
        else:
            right = info["judgment"] == self.problem["case"]["correct"]
            self.extra["ctrl_judgment_right" if right else "ctrl_judgment_wrong"] += 1
        return reward, info

    def counters(self) -> dict[str, int]:
        return {**super().counters(), **self.extra}
