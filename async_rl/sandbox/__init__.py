"""A sandbox for generated (hostile) Python code, and a pool that runs a worker's candidates in parallel.

``run_tests(code, tests, prefix=..., entry_point=...)`` runs ``prefix + code`` in ONE fresh sandboxed
process per candidate, and each test statement in a separate trusted process, the judge; it returns
``SandboxResult(passed, total, reason)``. The candidate's side is ``async_rl/sandbox/child.py``, the
judge ``async_rl/sandbox/judge.py``, what passes between them ``async_rl/sandbox/wire.py``.

Who decides a verdict
---------------------
The judge runs the prompt's helpers (``prefix``) and the tests; the candidate's process never receives
a test, nor anything a test expects. When a test reads a name the prompt does not define and the tests
do not bind (the entry point, or any function or value of the candidate's code), the judge asks the
candidate's process for it: a value comes back as plain data, a function becomes a stand-in whose calls
send their (plain-data) arguments and get back a plain-data result or the name of the exception raised
(a builtin exception is re-raised as itself, except StopIteration, which would end a ``map`` early).
The comparison, the ``abs(...) < eps``, the ``check(candidate)`` function, every assert runs in the
judge on values it rebuilt from JSON itself, so none of it can be patched, introspected or faked from
the candidate's interpreter. ``passed`` counts distinct tests, at most ``total``; a test the judge did
not finish (the candidate's process died, hung or broke its channel) fails.

Judged this way: ``assert f(x) == y``, ``assert abs(f(x) - y) < eps``, ``assert f(x)`` / ``not f(x)``,
``try: f(x) ... except ValueError``, HumanEval's statements and ``check(candidate)`` functions,
free-form asserts over the candidate's functions and plain module-level values, arguments computed
by earlier calls or by the prompt's helpers (all 164 HumanEval canonical solutions pass). Not
supported, and scored as failures (fail closed): a result or an argument that is not plain data (None,
bool, int, float, str, bytes, complex and lists, tuples, sets, frozensets, dicts of them; not an
object of the candidate's class, a generator, a function), a test that checks how a call mutated its
argument, reads the candidate's files, tests identity (``is``) beyond None/True/False, uses a module
only the candidate imported, or reaches a name only at run time (``eval("f")``). Names the prompt defines
(``prefix``) and builtins are always the judge's own: a candidate that redefines a helper (HumanEval/38's
``encode_cyclic``) or a builtin changes only its own calls. The one exception is ``entry_point``, always
asked of the candidate: without it, a function under test named like a builtin (``max``) or like
something the prefix defines (a stub of it) would be the builtin's or the prompt's in the tests. A caller
that passes the prompt inside ``code`` (no ``prefix``) leaves the helpers to the candidate, whose
redefinition then counts; the command line has neither ``prefix`` nor ``entry_point``. The project's
callers pass both apart: HumanEval's ``code_reward``, the ``code_tests`` reward (its ``prefix`` and
``entry_point`` columns, which HumanEval's rows carry), CTRL's case labels and its evaluation; the CTRL
env's reward passes ``prefix`` apart and no ``entry_point`` (no HumanEval entry point is named like a
builtin or a prompt helper, so that changes no verdict there).

What a candidate gets, and cannot do
------------------------------------
Mode ``namespaces`` (``unshare`` with network, PID, mount, IPC, UTS and cgroup namespaces, new for each
candidate; a user namespace too when the caller is not root; Linux >= 5.12; probed once per process):

- a new root holding only what Python needs: read-only /usr (and /bin, /lib links), /etc/ld.so.cache,
  the standard library, a minimal /dev (null, zero, random, urandom), its own /proc and a fresh 64 MiB
  tmpfs of 4096 inodes on /tmp (its cwd, HOME and TMPDIR; the only writable place, gone with its mount
  namespace). No home directory, no project tree, no host /tmp (Ray's session directory), no /dev/shm,
  /var/tmp or /dev/mqueue, no /run (host sockets), no /etc/shadow;
- an unprivileged uid of its own (a high uid per concurrent candidate of the calling process) when the
  caller is root, the caller's own (unprivileged) uid otherwise; no capabilities, so file permissions and RLIMIT_NPROC
  apply (threads count: a ``clone(CLONE_THREAD)`` bomb stops at ``max_procs``);
- no network (its own namespace, loopback down), and the seccomp filter of ``sandbox/seccomp.py``
  (docs/sandbox.md lists each call and why): no new processes (fork, vfork, clone of a process fail;
  threads are fine), no new or other namespace (unshare, setns, clone with CLONE_NEW*; clone3 is ENOSYS),
  no socket but AF_UNIX, no signals to anyone but itself, no ptrace or other process's memory, none of
  the state that outlives a process (System V IPC, POSIX message queues, keys), no memfd or vmsplice, no bpf,
  perf_event_open, userfaultfd, io_uring or mount-family call. PID namespace: when its first process
  ends, the kernel kills every process it left;
- nothing it can write is seen by a later candidate: its tmpfs, hostname and IPC objects die with its
  namespaces, and after each run of a root caller's candidate the caller removes what its uid might
  still hold (System V objects, keys: ``sandbox/leftovers.py``), before another candidate gets that uid;
- no life beyond its caller's: the namespace's first process ends it (and so the namespace) as soon as
  the calling process exits, SIGKILL included (a lifeline pipe whose only write end the caller holds
  reads EOF), and in any case ``_STARTUP_S + timeout + 10`` s after it started (a backstop behind the
  caller's own deadline). A process forked from the caller without exec while a run is in flight
  inherits that write end: the candidate then lives until that process exits or the backstop;
- RLIMIT_CPU (timeout + 1 s), RLIMIT_AS (1 GiB: every mapping counts), RLIMIT_FSIZE, RLIMIT_NOFILE (64:
  the pipe and socket buffers it can hold), a wall timeout (default 3 s, counted
  from the moment the candidate starts), and every channel capped: stdout and stderr at
  ``output_limit`` (64 KiB), its answers to the judge at ``result_limit`` (1 MiB): over a cap it is
  killed and scores 0 (reasons ``output_limit``, ``result_limit``); a malformed answer scores 0 too
  (``bad_result``). The caller buffers at most these caps per candidate;
- memory in no form beyond its limit: its address space (RLIMIT_AS), its tmpfs and its descriptors'
  buffers; what no mapping counts (memfd, System V shared memory, /dev/shm) it cannot make or reach;
- a cgroup v2 (``pids.max``, ``memory.max``) where the machine delegates one with those controllers;
  elsewhere one line says so once, and the rlimits and the filter above are the bound.

Fail closed: when no namespace variant works, ``run_tests`` raises ``SandboxUnavailable`` (one line:
why, and how to allow the weak mode) instead of running the code. The weak mode (``sandbox_mode: weak``
in a run's config, ``--sandbox-mode weak`` on the command line, or ``ASYNC_RL_SANDBOX_MODE=weak``) runs
the candidate as the caller's user with the same rlimits, seccomp filter, caps and judge, but protects
NOTHING of the machine beyond that: it can read and write the caller's files and reach the network, and
as the judge's user (root's capabilities included, for a root caller) it may reach the judge and forge
verdicts. Use it only on a machine that holds nothing to protect, for code that is not an adversary.

Judges are processes of their own, reused from run to run (``async_rl/sandbox/run.py``: a fresh
namespace per run; one whose run did not end cleanly is killed), so a candidate costs one interpreter
start, as before the judge existed. How a verdict reaches the caller: on a pipe made for that run alone,
whose write end only the judge holds and closes at the run's end, each line tagged with the run's number
and a random nonce that only the judge learns; the caller ignores any other line and never reuses a
judge that wrote one. A judge's stdout and stderr are /dev/null: what a test prints (a value the
candidate returned included) reaches no caller and no later run. A judge has 2 GiB of address space
and, per run, the run's timeout plus 21 s of CPU (SIGXCPU); it dies with its caller, SIGKILL included,
even in the middle of one long C call on a candidate's value (``PR_SET_PDEATHSIG``, from a thread of the
caller that lives as long as the caller; a thread that exits once the caller's end of their socket
closes, besides). A judge that ends mid-run is reported for what ended it: a test's ``os._exit`` is
``exit``, its CPU limit ``timeout``, a signal or its own failure ``error``, never the candidate's doing.
In the weak mode too, the candidate's reaper kills the candidate once the caller is gone (the lifeline
and backstop above).

Not protected in any mode: the CPU and wall time the candidate spends up to its limits, what it learns
of a test's inputs (the arguments of its own calls), and a reward that a correct function earns
honestly. Covert channels through what the kernel shares (caches and counters read by timing or by the
numbers it hands out) are not closed, between concurrent candidates or to a later one. The verdicts are
only as trusted as the prefix and tests a caller hands over: helpers passed inside ``code``, or a
function under test that shadows a builtin without ``entry_point``, are decided as said above.

Reasons (``SandboxResult.reason``): ok, no_code, syntax_error, crash (the code raised; tests still ran),
exit (the candidate's process ended before the tests finished; also an exit status of 128 + SIGXCPU
without the CPU limit spent, told apart by the CPU its processes used), timeout (wall clock or CPU),
memory, killed (ended by a signal), output_limit, result_limit, bad_result, error (the sandbox itself
failed, the judge included).

Command line: ``python -m async_rl.sandbox CODE_FILE TESTS_FILE [--timeout S] [--sandbox-mode strict|weak]``
prints ``{"passed": P, "total": T, "reason": ...}`` (one test statement per line of TESTS_FILE) and
exits 0 whatever the code did; bad arguments or no usable sandbox: one line on stderr, exit 2.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from async_rl.errors import ConfigError, OneLineArgumentParser
from async_rl.sandbox.run import REASONS, SandboxResult, run_candidate

__all__ = ["CHANNEL_VIOLATIONS", "REASONS", "SANDBOX_MODES", "SandboxPool", "SandboxResult", "SandboxUnavailable",
           "isolation_mode",
           "run_tests", "set_sandbox_mode"]

SANDBOX_MODES = ("strict", "weak")
# Reasons of a candidate that broke a channel: printed past a cap, answered past its cap or not as asked.
# Envs count them apart (e.g. env/ctrl_channel_violations): a run whose policy starts hacking shows it.
CHANNEL_VIOLATIONS = ("output_limit", "result_limit", "bad_result")
_mode: Optional[str] = None  # namespaces | weak, once probed
_variant: Optional[str] = None  # root | userns | weak: how run_candidate starts the candidate
_mode_lock = threading.Lock()


class SandboxUnavailable(ConfigError):
    """No usable isolation, and the weak mode was not allowed: generated code is not run. A ConfigError:
    the driver's checks (a reward's dry run, a task set that builds cases) stop the run with its line."""


def set_sandbox_mode(mode: str) -> None:
    """``strict`` (default: refuse to run without namespaces) or ``weak`` (allow the weak mode). Also
    read from ``ASYNC_RL_SANDBOX_MODE``, which a run's driver hands to every Ray worker."""
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox mode must be one of {SANDBOX_MODES}, got {mode!r}")
    os.environ["ASYNC_RL_SANDBOX_MODE"] = mode


