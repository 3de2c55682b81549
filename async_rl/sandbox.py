"""A sandbox for generated (hostile) Python code, and a pool that runs a worker's candidates in parallel.

``run_tests(code, tests)`` runs ``code``, then each test statement on its own (a failing assert does
not stop the others), all in ONE fresh subprocess per candidate, and returns
``SandboxResult(passed, total, reason)``. The program inside is ``async_rl/sandbox_child.py``.

What a candidate gets, and cannot do
------------------------------------
Mode ``namespaces`` (``unshare --user --map-root-user --net --pid --mount``; needs Linux >= 5.12 and
user namespaces, root or not; probed once per process):

- no network: its own network namespace has only a loopback that is down ("Network is unreachable");
  Unix sockets under /tmp, /run and /var/run are hidden behind empty mounts;
- no writes outside a fresh tmpfs on /tmp (its cwd, HOME and TMPDIR; 64 MiB): every other mount is
  read-only, /dev holds only null, zero, random, urandom, and it holds no capability, so it cannot
  remount anything (a new user namespace of its own only sees locked copies);
- no new processes (seccomp: fork, vfork, clone of a process fail with EAGAIN; threads work) and
  RLIMIT_NPROC besides (the kernel does not enforce it when the caller is root outside);
- no signals to anyone but itself (seccomp; kill(0) is its own one-process session), no ptrace, and
  the processes that run it are outside its PID namespace anyway;
- RLIMIT_CPU (timeout + 1 s), RLIMIT_AS (1 GiB), RLIMIT_FSIZE, a wall timeout (default 3 s, counted
  from the moment the candidate starts; the whole process group is SIGKILLed and the PID namespace
  dies with its first process), stdout and stderr each capped at 64 KiB (the rest is drained and
  dropped).

Mode ``weak`` (no usable ``unshare``; said once on stderr): the same rlimits, seccomp filter and
timeouts (the candidate stays in the harness-made process group, so that the timeout kills it), but the network, shell-outs, ``os.kill`` and writes outside a fresh temporary directory
are only refused by patching Python in the child (ctypes gets past that) and the file system is the
caller's.

Results cannot be forged by printing or exiting: each test's outcome is written by the harness code in
the child to a pipe at a random high descriptor, tagged with a random nonce; stdout is never parsed; a
candidate that exits early loses the tests that had not run. Code that introspects the interpreter
(reads the nonce from memory) or returns objects whose ``__eq__`` is always true can still cheat: the
sandbox protects the machine, not the reward from a determined adversary.

Reasons (``SandboxResult.reason``): ok (code and every test ran; ``passed`` says how many passed),
no_code (nothing to run), syntax_error, crash (the code raised; tests still ran), exit (the process
ended before the tests finished: sys.exit is caught, os._exit is not), timeout (wall clock or CPU),
memory (a MemoryError), killed (ended by a signal), error (the sandbox itself failed to start).

Command line: ``python -m async_rl.sandbox CODE_FILE TESTS_FILE [--timeout S]`` prints
``{"passed": P, "total": T, "reason": ...}`` (one test statement per line of TESTS_FILE) and exits 0
whatever the code did; bad arguments: one line on stderr, exit 2.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

__all__ = ["REASONS", "SandboxPool", "SandboxResult", "isolation_mode", "run_tests"]

REASONS = ("ok", "no_code", "syntax_error", "crash", "exit", "timeout", "memory", "killed", "error")
_CHILD_SOURCE = (Path(__file__).with_name("sandbox_child.py")).read_text()
_UNSHARE = ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount",
            "--mount-proc", "--")
_STARTUP_S = 20.0  # interpreter start on a loaded machine; not part of the candidate's timeout
_mode: Optional[str] = None
_mode_lock = threading.Lock()


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


def isolation_mode() -> str:
    """``namespaces`` or ``weak``, probed once per process (the first call costs one sandbox run)."""
    global _mode
    with _mode_lock:
        if _mode is None:
            _mode = "namespaces"
            why = ""
            if shutil.which("unshare") is None:
                why = "the unshare command (util-linux) is not installed"
            else:
                probe = _run("x = 1", ["assert x == 1"], 10.0, 256, 16, 64 * 1024, "namespaces")
                if (probe.passed, probe.reason) != (1, "ok"):
                    why = f"unshare did not work here ({(probe.stderr.strip().splitlines() or [probe.reason])[-1]})"
            if why:
                _mode = "weak"
                print(f"[sandbox] {why}: running candidates in the weak mode (no namespaces: network, "
                      "shell-outs and writes outside the temporary directory are only refused inside Python); "
                      "see async_rl/sandbox.py", file=sys.stderr)
        return _mode


def run_tests(code: Optional[str], tests: Sequence[str], timeout_s: float = 3.0, memory_mb: int = 1024,
              max_procs: int = 32, output_limit: int = 64 * 1024) -> SandboxResult:
    """Run ``code`` then each of ``tests`` (Python snippets, typically one assert) in a fresh sandbox.

    A test passes when it runs without raising. ``timeout_s`` is the wall time of the code and all
    tests together; ``memory_mb`` the address-space limit; ``output_limit`` the bytes of stdout and of
    stderr kept. Never raises for anything the code does."""
    tests = [str(t) for t in tests]
    if code is None or not str(code).strip():
        return SandboxResult(0, len(tests), "no_code")
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError(f"sandbox limits must be positive, got timeout_s={timeout_s}, memory_mb={memory_mb}")
    return _run(str(code), tests, float(timeout_s), int(memory_mb), int(max_procs), int(output_limit),
                isolation_mode())


def _run(code: str, tests: list[str], timeout_s: float, memory_mb: int, max_procs: int, output_limit: int,
         mode: str) -> SandboxResult:
    t0 = time.monotonic()
    nonce = secrets.token_hex(16)
    isolated = mode == "namespaces"
    workdir = None if isolated else tempfile.mkdtemp(prefix="sandbox-")
    read_fd, write_fd = os.pipe()
    orders = {"code": code, "tests": tests, "nonce": nonce, "fd": write_fd, "hide_fd": 100 + secrets.randbelow(150),
              "isolated": isolated, "workdir": workdir, "tmpfs_mb": 64, "file_mb": 16, "memory_mb": memory_mb,
              "max_procs": max_procs, "cpu_s": int(timeout_s) + 1}
    argv = [sys.executable, "-I", "-S", "-B", "-c", _CHILD_SOURCE]
    try:
        proc = subprocess.Popen(list(_UNSHARE) + argv if isolated else argv, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,),
                                start_new_session=True, cwd=workdir or "/", env={"PATH": os.environ.get("PATH", "")})
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        _remove(workdir)
        return SandboxResult(0, len(tests), "error", stderr=f"could not start the sandbox: {exc}")
    os.close(write_fd)
    try:
        return _collect(proc, read_fd, json.dumps(orders).encode(), nonce, len(tests), timeout_s, output_limit, t0)
    finally:
        _kill(proc)
        os.close(read_fd)
        _remove(workdir)


def _collect(proc: subprocess.Popen, read_fd: int, orders: bytes, nonce: str, total: int, timeout_s: float,
             output_limit: int, t0: float) -> SandboxResult:
    try:  # the child reads all of it first thing; a child that died at once leaves a broken pipe
        proc.stdin.write(orders)
        proc.stdin.close()
    except OSError:
        pass
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    streams = {out_fd: bytearray(), err_fd: bytearray(), read_fd: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline, started, timed_out = t0 + _STARTUP_S, False, False
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fd)
                continue
            buf = streams[key.fd]
            if key.fd == read_fd or len(buf) < output_limit:  # output past the cap is drained and dropped
                buf += chunk if key.fd == read_fd else chunk[: output_limit - len(buf)]
            if key.fd == read_fd and not started and f"{nonce} start ".encode() in buf:
                started, deadline = True, time.monotonic() + timeout_s
    sel.close()
    if timed_out:
        _kill(proc)
    returncode = proc.wait()
    lines = [ln.split(" ")[1:] for ln in streams[read_fd].decode(errors="replace").splitlines()
             if ln.startswith(nonce + " ")]
    passed = sum(1 for p in lines if p[:1] == ["test"] and len(p) == 3 and p[2] == "1")
    code_status = next((p[1] for p in lines if p[:1] == ["code"] and len(p) == 2), None)
    memory = code_status == "memory" or any(p[:1] == ["test"] and p[-1:] == ["m"] for p in lines)
    done = ["done"] in lines
    if not started:
        reason = "error"  # the candidate never ran: unshare or the interpreter failed (see stderr)
    elif timed_out:
        reason = "timeout"
    elif code_status == "syntax":
        reason = "syntax_error"
    elif memory:
        reason = "memory"
    elif not done:
        sig = returncode - 128 if returncode > 128 else 0
        reason = "timeout" if sig == signal.SIGXCPU else "killed" if sig else "exit"
    elif code_status == "crash":
        reason = "crash"
    else:
        reason = "ok"
    text = lambda b: bytes(b).decode(errors="replace")  # noqa: E731
    return SandboxResult(passed, total, reason, text(streams[out_fd]), text(streams[err_fd]), time.monotonic() - t0)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's process group (unshare and the namespace's first process: the kernel then
    kills every process of the PID namespace)."""
    if proc.poll() is None:  # once reaped, its group id may belong to someone else
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()


