"""Hostile candidates against the verdict's channel, the judge and the result cache: each one's real
function is wrong, and none may score more than plain wrong code, on its first run and on a second one,
through run_tests, a reused SandboxPool, the command line, the ``code_tests`` reward and the CTRL reward.
After each batch no candidate process is left, and every judge still alive is one the pool keeps idle.

- forged verdict lines: a test prints a value the candidate returned, which holds lines shaped like the
  judge's verdicts (every run number a caller may be at), for its own run and, left in the judge's
  stdout buffer or as a partial line, for the next candidate of the same judge;
- a judge that crashes, runs out of its CPU or is ended by a test: each named as what it is;
- a judge kept busy in one long C call on a candidate's value when its caller is SIGKILLed: it dies;
- two programs that a normalised cache key equated (a local's name or a docstring the code reads).
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from async_rl.sandbox import SandboxPool, isolation_mode, run_tests
from async_rl.sandbox.run import _judges

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10.0  # generous: only a hung run waits for it, and a timed-out run would leave no judge to reuse
WRONG = "def add(a, b):\n    return None\n"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5"]


def _forged_lines(runs=range(0, 64), tests=8) -> str:
    """Lines shaped like every verdict format the judge ever had, for each run number."""
    lines = []
    for run in runs:
        for tag in (f"{run}", f"{run} 00000000000000000000000000000000"):
            lines += [f"{tag} start", f"{tag} code ok"] + [f"{tag} test {i} 1" for i in range(tests)] + [f"{tag} done"]
    return "\n".join(lines) + "\n"


FORGED = _forged_lines()
# A test that prints what the candidate returned: the last test, so that its lines would come after the
# judge's own verdicts of the earlier ones (and, flushed, before the run's "done").
PRINTING = TESTS + ["print(add(1, 2), flush=True)"]
HACKS = {
    "forge_own_run": f"def add(a, b):\n    return {FORGED!r}\n",
    "forge_past_the_buffer": f"def add(a, b):\n    return {FORGED * 4!r}\n",  # written out at once, mid-test
    "partial_line": f"def add(a, b):\n    return {FORGED[:-5]!r}\n",  # ends in a partial line for the next run
}
# Left in the judge's stdout buffer (printed without a flush, small enough to stay there) for whatever the
# judge prints next: lines for the next runs of a fresh judge.
PLANTER = (f"def add(a, b):\n    return {_forged_lines(range(0, 8), 4)!r}\n", TESTS + ["print(add(1, 2))"])
VICTIM_TESTS = TESTS + ["print('the next run prints too', flush=True)"]


def _children_by_kind():
    """This process's child processes that are judges and candidates (pid lists)."""
    pids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            pids.update(int(p) for p in open(f"/proc/self/task/{task}/children").read().split())
        except OSError:
            pass
    kinds = {"judge": [], "candidate": []}
    for pid in pids:
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state in ("Z", "X"):
            continue
        if b"def judge_run(" in cmdline:
            kinds["judge"].append(pid)
        elif b"def private_root(" in cmdline:
            kinds["candidate"].append(pid)
    return kinds


def _assert_nothing_of_the_runs_left():
    kinds = _children_by_kind()
    idle = {j.proc.pid for j in _judges._idle}
    assert kinds["candidate"] == [], f"candidate processes outlived their runs: {kinds['candidate']}"
    assert set(kinds["judge"]) <= idle, f"judges neither kept idle nor ended: {set(kinds['judge']) - idle}"


def _wrong_score(tests):
    return run_tests(WRONG, tests, timeout_s=TIMEOUT_S).passed


@pytest.mark.parametrize("attempt", [1, 2])
def test_forged_verdict_lines_score_what_wrong_code_scores(attempt):
    wrong = _wrong_score(PRINTING)
    with SandboxPool(workers=2, timeout_s=TIMEOUT_S) as pool:
        results = dict(zip(HACKS, pool.map([(code, PRINTING) for code in HACKS.values()])))
    for name, result in results.items():
        assert result.passed <= wrong, f"attempt {attempt}: {name} scored {result.passed}, wrong code {wrong}: {result}"
    _assert_nothing_of_the_runs_left()


