"""Bring your own prompts and rewards (``--env prompts``): one-step episodes over the rows of a data set,
scored by reward functions in TRL's convention (``async_rl/rewards``).

    --env prompts --env-kwargs "{data: train.jsonl, heldout_data: heldout.jsonl, rewards: [math]}"
    (launch/ds_lm_grpo.py --data train.jsonl --heldout-data heldout.jsonl --reward math says the same)

A row is one prompt (the ``prompt`` column, or the one ``prompt_column`` names; text, or chat messages whose
system message replaces the policy's ``system_prompt``) plus any columns (``answer``, ``tests``, ...), read from
JSONL, Parquet or a ``datasets`` ``save_to_disk`` folder (``envs/_prompt_rows.py``). Held-out prompts come from
``heldout_data`` or, for a saved ``DatasetDict``, its ``heldout_split`` (unset: ``test``, else ``validation``);
they never mix with training: a prompt in both is refused up front.
The built-in ``arithmetic`` and ``humaneval`` envs are this env over generated rows (``RowSource``).

Scoring: the rollout worker calls ``prepare_step`` on all its envs, then ``step`` on each; the first step
scores every prepared completion of the process in one call per reward function (``ScoringBatch``), so
rewards see batches as in TRL and sandboxed code tests run in parallel. They get TRL's arguments: the
completions' token ids (the action's, or the text tokenized) and a ``trainer_state`` whose ``global_step`` is
the policy version that wrote them (the worker tells each env with ``set_policy_version``). Each reward's values
are logged as ``reward/<name>`` (mean, and ``reward/<name>_std``; rows it skipped with None left out) besides
``reward/total``, the weighted sum that trains.
An episode succeeds when the first reward (or ``success_reward``) reaches ``success_threshold``.

Checked in the driver before Ray starts (one ConfigError line each): by the options' schema as the config
loads, --data is given, each path is a .jsonl/.json/.parquet file or a folder (``DataPath``) and there are
held-out rows (--heldout-data or a saved DatasetDict); then the files parse, every reward's required columns are in every row, train and
held-out share no prompt, and every reward runs on the first rows (a dry run with stand-in completions)
returning one finite number (or None) per completion.
"""
from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence, Union

import numpy as np
import pydantic

from async_rl.errors import ConfigError
from async_rl.rewards.functions import TOTAL, RewardSpec, parse_reward_specs, split_reward_item, written_name
from async_rl.rewards.scoring import RewardSet, TrainerState, dry_run, missing_column_message
from envs import register_env
from envs._prompt_rows import DataPath, heldout_split_of, is_split_folder, read_rows, shared_prompts
from envs._text import (
    EVAL_BATCH,
    PreparedStepEnv,
    TextEnvOptions,
    TextTaskSetBase,
    action_key,
    load_tokenizer,
    response_text,
)

DRY_RUN_ROWS = 4  # training rows every reward is called on before the run starts


class RowSource(Protocol):
    """Where an env's rows come from: a file, or a generator (``size`` None: every index its own row)."""

    size: Optional[int]

    def row(self, index: int) -> dict: ...

    def label(self, index: int) -> str: ...


@dataclass(frozen=True)
class FileRows:
    """The rows of a file (or one split of a saved DatasetDict); read once per process, row ``i % size``."""

    path: str
    split: Optional[str] = None
    flag: str = "--data"
    prompt_column: str = "prompt"

    def rows(self) -> Any:
        return read_rows(self.path, self.split, self.flag, self.prompt_column)

    @property
    def size(self) -> int:
        return len(self.rows().rows)

    def row(self, index: int) -> dict:
        return dict(self.rows().rows[index % self.size])

    def label(self, index: int) -> str:
        return self.rows().labels[index % self.size]