def _weak_allowed() -> bool:
    return os.environ.get("ASYNC_RL_SANDBOX_MODE", "strict") == "weak"


def isolation_mode() -> str:
    """``namespaces`` or ``weak``, probed once per process (the first call costs a sandbox run or two).
    Raises ``SandboxUnavailable`` when namespaces do not work and the weak mode is not allowed."""
    global _mode, _variant
    with _mode_lock:
        if _mode is None:
            why = "the unshare command (util-linux) is not installed"
            if shutil.which("unshare") is not None:
                for variant in (("root", "userns") if os.geteuid() == 0 else ("userns",)):
                    probe = run_candidate("x = 1\n", ["assert x == 1"], "", None, 10.0, 256, 16, 64 * 1024, 1 << 16,
                                          variant)
                    if (probe.passed, probe.reason) == (1, "ok"):
                        _mode, _variant = "namespaces", variant
                        break
                    why = f"unshare did not work here ({(probe.stderr.strip().splitlines() or [probe.reason])[-1]})"
            if _mode is None:
                if not _weak_allowed():
                    raise SandboxUnavailable(
                        f"[sandbox] refusing to run generated code: {why}. To run it anyway WITHOUT isolation "
                        "(it can read and write your files and reach the network), allow the weak mode: "
                        "sandbox_mode: weak in the config, --sandbox-mode weak, or ASYNC_RL_SANDBOX_MODE=weak")
                _mode = _variant = "weak"
                print(f"[sandbox] {why}: running candidates in the weak mode, as allowed (no isolation of the "
                      "machine; see async_rl/sandbox/)", file=sys.stderr)
        return _mode