def _one_judge_runs(jobs):
    """The jobs one after the other through one pool thread, and the pid of the judge of each run."""
    out = []
    with SandboxPool(workers=1, timeout_s=TIMEOUT_S) as pool:
        for code, tests in jobs:
            out.append((pool.run(code, tests), sorted(j.proc.pid for j in _judges._idle)))
    return out


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_candidate_cannot_change_the_next_candidates_verdict(attempt):
    """The planter leaves forged lines in the judge's stdout buffer (or as a partial line); the wrong
    candidate after it, judged by the same judge, prints too. It scores what wrong code scores alone."""
    wrong = _wrong_score(VICTIM_TESTS)
    for planter in (PLANTER, (HACKS["partial_line"], PRINTING)):
        _judges.close()  # one judge for the pair: the planter's run and the victim's
        (planted, judges_after_planter), (victim, judges_after_victim) = _one_judge_runs(
            [planter, (WRONG, VICTIM_TESTS)])
        assert planted.passed <= _wrong_score(planter[1])
        assert judges_after_planter == judges_after_victim and len(judges_after_victim) == 1, \
            "the same judge judged both runs (else this test proves nothing)"
        assert victim.passed == wrong, f"attempt {attempt}: the next candidate scored {victim.passed}, alone {wrong}"
    _assert_nothing_of_the_runs_left()