class PromptsOptions(TextEnvOptions):
    """Your own prompts and rewards."""

    data: DataPath
    """the training rows (--data): JSONL, Parquet or a datasets folder"""
    heldout_data: Optional[DataPath] = None
    """the held-out rows (--heldout-data); null when data is a saved DatasetDict (its heldout_split)"""
    rewards: Union[str, list[str]] = ["math"]
    """reward functions, NAME_OR_PATH[=WEIGHT] each (--reward): a built-in or a module:function"""
    reward_options: Optional[dict[str, dict[str, Any]]] = None
    """{built-in reward: {option: value}}"""
    prompt_column: str = "prompt"
    """the column that holds the prompt (e.g. question); read as prompt, the rewards get the others"""
    train_split: str = "train"
    """the training split of a saved DatasetDict"""
    heldout_split: Optional[str] = None
    """the held-out split of a saved DatasetDict; null = test, else validation"""
    heldout_size: Optional[pydantic.PositiveInt] = None
    """evaluate only the first N held-out rows; null = all"""
    success_reward: Optional[str] = None
    """the reward whose value >= success_threshold counts as solved (an import path by its function's name);
    null = the first"""
    success_threshold: float = 1.0
    """a row is solved when success_reward's value is at least this"""
    task_name: str = "prompts"
    """how logs name the task"""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _training_rows_given(cls, values: Any) -> Any:
        """The required ``data``, refused with the flag that sets it rather than pydantic's "Field required"."""
        if isinstance(values, dict) and values.get("data") is None:
            raise ValueError("env prompts needs its training rows: --data FILE (JSONL, Parquet or a datasets folder)")
        return values

    @pydantic.model_validator(mode="after")
    def _heldout_rows_given(self) -> "PromptsOptions":
        """Held-out rows come from heldout_data or from a saved DatasetDict's heldout_split."""
        if self.heldout_data is None and not is_split_folder(self.data):
            raise ValueError(f"--data {self.data}: no held-out rows; pass --heldout-data FILE (prompts never seen in "
                             "training), or a datasets folder with a held-out split")
        return self

    @pydantic.model_validator(mode="after")
    def _success_reward_is_a_reward(self) -> "PromptsOptions":
        items = [self.rewards] if isinstance(self.rewards, str) else self.rewards
        # A blank item is parse_reward_specs' to refuse, with its own message.
        names = [written_name(split_reward_item(item)[0]) for item in items if item.strip()]
        if self.success_reward is not None and names and self.success_reward not in names:
            raise ValueError(f"success_reward {self.success_reward!r} is not one of the rewards ({', '.join(names)}); "
                             "name one of them (an import path by its function) or leave it null for the first")
        return self


def prompts_task_set(options: PromptsOptions) -> "PromptTaskSet":
    """The prompts env over the rows of ``options.data``, held-out rows apart, scored by ``options.rewards``."""
    data, heldout_data = _absolute(options.data), _absolute(options.heldout_data)  # Ray's workers may start elsewhere
    dict_folder, column = is_split_folder(str(data)), options.prompt_column
    train = FileRows(str(data), options.train_split if dict_folder else None, "--data", column)
    if heldout_data is not None:
        split = (heldout_split_of(str(heldout_data), options.heldout_split, "", "--heldout-data")
                 if is_split_folder(str(heldout_data)) else None)
        heldout = FileRows(str(heldout_data), split, "--heldout-data", column)
    else:  # a saved DatasetDict: the options' _heldout_rows_given
        heldout = FileRows(str(data), heldout_split_of(str(data), options.heldout_split, options.train_split), "--data",
                           column)
    specs = parse_reward_specs(options.rewards, options.reward_options)
    task_set = PromptTaskSet(split=options.split, tokenizer_path=options.tokenizer_path, seed=options.seed, train=train,
                             heldout=heldout, rewards=tuple(specs),
                             success_reward=_success_name(specs, options.success_reward),
                             success_threshold=options.success_threshold, heldout_size=options.heldout_size,
                             task_names=[options.task_name])
    shared = shared_prompts(train.rows().rows, heldout.rows().rows)
    if shared:
        raise ConfigError(f"--data {data} and the held-out rows share {len(shared)} prompt(s), e.g. {shared[0][:80]!r}; "
                          "held-out prompts must never be trained on: remove them from one side")
    check_task_set(task_set)
    return task_set