def run_tests(code: Optional[str], tests: Sequence[str], timeout_s: float = 3.0, memory_mb: int = 1024,
              max_procs: int = 32, output_limit: int = 64 * 1024, *, prefix: str = "",
              entry_point: Optional[str] = None, result_limit: int = 1 << 20) -> SandboxResult:
    """Run ``prefix + code``, then judge each of ``tests`` (Python snippets, typically one assert) on the
    trusted side (see the module docstring).

    A test passes when the judge runs it without an exception. ``prefix``: the prompt's imports and
    helpers (run on both sides; the tests see the prompt's own). ``entry_point``: the function under
    test, asked of the candidate whatever the tests bind. ``timeout_s`` is the wall time of the code and
    all tests together; ``memory_mb`` the address-space limit; ``output_limit`` the bytes of stdout and
    of stderr allowed, ``result_limit`` those of its answers. Never raises for anything the code does;
    raises ``SandboxUnavailable`` when there is no usable sandbox and the weak mode is not allowed."""
    tests = [str(t) for t in tests]
    if code is None or not str(code).strip():
        return SandboxResult(0, len(tests), "no_code")
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError(f"sandbox limits must be positive, got timeout_s={timeout_s}, memory_mb={memory_mb}")
    mode = isolation_mode()
    prefix = f"{prefix}\n\n" if prefix and prefix.strip() else ""
    return run_candidate(str(code), tests, prefix, entry_point, float(timeout_s), int(memory_mb), int(max_procs),
                         int(output_limit), int(result_limit), _variant if mode == "namespaces" and _variant else "weak")


