"""The code sandbox against hostile candidates: real subprocesses, real limits, the caller survives.

Every hostile case runs through one SandboxPool (in parallel) and is checked for its score, its
reason, and the absence of its side effect on the host.
"""
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.code_blocks import extract_code
from async_rl.sandbox import REASONS, SandboxPool, isolation_mode, run_tests

ROOT = Path(__file__).resolve().parents[2]
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=4, timeout_s=1.5) as p:
        yield p


@pytest.fixture(scope="module")
def listener():
    """A real TCP server on the host's loopback: a candidate must not reach it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.2)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def outcomes(pool, listener, tmp_path_factory):
    host = tmp_path_factory.mktemp("host")
    port = listener.getsockname()[1]
    cases = {
        "correct": (ADD, ADD_TESTS),
        "one_wrong": ("def add(a, b):\n    return 4\n", ADD_TESTS),
        "infinite_loop": ("while True:\n    pass\n", ADD_TESTS),
        "sleeps_in_test": ("import time\ndef add(a, b):\n    time.sleep(60)\n", ADD_TESTS),
        "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", ADD_TESTS),
        "fork_refused": (
            "import os\nforks = 0\ntry:\n    while forks < 1000:\n        os.fork()\n        forks += 1\n"
            "except OSError:\n    pass\n" + ADD, ["assert forks == 0"] + ADD_TESTS),
        "huge_allocation": ("blob = bytearray(64 * 2**30)\n" + ADD, ADD_TESTS),
        "os_system": (f"import os\nrc = os.system('touch {host}/by_system')\n" + ADD, ["assert rc == 0"]),
        "subprocess": (f"import subprocess\nsubprocess.run(['touch', '{host}/by_subprocess'])\n", ADD_TESTS),
        "network": (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n" + ADD, ADD_TESTS),
        "write_outside": (f"open('{host}/by_open', 'w').write('x')\n" + ADD, ADD_TESTS),
        "write_cwd_ok": ("open('mine.txt', 'w').write('x')\nread_back = open('mine.txt').read()\n" + ADD,
                         ["assert read_back == 'x'"]),  # the tests run in the judge: they see the code's values
        "kill_parent": ("import os, signal\nfor target in (os.getppid(), 1, -1, 0 - os.getppid()):\n"
                        "    try:\n        os.kill(target, signal.SIGKILL)\n    except OSError:\n        pass\n" + ADD,
                        ADD_TESTS),
        "syntax_error": ("def add(a, b):\n    return a +\n", ADD_TESTS),
        "fake_results": (
            "import os, sys\nline = b'test 0 1\\ntest 1 1\\ntest 2 1\\ndone\\n'\nprint(line.decode())\n"
            "for fd in range(1, 300):\n    try:\n        os.write(fd, line)\n    except OSError:\n        pass\n"
            "os._exit(0)\n", ADD_TESTS),
        "sys_exit_then_tests": (ADD + "import sys\nsys.exit(0)\n", ADD_TESTS),
        "exit_in_test": ("import os\ndef add(a, b):\n    os._exit(0)\n", ADD_TESTS),
        "print_flood": ("while True:\n    print('x' * 4096)\n", ADD_TESTS),
    }
    results = pool.map(list(cases.values()))
    connected = True
    try:
        listener.accept()[0].close()
    except OSError:  # socket.timeout: nobody came
        connected = False
    return dict(zip(cases, results)), host, connected


def _check(outcomes, name, passed, reason):
    result = outcomes[0][name]
    assert (result.passed, result.reason) == (passed, reason), f"{name}: {result}"
    assert result.reason in REASONS
    return result


def test_correct_and_partially_wrong_code(outcomes):
    _check(outcomes, "correct", 3, "ok")
    _check(outcomes, "one_wrong", 1, "ok")  # return 4: only add(2, 2) == 4 passes
    assert outcomes[0]["one_wrong"].total == 3


def test_one_failing_assert_does_not_stop_the_others():
    result = run_tests(ADD, ["assert add(1, 1) == 3", "assert add(1, 2) == 3", "assert 1/0", "assert add(0, 0) == 0"])
    assert (result.passed, result.total, result.reason) == (2, 4, "ok")


def test_infinite_loop_and_sleeping_test_time_out(outcomes):
    for name in ("infinite_loop", "sleeps_in_test"):
        result = _check(outcomes, name, 0, "timeout")
        assert result.seconds < 1.5 + 20  # the wall timeout ended it (startup on a loaded machine excluded)


def test_fork_bomb_is_refused(outcomes):
    _check(outcomes, "fork_bomb", 0, "crash")  # the first fork raised: nothing was ever forked
    _check(outcomes, "fork_refused", 4, "ok")  # forks == 0, and the code after it still works


def test_huge_allocation_is_a_memory_error(outcomes):
    _check(outcomes, "huge_allocation", 0, "memory")


def test_os_system_and_subprocess_run_nothing(outcomes):
    _check(outcomes, "os_system", 0, "ok")  # os.system returned an error code, the test failed
    _check(outcomes, "subprocess", 0, "crash")
    host = outcomes[1]
    assert not (host / "by_system").exists() and not (host / "by_subprocess").exists()


def test_no_network(outcomes):
    _check(outcomes, "network", 0, "crash")
    assert outcomes[2] is False, "the candidate reached a server on the host's loopback"


def test_no_writes_outside_its_directory(outcomes):
    _check(outcomes, "write_outside", 0, "crash")
    assert not (outcomes[1] / "by_open").exists()
    _check(outcomes, "write_cwd_ok", 1, "ok")


def test_killing_the_parent_kills_nobody(outcomes):
    _check(outcomes, "kill_parent", 3, "ok")  # every kill was refused; the code went on
    assert run_tests(ADD, ADD_TESTS).passed == 3  # and the caller is alive and well


def test_syntax_error(outcomes):
    _check(outcomes, "syntax_error", 0, "syntax_error")


def test_printed_or_written_fake_results_do_not_count(outcomes):
    _check(outcomes, "fake_results", 0, "bad_result")  # its lines reached the judge: not answers, scored 0


def test_exits(outcomes):
    _check(outcomes, "sys_exit_then_tests", 3, "crash")  # SystemExit is caught: the tests still ran
    _check(outcomes, "exit_in_test", 0, "exit")  # os._exit in the first test: the rest never ran


def test_output_is_capped(outcomes):
    result = _check(outcomes, "print_flood", 0, "output_limit")  # killed at the cap, not at the timeout
    assert 0 < len(result.stdout) <= 64 * 1024


def test_no_code_and_bad_limits():
    assert run_tests("", ADD_TESTS).reason == "no_code"
    assert run_tests(None, ADD_TESTS).to_json() == {"passed": 0, "total": 3, "reason": "no_code"}
    with pytest.raises(ValueError, match="timeout_s"):
        run_tests(ADD, ADD_TESTS, timeout_s=0)


def test_isolation_mode_is_namespaces_where_unshare_works():
    mode = isolation_mode()
    assert mode in ("namespaces", "weak")
    kernel = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
    if kernel >= (5, 12) and subprocess.run(["unshare", "--user", "--map-root-user", "--net", "true"],
                                                  capture_output=True).returncode == 0:
        assert mode == "namespaces"


def test_pool_keeps_order_and_pickles(pool):
    results = pool.map([(ADD, ADD_TESTS), ("def add(a, b):\n    return 0\n", ADD_TESTS), ("", ADD_TESTS)])
    assert [(r.passed, r.reason) for r in results] == [(3, "ok"), (1, "ok"), (0, "no_code")]
    clone = pickle.loads(pickle.dumps(pool))
    try:
        assert clone.workers == 4 and clone.run(ADD, ADD_TESTS[:1]).passed == 1
    finally:
        clone.close()


def test_command_line(tmp_path):
    code, tests = tmp_path / "code.py", tmp_path / "tests.txt"
    code.write_text(ADD)
    tests.write_text("assert add(1, 2) == 3\n\nassert add(1, 1) == 3\nimport os; os._exit(1)\n")
    cmd = [sys.executable, "-m", "async_rl.sandbox"]
    done = subprocess.run(cmd + [str(code), str(tests), "--timeout", "2"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"passed": 1, "total": 3, "reason": "exit"}
    bad = subprocess.run(cmd + [str(code), str(tmp_path / "missing.txt")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "missing.txt" in bad.stderr
    bad = subprocess.run(cmd + [str(code)], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_extract_code():
    answer = "Sure.\n```python\ndef add(a, b):\n    return a + b\n```\nAlso ```py\nx = 1\n```"
    assert extract_code(answer) == ADD
    assert extract_code("```\nplain = 1\n```") == "plain = 1\n"
    assert extract_code("```text\nnot code\n```\n```python\ncode = 1\n```") == "code = 1\n"
    assert extract_code("```python\ndef cut(:\n") == "def cut(:\n"  # cut at max tokens: a syntax error later
    assert extract_code("just prose") is None and extract_code("```python\n\n```") is None and extract_code(None) is None


def test_weak_mode_still_refuses_the_obvious(monkeypatch, tmp_path):
    """The fallback without namespaces (said once on stderr): rlimits, seccomp and Python-level refusals."""
    import async_rl.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_mode", "weak")
    jobs = {
        "correct": (ADD + "open('mine.txt', 'w').write('x')\nimport tempfile\ntempfile.TemporaryFile().write(b'x')\n",
                    ADD_TESTS),
        "write_outside": (f"open('{tmp_path}/by_open', 'w').write('x')\n", ["assert True"]),
        "os_system": (f"import os\nos.system('touch {tmp_path}/by_system')\n", ["assert True"]),
        "fork": ("import os\nos.fork()\n", ["assert True"]),
        "network": ("import socket\nsocket.create_connection(('127.0.0.1', 9))\n", ["assert True"]),
        "loop": ("while True:\n    pass\n", ["assert True"]),
    }
    got = {name: run_tests(code, tests, timeout_s=1.0) for name, (code, tests) in jobs.items()}
    assert {k: (r.passed, r.reason) for k, r in got.items()} == {
        "correct": (3, "ok"), "write_outside": (1, "crash"), "os_system": (1, "crash"), "fork": (1, "crash"),
        "network": (1, "crash"), "loop": (0, "timeout")}
    assert list(tmp_path.iterdir()) == []


def test_no_isolation_fails_closed_unless_weak_is_allowed(monkeypatch, tmp_path):
    """Without a working unshare: refused, in one line saying how to allow the weak mode; allowed, it runs."""
    import async_rl.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_mode", None)
    monkeypatch.setattr(sandbox, "_variant", None)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.setenv("ASYNC_RL_SANDBOX_MODE", "strict")
    with pytest.raises(sandbox.SandboxUnavailable) as refused:
        run_tests(ADD, ADD_TESTS)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and "unshare" in message and "--sandbox-mode weak" in message
    sandbox.set_sandbox_mode("weak")
    result = run_tests(ADD, ADD_TESTS)
    assert (result.passed, result.reason, sandbox.isolation_mode()) == (3, "ok", "weak")
    with pytest.raises(ValueError, match="sandbox mode"):
        sandbox.set_sandbox_mode("off")
    # the command line: one line and exit 2 when refused (no unshare on PATH), the JSON when allowed
    code, tests = tmp_path / "code.py", tmp_path / "tests.txt"
    code.write_text(ADD)
    tests.write_text("assert add(1, 2) == 3\n")
    cmd = [sys.executable, "-m", "async_rl.sandbox", str(code), str(tests)]
    env = {"PATH": str(tmp_path), "PYTHONPATH": str(ROOT)}
    refused = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    allowed = subprocess.run(cmd + ["--sandbox-mode", "weak"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert allowed.returncode == 0 and json.loads(allowed.stdout) == {"passed": 1, "total": 1, "reason": "ok"}


def test_plain_data_wire_is_strict():
    """What crosses from a candidate to the judge: exact plain types only, rebuilt by the judge itself."""
    from async_rl.sandbox.wire import NotPlain, dump_line, from_plain, parse_line, to_plain

    value = [None, True, 3, -2.5, float("inf"), "s", b"\x00b", 1 + 2j, (1, (2,)), {1, 2}, frozenset({3}),
             {"k": [1], 2: (3,)}]
    back = from_plain(parse_line(dump_line({"value": to_plain(value)}).rstrip(b"\n"))["value"])
    assert back == value and [type(v) for v in back] == [type(v) for v in value]

    class Int(int):
        def __eq__(self, other):
            return True

    nested = []
    for _ in range(100):
        nested = [nested]
    for bad in (Int(1), object(), (x for x in ()), len, nested):
        with pytest.raises(NotPlain):
            to_plain(bad)
    for node in ({"X": []}, {"L": [], "T": []}, {"S": [{"L": []}]}, {"D": [[1]]}, {"C": ["a", 1]}, [1]):
        with pytest.raises(NotPlain):
            from_plain(node)
    for line in (b"{", b"[1]", b"\xff", b"1" * 5000):
        with pytest.raises(NotPlain):
            parse_line(line)
