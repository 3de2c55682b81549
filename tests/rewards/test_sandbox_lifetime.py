"""No process of a candidate (nor its judge) outlives the process that asked for it, even when that
caller is SIGKILLed mid-run and so never gets to clean up: a sleeping candidate must not run on.

The candidate names itself (``prctl(PR_SET_NAME)``, seen in the host's ``/proc/PID/comm``) so that the
test finds it; every wait polls with a deadline.
"""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from async_rl.sandbox import isolation_mode

ROOT = Path(__file__).resolve().parents[2]
START_S = 90.0  # the caller's interpreter, the isolation probe and the candidate's start, on a loaded machine
GONE_S = 15.0  # after the caller's SIGKILL, every process of the run must be gone within this


def _identity(pid: int):
    """(start time, state) of a live process, None when it is gone or a zombie (its start time tells a
    reused pid apart)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = open(f"/proc/{parent}/task/{task}/children").read().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _named(marker: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if open(f"/proc/{entry}/comm").read().strip() == marker and _identity(int(entry)):
                    out.append(int(entry))
            except OSError:
                pass
    return out


def _wait_for(predicate, seconds: float):
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.mark.parametrize("sleeper,how", [("candidate", "run_tests"), ("candidate", "pool"), ("judge", "run_tests"),
                                         ("candidate", "weak")],
                         ids=["candidate-run_tests", "candidate-SandboxPool", "judge-busy-in-a-test", "candidate-weak"])
def test_no_process_of_a_run_outlives_its_sigkilled_caller(sleeper, how):
    if how != "weak" and isolation_mode() != "namespaces":
        pytest.skip("needs the namespace sandbox")
    marker = "c" + uuid.uuid4().hex[:14]  # comm holds 15 characters
    code = (f"import ctypes, time\nctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0)\n"
            f"{'time.sleep(60)' if sleeper == 'candidate' else ''}\ndef f():\n    return 1\n")
    tests = ["assert f() == 1"] if sleeper == "candidate" else ["__import__('time').sleep(60)"]
    run = {"run_tests": f"run_tests(CODE, {tests!r}, timeout_s=60)",
           "pool": f"SandboxPool(workers=2).run(CODE, {tests!r}, timeout_s=60)",
           "weak": f"run_candidate(CODE, {tests!r}, '', None, 60.0, 1024, 32, 1 << 16, 1 << 20, 'weak')"}[how]
    caller = subprocess.Popen([sys.executable, "-c", "from async_rl.sandbox import SandboxPool, run_tests\n"
                               f"from async_rl.sandbox.run import run_candidate\nCODE = {code!r}\n{run}\n"],
                              cwd=ROOT, stdout=subprocess.DEVNULL)
    survivors: dict[int, str] = {}
    try:
        assert _wait_for(lambda: _named(marker), START_S), "the candidate never started"
        run_pids = _descendants(caller.pid)  # unshare, the namespace's first process, the candidate, the judge
        identities = {pid: _identity(pid) for pid in run_pids}
        assert set(_named(marker)) <= run_pids
        expected = 3 if how == "weak" else 4  # (unshare), the reaper, the candidate, the judge
        assert len(run_pids) >= expected, f"expected {expected} processes in the run, got {run_pids}"
        caller.send_signal(signal.SIGKILL)
        caller.wait()

        def alive():
            return {pid: ident for pid, ident in identities.items() if ident and _identity(pid) == ident}

        _wait_for(lambda: not alive(), GONE_S)
        survivors = alive()
        assert not survivors, f"processes of the run outlived their SIGKILLed caller: {sorted(survivors)}"
        assert not _named(marker)
    finally:
        caller.kill()
        caller.wait()
        for pid in list(survivors) + _named(marker):  # leave nothing behind on a failure
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