def test_the_command_line(tmp_path):
    tests = tmp_path / "tests.txt"
    tests.write_text("\n".join(PRINTING) + "\n")

    def run(code):
        path = tmp_path / f"{uuid.uuid4().hex}.py"
        path.write_text(code)
        done = subprocess.run([sys.executable, "-m", "async_rl.sandbox", str(path), str(tests), "--timeout",
                               str(TIMEOUT_S)], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # exactly one JSON line: nothing of the judge's reaches stdout

    wrong = run(WRONG)["passed"]
    for attempt in (1, 2):
        for name, code in HACKS.items():
            out = run(code)
            assert out["passed"] <= wrong, f"CLI attempt {attempt}: {name} {out}, wrong code {wrong}"


def test_the_code_tests_reward():
    from async_rl.rewards.code_tests import make_code_tests

    reward = make_code_tests(timeout_s=TIMEOUT_S)
    answers = {"wrong": WRONG, **HACKS}
    completions = [f"```python\n{code}```" for code in answers.values()]
    for attempt in (1, 2):
        scores = dict(zip(answers, reward([""] * len(completions), completions, [PRINTING] * len(completions),
                                          entry_point=["add"] * len(completions))))
        for name, score in scores.items():
            assert score <= scores["wrong"], f"code_tests attempt {attempt}: {name} {score}, wrong {scores['wrong']}"
    _assert_nothing_of_the_runs_left()


# Two programs the old normalised key equated: the right one first, then a wrong one that differs only
# in a local's name (that it reads as a string) or a docstring (that it reads).
RIGHT_BY_NAME = "def add(a, b):\n    ok = a + b\n    return locals().get('ok')\n"
WRONG_BY_NAME = "def add(a, b):\n    no = a + b\n    return locals().get('ok')\n"
RIGHT_BY_DOC = "def add(a, b):\n    '''plus'''\n    return a + b if add.__doc__ == 'plus' else None\n"
WRONG_BY_DOC = "def add(a, b):\n    '''minus'''\n    return a + b if add.__doc__ == 'plus' else None\n"


def test_the_ctrl_reward_and_its_cache():
    from async_rl.ctrl.reward import ResultCache, critique_reward, score_revision

    critique = "The solution is wrong.\nOverall judgment: Incorrect"

    def reward(code, cache, pool):
        future, hit = score_revision(f"```python\n{code}```", PRINTING, "", cache, pool, TIMEOUT_S, "add")
        return critique_reward(critique, future.result(), "pass_rate")[0], hit

    with SandboxPool(workers=2) as pool:
        for attempt in (1, 2):  # a fresh cache each time: the second attempt runs again
            cache = ResultCache()
            wrong = reward(WRONG, cache, pool)[0]
            for name, code in HACKS.items():
                assert reward(code, cache, pool)[0] <= wrong, f"CTRL attempt {attempt}: {name}"
            for right, wrong_twin in ((RIGHT_BY_NAME, WRONG_BY_NAME), (RIGHT_BY_DOC, WRONG_BY_DOC)):
                assert reward(right, cache, pool) == (1.0, False)
                assert reward(wrong_twin, cache, pool) == (wrong, False), "a wrong program got a right one's verdict"
                assert reward(wrong_twin, cache, pool) == (wrong, True)  # the same text: answered by the cache
            assert cache.hits == 2 and cache.lookups == 1 + len(HACKS) + 6
    _assert_nothing_of_the_runs_left()


def test_a_judge_that_fails_is_named_for_what_happened():
    """A judge killed by a signal is ``error`` (not the candidate's ``exit``, not ``timeout``), one out
    of its CPU for the run ``timeout``, one a test ended ``exit``; none of them is kept."""
    crash = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"
    out_of_cpu = ("import resource\nu = resource.getrusage(resource.RUSAGE_SELF)\n"
                  "resource.setrlimit(resource.RLIMIT_CPU, (int(u.ru_utime + u.ru_stime) + 1, "
                  "resource.getrlimit(resource.RLIMIT_CPU)[1]))\nwhile True:\n    pass")
    ended = "import os\nos._exit(3)"
    right = "def add(a, b):\n    return a + b\n"
    for test, reason in ((crash, "error"), (out_of_cpu, "timeout"), (ended, "exit")):
        result = run_tests(right, [TESTS[0], test, TESTS[1]], timeout_s=30.0)
        assert (result.passed, result.reason) == (1, reason), (test, result)
        _assert_nothing_of_the_runs_left()
    assert run_tests(right, TESTS, timeout_s=TIMEOUT_S).reason == "ok"  # and the next run is judged as usual


def _alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(isolation_mode() != "namespaces", reason="needs the namespace sandbox")
def test_a_judge_busy_in_one_long_c_call_dies_with_its_sigkilled_caller():
    """The candidate returns a string on which the test's regular expression backtracks for hours, in
    one C call that holds the judge's interpreter: its caller is SIGKILLed, the judge must die at once."""
    code = "def add(a, b):\n    return 'a' * 60\n"
    tests = ["import re\nassert re.match(r'(a|aa)+c', add(1, 2))"]
    caller = subprocess.Popen([sys.executable, "-c", "from async_rl.sandbox import run_tests\n"
                               f"run_tests({code!r}, {tests!r}, timeout_s=300)\n"], cwd=ROOT, stdout=subprocess.DEVNULL)
    judge = None
    try:
        deadline = time.monotonic() + 90
        while judge is None and time.monotonic() < deadline:  # the judge that is burning CPU on the run
            for task in os.listdir(f"/proc/{caller.pid}/task"):
                for pid in open(f"/proc/{caller.pid}/task/{task}/children").read().split():
                    try:
                        if b"def judge_run(" in open(f"/proc/{pid}/cmdline", "rb").read() and _cpu_seconds(pid) > 1.0:
                            judge = int(pid)
                    except OSError:
                        pass
            time.sleep(0.1)
        assert judge is not None, "no judge of the run got busy"
        caller.send_signal(signal.SIGKILL)
        caller.wait()
        deadline = time.monotonic() + 10
        while _alive(judge) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(judge), "the judge outlived its SIGKILLed caller"
    finally:
        caller.kill()
        caller.wait()
        if judge is not None:
            try:
                os.kill(judge, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_candidates_exit_status_does_not_read_as_its_cpu_limit():
    """128 + SIGXCPU is what the candidate's reaper reports for a CPU-limit kill: a candidate that exits
    with that status, or sends itself SIGXCPU, without having spent its CPU ended itself (``exit``)."""
    for code in ("import os\ndef add(a, b):\n    os._exit(128 + 24)\n",
                 "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGXCPU)\n"):
        result = run_tests(code, TESTS, timeout_s=TIMEOUT_S)
        assert (result.passed, result.reason) == (0, "exit"), (code, result)
    _assert_nothing_of_the_runs_left()