class SandboxPool:
    """Runs candidates in parallel, each in its own sandbox: a thread pool of ``workers`` (default: the
    CPU count), since every run waits on a subprocess. ``limits`` go to ``run_tests``."""

    def __init__(self, workers: Optional[int] = None, **limits: Any) -> None:
        self.workers = int(workers or os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError(f"SandboxPool workers must be >= 1, got {workers}")
        self.limits = limits
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")

    def submit(self, code: Optional[str], tests: Sequence[str], **limits: Any) -> "concurrent.futures.Future[SandboxResult]":
        return self._pool.submit(run_tests, code, tests, **{**self.limits, **limits})

    def run(self, code: Optional[str], tests: Sequence[str], **limits: Any) -> SandboxResult:
        return self.submit(code, tests, **limits).result()

    def map(self, jobs: Iterable[tuple[Any, ...]], **limits: Any) -> list[SandboxResult]:
        """``[run_tests(code, tests, **options) for code, tests[, options] in jobs]``, in parallel, in order
        (``options``: a job's own keyword arguments, e.g. ``{"prefix": prompt_helpers}``)."""
        futures = [self.submit(job[0], job[1], **{**limits, **(job[2] if len(job) > 2 else {})}) for job in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # picklable (an env holding one travels to a worker): a fresh pool there
        return {"workers": self.workers, "limits": self.limits}

    def __setstate__(self, state: dict[str, Any]) -> None:
        SandboxPool.__init__(self, state["workers"], **state["limits"])


def _main(argv: Optional[list[str]] = None) -> int:
    parser = OneLineArgumentParser(prog="python -m async_rl.sandbox",
                                   description="Run CODE_FILE, then each line of TESTS_FILE, in the sandbox.")
    parser.add_argument("code_file")
    parser.add_argument("tests_file")
    parser.add_argument("--timeout", type=float, default=3.0, help="wall seconds for the code and all tests")
    parser.add_argument("--sandbox-mode", choices=SANDBOX_MODES, default=None,
                        help="weak: allow running WITHOUT isolation where namespaces do not work (default strict)")
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
    if args.sandbox_mode:
        set_sandbox_mode(args.sandbox_mode)
    try:
        result = run_tests(code, tests, timeout_s=args.timeout)
    except SandboxUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(result.to_json()))
    return 0

