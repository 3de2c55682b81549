"""CompilerGym LLVM pass ordering (Passformer RL training, after CompilerDream), registered as
env ``compiler_gym`` with its final evaluation.

Programs: ``generator://csmith-v0/<seed>`` over disjoint seed ranges for training and evaluation,
or every .c/.cpp/.bc file of ``benchmark_dir``, or named CompilerGym datasets (online only).

Where each part lives: the server process (``compiler_gym_client``), the env and its task set
(``compiler_gym_env``), the reward (``compiler_gym_reward``), the observation vector
(``compiler_gym_features``), IR and pass tokens (``compiler_gym_tokens``), the programs
(``compiler_gym_programs``), the held-out evaluation (``compiler_gym_evaluation``) and the searches
at inference time (``compiler_gym_search``, on the env through ``compiler_gym_env_compiler``).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from async_rl.errors import ConfigError
from envs import register_env
from envs.compiler_gym_client import (
    SETUP_HINT,
    CompilerGymClient,
    CompilerGymServerError,
    compiler_gym_unavailable_reason,
    default_python,
    default_site_data,
)
from envs.compiler_gym_env import CompilerGymTaskSet
from envs.compiler_gym_evaluation import held_out_evaluation
from envs.compiler_gym_programs import csmith_programs, program_uris, split_held_out
from envs.compiler_gym_reward import RewardConfig
from envs.compiler_gym_search import parse_search

_MODES = ("per_step", "sequence")
_BASELINES = ("oz", "initial")
_TIME_LIMITS = ("terminal", "truncate")


def _check_eval_search(search: Any, budget: Any) -> None:
    """ConfigError for a bad ``eval_search`` / ``eval_search_budget`` (before any server starts)."""
    parse_search(search, what="compiler_gym eval_search")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ConfigError(f"compiler_gym eval_search_budget must be a non-negative integer (0: 16 x the episode "
                          f"length), got {budget!r}")


def compiler_gym_task_set(
    mode: str = "per_step",
    max_steps: int = 45,
    seq_len: int = 16,
    train_seeds: Sequence[int] = (0, 200),
    eval_seeds: Sequence[int] = (1_000_000, 20),
    benchmark_dir: Optional[str] = None,
    eval_benchmark_dir: Optional[str] = None,
    eval_search: str = "none",
    eval_search_budget: int = 0,
    datasets: Optional[list[str]] = None,
    dataset_limit: int = 100,
    eval_fraction: float = 0.2,
    ir_tokens: int = 0,
    ir_vocab_size: int = 4096,
    baseline_thre: float = 1.0,
    leakiness: float = 1.0,
    step_penalty: float = 0.0,
    reward_baseline: str = "oz",
    oz_floor: float = 0.01,
    noop_penalty: float = 0.0,
    call_timeout_s: float = 60.0,
    start_timeout_s: float = 120.0,
    episodes_per_program: int = 1,
    reuse_programs: bool = True,
    time_limit: str = "terminal",
    mask_noops: bool = False,
    success_vs_oz: float = 1.0,
) -> CompilerGymTaskSet:
    """Build the CompilerGym TaskSet.

    mode: ``per_step`` (one pass per step, ``max_steps`` per episode) or ``sequence`` (one step
    applies a whole sequence of up to ``seq_len`` passes). Programs: csmith seeds
    ``train_seeds``/``eval_seeds`` = (first seed, count), disjoint; or ``benchmark_dir`` (its
    .c/.cpp/.bc files, the first ``eval_fraction`` of them held out); or ``datasets`` (benchmark
    URIs, or dataset names such as cbench-v1 whose first ``dataset_limit`` programs are used;
    named datasets need the internet). ir_tokens: IR tokens per observation (0 = no IR).
    episodes_per_program: consecutive training episodes on each program (its first reset is slow).
    oz_floor: the reward's -Oz denominator is at least this fraction of the -O0 count.
    noop_penalty: per step, subtracted for a pass that leaves the instruction count unchanged.
    reuse_programs: the server keeps each program's start state (false: rebuilt at every reset).
    eval_benchmark_dir: held-out programs of their own (every file of the folder, e.g. envs/programs),
    whatever the training programs are (csmith seeds, or all of ``benchmark_dir``). eval_search: a
    search the final evaluation adds (none, greedy, best-of-K, beam-K) with ``eval_search_budget``
    compilations per program (0: 16 x the episode length). time_limit: reaching ``max_steps`` ends the
    task (``terminal``, value 0 after it) or is a time limit bootstrapped from V (``truncate``).
    mask_noops: per step, the observation's ``action_mask`` rules out the passes run since the
    instruction count last changed (they would do nothing again). success_vs_oz: ``info["success"]``
    (the episode label that success rates and PACS read) is -Oz count / count >= this; 1.0 = at least as
    small as -Oz, lower values make a success reachable for an untrained policy.
    """
    if mode not in _MODES:
        raise ConfigError(f"compiler_gym mode '{mode}' is unknown; valid: {', '.join(_MODES)}")
    if reward_baseline not in _BASELINES:
        raise ConfigError(f"compiler_gym reward_baseline '{reward_baseline}' is unknown; valid: {', '.join(_BASELINES)}")
    if not float(success_vs_oz) > 0:
        raise ConfigError(f"compiler_gym success_vs_oz must be > 0 (1.0: as small as -Oz), not {success_vs_oz}")
    if time_limit not in _TIME_LIMITS:
        raise ConfigError(f"compiler_gym time_limit '{time_limit}' is unknown; valid: {', '.join(_TIME_LIMITS)}")
    for name, value in (("max_steps", max_steps), ("seq_len", seq_len), ("episodes_per_program", episodes_per_program)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"compiler_gym {name} must be a positive integer, got {value!r}")
    if isinstance(noop_penalty, bool) or not isinstance(noop_penalty, (int, float)) or not 0.0 <= noop_penalty < 1.0:
        raise ConfigError(f"compiler_gym noop_penalty must be a number in [0, 1) (e.g. 0.01), got {noop_penalty!r}")
    if not 0.0 < float(oz_floor) <= 1.0:
        raise ConfigError(f"compiler_gym oz_floor must be in (0, 1], got {oz_floor!r}")
    if not 0.0 < float(eval_fraction) < 1.0:
        raise ConfigError(f"compiler_gym eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction!r}")
    _check_eval_search(eval_search, eval_search_budget)
    held_out = program_uris(eval_benchmark_dir, "compiler_gym eval_benchmark_dir") if eval_benchmark_dir else None
    if benchmark_dir is not None:
        files = program_uris(benchmark_dir, "compiler_gym benchmark_dir")
        train, evaluation = (files, held_out) if held_out else split_held_out(files, eval_fraction)
    elif datasets:
        train, evaluation = [], []  # filled from the probe server below (named datasets need the internet)
    else:
        (t0, tn), (e0, en) = (tuple(int(x) for x in train_seeds), tuple(int(x) for x in eval_seeds))
        if tn < 1 or en < 1:
            raise ConfigError("compiler_gym train_seeds/eval_seeds are (first seed, count) with count >= 1")
        if t0 < e0 + en and e0 < t0 + tn:
            raise ConfigError(f"compiler_gym train_seeds {list(train_seeds)} and eval_seeds {list(eval_seeds)} overlap; "
                              "give disjoint (first seed, count) ranges")
        train, evaluation = csmith_programs(t0, tn), csmith_programs(e0, en)

    python, site_data = default_python(), default_site_data()
    reason = compiler_gym_unavailable_reason(python, site_data)
    if reason:
        raise ConfigError(reason)
    # One short-lived server tells the pass flags (and proves the set-up works) before Ray starts.
    try:
        client = CompilerGymClient(python, site_data, call_timeout_s, start_timeout_s)
    except CompilerGymServerError as exc:
        raise ConfigError(f"{exc}; {SETUP_HINT}") from None
    try:
        flags = client.flags
        if datasets:
            uris = []
            for name in datasets:
                if "://" in name:
                    uris.append(str(name))
                    continue
                try:
                    uris += client.call("dataset_uris", timeout_s=600, name=str(name), limit=int(dataset_limit))["uris"]
                except CompilerGymServerError as exc:
                    raise ConfigError(f"compiler_gym dataset '{name}' is unavailable ({exc}); named datasets need "
                                      "the internet: use csmith seeds or benchmark_dir offline") from None
            if not uris:
                raise ConfigError(f"compiler_gym datasets {list(datasets)} hold no programs; check the names and dataset_limit")
            train, evaluation = split_held_out(uris, eval_fraction)
    finally:
        client.close()
    evaluation = held_out or evaluation
    return CompilerGymTaskSet(
        train_benchmarks=train, eval_benchmarks=evaluation, flags=flags, mode=mode, max_steps=max_steps,
        seq_len=seq_len, ir_tokens=int(ir_tokens), ir_vocab_size=int(ir_vocab_size),
        reward=RewardConfig(float(baseline_thre), float(leakiness), float(step_penalty), reward_baseline, float(oz_floor),
                            float(noop_penalty)),
        python=str(python), site_data=str(site_data), call_timeout_s=float(call_timeout_s),
        start_timeout_s=float(start_timeout_s), episodes_per_program=episodes_per_program,
        reuse_programs=bool(reuse_programs), eval_search=str(eval_search), eval_search_budget=int(eval_search_budget),
        time_limit=str(time_limit), mask_noops=bool(mask_noops), success_vs_oz=float(success_vs_oz),
    )


register_env("compiler_gym", final_evaluation=held_out_evaluation)(compiler_gym_task_set)