def _absolute(path: Optional[str]) -> Optional[str]:
    """An existing path made absolute; anything else as given (its error then names it as the user wrote it)."""
    if path is None or not Path(str(path)).expanduser().exists():
        return path
    return str(Path(str(path)).expanduser().resolve())


def _success_name(specs: Sequence[RewardSpec], chosen: Optional[str]) -> str:
    """The logged name of the reward ``chosen`` names (PromptsOptions checked that one does); None: the first's."""
    if chosen is None:
        return specs[0].name
    return next(s.name for s in specs if written_name(s.source) == chosen)


def check_task_set(task_set: "PromptTaskSet", rows_checked: int = 64) -> None:
    """Before Ray: every reward's required columns in the rows (all of a file's; the first ``rows_checked`` of
    a generator), then a dry run of every reward on the first training rows. Fills the example prompts."""
    rewards = RewardSet(task_set.rewards)
    examples = []
    for source in (task_set.train, task_set.heldout):
        count = source.size if source.size is not None else rows_checked
        for index in range(count):
            row = source.row(index)
            examples.append(row["prompt"])
            missing = rewards.missing_columns(list(row))
            if missing:
                name, columns = next(iter(missing.items()))
                raise ConfigError(missing_column_message(name, columns, source.label(index),
                                                         [c for c in row if c != "prompt"]))
    rows = [task_set.train.row(i) for i in range(min(DRY_RUN_ROWS, task_set.train.size or DRY_RUN_ROWS))]
    dry_run(rewards, rows, [task_set.train.label(i) for i in range(len(rows))], tokenize=task_set.tokenize)
    longest = sorted(examples, key=lambda p: len(str(p)))[-3:]  # chat prompts whole: the system message counts too
    task_set.obs_spec = {**task_set.obs_spec, "example_prompts": longest}


@dataclass
class PromptTaskSet(TextTaskSetBase):
    """Picklable and small: sources and reward specs; rows and functions load in each process."""

    train: Any = None  # a RowSource
    heldout: Any = None
    rewards: tuple = ()
    success_reward: str = ""
    success_threshold: float = 1.0
    heldout_size: Optional[int] = None
    task_names: list[str] = field(default_factory=lambda: ["prompts"])

    @property
    def tokenize(self) -> Optional[Any]:
        """``text -> token ids`` by the policy's tokenizer (None: no tokenizer known yet)."""
        if self.tokenizer_path is None:
            return None
        tokenizer = load_tokenizer(str(self.tokenizer_path))
        return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def heldout_count(self) -> int:
        """How many held-out rows the final evaluation answers."""
        size = self.heldout.size
        return size if self.heldout_size is None else min(size, self.heldout_size)

    def make_env(self, task_index: int, seed: int) -> "PromptEnv":
        if task_index != 0:
            raise IndexError(f"task_index {task_index} out of range: {self.task_names[0]} has one task")
        return PromptEnv(self, seed=int(seed) + 1_000_003 * self.seed)


@functools.lru_cache(maxsize=8)
def scoring_batch(specs: tuple) -> "ScoringBatch":
    """The process's scoring batch of these rewards: every env of a rollout worker adds to the same one."""
    return ScoringBatch(RewardSet(specs))


