"""Line coverage of async_rl/ and envs/ over a pytest run, the processes it starts included (`make coverage`;
tests/README.md, Coverage). Not a test module and not a pytest plug-in: `make test` never loads it.

    python tests/coverage_record.py --out tests/coverage.json -- python -m pytest tests -q ...

runs the command after `--` unchanged, with three variables in its environment:
COVERAGE_PROCESS_START=.coveragerc (coverage's a1_coverage.pth then measures every Python process of .venv
that inherits it: the pytest process, Ray's workers through the raylet, launch scripts, multiprocessing
children), COVERAGE_FILE=runs/coverage/.coverage (one data file per process) and PYTHONPATH with
tests/coverage_hook first (its sitecustomize saves an actor's data as each call returns: `ray.kill` ends a
worker with no exit handler). Then it combines the data files and writes OUT: the line coverage (percent, and
statements / missed) in total, per package and per file, with the date, commit, the run's wall seconds, its
1-minute load at start and end, and pytest's summary line and exit status. Exits with the command's status.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("async_rl", "envs")
RCFILE = ROOT / ".coveragerc"
HOOK = ROOT / "tests" / "coverage_hook"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def run_measured(command: list[str], data_dir: Path) -> tuple[int, float, list[str]]:
    """The command's exit status, wall seconds and its last output lines (its output passes through)."""
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    env = dict(os.environ)
    env.pop("COVERAGE_PROCESS_CONFIG", None)  # a run nested in a measured one (tests/tools/test_coverage_config.py)
    env["COVERAGE_PROCESS_START"] = str(RCFILE)
    env["COVERAGE_FILE"] = str(data_dir / ".coverage")
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK), *filter(None, [env.get("PYTHONPATH")])])
    tail: list[str] = []
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        tail = (tail + [line.rstrip("\n")])[-400:]
    rc = proc.wait()
    return rc, round(time.monotonic() - start, 1), tail


def figures(data_dir: Path) -> dict:
    """Combine the per-process data files and count statements and missed lines per file and package."""
    import coverage

    processes = sum(1 for _ in data_dir.glob(".coverage.*"))
    combined = data_dir / ".coverage"
    cov = coverage.Coverage(data_file=str(combined), config_file=str(RCFILE))
    cov.combine([str(data_dir)], strict=False, keep=False)
    cov.save()
    cov = coverage.Coverage(data_file=str(combined), config_file=str(RCFILE))
    cov.load()
    with open(data_dir / "report.txt", "w") as report:
        total_reported = cov.report(file=report, show_missing=True)
    files: dict[str, list[int]] = {}
    for path in sorted(cov.get_data().measured_files()):
        rel = os.path.relpath(path, ROOT)
        if rel.split(os.sep)[0] not in PACKAGES:
            continue
        try:
            _, statements, _, missing, _ = cov.analysis2(path)
        except Exception:  # noqa: BLE001  a file gone since (another engineer's change): not counted
            continue
        if statements:
            files[rel] = [len(statements), len(missing)]

    def percent(rows) -> dict:
        statements = sum(s for s, _ in rows)
        missed = sum(m for _, m in rows)
        return {"line_coverage_percent": round(100.0 * (statements - missed) / statements, 2) if statements else None,
                "statements": statements, "missed": missed, "files": len(rows)}

    packages = {p: percent([v for k, v in files.items() if k.split(os.sep)[0] == p]) for p in PACKAGES}
    total = percent(list(files.values()))
    return {"total": total, "packages": packages, "coverage_report_total_percent": round(total_reported, 2),
            "files": {k: {"statements": s, "missed": m} for k, (s, m) in files.items()},
            "processes_measured": processes}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: coverage_record.py [--out JSON] [--data-dir DIR] -- COMMAND...", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "coverage.json"))
    parser.add_argument("--data-dir", default=str(ROOT / "runs" / "coverage"))
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    data_dir = Path(args.data_dir).resolve()
    started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    load_start = _load()
    dirty = _git("status", "--porcelain", "--untracked-files=all", "--", *PACKAGES, "tests").splitlines()
    rc, wall_s, tail = run_measured(command, data_dir)
    load_end = _load()
    dirty_end = _git("status", "--porcelain", "--untracked-files=all", "--", *PACKAGES, "tests").splitlines()
    summary = next((line.strip("= ") for line in reversed(tail)
                    if re.search(r"\d+ (passed|failed|error)", line)), "")
    failed = sorted({m.group(1) for line in tail for m in [re.match(r"(?:FAILED|ERROR) (\S+)", line)] if m})
    measured = figures(data_dir)
    result = {
        "about": "line coverage (coverage.py, .coveragerc) of async_rl/ and envs/ over the command below, the "
                 "processes it starts included (Ray actors, launch scripts); tests/README.md, Coverage",
        "line_coverage_percent": measured["total"]["line_coverage_percent"],
        "per_package": measured["packages"],
        "total": measured["total"],
        "date": started.isoformat().replace("+00:00", "Z"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        # the working tree is measured: its uncommitted changes (a file edited during the run can shift lines)
        "uncommitted_paths_at_start": dirty,
        "uncommitted_paths_at_end": dirty_end,
        "command": " ".join(command),
        "wall_seconds": wall_s,
        "load_1min": [load_start, load_end],
        "cpus": os.cpu_count(),
        "exit_status": rc,
        "pytest_summary": summary,
        "failed": failed,
        "processes_measured": measured["processes_measured"],
        "coverage_report_total_percent": measured["coverage_report_total_percent"],
        "files": measured["files"],
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"[coverage] {result['line_coverage_percent']} % of the lines of async_rl/ and envs/ "
          f"(async_rl {measured['packages']['async_rl']['line_coverage_percent']} %, envs "
          f"{measured['packages']['envs']['line_coverage_percent']} %), {wall_s} s, load {load_start}-{load_end}, "
          f"{measured['processes_measured']} processes; per file: {data_dir / 'report.txt'}; written to {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
