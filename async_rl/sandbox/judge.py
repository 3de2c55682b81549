"""The judge: the trusted process that runs a candidate's tests and decides every verdict.

``async_rl/sandbox/run.py`` starts it as ``python -I -S -B -c <sandbox/wire.py + this file> FD`` (nothing
imports it); each run arrives on the Unix socket FD (its orders, and the two pipe ends of that run's
candidate process) and its verdicts leave on stdout. Runs share nothing but imported modules: each has a
fresh namespace, and a judge whose run did not end cleanly is killed, not reused. The judge holds
the test source, the prompt's helpers (``prefix``) and everything the tests expect; the candidate's
process never sees any of it. The judge never runs candidate code: a name a test uses that the prompt
does not define (the entry point, any function or value of the candidate) is asked of the candidate's
process over two pipes (``get``, then ``call`` with plain-data arguments), and only plain data comes
back (``sandbox/wire.py``), checked and rebuilt here. So an always-equal object, a patched builtin, a
harness's frame or reporter: none of it exists on this side.

It dies with its caller: a thread watches the socket and exits the judge once the caller's end is closed.

Lines on stdout (read by the caller), each after the run's number: ``start`` (the candidate's process is running its code),
``code ok|crash|syntax|memory``, ``test I 1|0|m`` per test, ``channel over_cap|malformed|eof`` (the
candidate's channel broke: the tests after it are not run), ``done``.
"""
import ast
import builtins
import os
import resource
import socket
import struct
import sys

JUDGE_MEMORY_MB = 2048  # its address space: what a candidate's (capped) answers can make it build
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

    def __init__(self, request_fd, answer_fd, limit):
        self.request_fd, self.answer_fd, self.limit = request_fd, answer_fd, limit
        self.buffer, self.received, self.next_id = b"", 0, 0
        self.broken = None  # over_cap | malformed | eof

    def _break(self, why):
        self.broken = self.broken or why
        raise ChannelBroken(why)

    def read_message(self):
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
            return parse_line(line)  # noqa: F821 (sandbox/wire.py's text runs before this file's)
        except NotPlain:  # noqa: F821
            self._break("malformed")

    def ask(self, message):
        if self.broken:
            raise ChannelBroken(self.broken)
        self.next_id += 1
        data = dump_line(dict(message, id=self.next_id))  # noqa: F821
        try:
            while data:
                data = data[os.write(self.request_fd, data):]
        except OSError:
            self._break("eof")
        answer = self.read_message()
        if answer.get("id") != self.next_id:
            self._break("malformed")
        return answer


def _value(answer, channel):
    """What a ``call`` answered: its plain value, or the exception it raised."""
    if "value" in answer:
        try:
            return from_plain(answer["value"])  # noqa: F821
        except NotPlain:  # noqa: F821
            channel.not_plain = True
            raise NotPlainResult() from None
    if "raised" in answer and type(answer["raised"]) is str:
        if answer["raised"] == "MemoryError":
            raise MemoryError("in the candidate")
        raise _EXCEPTIONS.get(answer["raised"], CandidateRaised)(f"raised by the candidate: {answer['raised']}")
    channel.not_plain = True
    raise NotPlainResult()


def proxy(name, channel):
    """A stand-in for the candidate's function ``name``: arguments go out as plain data, the answer
    comes back as plain data (an argument that is not plain data is a TypeError here)."""
    def call(*args, **kwargs):
        try:
            message = {"op": "call", "name": name, "args": to_plain(list(args)),  # noqa: F821
                       "kwargs": {str(k): to_plain(v) for k, v in kwargs.items()}}  # noqa: F821
        except NotPlain as exc:  # noqa: F821
            raise TypeError(f"an argument to {name} is not plain data: {exc}") from None
        return _value(channel.ask(message), channel)
    call.__name__ = call.__qualname__ = name
    return call


def _bound_names(tree):
    """Names a piece of code binds (assignments, imports, defs, loop and with targets, ...)."""
    names = set()
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


def _candidate_names(trees, trusted, entry_point):
    """Per test: the names it reads that only the candidate can define (not the prompt's, not a
    builtin, not bound by any test); the entry point whenever a test reads it."""
    bound = set().union(*(_bound_names(t) for t in trees if t is not None)) if trees else set()
    out = []
    for tree in trees:
        read = set() if tree is None else {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                                           and isinstance(n.ctx, ast.Load)}
        names = {n for n in read if n not in trusted and n not in bound and not hasattr(builtins, n)}
        if entry_point and entry_point in read:
            names.add(entry_point)
        out.append(sorted(names))
    return out


def judge_run(orders, request_fd, answer_fd, say):
    """Judge one candidate: its tests in a fresh namespace, every verdict said as it is decided."""
    channel = Channel(request_fd, answer_fd, orders["result_limit"])
    channel.not_plain = False
    env = {"__name__": "__judge__", "__builtins__": builtins}
    try:  # the prompt's helpers: the same text the candidate's process ran before its code
        exec(compile(orders["prefix"], "<prompt>", "exec"), env)
    except BaseException:
        pass
    trusted = set(env) - {orders["entry_point"]}
    trees, codes = [], []
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
        proxies = {}  # a name once callable keeps its stand-in: each call looks the name up anew over there
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
            except BaseException:
                pass
            if channel.broken:
                raise ChannelBroken(channel.broken)
            say("test", str(i), "0" if channel.not_plain else outcome)
    except ChannelBroken:
        say("channel", channel.broken or "malformed")


def _receive(sock):
    """The next run's orders and its two pipe ends; None when the caller closed the socket."""
    header, fds, _, _ = socket.recv_fds(sock, 8, 2)
    while header and len(header) < 8:
        header += sock.recv(8 - len(header))
    if len(header) < 8 or len(fds) != 2:
        return None
    (size,) = struct.unpack("<Q", header)
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return json.loads(data.decode()), fds  # json: imported by sandbox/wire.py, whose text runs first


def _die_with_caller(sock):
    """A thread that ends the judge once the caller's end of ``sock`` is closed (a SIGKILLed caller
    included), whatever the main thread is doing. POLLRDHUP, not POLLIN: the next run's orders do not
    wake it. (Not PR_SET_PDEATHSIG: that fires when the caller's thread that started the judge ends,
    while judges outlive the pool threads that start them.)"""
    import _thread
    import select

    def watch():
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLRDHUP)
        while True:
            for _, events in poller.poll():
                if events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    os._exit(0)

    _thread.start_new_thread(watch, ())


def main():
    resource.setrlimit(resource.RLIMIT_AS, (JUDGE_MEMORY_MB << 20,) * 2)
    import ctypes  # not dumpable: a process of the same user (a weak-mode candidate) cannot open its /proc files
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    sock = socket.socket(fileno=int(sys.argv[1]))
    _die_with_caller(sock)
    while True:
        received = _receive(sock)
        if received is None:
            os._exit(0)
        orders, (request_fd, answer_fd) = received
        tag = str(orders["run"])

        def say(*parts, _tag=tag):
            os.write(1, (" ".join((_tag,) + parts) + "\n").encode())

        try:
            judge_run(orders, request_fd, answer_fd, say)
        finally:
            os.close(request_fd)  # the candidate's process reads the end of its requests and exits
            os.close(answer_fd)
        say("done")


main()
