"""One candidate's run: its sandboxed process, a judge, the channels between them, and the verdict.

``run_candidate`` starts the candidate's process (``sandbox/child.py``, inside ``unshare`` unless the
mode is weak), hands its tests to a judge (``sandbox/judge.py``), reads the judge's verdicts and the
candidate's stdout and stderr under their caps, and kills what is left. Judges are trusted and hold no
candidate state between runs (a fresh namespace per run), so a judge that finished a run cleanly is
kept for the next one (``_JudgePool``): a Python start per candidate saved. A judge whose run did not
end cleanly (timeout, a cap, a broken channel, a line that is not the run's) is killed, never reused.

The verdicts of a run come on a pipe made for that run alone, whose write end only the judge holds,
each line tagged with the run's number and a random nonce (``secrets``) that only the judge learns; a
judge's stdout and stderr (what a test prints) go to /dev/null. Judges are started from one thread
that lives as long as this process (``_Spawner``), so that their ``PR_SET_PDEATHSIG`` fires only when
this process ends. A judge that ends a run without ``done`` is told apart: a test's ``os._exit`` is
``exit``, its CPU limit ``timeout``, any other end (a signal, its own failure) ``error``. The public
face, the modes and the pool are ``async_rl/sandbox/``.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import queue
import secrets
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from async_rl.sandbox.leftovers import sweep
from async_rl.sandbox.limits import cgroup_for, release_cgroup

REASONS = ("ok", "no_code", "syntax_error", "crash", "exit", "timeout", "memory", "killed", "output_limit",
           "result_limit", "bad_result", "error")
_HERE = Path(__file__).parent
_WIRE = (_HERE / "wire.py").read_text()
_CHILD_SOURCE = _WIRE + (_HERE / "seccomp.py").read_text() + (_HERE / "child.py").read_text()
_JUDGE_SOURCE = _WIRE + (_HERE / "judge.py").read_text()
# Every namespace that holds state a candidate could leave for the next one: its System V IPC and POSIX
# message queues (--ipc), hostname (--uts), cgroup view (--cgroup), besides network, PID and mounts. (A time
# namespace would hold only clock offsets, which no process of the candidate can set.)
_NAMESPACES = ("--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--ipc", "--uts", "--cgroup",
               "--")
VARIANTS = {"root": ("unshare",) + _NAMESPACES,  # root caller: no user namespace, the candidate gets a uid
            "userns": ("unshare", "--user", "--map-root-user") + _NAMESPACES}
# One unprivileged uid per concurrent candidate of this process (RLIMIT_NPROC counts per uid): a block of
# _UIDS_PER_PROCESS uids per process id, so that candidates of different processes do not share one either.
_UID_BASE, _UIDS_PER_PROCESS = 2_000_000_000, 256
_STARTUP_S = 20.0  # interpreter start on a loaded machine; not part of the candidate's timeout
_BACKSTOP_S = 10.0  # the candidate's own wall bound lies this far past the caller's deadline (a stalled caller)
_JUDGE_RUNS = 1000  # a judge is replaced after this many runs (bounded drift of its memory)
_JUDGE_FAILED = 70  # sandbox/judge.py's JUDGE_FAILED: the judge failed itself
_PYTHON_DIRS = sorted({os.path.realpath(p) for k, p in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib")})


@dataclass(frozen=True)
class SandboxResult:
    passed: int
    total: int
    reason: str
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @property
    def fraction(self) -> float:
        """passed / total (0 without tests)."""
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        """Whether the code passed every one of its (at least one) tests."""
        return self.total > 0 and self.passed == self.total

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "total": self.total, "reason": self.reason}


class _Slots:
    """Small integers for concurrent candidates: each one's uid and cgroup."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[int] = []
        self._next = 0

    def take(self) -> int:
        with self._lock:
            if self._free:
                return self._free.pop()
            self._next += 1
            return self._next - 1

    def give(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)