def _remove(workdir: Optional[str]) -> None:
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


class SandboxPool:
    """Runs candidates in parallel, each in its own sandbox: a thread pool of ``workers`` (default: the
    CPU count), since every run waits on a subprocess. ``limits`` go to ``run_tests``."""

    def __init__(self, workers: Optional[int] = None, **limits) -> None:
        self.workers = int(workers or os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError(f"SandboxPool workers must be >= 1, got {workers}")
        self.limits = limits
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")

    def submit(self, code: Optional[str], tests: Sequence[str], **limits) -> "concurrent.futures.Future[SandboxResult]":
        return self._pool.submit(run_tests, code, tests, **{**self.limits, **limits})

    def run(self, code: Optional[str], tests: Sequence[str], **limits) -> SandboxResult:
        return self.submit(code, tests, **limits).result()

    def map(self, jobs: Iterable[tuple[Optional[str], Sequence[str]]], **limits) -> list[SandboxResult]:
        """``[run_tests(code, tests) for code, tests in jobs]``, in parallel, in order."""
        futures = [self.submit(code, tests, **limits) for code, tests in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:  # picklable (an env holding one travels to a worker): a fresh pool there
        return {"workers": self.workers, "limits": self.limits}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["workers"], **state["limits"])


def _main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m async_rl.sandbox",
                                     description="Run CODE_FILE, then each line of TESTS_FILE, in the sandbox.")
    parser.add_argument("code_file")
    parser.add_argument("tests_file")
    parser.add_argument("--timeout", type=float, default=3.0, help="wall seconds for the code and all tests")
    def usage_error(message: str) -> None:  # one line, not argparse's usage block
        print(f"python -m async_rl.sandbox: {message}; usage: CODE_FILE TESTS_FILE [--timeout S]", file=sys.stderr)
        sys.exit(2)

    parser.error = usage_error  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        print(f"--timeout must be a positive number of seconds, got {args.timeout}", file=sys.stderr)
        return 2
    try:
        code = Path(args.code_file).read_text()
        tests = [ln for ln in Path(args.tests_file).read_text().splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        print(f"cannot read {getattr(exc, 'filename', None) or 'input'}: {exc}; pass readable UTF-8 files",
              file=sys.stderr)
        return 2
    print(json.dumps(run_tests(code, tests, timeout_s=args.timeout).to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
