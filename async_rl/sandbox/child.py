"""The candidate's side of the sandbox (``async_rl/sandbox/`` starts it; nothing imports it).

It is started as ``python -I -S -B -c <sandbox/wire.py + sandbox/seccomp.py + this file>`` (inside ``unshare`` when
namespaces are available), reads its orders as JSON on stdin (the code and the prompt's prefix; never
the tests nor what they expect), then:

1. (namespaces) builds a new root holding only what Python needs (``private_root``: read-only /usr,
   the standard library, a minimal /dev, its own /proc, a size-limited tmpfs on /tmp as the only
   writable place) and pivots into it: no home directory, project tree, Ray session or host socket;
2. forks. The parent (pid 1 of the PID namespace) only reaps and exits with the candidate's status:
   when it exits, the kernel kills whatever the candidate left behind. It exits at once, killing the
   candidate, when the caller dies (a lifeline pipe reads EOF) or past a wall-clock backstop;
3. the child confines itself (own session, rlimits, an unprivileged uid of its own when the caller is
   root, no capabilities, the seccomp filter of ``sandbox/seccomp.py``: no new process or namespace,
   signals only to itself, no System V IPC, message queue, key or memfd), runs the code,
   then answers the judge's requests (``sandbox/judge.py``) with plain data: the values its functions
   return. It reports no verdict; whatever it writes on its channel is only ever an answer to check.

Only the standard library: it runs without site-packages.
"""
import builtins
import ctypes
import io
import json
import os
import resource
import select
import struct
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn

if TYPE_CHECKING:  # at run time the texts of sandbox/wire.py and sandbox/seccomp.py run before this file's
    from async_rl.sandbox.seccomp import install_filter
    from async_rl.sandbox.wire import NotPlain, dump_line, from_plain, to_plain

_LIBC = ctypes.CDLL(None, use_errno=True)


