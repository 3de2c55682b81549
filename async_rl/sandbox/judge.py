"""The judge: the trusted process that runs a candidate's tests and decides every verdict.

``async_rl/sandbox/run.py`` starts it as ``python -I -S -B -c <sandbox/wire.py + this file> FD PPID``
(nothing imports it), its stdout and stderr on /dev/null; each run arrives on the Unix socket FD: its
orders and three pipe ends, the two of that run's candidate process and the write end of the run's own
verdict pipe. Runs share nothing but imported modules: each has a fresh namespace and a fresh verdict
pipe, and a judge whose run did not end cleanly is killed, not reused. The judge holds the test source,
the prompt's helpers (``prefix``) and everything the tests expect; the candidate's process never sees
any of it. The judge never runs candidate code: a name a test uses that the prompt does not define (the
entry point, any function or value of the candidate) is asked of the candidate's process over two pipes
(``get``, then ``call`` with plain-data arguments), and only plain data comes back (``sandbox/wire.py``),
checked and rebuilt here. So an always-equal object, a patched builtin, a harness's frame or reporter:
none of it exists on this side.

Verdicts go only to the run's verdict pipe, which nothing else writes: what a test prints (a value the
candidate returned included) goes to /dev/null, and the pipe is closed when the run ends, so nothing of
one run reaches the next. Each line starts with the run's number and a random nonce that the caller
chose for that run and the candidate never sees: ``start`` (the candidate's process is running its
code), ``code ok|crash|syntax|memory``, ``test I 1|0|m`` per test, ``channel over_cap|malformed|eof``
(the candidate's channel broke: the tests after it are not run), ``done``.

Limits: ``JUDGE_MEMORY_MB`` of address space, and per run ``cpu_s`` seconds of CPU counted from the
run's start (RLIMIT_CPU's soft limit moved up at each run; SIGXCPU ends it). It dies with its caller:
``PR_SET_PDEATHSIG`` (SIGKILL, from the kernel, so also in the middle of a long C call on a candidate's
data; the caller starts judges from one thread that lives as long as the caller), checked against the
caller's pid it was given, and a thread that exits once the caller's end of the socket is closed. An
internal failure exits with ``JUDGE_FAILED``, which the caller reports as ``error``.
"""
import _thread
import ast
import builtins
import ctypes
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn

if TYPE_CHECKING:  # at run time sandbox/wire.py's text runs before this file's and defines them
    from async_rl.sandbox.wire import NotPlain, dump_line, from_plain, parse_line, to_plain

JUDGE_MEMORY_MB = 2048  # its address space: what a candidate's (capped) answers can make it build
JUDGE_FAILED = 70  # the exit status of a judge that failed itself (not a test's os._exit): reason "error"
# Re-raised as themselves, so that a test's ``except ValueError`` works; not StopIteration: raised by a
# function that ``map`` or a loop calls, it would end that iteration early (``all(map(f, xs))`` true).
_EXCEPTIONS = {name: obj for name, obj in vars(builtins).items()
               if isinstance(obj, type) and issubclass(obj, Exception)
               and not issubclass(obj, (StopIteration, StopAsyncIteration))}


class ChannelBroken(BaseException):
    """The candidate's channel is over its cap, malformed or closed. A BaseException, so that a test's
    ``except Exception`` cannot swallow it (the channel's ``broken`` says so in any case)."""


class CandidateRaised(Exception):
    """The candidate's function raised something that is not a builtin Exception (SystemExit, its own class)."""


class NotPlainResult(BaseException):
    """The candidate's function returned something that is not plain data: the test fails, whatever
    the test's own ``except`` clauses say."""


