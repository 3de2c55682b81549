"""Sandbox cost per candidate: HumanEval's canonical solutions through ``async_rl.sandbox``.

Runs every problem's canonical solution (the prompt + its ``canonical_solution``) against the
problem's tests as the HumanEval env does, first one at a time (wall milliseconds per candidate),
then through a ``SandboxPool`` of ``--workers`` threads (default 2; candidates per second). Also
counts how many canonical solutions pass all their tests: an honest answer must pass, whatever the
sandbox does to stop forgeries.

    .venv/bin/python benchmarks/bench_sandbox.py --quick --out benchmarks/results/sandbox_quick.json

``--quick``: the first 40 problems; otherwise all 164. The cost before a change: the same script run
from an export of the older tree (``git archive REV async_rl envs benchmarks | tar -x -C DIR``).
The figures depend on the machine's load, recorded with them (``load_avg_1min_before`` / ``_after``).
"""
from __future__ import annotations

import inspect
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import parser, report, run_facts

HEADLINE = ("ms_per_candidate_median", "ms_per_candidate_mean", "pool_candidates_per_s", "pool_workers",
            "canonical_all_passed",
            "canonical_problems", "isolation", "load_avg_1min_before", "load_avg_1min_after")


def _jobs(limit: int) -> list[tuple[str, list[str], dict]]:
    """(code, tests, extra keyword args of run_tests) per problem, as the env hands them to the sandbox."""
    from async_rl import sandbox
    from envs.humaneval import _problems

    takes_prefix = "prefix" in inspect.signature(sandbox.run_tests).parameters
    jobs = []
    for p in _problems()[:limit]:
        code = p["code_prompt"] + p["canonical_solution"]
        if takes_prefix:  # the prompt's helpers are given apart, so they come from the prompt, not the candidate
            jobs.append((code, list(p["tests"]), {"prefix": p["prefix"], "entry_point": p["entry_point"]}))
        else:
            jobs.append((f"{p['prefix']}\n\n{code}", list(p["tests"]), {}))
    return jobs


def main() -> None:
    ap = parser(__doc__, "the first 40 problems instead of all 164")
    ap.add_argument("--workers", type=int, default=2, help="the SandboxPool's threads for the throughput figure")
    args = ap.parse_args()
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    from async_rl.sandbox import SandboxPool, isolation_mode, run_tests

    load_before, t_start = __import__("os").getloadavg(), time.monotonic()
    jobs = _jobs(40 if args.quick else 164)
    mode = isolation_mode()
    run_tests(*jobs[0][:2], **jobs[0][2])  # warm-up: imports and the first interpreter start
    seconds, passed, failures = [], 0, []
    for code, tests, extra in jobs:
        t0 = time.monotonic()
        result = run_tests(code, tests, timeout_s=3.0, **extra)
        seconds.append(time.monotonic() - t0)
        passed += result.all_passed
        if not result.all_passed:
            failures.append(f"{len(seconds) - 1}:{result.passed}/{result.total}:{result.reason}")
    with SandboxPool(workers=args.workers) as pool:
        t0 = time.monotonic()
        futures = [pool.submit(code, tests, timeout_s=3.0, **extra) for code, tests, extra in jobs]
        pool_results = [f.result() for f in futures]
        pool_s = time.monotonic() - t0
    figures = {
        "isolation": mode,
        "canonical_problems": len(jobs),
        "canonical_all_passed": passed,
        "canonical_all_passed_pool": sum(r.all_passed for r in pool_results),
        "canonical_failures": " ".join(failures),
        "ms_per_candidate_median": round(1000 * statistics.median(seconds), 1),
        "ms_per_candidate_mean": round(1000 * statistics.mean(seconds), 1),
        "ms_per_candidate_max": round(1000 * max(seconds), 1),
        "pool_workers": args.workers,
        "pool_candidates_per_s": round(len(jobs) / pool_s, 2),
        **run_facts(args.quick, load_before, __import__("os").getloadavg(), time.monotonic() - t_start),
    }
    report(figures, args, headline=HEADLINE)


if __name__ == "__main__":
    main()
