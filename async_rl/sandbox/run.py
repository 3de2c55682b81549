"""One candidate's run: its sandboxed process, a judge, the channels between them, and the verdict.

``run_candidate`` starts the candidate's process (``sandbox/child.py``, inside ``unshare`` unless the
mode is weak), hands its tests to a judge (``sandbox/judge.py``), reads the judge's verdicts and the
candidate's stdout and stderr under their caps, and kills what is left. Judges are trusted and hold no
candidate state between runs (a fresh namespace per run), so a judge that finished a run cleanly is
kept for the next one (``_JudgePool``): a Python start per candidate saved. A judge whose run did not
end cleanly (timeout, a cap, a broken channel) is killed, never reused. The public face, the modes
and the pool are ``async_rl/sandbox/``.
"""
from __future__ import annotations

import atexit
import json
import os
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
from typing import Optional

from async_rl.sandbox.limits import cgroup_for, release_cgroup

REASONS = ("ok", "no_code", "syntax_error", "crash", "exit", "timeout", "memory", "killed", "output_limit",
           "result_limit", "bad_result", "error")
_HERE = Path(__file__).parent
_WIRE = (_HERE / "wire.py").read_text()
_CHILD_SOURCE = _WIRE + (_HERE / "child.py").read_text()
_JUDGE_SOURCE = _WIRE + (_HERE / "judge.py").read_text()
_NAMESPACES = ("--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--")
VARIANTS = {"root": ("unshare",) + _NAMESPACES,  # root caller: no user namespace, the candidate gets a uid
            "userns": ("unshare", "--user", "--map-root-user") + _NAMESPACES}
# One unprivileged uid per concurrent candidate of this process (RLIMIT_NPROC counts per uid): a block of
# _UIDS_PER_PROCESS uids per process id, so that candidates of different processes do not share one either.
_UID_BASE, _UIDS_PER_PROCESS = 2_000_000_000, 256
_STARTUP_S = 20.0  # interpreter start on a loaded machine; not part of the candidate's timeout
_BACKSTOP_S = 10.0  # the candidate's own wall bound lies this far past the caller's deadline (a stalled caller)
_JUDGE_RUNS = 1000  # a judge is replaced after this many runs (bounded drift of its memory)
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

    def to_json(self) -> dict:
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


class _Judge:
    """A judge process: runs arrive on a Unix socket (orders + the two pipe ends, SCM_RIGHTS), verdict
    lines leave on its stdout, each tagged with the run's number."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", _JUDGE_SOURCE, str(theirs.fileno())],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, pass_fds=(theirs.fileno(),),
                                         start_new_session=True, cwd="/", env={"PATH": os.environ.get("PATH", "")})
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock, self.runs, self.pending = ours, 0, bytearray()
        os.set_blocking(self.proc.stdout.fileno(), False)

    def start(self, orders: dict, fds: tuple[int, int]) -> int:
        """Hand a run to the judge; its number (the tag of its verdict lines)."""
        self.runs += 1
        data = json.dumps(dict(orders, run=self.runs)).encode()
        socket.send_fds(self.sock, [struct.pack("<Q", len(data))], list(fds))
        self.sock.sendall(data)
        return self.runs

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
    judge_orders = {"prefix": prefix, "tests": tests, "entry_point": entry_point or "", "result_limit": result_limit}
    child = judge = None
    clean = ready = False
    try:
        argv = [*(VARIANTS[variant] if isolated else ()), sys.executable, "-I", "-S", "-B", "-c", _CHILD_SOURCE]
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 pass_fds=(request_r, answer_w, lifeline_r), start_new_session=True, cwd=workdir or "/",
                                 env={"PATH": os.environ.get("PATH", "")})
        judge = _judges.take()
        run = judge.start(judge_orders, (request_w, answer_r))
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
        result, clean = _collect(child, judge, run, child_orders, len(tests), timeout_s, output_limit, t0)
        return result
    finally:
        _end_candidate(child, isolated)
        os.close(lifeline_w)
        _judges.give(judge, clean)
        _cleanup(workdir, slot, cgroup)


def _collect(child: subprocess.Popen, judge: _Judge, run: int, child_orders: dict, total: int, timeout_s: float,
             output_limit: int, t0: float) -> tuple[SandboxResult, bool]:
    """The run's result, and whether the judge finished it cleanly (then it may judge another run)."""
    try:  # the child reads all of it first thing; one that died at once leaves a broken pipe
        child.stdin.write(json.dumps(child_orders).encode())
        child.stdin.close()
    except OSError:
        pass
    out_fd, err_fd, verdict_fd = child.stdout.fileno(), child.stderr.fileno(), judge.proc.stdout.fileno()
    streams = {out_fd: bytearray(), err_fd: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in (out_fd, err_fd, verdict_fd):
        if fd != verdict_fd:
            os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline, started, timed_out, over_cap, judge_ended, done = t0 + _STARTUP_S, False, False, False, False, False
    verdicts: dict[int, str] = {}
    code_status = channel = None
    tag = f"{run} ".encode()
    while not done:
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
                judge_ended = judge_ended or key.fd == verdict_fd
                continue
            if key.fd == verdict_fd:
                judge.pending += chunk
                continue
            buf = streams[key.fd]
            buf += chunk
            if len(buf) > output_limit:
                over_cap = True  # the candidate printed past its cap: killed, scored 0
                del buf[output_limit:]
        if over_cap or judge_ended:
            break
        *lines, rest = bytes(judge.pending).split(b"\n")
        judge.pending = bytearray(rest)  # a partial last line waits for the next read
        for line in lines:
            if not line.startswith(tag):  # a line of an earlier run (never, unless a judge was reused wrongly)
                continue
            parts = line[len(tag):].decode(errors="replace").split(" ")
            if parts == ["start"] and not started:
                started, deadline = True, time.monotonic() + timeout_s
            elif parts[0] == "code" and len(parts) == 2:
                code_status = parts[1]
            elif parts[0] == "test" and len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < total:
                verdicts[int(parts[1])] = parts[2]
            elif parts[0] == "channel" and len(parts) == 2:
                channel = parts[1]
            elif parts == ["done"]:
                done = True
    sel.close()
    if channel == "eof":  # the candidate's process ended (or is ending) by itself: how?
        try:
            child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
    _end_candidate(child, bool(child_orders["isolated"]))
    returncode = child.returncode
    passed = sum(1 for v in verdicts.values() if v == "1")
    memory = code_status == "memory" or "m" in verdicts.values()
    if over_cap:  # (the judge may not have said "start" yet: the candidate's output came first)
        reason = "output_limit"
    elif channel in ("over_cap", "malformed"):
        reason = "result_limit" if channel == "over_cap" else "bad_result"
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
        reason = "timeout" if sig == signal.SIGXCPU else "killed" if sig else "exit"
    elif not done:  # a test ended the judge itself (os._exit in a test line)
        reason = "exit"
    elif code_status == "crash":
        reason = "crash"
    else:
        reason = "ok"
    if reason in ("output_limit", "result_limit", "bad_result"):
        passed = 0
    text = lambda b: bytes(b).decode(errors="replace")  # noqa: E731
    result = SandboxResult(min(passed, total), total, reason, text(streams[out_fd]), text(streams[err_fd]),
                           time.monotonic() - t0)
    return result, done and not judge.pending


def _end_candidate(proc: subprocess.Popen, isolated: bool) -> None:
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


def _kill(proc: subprocess.Popen) -> None:
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
        _slots.give(slot)
