"""CompilerGym LLVM pass ordering (Passformer RL training, after CompilerDream), registered as
env ``compilergym`` with its final evaluation.

Programs: ``generator://csmith-v0/<seed>`` over disjoint seed ranges for training and evaluation,
or every .c/.cpp/.bc file of ``benchmark_dir``, or named CompilerGym datasets (online only).

Where each part lives (this package): the server process (``client``; the server itself, run by CompilerGym's
own Python, ``_server.py``), the env and its task set (``env``), the options (``options``), the reward
(``reward``), the observation vector (``features``), IR and pass tokens (``tokens``), the programs
(``programs``; the bundled C programs are ``envs/programs/``), the held-out evaluation (``evaluation``) and the
searches at inference time (``search``, on the env through ``env_compiler``).
"""
from __future__ import annotations

from async_rl.errors import ConfigError
from envs import register_env
from envs.compilergym.client import (
    SETUP_HINT,
    CompilerGymClient,
    CompilerGymServerError,
    compilergym_unavailable_reason,
    default_python,
    default_site_data,
)
from envs.compilergym.env import CompilerGymTaskSet
from envs.compilergym.evaluation import held_out_evaluation
from envs.compilergym.options import CompilerGymOptions
from envs.compilergym.programs import csmith_programs, program_uris, split_held_out
from envs.compilergym.reward import RewardConfig


def compilergym_task_set(options: CompilerGymOptions) -> CompilerGymTaskSet:
    """Build the CompilerGym TaskSet: the programs, and the pass flags from one short-lived server (which
    proves the set-up works before Ray starts)."""
    o = options
    held_out = program_uris(o.eval_benchmark_dir) if o.eval_benchmark_dir else None
    if o.benchmark_dir is not None:
        files = program_uris(o.benchmark_dir)
        train, evaluation = (files, held_out) if held_out else split_held_out(files, o.eval_fraction)
    elif o.datasets:
        train, evaluation = [], []  # filled from the probe server below (named datasets need the internet)
    else:
        train, evaluation = csmith_programs(*o.train_seeds), csmith_programs(*o.eval_seeds)

    python, site_data = default_python(), default_site_data()
    reason = compilergym_unavailable_reason(python, site_data)
    if reason:
        raise ConfigError(reason)
    # One short-lived server tells the pass flags (and proves the set-up works) before Ray starts.
    try:
        client = CompilerGymClient(python, site_data, o.call_timeout_s, o.start_timeout_s)
    except CompilerGymServerError as exc:
        raise ConfigError(f"{exc}; {SETUP_HINT}") from None
    try:
        flags = client.flags
        if o.datasets:
            uris = []
            for name in o.datasets:
                if "://" in name:
                    uris.append(str(name))
                    continue
                try:
                    uris += client.call("dataset_uris", timeout_s=600, name=str(name), limit=o.dataset_limit)["uris"]
                except CompilerGymServerError as exc:
                    raise ConfigError(f"compilergym dataset '{name}' is unavailable ({exc}); named datasets need "
                                      "the internet: use csmith seeds or benchmark_dir offline") from None
            if not uris:
                raise ConfigError(f"compilergym datasets {o.datasets} hold no programs; check the names and dataset_limit")
            train, evaluation = split_held_out(uris, o.eval_fraction)
    finally:
        client.close()
    evaluation = held_out or evaluation
    return CompilerGymTaskSet(
        train_benchmarks=train, eval_benchmarks=evaluation, flags=flags, mode=o.mode, max_steps=o.max_steps,
        seq_len=o.seq_len, ir_tokens=o.ir_tokens, ir_vocab_size=o.ir_vocab_size,
        reward=RewardConfig(o.leaky_above, o.leakiness, o.step_penalty, o.reward_baseline, o.oz_floor, o.noop_penalty),
        python=str(python), site_data=str(site_data), call_timeout_s=o.call_timeout_s,
        start_timeout_s=o.start_timeout_s, episodes_per_program=o.episodes_per_program,
        reuse_programs=o.reuse_programs, eval_search=o.eval_search, eval_search_budget=o.eval_search_budget,
        time_limit=o.time_limit, mask_noops=o.mask_noops, success_vs_oz=o.success_vs_oz,
    )


register_env("compilergym", options=CompilerGymOptions, final_evaluation=held_out_evaluation)(compilergym_task_set)