class ScoringBatch:
    """Completions prepared since the last flush; the first result asked for scores all of them at once."""

    def __init__(self, rewards: RewardSet) -> None:
        self.rewards = rewards
        self._waiting: list[tuple[int, Any, Any, dict, str, Optional[list[int]], int]] = []
        self._done: dict[int, tuple[float, dict[str, Optional[float]], Optional[dict[str, str]]]] = {}
        self._tickets = itertools.count()

    def add(self, prompt: Any, completion: Any, row: dict, where: str, completion_ids: Optional[list[int]] = None,
            policy_version: int = 0) -> int:
        """Queue a completion (and its token ids, and the policy version that wrote it) for the next flush."""
        ticket = next(self._tickets)
        self._waiting.append((ticket, prompt, completion, row, where, completion_ids, int(policy_version)))
        return ticket

    def discard(self, ticket: int) -> None:
        """Forget a ticket whose episode ended unscored (a dropped episode)."""
        self._waiting = [w for w in self._waiting if w[0] != ticket]
        self._done.pop(ticket, None)

    def result(self, ticket: int) -> tuple[float, dict[str, float], dict[str, str]]:
        """(total, {reward: value}, {reward: reason} for rewards that give reasons) of a ticket."""
        if ticket not in self._done:
            self.flush()
        return self._done.pop(ticket)

    def flush(self) -> None:
        batch, self._waiting = self._waiting, []
        if not batch:
            return
        _, prompts, completions, rows, where, ids, versions = zip(*batch)
        totals, values = self.rewards.score(prompts, completions, rows, where, completion_ids=ids,
                                            trainer_state=TrainerState.at(max(versions)))
        reasons = {name: getattr(fn, "last_reasons", None) for name, fn in zip(self.rewards.names, self.rewards.functions)}
        for k, (ticket, *_) in enumerate(batch):
            self._done[ticket] = (totals[k], {n: v[k] for n, v in values.items()},
                                  {n: r[k] for n, r in reasons.items() if r is not None and len(r) == len(batch)})


class PromptEnv(PreparedStepEnv):
    """One prompt per episode; its completion scored by the task set's rewards (see the module docstring)."""

    def __init__(self, task_set: PromptTaskSet, seed: int) -> None:
        self.task_set = task_set
        self.task_name = task_set.task_names[0]
        self.source: RowSource = task_set.heldout if task_set.split == "heldout" else task_set.train
        self.batch = scoring_batch(tuple(task_set.rewards))
        success_fn = self.batch.rewards.functions[self.batch.rewards.names.index(task_set.success_reward)]
        self.reason_names = tuple(getattr(success_fn, "reason_names", ("solved", "unsolved")))
        super().__init__(task_set.tokenizer_path, seed)
        self.where = ""
        self.policy_version = 0
        self._values: dict[str, list[float]] = defaultdict(list)
        self._pending: Optional[tuple[Any, int]] = None

    def set_policy_version(self, version: int) -> None:
        """The policy version whose completions the next steps score (the rewards' ``trainer_state.global_step``)."""
        self.policy_version = int(version)

    def _problem(self, start: Optional[int]) -> dict:
        if self._pending is not None:
            self.batch.discard(self._pending[1])
        self._pending = None
        size = self.source.size
        index = int(start) if start is not None else int(self.rng.integers(size if size is not None else 2**62))
        self.where = self.source.label(index)
        return self.source.row(index)

    def observation(self) -> dict[str, Any]:
        """The row's prompt: text, or its chat messages whole (the preprocessor applies the chat template)."""
        return {"prompt": self.problem["prompt"]}

    def _completion(self, text: str) -> Any:
        """TRL's form: text for a text prompt, ``[{"role": "assistant", ...}]`` for a chat prompt."""
        return text if isinstance(self.problem["prompt"], str) else [{"role": "assistant", "content": text}]

    def prepare_step(self, action: Union[str, np.ndarray]) -> None:
        """Queue this completion in the process's scoring batch; ``step`` (of any env) scores the batch."""
        if self.problem is None:
            return
        text = response_text(action, self.tokenizer_path, self.task_name)
        self._pending = (action_key(action), self._add(text, action))

    def _add(self, text: str, action: Union[str, np.ndarray, None]) -> int:
        """Queue the completion ``text`` (of ``action``: its ids, or text that the tokenizer, if any, encodes)."""
        if action is not None and not isinstance(action, str):
            ids: Optional[list[int]] = [int(i) for i in np.asarray(action).reshape(-1) if i >= 0]
        else:
            tokenize = self.task_set.tokenize
            ids = tokenize(text) if tokenize is not None else None
        return self.batch.add(self.problem["prompt"], self._completion(text), self.problem, self.where, ids,
                              self.policy_version)

    def score(self, text: str) -> tuple[float, dict[str, Any]]:
        """(reward, info) of a response to the current row (``reset`` first): the rewards' weighted sum; info:
        success, reason (the success reward's, where it gives one), rewards ({name: value})."""
        pending, self._pending = self._pending, None
        ticket = pending[1] if pending is not None else self._add(text, None)
        total, values, reasons = self.batch.result(ticket)
        deciding = values[self.task_set.success_reward]  # None: that reward skipped the row, which is then unsolved
        success = deciding is not None and deciding >= self.task_set.success_threshold
        reason = reasons.get(self.task_set.success_reward, "solved" if success else "unsolved")
        for name, value in values.items():
            if value is not None:
                self._values[name].append(value)
        self._values[TOTAL].append(total)
        return total, {"success": bool(success), "reason": reason, "rewards": values}

    def reward_components(self) -> dict[str, list[float]]:
        """Each reward's values (and the weighted total's) since the last call: logged as ``reward/<name>``."""
        out, self._values = dict(self._values), defaultdict(list)
        return out


