"""CTRL's cases: a HumanEval problem with an initial solution to critique, and whether it is correct.

Per problem of a split (train and held-out problems never mix: humaneval's ``HELDOUT_TASK_IDS``):

- ``canonical``: the reference solution, unchanged (correct when the sandbox passes all its tests);
- ``mutated:<kind>``: the reference changed by a seeded AST mutation (``mutations.py``), kept only when the
  sandbox says it fails at least one test; up to ``mutations`` per problem, of different kinds first;
- ``sampled``: the base model's own answers to the HumanEval prompt (sampled at temperature 1), labelled
  by running the tests; the model's generation takes minutes on a CPU, so it is optional (``samples``).

Building runs the sandbox (and the model for samples), so the cases are kept on disk under
``~/.cache/async_rl/ctrl/``, keyed by everything that decides them. The JSONL format of the evaluation
command is one case per line: ``{"prompt", "solution", "tests": [...], "correct": bool}`` plus the optional
``prefix`` (code run before the solution: the problem's imports and helpers, which the sandbox's judge takes
from here, not from the solution), ``entry_point`` (the function under test), ``task_id`` and ``source``.
Labels are the sandbox's verdicts with the prefix apart from the solution (``_label``).
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from async_rl.code_blocks import extract_code
from async_rl.ctrl.mutations import KINDS, mutate, solution_source
from async_rl.errors import ConfigError
from async_rl.jsonl import jsonl_values
from async_rl.sandbox import SandboxPool, SandboxResult
from async_rl.user_cache import user_cache_dir

CASES_FORMAT = 2  # bump when what a built case holds changes (part of the disk key); 2: helpers judged apart
MUTATION_TRIES = 12  # draws per problem to find mutants that fail a test


def _case(problem: dict[str, Any], solution: str, correct: bool, source: str) -> dict[str, Any]:
    return {"task_id": problem["task_id"], "prompt": problem["code_prompt"].strip(), "solution": solution,
            "tests": list(problem["tests"]), "prefix": problem["prefix"], "entry_point": problem["entry_point"],
            "correct": bool(correct), "source": source}


def _label(pool: SandboxPool, problem: dict[str, Any], code: str, timeout_s: float) -> "Future[SandboxResult]":
    """A solution's sandbox run. The prompt's helpers go apart from the code (``prefix``), so that the
    judge takes them from the prompt: a sampled answer that redefines one (HumanEval/38's
    ``encode_cyclic``) changes only its own calls, never its label."""
    return pool.submit(code, problem["tests"], timeout_s=timeout_s, prefix=problem["prefix"],
                       entry_point=problem["entry_point"])


def mutated_cases(problems: Sequence[dict[str, Any]], seed: int, per_problem: int, pool: SandboxPool,
                  timeout_s: float) -> list[dict[str, Any]]:
    """The canonical cases (dropped when the reference does not pass here) and up to ``per_problem``
    verified-failing mutants of each, all sandbox runs of all problems in flight together."""
    jobs: list[tuple[dict[str, Any], str, str]] = []  # (problem, source, solution)
    for number, problem in enumerate(problems):
        reference = solution_source(problem["code_prompt"], problem["canonical_solution"], problem["entry_point"])
        jobs.append((problem, "canonical", reference))
        rng = np.random.default_rng([seed, number])
        seen = {reference}
        # Kinds in a seeded order, then any kind again: the mutants of a problem differ in kind first.
        order = list(rng.permutation(KINDS)) + [None] * MUTATION_TRIES
        for kind in order[:MUTATION_TRIES]:
            found = mutate(reference, problem["entry_point"], rng, kind)
            if found is not None and found[1] not in seen:
                seen.add(found[1])
                jobs.append((problem, f"mutated:{found[0]}", found[1]))
    futures = [_label(pool, p, code, timeout_s) for p, _, code in jobs]
    cases: list[dict[str, Any]] = []
    mutants: dict[str, Any] = {}
    references_ok = {}
    for (problem, source, code), future in zip(jobs, futures):
        result = future.result()
        if source == "canonical":
            references_ok[problem["task_id"]] = result.all_passed
            if references_ok[problem["task_id"]]:
                cases.append(_case(problem, code, True, source))
        elif not result.all_passed and len(mutants.setdefault(problem["task_id"], [])) < per_problem:
            mutants[problem["task_id"]].append(_case(problem, code, False, source))
    # A mutant only counts as wrong if its reference passed here (else the tests, not the code, fail).
    cases += [c for task, found in mutants.items() if references_ok.get(task) for c in found]
    return sorted(cases, key=lambda c: (int(c["task_id"].split("/")[1]), c["source"] != "canonical", c["source"]))


def sampled_cases(problems: Sequence[dict[str, Any]], samples: int, model_path: Optional[str], seed: int,
                  pool: SandboxPool, timeout_s: float, max_new_tokens: int = 256) -> list[dict[str, Any]]:
    """``samples`` answers of the model per problem (its code block; answers without one are skipped),
    labelled by the sandbox."""
    import torch  # noqa: PLC0415 (env discovery imports this module: torch and the model only where cases are sampled)

    from async_rl.policies.causal_lm import load_tokenizer  # noqa: PLC0415 (as torch above)
    from async_rl.policies.lm_checkpoint import answer, load_lm_policy  # noqa: PLC0415 (as torch above)

    torch.manual_seed(seed)
    policy, preprocess, _ = load_lm_policy(model_path=model_path, overrides={
        "max_new_tokens": max_new_tokens, "max_prompt_tokens": 1024, "temperature": 1.0})
    tokenizer = load_tokenizer(preprocess.model_path)
    prompts = [p["prompt"] for p in problems for _ in range(samples)]
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in answer(policy, preprocess, prompts, greedy=False, batch_size=8)]
    jobs = []
    for index, text in enumerate(texts):
        problem, code = problems[index // samples], extract_code(text)
        if code is not None:
            jobs.append((problem, code.strip(), _label(pool, problem, code, timeout_s)))
    return [_case(p, code, f.result().all_passed, "sampled") for p, code, f in jobs]


def build_cases(split: str, seed: int = 0, mutations: int = 2, samples: int = 0, sample_model_path: Optional[str] = None,
                timeout_s: float = 3.0, task_ids: Optional[Iterable[str]] = None, use_disk: bool = True) -> list[dict[str, Any]]:
    """The cases of a split (see the module docstring), from the disk cache when built before."""
    from envs.humaneval import _data_file, humaneval_problems  # noqa: PLC0415 (the envs and pydantic load where problems are read, not for --help)

    problems = humaneval_problems(split)
    if task_ids is not None:
        wanted = set(task_ids)
        problems = [p for p in problems if p["task_id"] in wanted]
    if not problems:  # nothing to build (and nothing worth a file)
        return []
    key = json.dumps({"format": CASES_FORMAT, "data": _data_file().stat().st_size, "split": split, "seed": seed,
                      "mutations": mutations, "samples": samples, "model": str(sample_model_path) if samples else None,
                      "timeout": timeout_s, "tasks": [p["task_id"] for p in problems]}, sort_keys=True)
    path = user_cache_dir("ctrl") / f"cases-{split}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsonl"
    if use_disk and path.is_file():
        return read_cases(path)
    with SandboxPool() as pool:
        cases = mutated_cases(problems, seed, mutations, pool, timeout_s)
        if samples:
            cases += sampled_cases(problems, samples, sample_model_path, seed, pool, timeout_s)
    if use_disk:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        write_cases(tmp, cases)
        tmp.replace(path)
    return cases


def balanced(cases: Sequence[dict[str, Any]], count: Optional[int], seed: int) -> list[dict[str, Any]]:
    """As many correct as incorrect cases (``count`` in all, or as many as the smaller side allows), drawn
    by a seeded RNG, one case per problem before a second one of the same problem."""
    rng = np.random.default_rng(seed)
    sides = [[c for c in cases if c["correct"]], [c for c in cases if not c["correct"]]]
    per_side = min(len(sides[0]), len(sides[1]), (count // 2) if count else len(cases))
    out = []
    for side in sides:
        order = [side[i] for i in rng.permutation(len(side))]
        seen: set[str] = set()
        first = []
        for c in order:  # the first case of each task
            if c["task_id"] not in seen:
                seen.add(c["task_id"])
                first.append(c)
        chosen = {id(c) for c in first}
        rest = [c for c in order if id(c) not in chosen]
        out += (first + rest)[:per_side]
    return out


def write_cases(path: str | Path, cases: Iterable[dict[str, Any]]) -> None:
    """One JSON object per line (the evaluation format)."""
    Path(path).write_text("".join(json.dumps(case) + "\n" for case in cases))


def read_cases(path: str | Path) -> list[dict[str, Any]]:
    """The cases of a JSONL file; a ConfigError naming the first bad line."""
    cases = []
    for number, case in jsonl_values(path, "--problems", "{\"prompt\", \"solution\", \"tests\": [...], \"correct\": bool}"):
        problem = _problem_error(case)
        if problem:
            raise ConfigError(f"--problems {path} line {number}: {problem}")
        case.setdefault("prefix", "")
        case.setdefault("task_id", f"line-{number}")
        case.setdefault("source", "file")
        cases.append(case)
    if not cases:
        raise ConfigError(f"--problems {path}: no cases in it")
    return cases


def _problem_error(case: Any) -> str:
    if not isinstance(case, dict):
        return "not a JSON object"
    for key in ("prompt", "solution"):
        if not isinstance(case.get(key), str):
            return f"needs a string \"{key}\""
    if not isinstance(case.get("tests"), list) or not case["tests"] or not all(isinstance(t, str) for t in case["tests"]):
        return "\"tests\" must be a non-empty list of Python statements"
    if not isinstance(case.get("correct"), bool):
        return "needs \"correct\": true or false"
    if not isinstance(case.get("prefix", ""), str):
        return "\"prefix\" must be a string"
    entry = case.get("entry_point")
    if entry is not None and not (isinstance(entry, str) and entry.isidentifier()):
        return "\"entry_point\" must be the name of the function under test"
    return ""


def reference_solutions(split: str) -> dict[str, str]:
    """Each problem's reference solution of a split, as the canonical cases hold it (the oracle critique of a
    mutant names the reference's line in place of the changed one)."""
    from envs.humaneval import humaneval_problems  # noqa: PLC0415 (as in build_cases)

    return {p["task_id"]: solution_source(p["code_prompt"], p["canonical_solution"], p["entry_point"])
            for p in humaneval_problems(split)}