class Channel:
    """Requests to the candidate's process and its answers, one JSON line each, every answer checked."""

    def __init__(self, request_fd: int, answer_fd: int, limit: int) -> None:
        self.request_fd, self.answer_fd, self.limit = request_fd, answer_fd, limit
        self.buffer, self.received, self.next_id = b"", 0, 0
        self.broken: str | None = None  # over_cap | malformed | eof
        self.not_plain = False  # the current test got an answer that is not plain data

    def _break(self, why: str) -> NoReturn:
        self.broken = self.broken or why
        raise ChannelBroken(why)

    def read_message(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            try:
                chunk = os.read(self.answer_fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._break("eof")
            self.received += len(chunk)
            if self.received > self.limit:
                self._break("over_cap")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            return parse_line(line)
        except NotPlain:
            self._break("malformed")

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.broken:
            raise ChannelBroken(self.broken)
        self.next_id += 1
        data = dump_line(dict(message, id=self.next_id))
        try:
            while data:
                data = data[os.write(self.request_fd, data):]
        except OSError:
            self._break("eof")
        answer = self.read_message()
        if answer.get("id") != self.next_id:
            self._break("malformed")
        return answer


def _value(answer: dict[str, Any], channel: Channel) -> Any:
    """What a ``call`` answered: its plain value, or the exception it raised."""
    if "value" in answer:
        try:
            return from_plain(answer["value"])
        except NotPlain:
            channel.not_plain = True
            raise NotPlainResult() from None
    if "raised" in answer and type(answer["raised"]) is str:
        if answer["raised"] == "MemoryError":
            raise MemoryError("in the candidate")
        raise _EXCEPTIONS.get(answer["raised"], CandidateRaised)(f"raised by the candidate: {answer['raised']}")
    channel.not_plain = True
    raise NotPlainResult()


def proxy(name: str, channel: Channel) -> Callable[..., Any]:
    """A stand-in for the candidate's function ``name``: arguments go out as plain data, the answer
    comes back as plain data (an argument that is not plain data is a TypeError here)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            message = {"op": "call", "name": name, "args": to_plain(list(args)),
                       "kwargs": {str(k): to_plain(v) for k, v in kwargs.items()}}
        except NotPlain as exc:
            raise TypeError(f"an argument to {name} is not plain data: {exc}") from None
        return _value(channel.ask(message), channel)
    call.__name__ = call.__qualname__ = name
    return call


def _bound_names(tree: ast.AST) -> set[str]:
    """Names a piece of code binds (assignments, imports, defs, loop and with targets, ...)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _candidate_names(trees: list[ast.Module | None], trusted: set[str], entry_point: str) -> list[list[str]]:
    """Per test: the names it reads that only the candidate can define (not the prompt's, not a
    builtin, not bound by any test); the entry point whenever a test reads it."""
    bound: set[str] = set().union(*(_bound_names(t) for t in trees if t is not None)) if trees else set()
    out = []
    for tree in trees:
        read = set() if tree is None else {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                                           and isinstance(n.ctx, ast.Load)}
        names = {n for n in read if n not in trusted and n not in bound and not hasattr(builtins, n)}
        if entry_point and entry_point in read:
            names.add(entry_point)
        out.append(sorted(names))
    return out


def judge_run(orders: dict[str, Any], request_fd: int, answer_fd: int, say: Callable[..., None]) -> None:
    """Judge one candidate: its tests in a fresh namespace, every verdict said as it is decided."""
    channel = Channel(request_fd, answer_fd, orders["result_limit"])
    env: dict[str, Any] = {"__name__": "__judge__", "__builtins__": builtins}
    try:  # the prompt's helpers: the same text the candidate's process ran before its code
        exec(compile(orders["prefix"], "<prompt>", "exec"), env)
    except BaseException:  # noqa: BLE001 (a prompt whose helpers fail still has its tests judged)
        pass
    trusted = set(env) - {orders["entry_point"]}
    trees: list[ast.Module | None] = []
    codes: list[Any] = []  # compiled code objects, None for a test that does not compile
    for i, test in enumerate(orders["tests"]):
        try:
            tree = ast.parse(test)
            codes.append(compile(tree, f"<test {i}>", "exec"))
            trees.append(tree)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            trees.append(None)
            codes.append(None)
    names_of = _candidate_names(trees, trusted, orders["entry_point"])
    try:
        if "start" not in channel.read_message():
            channel._break("malformed")
        say("start")
        status = channel.read_message().get("code")
        say("code", status if status in ("ok", "crash", "syntax", "memory") else "crash")
        proxies: dict[str, Callable[..., Any]] = {}  # a name once callable keeps its stand-in: each call looks the name up anew over there
        for i, code in enumerate(codes):
            outcome = "0"
            channel.not_plain = False
            try:
                for name in names_of[i]:
                    if name in proxies:
                        env[name] = proxies[name]
                        continue
                    answer = channel.ask({"op": "get", "name": name})
                    if answer.get("callable") is True:
                        env[name] = proxies[name] = proxy(name, channel)
                    elif "value" in answer:
                        env[name] = _value(answer, channel)
                    else:  # missing, or not plain data (a class, a module): the test cannot use it
                        env.pop(name, None)
                if code is not None:
                    exec(code, env)
                    outcome = "1"
            except ChannelBroken:
                raise
            except MemoryError:
                outcome = "m"
            except BaseException:  # noqa: BLE001 (any other failure fails the test: outcome stays "0")
                pass
            if channel.broken:
                raise ChannelBroken(channel.broken)
            say("test", str(i), "0" if channel.not_plain else outcome)
    except ChannelBroken:
        say("channel", channel.broken or "malformed")


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next run's orders and its three pipe ends; None when the caller closed the socket."""
    header, fds, _, _ = socket.recv_fds(sock, 8, 3)
    while header and len(header) < 8:
        header += sock.recv(8 - len(header))
    if len(header) < 8 or len(fds) != 3:
        return None
    (size,) = struct.unpack("<Q", header)
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return json.loads(data.decode()), fds


def _die_with_caller(sock: socket.socket, caller: int) -> None:
    """End the judge with its caller: the kernel SIGKILLs it when the caller's thread that started it
    ends (``PR_SET_PDEATHSIG``; the caller starts judges from a thread that lives as long as it does),
    whatever the judge is doing. A caller that died before the prctl is seen as a changed parent pid.
    Besides, a thread exits the judge once the caller's end of ``sock`` is closed (POLLRDHUP, not
    POLLIN: the next run's orders do not wake it)."""
    libc = ctypes.CDLL(None)
    if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0 or os.getppid() != caller:  # PR_SET_PDEATHSIG
        os._exit(0)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: a process of the same user (weak mode) cannot open its /proc files

    def watch() -> None:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP)
        while True:
            for _, events in poller.poll():
                if events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    os._exit(0)

    _thread.start_new_thread(watch, ())


def _limit_cpu(seconds: float) -> None:
    """At most ``seconds`` more of CPU from now: the soft RLIMIT_CPU (SIGXCPU, whose default action ends
    the judge), raised again at the next run's start."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(usage.ru_utime + usage.ru_stime) + 1 + int(seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def _serve(sock: socket.socket) -> None:
    """Judge runs until the caller closes the socket."""
    while True:
        received = _receive(sock)
        if received is None:
            return
        orders, (request_fd, answer_fd, verdict_fd) = received
        _limit_cpu(orders["cpu_s"])
        tag = f"{int(orders['run'])} {orders['nonce']}"

        def say(*parts: str, _tag: str = tag, _fd: int = verdict_fd) -> None:
            data = (" ".join((_tag,) + parts) + "\n").encode()
            while data:
                data = data[os.write(_fd, data):]

        try:
            try:
                judge_run(orders, request_fd, answer_fd, say)
            finally:
                os.close(request_fd)  # the candidate's process reads the end of its requests and exits
                os.close(answer_fd)
            say("done")
        except BrokenPipeError:  # the caller stopped reading this run (its deadline): it kills or drops us
            pass
        finally:
            os.close(verdict_fd)  # the end of this run's verdicts: the caller reads EOF


def main() -> None:
    for limit, value in ((resource.RLIMIT_AS, JUDGE_MEMORY_MB << 20), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    sock = socket.socket(fileno=int(sys.argv[1]))
    _die_with_caller(sock, int(sys.argv[2]))
    try:
        _serve(sock)
    except BaseException:  # noqa: BLE001 (its own failure (MemoryError on an order, a bug): never a verdict)
        os._exit(JUDGE_FAILED)
    os._exit(0)


main()
