"""The final evaluation of a CompilerGym policy on held-out programs: the policy greedy and
sampled beside random search (``evaluate_programs``), a search at inference time beside random
search with as many compilations (``search_programs``), their tables and TensorBoard scalars."""
from __future__ import annotations

import math
import time
from typing import Any, Optional, Sequence

import numpy as np

from envs.compilergym.env import CompilerGymTaskSet
from envs.compilergym.env_compiler import EnvCompiler
from envs.compilergym.options import parse_search
from envs.compilergym.programs import program_name
from envs.compilergym.search import ActPolicy, random_baseline, run_search


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive values (nan for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def search_horizon(task_set: CompilerGymTaskSet) -> int:
    """Passes a policy writes per program: an episode (per step) or a sequence."""
    return task_set.max_steps if task_set.mode == "per_step" else task_set.seq_len


def search_programs(task_set: CompilerGymTaskSet, policy: Any, benchmarks: list[str], search: Any, budget: int,
                    seed: int = 0) -> dict[str, Any]:
    """``search`` (``greedy``, ``best-of-K``, ``beam-K``) with ``budget`` compilations on every
    program of ``benchmarks``, next to -Oz and to random search with as many compilations as the
    search used. ``policy`` is a ``SearchPolicy`` (``ModelPolicy`` in process, ``ActPolicy``
    behind an inference actor). Returns the rows and the geometric means over programs of
    -Oz count / count (> 1 beats -Oz): ``geomean_vs_oz`` and ``random_search_geomean_vs_oz``."""
    spec = parse_search(search, allow_none=False) if isinstance(search, str) else search
    horizon = search_horizon(task_set)
    env = task_set.make_env(0, seed=seed, benchmarks=benchmarks)
    rng = np.random.default_rng(seed)
    rows = []
    try:
        for uri in env.benchmarks:
            if env.reset_to(uri) is None:  # skipped and counted
                continue
            oz, o0 = env.program["oz_count"], env.program["o0_count"]
            compiler = EnvCompiler(env, uri)
            found = run_search(spec, compiler, policy, budget, horizon)
            rand = random_baseline(compiler, max(found.compilations, 1), horizon, rng)
            if found.count is None or rand.count is None:
                continue
            rows.append({"program": program_name(uri), "benchmark": uri, "o0_count": o0, "oz_count": oz,
                         "count": found.count, "vs_oz": oz / max(found.count, 1), "compilations": found.compilations,
                         "passes": [task_set.flags[i] for i in found.passes], "seconds": found.seconds,
                         "random_count": rand.count, "random_vs_oz": oz / max(rand.count, 1),
                         "random_compilations": rand.compilations, "failed_compilations": compiler.failures})
    finally:
        env.close()
    return {"search": spec.name, "budget": int(budget), "horizon": horizon, "rows": rows, "skipped": dict(env.skipped),
            "geomean_vs_oz": geomean([r["vs_oz"] for r in rows]),
            "random_search_geomean_vs_oz": geomean([r["random_vs_oz"] for r in rows])}


def evaluate_programs(task_set: CompilerGymTaskSet, policy: Any, preprocess: Any, random_trials: int = 1,
                      seed: int = 0, benchmarks: Optional[list[str]] = None) -> dict[str, Any]:
    """The policy, greedy and sampled, and random search on every held-out program.

    ``policy(obs_batch, deterministic) -> env actions [B, action_dim]`` takes preprocessed
    observations. Per program: -Oz count / count after the policy's greedy passes (> 1 beats -Oz),
    the same for one sampled sequence (a per-step policy decoded greedily can repeat one pass that
    no longer changes the program; sampling is how it was trained), and for the best of
    ``random_trials`` random sequences, each as many passes as the greedy policy applied
    (``random_trials=1``: the same number of env steps). Returns the per-program rows and the
    geometric means ``geomean_reduction_vs_oz`` (greedy), ``sampled_geomean_reduction_vs_oz`` and
    ``random_search_geomean_vs_oz``.
    """
    import torch  # noqa: PLC0415 (env discovery imports this module: torch only where a policy runs)

    env = task_set.make_env(0, seed=seed, benchmarks=benchmarks or task_set.eval_benchmarks)
    rng = np.random.default_rng(seed)

    def rollout(obs: dict[str, np.ndarray], deterministic: bool) -> Optional[dict[str, Any]]:
        """One episode from the reset program ``obs``; None if the server failed in it."""
        started, passes, names, done = time.monotonic(), 0, [], False
        info: dict[str, Any] = {}
        while not done:
            action = policy(torch.stack([preprocess(obs, env.task_name)]), deterministic)[0]
            obs, _, terminated, truncated, info = env.step(np.asarray(action))
            passes += int(info.get("num_passes", 1))
            names += info.get("passes", [])
            done = terminated or truncated
        if "server_error" in info:
            return None
        return {"count": int(info["ir_count"]), "passes": passes, "names": names, "seconds": time.monotonic() - started}

    rows = []
    try:
        for uri in env.benchmarks:
            obs = env.reset_to(uri)
            greedy = rollout(obs, True) if obs is not None else None
            obs = env.reset_to(uri) if greedy is not None else None
            sampled = rollout(obs, False) if obs is not None else None
            if sampled is None:
                continue
            oz, o0 = env.program["oz_count"], env.program["o0_count"]
            length = max(greedy["passes"], 1)
            random_count = random_baseline(EnvCompiler(env, uri), random_trials * length, length, rng,
                                           every_prefix=False).count
            if random_count is None:  # the program no longer loads (skipped and counted)
                continue
            rows.append({"benchmark": uri, "o0_count": o0, "oz_count": oz, "policy_count": greedy["count"],
                         "policy_passes": greedy["passes"], "policy_sequence": greedy["names"],
                         "sampled_count": sampled["count"], "sampled_sequence": sampled["names"],
                         "random_count": random_count, "policy_vs_oz": oz / max(greedy["count"], 1),
                         "sampled_vs_oz": oz / max(sampled["count"], 1), "random_vs_oz": oz / max(random_count, 1),
                         "policy_seconds": greedy["seconds"]})
    finally:
        env.close()
    return {"rows": rows, "skipped": dict(env.skipped), "random_trials": random_trials,
            "geomean_reduction_vs_oz": geomean([r["policy_vs_oz"] for r in rows]),
            "sampled_geomean_reduction_vs_oz": geomean([r["sampled_vs_oz"] for r in rows]),
            "random_search_geomean_vs_oz": geomean([r["random_vs_oz"] for r in rows])}


def format_table(result: dict[str, Any]) -> str:
    """The per-program table and the geometric means (greedy, sampled, random search), as text."""
    lines = [f"{'program':<34}{'-O0':>8}{'-Oz':>8}{'greedy':>8}{'passes':>7}{'sampled':>8}{'random':>8}"
             f"{'grd/Oz':>8}{'smp/Oz':>8}{'rnd/Oz':>8}"]
    for r in result["rows"]:
        lines.append(f"{r['benchmark'][-34:]:<34}{r['o0_count']:>8}{r['oz_count']:>8}{r['policy_count']:>8}"
                     f"{r['policy_passes']:>7}{r['sampled_count']:>8}{r['random_count']:>8}{r['policy_vs_oz']:>8.3f}"
                     f"{r['sampled_vs_oz']:>8.3f}{r['random_vs_oz']:>8.3f}")
    lines.append(f"geomean (-Oz count / count), >1 beats -Oz: policy greedy {result['geomean_reduction_vs_oz']:.3f}, "
                 f"sampled {result['sampled_geomean_reduction_vs_oz']:.3f}, random search ({result['random_trials']} x "
                 f"same passes) {result['random_search_geomean_vs_oz']:.3f}; {len(result['rows'])} programs, "
                 f"skipped {result['skipped']}")
    return "\n".join(lines)


def format_search_table(result: dict[str, Any]) -> str:
    """``search_programs``'s rows and geometric means, as text."""
    name = result["search"]
    lines = [f"{'program':<26}{'-O0':>7}{'-Oz':>7}{name:>12}{'compiles':>9}{'random':>8}{'srch/Oz':>8}{'rnd/Oz':>8}"]
    for r in result["rows"]:
        lines.append(f"{r['program'][-26:]:<26}{r['o0_count']:>7}{r['oz_count']:>7}{r['count']:>12}"
                     f"{r['compilations']:>9}{r['random_count']:>8}{r['vs_oz']:>8.3f}{r['random_vs_oz']:>8.3f}")
    lines.append(f"geomean (-Oz count / count), >1 beats -Oz: {name} {result['geomean_vs_oz']:.3f}, random search "
                 f"(same compilations) {result['random_search_geomean_vs_oz']:.3f}; budget {result['budget']} "
                 f"compilations per program, {len(result['rows'])} programs, skipped {result['skipped']}")
    return "\n".join(lines)


def search_scalars(result: dict[str, Any], prefix: str = "eval/compilergym") -> dict[str, float]:
    """TensorBoard scalars of ``search_programs``: per program ``<prefix>/<program>/<search>_vs_oz``
    (and random search's), and the geometric means ``<prefix>/<search>_geomean_vs_oz``."""
    name = result["search"].replace("-", "_")
    scalars = {f"{prefix}/{name}_geomean_vs_oz": result["geomean_vs_oz"],
               f"{prefix}/{name}_random_search_geomean_vs_oz": result["random_search_geomean_vs_oz"]}
    for r in result["rows"]:
        scalars[f"{prefix}/{r['program']}/{name}_vs_oz"] = r["vs_oz"]
        scalars[f"{prefix}/{r['program']}/{name}_random_vs_oz"] = r["random_vs_oz"]
    return scalars


def held_out_evaluation(task_set: CompilerGymTaskSet, act: Any, preprocess: Any, seed: int,
                        random_trials: int = 1) -> dict[str, Any]:
    """The env's final evaluation (``envs.final_evaluation_for("compilergym")``): ``evaluate_programs``
    with ``act(obs_batch, deterministic) -> env actions``, and with ``eval_search`` set, that search
    (``search_programs``, the policy behind ``act``), as a report: ``scalars`` (eval/ geometric
    means, ``eval/compilergym/<program>/vs_oz`` per program), ``text`` (the tables), ``files``
    (``eval_programs.json``) and the raw result."""
    result = evaluate_programs(task_set, act, preprocess, random_trials, seed)
    scalars = {f"eval/{key}": result[key] for key in
               ("geomean_reduction_vs_oz", "sampled_geomean_reduction_vs_oz", "random_search_geomean_vs_oz")}
    scalars.update({f"eval/compilergym/{program_name(r['benchmark'])}/vs_oz": r["policy_vs_oz"] for r in result["rows"]})
    text = format_table(result)
    spec = parse_search(task_set.eval_search)
    if spec is not None:
        budget = task_set.eval_search_budget or 16 * search_horizon(task_set)
        searched = search_programs(task_set, ActPolicy(act, preprocess, task_set), task_set.eval_benchmarks, spec,
                                   budget, seed)
        result["search"] = searched
        scalars.update(search_scalars(searched))
        text += "\n" + format_search_table(searched)
    return {**result, "scalars": scalars, "text": text, "files": {"eval_programs.json": result}}