class _Spawner:
    """Starts every judge from one thread that lives as long as this process: a judge's
    ``PR_SET_PDEATHSIG`` fires when the thread that started it ends, and the pool threads that ask for
    judges come and go while the judges they started are reused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._orders: "queue.SimpleQueue[tuple[list[str], dict[str, Any], concurrent.futures.Future[subprocess.Popen[bytes]]]]" = queue.SimpleQueue()
        self._pid = -1  # the process whose thread is running (a forked child starts its own)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._pid != os.getpid():
                self._orders = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._orders,), name="sandbox-judges", daemon=True).start()
                self._pid = os.getpid()
            done: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
            self._orders.put((argv, kwargs, done))
        return done.result()

    @staticmethod
    def _serve(orders: queue.SimpleQueue[tuple[list[str], dict[str, Any], concurrent.futures.Future[subprocess.Popen[bytes]]]]) -> None:
        while True:
            argv, kwargs, done = orders.get()
            try:
                done.set_result(subprocess.Popen(argv, **kwargs))
            except BaseException as exc:  # noqa: BLE001 (OSError (no memory, too many processes): the caller's error)
                done.set_exception(exc)


class _Judge:
    """A judge process: runs arrive on a Unix socket (orders + three pipe ends, SCM_RIGHTS); each run's
    verdict lines come back on a pipe of that run's own, tagged with the run's number and nonce. Its
    stdout and stderr go to /dev/null: nothing a test prints is read."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = _spawner.popen([sys.executable, "-I", "-S", "-B", "-c", _JUDGE_SOURCE, str(theirs.fileno()),
                                        str(os.getpid())],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       pass_fds=(theirs.fileno(),), start_new_session=True, cwd="/",
                                       env={"PATH": os.environ.get("PATH", "")})
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock, self.runs = ours, 0

    def start(self, orders: dict[str, Any], fds: tuple[int, int]) -> tuple[int, str, int]:
        """Hand a run to the judge: (its number, its nonce, the read end of its verdict pipe)."""
        self.runs += 1
        nonce = secrets.token_hex(16)
        verdict_r, verdict_w = os.pipe()
        try:
            data = json.dumps(dict(orders, run=self.runs, nonce=nonce)).encode()
            socket.send_fds(self.sock, [struct.pack("<Q", len(data))], [*fds, verdict_w])
            self.sock.sendall(data)
        except OSError:
            os.close(verdict_r)
            raise
        finally:
            os.close(verdict_w)  # the judge holds the only write end: EOF once it closes it (or dies)
        return self.runs, nonce, verdict_r

    def close(self) -> None:
        self.sock.close()
        _kill(self.proc)


class _JudgePool:
    """Idle judges, one per candidate run in flight at most; all killed when the process exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Judge] = []
        atexit.register(self.close)

    def take(self) -> _Judge:
        with self._lock:
            while self._idle:
                judge = self._idle.pop()
                if judge.proc.poll() is None:
                    return judge
                judge.close()
        return _Judge()

    def give(self, judge: _Judge, clean: bool) -> None:
        if clean and judge.runs < _JUDGE_RUNS and judge.proc.poll() is None:
            with self._lock:
                self._idle.append(judge)
        else:
            judge.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for judge in idle:
            judge.close()


_slots = _Slots()
_spawner = _Spawner()
_judges = _JudgePool()


def candidate_uids() -> tuple[int, int]:
    """[low, high): the uids this process gives its candidates (when it is root)."""
    low = _UID_BASE + (os.getpid() % (1 << 22)) * _UIDS_PER_PROCESS  # pid_max is at most 2**22
    return low, low + _UIDS_PER_PROCESS


def run_candidate(code: str, tests: list[str], prefix: str, entry_point: Optional[str], timeout_s: float,
                  memory_mb: int, max_procs: int, output_limit: int, result_limit: int, variant: str) -> SandboxResult:
    """``prefix + code`` in a sandbox started as ``variant`` (root | userns | weak), ``tests`` judged."""
    t0 = time.monotonic()
    isolated = variant != "weak"
    workdir = None if isolated else tempfile.mkdtemp(prefix="sandbox-")
    slot = _slots.take() if variant == "root" else None
    cgroup = cgroup_for(slot, memory_mb, max_procs) if slot is not None else None
    request_r, request_w = os.pipe()
    answer_r, answer_w = os.pipe()
    # The candidate's lifeline: this process alone holds the write end (non-inheritable), so the read end
    # sees EOF once it exits, SIGKILLed included; the namespace's first process then ends the namespace.
    lifeline_r, lifeline_w = os.pipe()
    uid = None if slot is None else candidate_uids()[0] + slot % _UIDS_PER_PROCESS
    child_orders = {"code": code, "prefix": prefix, "request_fd": request_r, "answer_fd": answer_w,
                    "isolated": isolated, "workdir": workdir, "tmpfs_mb": 64, "file_mb": 16, "memory_mb": memory_mb,
                    "max_procs": max_procs, "cpu_s": int(timeout_s) + 1, "uid": uid, "python_dirs": _PYTHON_DIRS,
                    "cgroup": cgroup, "lifeline_fd": lifeline_r, "wall_s": _STARTUP_S + timeout_s + _BACKSTOP_S}
    judge_orders = {"prefix": prefix, "tests": tests, "entry_point": entry_point or "", "result_limit": result_limit,
                    "cpu_s": int(_STARTUP_S + timeout_s) + 1}  # its CPU for the run: past the caller's deadline
    child = judge = None
    clean = ready = False
    try:
        argv = [*(VARIANTS[variant] if isolated else ()), sys.executable, "-I", "-S", "-B", "-c", _CHILD_SOURCE]
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 pass_fds=(request_r, answer_w, lifeline_r), start_new_session=True, cwd=workdir or "/",
                                 env={"PATH": os.environ.get("PATH", "")})
        judge = _judges.take()
        verdict_channel = judge.start(judge_orders, (request_w, answer_r))
        ready = True
    except OSError as exc:
        return SandboxResult(0, len(tests), "error", stderr=f"could not start the sandbox: {exc}")
    finally:
        for fd in (request_r, request_w, answer_r, answer_w, lifeline_r):
            os.close(fd)
        if not ready:
            if child is not None:
                _kill(child)
            if judge is not None:
                judge.close()
            os.close(lifeline_w)
            _cleanup(workdir, slot, cgroup)
    try:
        result, clean = _collect(child, judge, verdict_channel, child_orders, len(tests), timeout_s, output_limit, t0)
        return result
    finally:
        _end_candidate(child, isolated)
        os.close(lifeline_w)
        _judges.give(judge, clean)
        _cleanup(workdir, slot, cgroup)


def _collect(child: subprocess.Popen[bytes], judge: _Judge, verdict_channel: tuple[int, str, int], child_orders: dict[str, Any],
             total: int, timeout_s: float, output_limit: int, t0: float) -> tuple[SandboxResult, bool]:
    """The run's result, and whether the judge finished it cleanly (then it may judge another run)."""
    run, nonce, verdict_fd = verdict_channel
    try:
        return _read_run(child, judge, run, nonce, verdict_fd, child_orders, total, timeout_s, output_limit, t0)
    finally:
        os.close(verdict_fd)


