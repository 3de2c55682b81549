"""Per-file and per-test wall time of a pytest run, kept in ``tests/durations.json`` (``make durations``).

``--durations-json PATH``: as each file ends, its entry in PATH is replaced (a run cut short keeps what it
measured; files not run keep theirs): its seconds (set-up, call and tear-down of each of its tests, module fixtures included; collection
not), each test's seconds and outcome, the 1-minute load average when the file started and ended, and the
run's date, commit and machine speed (``--durations-machine``: the JSON that ``benchmarks/bench_env_raw.py
--out`` writes; the raw MetaWorld env's steps/s tells the faster kind of machine from the slower). The
terminal summary compares each file with what PATH held before, so a file that got slower shows. Timings
on a shared machine are noisy: compare figures of the same load and speed. Nothing here asserts a time.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("durations-json", "per-file wall time kept in a JSON file")
    group.addoption("--durations-json", default=None, metavar="PATH",
                    help="write each file's and each test's wall time into PATH (entries of files not run are kept)")
    group.addoption("--durations-machine", default=None, metavar="JSON",
                    help="benchmarks/bench_env_raw.py --out file: the machine's speed, recorded with the times")


def pytest_configure(config):
    path = config.getoption("--durations-json", default=None)
    if path:
        config.pluginmanager.register(DurationsRecorder(config, Path(path)), "durations-json-recorder")


def _commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "tests"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+tests-modified" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class DurationsRecorder:
    def __init__(self, config, path: Path) -> None:
        self.config, self.path = config, path
        self.files: dict[str, dict] = {}
        machine = config.getoption("--durations-machine")
        self.speed = None
        if machine and Path(machine).is_file():
            self.speed = json.loads(Path(machine).read_text()).get("raw_env_steps_per_sec_per_worker")
        self.started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.commit = _commit(Path(str(config.rootpath)))
        self.previous = self._read()

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        file = item.nodeid.split("::")[0]
        entry = self.files.get(file)
        if entry is None:
            entry = self.files[file] = {"seconds": 0.0, "load_1min": [round(os.getloadavg()[0], 2)], "tests": {}}
        start = time.monotonic()
        yield
        seconds = time.monotonic() - start
        entry["seconds"] += seconds
        entry["tests"].setdefault(item.nodeid, {})["seconds"] = round(seconds, 2)
        if nextitem is None or nextitem.nodeid.split("::")[0] != file:
            entry["load_1min"].append(round(os.getloadavg()[0], 2))
            self._write()  # after each file: a run cut short keeps what it measured

    def pytest_runtest_logreport(self, report):
        test = self.files.get(report.nodeid.split("::")[0], {}).get("tests", {}).setdefault(report.nodeid, {})
        if report.failed:
            test["outcome"] = "failed"
        elif report.skipped and test.get("outcome") != "failed":
            test["outcome"] = "skipped"
        elif report.when == "call" and "outcome" not in test:
            test["outcome"] = "passed"

    def pytest_terminal_summary(self, terminalreporter):
        if not self.files:
            return
        before = self.previous.get("files", {})
        terminalreporter.section("wall time per file (s)")
        terminalreporter.write_line(f"{'file':<48} {'recorded':>9} {'now':>8}  load 1 min (start, end)")
        for file, entry in sorted(self.files.items(), key=lambda kv: -kv[1]["seconds"]):
            old = before.get(file, {}).get("seconds")
            terminalreporter.write_line(f"{file:<48} {'-' if old is None else f'{old:.1f}':>9} {entry['seconds']:>8.1f}  "
                                        f"{entry['load_1min']}")
        terminalreporter.write_line(f"written: {self.path}")

    def _write(self) -> None:
        data = self._read() or {"about": "Per-file wall time of the test suite; refresh with `make durations` "
                                         "(FILES=... for some files). See tests/README.md."}
        files = data.setdefault("files", {})
        for file, entry in self.files.items():
            if len(entry["load_1min"]) < 2:  # still running
                continue
            outcomes = [t.get("outcome", "error") for t in entry["tests"].values()]
            files[file] = {"seconds": round(entry["seconds"], 1), "measured": self.started, "commit": self.commit,
                           "env_raw_steps_per_sec": self.speed, "cpus": os.cpu_count(), "load_1min": entry["load_1min"],
                           "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
                           "tests": {k: v["seconds"] for k, v in sorted(entry["tests"].items(), key=lambda kv: -kv[1]["seconds"])}}
        data["files"] = dict(sorted(files.items(), key=lambda kv: -(kv[1].get("seconds") or 0)))
        data["total_seconds"] = round(sum(f.get("seconds") or 0 for f in data["files"].values()), 1)
        self.path.write_text(json.dumps(data, indent=1) + "\n")