def _fail(msg: str) -> NoReturn:
    sys.stderr.write(f"sandbox setup failed: {msg}\n")
    os._exit(70)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        _fail(f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(src: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(_LIBC.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 0x1, 0x2, 0x4, 0x1000, 0x4000
MNT_DETACH, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = 2, -100, 0x8000, 0x1, 442


def _mount_setattr(path: str, recursive: bool, set_ro: bool) -> None:
    # struct mount_attr {u64 attr_set, attr_clr, propagation, userns_fd}; 442 on every arch (Linux >= 5.12)
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY if set_ro else 0, 0 if set_ro else MOUNT_ATTR_RDONLY, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ret = _LIBC.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(),
                        ctypes.c_uint(AT_RECURSIVE if recursive else 0), buf, ctypes.c_size_t(len(attr)))
    _check(ret, f"mount_setattr {path}")


SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
TMPFS_INODES = 4096  # files and folders in the candidate's /tmp
NOFILE = 64  # its open descriptors


def _bind(src: str, target: str, is_dir: bool = True) -> None:
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "w").close()
    _mount(src, target, None, MS_BIND | MS_REC)


def private_root(tmpfs_mb: float, python_dirs: list[str]) -> str:
    """A new root holding only what Python needs (we are root of fresh mount and PID namespaces):
    /usr and its top-level links or binds (/bin, /lib, ...), /etc/ld.so.cache, the interpreter's
    standard library where it lives outside /usr, a minimal /dev, the namespace's /proc and a
    size-limited tmpfs on /tmp (the only writable place). Every other path of the host (home
    directories, the project's tree, /tmp with Ray's session directory, /run's sockets) is not there."""
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=700")  # scratch for the new root
    root = "/tmp/root"
    os.mkdir(root)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for top in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = "/" + top
        if os.path.islink(host):
            os.symlink(os.readlink(host), root + host)
        elif os.path.isdir(host):
            _bind(host, root + host)
    os.mkdir(root + "/etc")
    for name in ("ld.so.cache", "localtime"):  # the dynamic loader's cache (hashlib's libcrypto), time zone
        if os.path.isfile("/etc/" + name):
            _bind(os.path.realpath("/etc/" + name), f"{root}/etc/{name}", is_dir=False)
    for path in python_dirs:
        if os.path.isdir(path) and not os.path.exists(root + path):
            _bind(path, root + path)
            parent = os.path.dirname(path)
            while parent != "/" and not os.path.ismount(root + parent):  # /root/.pyenv/...: pass through, not list
                os.chmod(root + parent, 0o711)
                parent = os.path.dirname(parent)
    # A minimal /dev: host device nodes stay reachable through a mount of /dev even when it is read-only
    # (device writes ignore the read-only flag), so only null, zero, random and urandom are kept.
    os.mkdir(root + "/dev")
    _mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID, "size=64k,mode=755")
    for name in ("null", "zero", "random", "urandom"):
        _bind(f"/dev/{name}", f"{root}/dev/{name}", is_dir=False)
    _bind("/proc", root + "/proc")  # the PID namespace's own /proc (unshare --mount-proc)
    os.mkdir(root + "/tmp")  # inodes capped too: each costs kernel memory that size= does not count
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={int(tmpfs_mb)}m,nr_inodes={TMPFS_INODES},mode=1777")
    os.mkdir(root + "/.old")
    nr = SYS_PIVOT_ROOT.get(os.uname().machine)
    if nr is None:
        _fail(f"no pivot_root number for {os.uname().machine}")
    _check(_LIBC.syscall(ctypes.c_long(nr), root.encode(), (root + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(_LIBC.umount2(b"/.old", MNT_DETACH), "umount the old root")
    os.rmdir("/.old")
    _mount_setattr("/", recursive=True, set_ro=True)
    _mount_setattr("/tmp", recursive=False, set_ro=False)
    os.mkdir("/tmp/work")
    return "/tmp/work"


def _reap(child: int, lifeline: int, wall_s: float) -> NoReturn:
    """pid 1 of the namespace: reap everything, exit with the candidate's status (128 + signal). It also
    ends the run, killing the candidate, when the caller is gone (``lifeline``, a pipe whose only write
    end the caller holds, reads EOF: a SIGKILLed caller cannot clean up) or after ``wall_s`` seconds (a
    backstop past the caller's own deadline). Its exit kills every process left in the namespace."""
    deadline = time.monotonic() + wall_s
    try:
        watched = [lifeline, os.pidfd_open(child)]  # readable when the candidate ends
    except (AttributeError, OSError):  # Linux < 5.3 (weak mode only): poll for it
        watched = [lifeline]
    while True:
        left = deadline - time.monotonic()
        ready = select.select(watched, [], [], left if len(watched) == 2 else min(left, 0.05))[0] if left > 0 else None
        if ready is None or lifeline in ready:  # past the backstop, or the caller is gone
            try:
                os.kill(child, 9)  # (the weak mode has no namespace to end it)
                os.waitpid(child, 0)
            except OSError:
                pass
            os._exit(128 + 9)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(0)
            if pid == 0:
                break
            if pid == child:
                os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _drop_privileges(uid: int | None) -> None:
    """No capability left, and (when the caller is root on the host) an unprivileged uid of its own:
    file permissions and RLIMIT_NPROC then apply to it, and it cannot remount anything."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _check(_LIBC.prctl(24, cap, 0, 0, 0), "PR_CAPBSET_DROP")  # bounding set: execve cannot regain
    _check(_LIBC.prctl(28, 0x3, 0, 0, 0), "PR_SET_SECUREBITS")  # SECBIT_NOROOT, locked
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # clears every capability set (no SECBIT_KEEP_CAPS)
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = ctypes.create_string_buffer(24)  # two {effective, permitted, inheritable} words, all zero
    _check(_LIBC.capset(ctypes.create_string_buffer(header, 8), data), "capset")
    status = open("/proc/self/status").read()
    if "CapEff:\t0000000000000000" not in status or "CapPrm:\t0000000000000000" not in status:
        _fail("capabilities still held after capset")
    if uid is not None and os.getresuid() != (uid, uid, uid):
        _fail("still root after setresuid")


def _weaken_python() -> None:
    """Without namespaces: make the obvious escapes fail in Python (a courtesy, not a boundary: ctypes
    or a C extension gets past it). Sockets, shell-outs and writes outside the work directory."""
    import socket  # noqa: PLC0415 (weak mode only: ~10 ms of every candidate's start otherwise)

    def refuse(*_args: object, **_kwargs: object) -> NoReturn:
        raise PermissionError("not allowed in the sandbox")

    class NoSocket(socket.socket):
        def __init__(self, *args: object, **kwargs: object) -> None:
            refuse()

    socket.socket = NoSocket  # type: ignore[misc]  # replacing the class is the point: a later socket() refuses
    for name in ("create_connection", "socketpair", "fromfd", "getaddrinfo"):
        setattr(socket, name, refuse)
    for name in ("system", "popen", "kill", "killpg", "fork", "forkpty", "execv", "execve", "execvp", "execvpe",
                 "spawnv", "spawnve", "spawnvp", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, refuse)
    sys.modules["subprocess"] = None  # type: ignore[assignment]  # None there: import subprocess -> ImportError
    real_open, real_os_open, root = builtins.open, os.open, os.getcwd()

    def inside(path: object) -> bool:
        path = os.path.realpath(os.fsdecode(path) if isinstance(path, (str, bytes)) else str(path))
        return path == root or path.startswith(root + os.sep)

    def only_inside(fn: Callable[..., Any]) -> Callable[..., Any]:  # file changes (tempfile deletes its files) are fine within the work directory
        def guarded(*paths: Any, **kwargs: Any) -> Any:
            if all(inside(p) for p in paths if not isinstance(p, int)):
                return fn(*paths, **kwargs)
            refuse()
        return guarded

    for name in ("remove", "unlink", "rmdir", "rename", "replace", "chmod", "chown", "symlink", "link", "truncate",
                 "mkdir", "makedirs"):
        if hasattr(os, name):
            setattr(os, name, only_inside(getattr(os, name)))

    def guarded_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, int) or not any(c in mode for c in "wax+") or inside(file):
            return real_open(file, mode, *args, **kwargs)
        refuse()

    def guarded_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND) and not inside(path):
            refuse()
        return real_os_open(path, flags, *args, **kwargs)

    builtins.open, os.open = guarded_open, guarded_os_open
    io.open = guarded_open


def _confine(orders: dict[str, Any], workdir: str, isolated: bool) -> None:
    if isolated:  # its own session: kill(0, ...) reaches only itself (weak mode: the harness kills its group)
        os.setsid()
        if orders["uid"] is not None:
            os.chown(workdir, orders["uid"], orders["uid"])
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(HOME=workdir, TMPDIR=workdir, PATH="/usr/bin:/bin", LANG="C.UTF-8", PYTHONHASHSEED="0")
    mb = 1 << 20
    cpu = int(orders["cpu_s"])
    for limit, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),  # soft: SIGXCPU, then SIGKILL
                         (resource.RLIMIT_AS, (orders["memory_mb"] * mb,) * 2),
                         (resource.RLIMIT_NPROC, (orders["max_procs"],) * 2),  # threads count too
                         (resource.RLIMIT_FSIZE, (orders["file_mb"] * mb,) * 2),
                         # few descriptors: each pipe or socket may hold up to ~0.5 MiB of kernel buffers
                         (resource.RLIMIT_NOFILE, (NOFILE, NOFILE)),
                         (resource.RLIMIT_MSGQUEUE, (0, 0)),  # no POSIX message queue bytes (seccomp refuses them too)
                         (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(limit, value)
    if isolated:
        _drop_privileges(orders["uid"])
    try:
        filtered = install_filter(own_group=isolated)
    except OSError as exc:
        _fail(str(exc))
    if not filtered:
        sys.stderr.write(f"sandbox: no seccomp filter for {os.uname().machine}: no system call is refused\n")
    if not isolated:
        _weaken_python()


def _serve(code: str, send: Callable[[dict[str, Any]], None], requests: Iterator[dict[str, Any]]) -> None:
    """Run the code, then answer the judge's requests (``get`` a name, ``call`` a function with plain
    arguments) with plain data until the judge closes its end. Nothing here decides a verdict: the
    judge checks every answer, so what the candidate does to this loop only changes its own answers."""
    run, build = exec, compile  # captured before the candidate can replace builtins.exec / compile
    send({"start": os.getpid()})
    try:
        compiled = build(code, "<candidate>", "exec")
    except BaseException:  # noqa: BLE001 (SyntaxError, ValueError (NUL bytes), MemoryError on absurd nesting)
        send({"code": "syntax"})
        return
    env: dict[str, Any] = {"__name__": "__candidate__", "__builtins__": builtins}  # __main__ blocks do not run
    try:
        run(compiled, env)
        status = "ok"
    except MemoryError:
        status = "memory"
    except BaseException:  # noqa: BLE001 (SystemExit, KeyboardInterrupt included: the tests still run)
        status = "crash"
    send({"code": status})
    for request in requests:
        answer: dict[str, Any] = {"id": request["id"]}
        target = env.get(request["name"], _MISSING)
        try:
            if target is _MISSING:
                answer["missing"] = True
            elif request["op"] == "get" and callable(target):
                answer["callable"] = True
            else:
                if request["op"] == "call":
                    args = from_plain(request["args"])
                    kwargs = {k: from_plain(v) for k, v in request["kwargs"].items()}
                    target = target(*args, **kwargs)
                answer["value"] = to_plain(target)
        except NotPlain as exc:
            answer["not_plain"] = str(exc)[:200]
        except BaseException as exc:  # noqa: BLE001 (SystemExit, KeyboardInterrupt included: an answer, not an exit)
            answer["raised"] = type(exc).__name__
        send(answer)


_MISSING = object()


def _requests(fd: int) -> Iterator[dict[str, Any]]:
    """The judge's requests, one JSON line each, until it closes its end."""
    buffer = b""
    while True:
        while b"\n" not in buffer:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        yield json.loads(line)


def main() -> None:
    orders = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    answer_fd, write = orders["answer_fd"], os.write

    def send(message: dict[str, Any], _write: Callable[[int, bytes], int] = write, _fd: int = answer_fd,
             _dump: Callable[[dict[str, Any]], bytes] = dump_line) -> None:
        data = _dump(message)
        while data:
            data = data[_write(_fd, data):]

    if orders["cgroup"]:  # before the fork: the reaper and all the candidate starts are counted there
        with open(os.path.join(orders["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    isolated = orders["isolated"]
    workdir = private_root(orders["tmpfs_mb"], orders["python_dirs"]) if isolated else orders["workdir"]
    child = os.fork()
    if child:
        os.close(answer_fd)
        os.close(orders["request_fd"])
        _reap(child, orders["lifeline_fd"], orders["wall_s"])
    os.close(orders["lifeline_fd"])
    _confine(orders, workdir, isolated)
    try:
        _serve(orders["prefix"] + orders["code"], send, _requests(orders["request_fd"]))
    except OSError:  # the judge is gone: nothing left to answer
        pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


main()