def _read_run(child: subprocess.Popen[bytes], judge: _Judge, run: int, nonce: str, verdict_fd: int, child_orders: dict[str, Any],
              total: int, timeout_s: float, output_limit: int, t0: float) -> tuple[SandboxResult, bool]:
    assert child.stdin and child.stdout and child.stderr  # run_candidate opened all three as pipes
    try:  # the child reads all of it first thing; one that died at once leaves a broken pipe
        child.stdin.write(json.dumps(child_orders).encode())
        child.stdin.close()
    except OSError:
        pass
    out_fd, err_fd = child.stdout.fileno(), child.stderr.fileno()
    streams = {out_fd: bytearray(), err_fd: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in (out_fd, err_fd, verdict_fd):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline = t0 + _STARTUP_S
    started = timed_out = over_cap = closed = done = stray = False
    verdicts: dict[int, str] = {}
    code_status = channel = None
    pending = bytearray()
    tag = f"{run} {nonce} ".encode()  # only this run's judge knows the nonce; the pipe is this run's alone
    while not (closed or done):  # not EOF alone: a process forked from the caller may hold the write end too
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(key.fd)
                closed = closed or key.fd == verdict_fd  # the judge ended the run (or died)
                continue
            if key.fd == verdict_fd:
                pending += chunk
                continue
            buf = streams[key.fd]
            buf += chunk
            if len(buf) > output_limit:
                over_cap = True  # the candidate printed past its cap: killed, scored 0
                del buf[output_limit:]
        if over_cap:
            break
        *lines, rest = bytes(pending).split(b"\n")
        pending = bytearray(rest)  # a partial last line waits for the next read
        for line in lines:
            parts = line[len(tag):].decode(errors="replace").split(" ") if line.startswith(tag) else []
            if done or not parts:
                stray = True  # not this run's, or after its end: never from a sound judge, which is not kept
            elif parts == ["start"] and not started:
                started, deadline = True, time.monotonic() + timeout_s
            elif parts[0] == "code" and len(parts) == 2:
                code_status = parts[1]
            elif parts[0] == "test" and len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < total:
                verdicts[int(parts[1])] = parts[2]
            elif parts[0] == "channel" and len(parts) == 2:
                channel = parts[1]
            elif parts == ["done"]:
                done = True
            else:
                stray = True
    sel.close()
    if done:  # what the judge wrote after "done" (never, from a sound one): then it is not kept
        try:
            stray = stray or bool(pending) or bool(os.read(verdict_fd, 1))
        except BlockingIOError:
            pass
    judge_end = None if done or not closed else _judge_end(judge)
    cpu_spent = _reap_counting_cpu(child, 1.0) if channel == "eof" else None  # it ended by itself: how?
    _end_candidate(child, bool(child_orders["isolated"]))
    returncode = child.returncode
    passed = sum(1 for v in verdicts.values() if v == "1")
    memory = code_status == "memory" or "m" in verdicts.values()
    stderr = bytes(streams[err_fd])
    if over_cap:  # (the judge may not have said "start" yet: the candidate's output came first)
        reason = "output_limit"
    elif channel in ("over_cap", "malformed"):
        reason = "result_limit" if channel == "over_cap" else "bad_result"
    elif judge_end is not None and judge_end != "exit":  # the judge itself failed: not the candidate's doing
        reason = "timeout" if judge_end == "cpu" else "error"
        stderr += f"\n[sandbox] the judge ended in the middle of the run ({judge_end})\n".encode()
    elif not started:
        reason = "error"  # the candidate never ran: unshare or the interpreter failed (see stderr)
    elif timed_out:
        reason = "timeout"
    elif code_status == "syntax":
        reason = "syntax_error"
    elif memory:
        reason = "memory"
    elif channel == "eof":
        sig = returncode - 128 if returncode is not None and returncode > 128 else 0
        if sig == signal.SIGXCPU and (cpu_spent is None or cpu_spent < child_orders["cpu_s"] - 0.1):
            sig = 0  # exit status 152 or its own SIGXCPU, not its CPU limit: it ended itself
        reason = "timeout" if sig == signal.SIGXCPU else "killed" if sig else "exit"
    elif not done:  # a test ended the judge itself (os._exit in a test line)
        reason = "exit"
    elif code_status == "crash":
        reason = "crash"
    else:
        reason = "ok"
    if reason in ("output_limit", "result_limit", "bad_result"):
        passed = 0

    def text(b: bytes | bytearray) -> str:
        return bytes(b).decode(errors="replace")

    result = SandboxResult(min(passed, total), total, reason, text(streams[out_fd]), text(stderr),
                           time.monotonic() - t0)
    return result, done and not stray


def _reap_counting_cpu(proc: subprocess.Popen[bytes], seconds: float) -> Optional[float]:
    """Wait up to ``seconds`` for ``proc`` to end and reap it (setting its returncode); the CPU seconds
    that it and every process it reaped spent (the candidate, reaped by its reaper), None when it did
    not end. Its exit status alone cannot tell a CPU limit's SIGXCPU from ``os._exit(128 + 24)``."""
    deadline = time.monotonic() + seconds
    while proc.returncode is None:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)
    return None