def heldout_evaluation(task_set: PromptTaskSet, act: Any, preprocess: Any, seed: int) -> dict[str, Any]:
    """The final evaluation: every held-out row answered greedily by the final weights, in batches. Reports the
    mean reward (``eval/heldout_reward``), each reward's mean (``eval/heldout_reward/<name>``) and the fraction
    solved (``eval/heldout_success``); per-row results in ``eval_problems.json``."""
    import torch  # the evaluation stacks the policy's inputs

    heldout = replace(task_set, split="heldout")
    count = task_set.heldout_count()
    rows: list[dict[str, Any]] = []
    for first in range(0, count, EVAL_BATCH):
        starts = list(range(first, min(first + EVAL_BATCH, count)))
        envs = [heldout.make_env(0, seed) for _ in starts]  # one env per row: the batch is scored in one call per reward
        prompts = [env.reset(start=s)["prompt"] for env, s in zip(envs, starts)]
        actions = act(torch.stack([preprocess({"prompt": p}, envs[0].task_name) for p in prompts]), True)
        for env, action in zip(envs, actions):
            env.prepare_step(action)
        for env, prompt, action in zip(envs, prompts, actions):
            _, reward, _, _, info = env.step(action)
            rows.append({"prompt": prompt, "response": response_text(action, task_set.tokenizer_path, env.task_name),
                         "reward": reward, "success": info["success"], "reason": info["reason"], "rewards": info["rewards"]})
    n = max(len(rows), 1)
    reward, success = sum(r["reward"] for r in rows) / n, sum(r["success"] for r in rows) / n
    scalars = {"eval/heldout_reward": reward, "eval/heldout_success": success}
    for name in (rows[0]["rewards"] if rows else {}):
        scored = [r["rewards"][name] for r in rows if r["rewards"][name] is not None]  # None: skipped rows
        scalars[f"eval/heldout_reward/{name}"] = sum(scored) / max(len(scored), 1)
    name = task_set.task_names[0]
    return {"scalars": scalars, "files": {"eval_problems.json": rows}, "heldout_reward": reward, "heldout_success": success,
            "text": f"{name}: {len(rows)} held-out problems, greedy: mean reward {reward:.3f}, solved {success:.3f}"}


register_env("prompts", options=PromptsOptions, final_evaluation=heldout_evaluation)(prompts_task_set)