def _judge_end(judge: _Judge) -> str:
    """Why a judge closed its run's verdicts before ``done``: ``exit`` (a test's ``os._exit``), ``cpu``
    (its CPU limit for the run), or its own failure (``exit status 70``, ``signal N``)."""
    try:
        code = judge.proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        return "closed its verdicts and went on"  # (killed: never reused)
    if code < 0:
        return "cpu" if -code == signal.SIGXCPU else f"signal {-code}"
    return f"exit status {code}" if code == _JUDGE_FAILED else "exit"


def _end_candidate(proc: subprocess.Popen[bytes], isolated: bool) -> None:
    """Kill the candidate's PID namespace and return once every process of it is gone: SIGKILL its
    first process (unshare's child), whose exit makes the kernel kill and reap the rest, and which
    unshare waits for before it exits itself."""
    if isolated and proc.poll() is None:
        try:
            firsts = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
        except OSError:  # a kernel without CONFIG_PROC_CHILDREN: the whole group at once instead
            firsts = []
        for pid in firsts:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if firsts:
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
    _kill(proc)  # no first process yet (unshare still starting it), or a namespace slow to end: the group


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process's group (for the candidate: unshare and the namespace's first process; the
    kernel then kills every process of the PID namespace)."""
    if proc.poll() is None:  # once reaped, its group id may belong to someone else
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()


def _cleanup(workdir: Optional[str], slot: Optional[int], cgroup: Optional[str]) -> None:
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
    if cgroup is not None:
        release_cgroup(cgroup)
    if slot is not None:
        sweep(candidate_uids()[0] + slot % _UIDS_PER_PROCESS)  # before another candidate gets the uid
        _slots.give(slot)
