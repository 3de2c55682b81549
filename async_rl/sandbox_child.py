"""The program that runs inside the sandbox (``async_rl/sandbox.py`` starts it; nothing imports it).

It is started as ``python -I -S -B -c <this file's text>`` (inside ``unshare`` when namespaces are
available), reads its orders as JSON on stdin, then:

1. (namespaces) as root of its own user namespace: a size-limited tmpfs on /tmp (the only writable
   place), a minimal /dev, empty tmpfs over /run and /dev/shm (their Unix sockets), and every other
   mount made read-only, recursively;
2. forks. The parent (pid 1 of the PID namespace) only reaps and exits with the candidate's status:
   when it exits, the kernel kills whatever the candidate left behind;
3. the child confines itself (own session, rlimits, no capabilities, a seccomp filter: no new
   processes, signals only to itself) and runs the candidate code, then each test in its own
   try/except, reporting on a pipe the harness opened: lines tagged with a random nonce, so text the
   candidate prints, or an early exit, cannot count as a passed test.

Only the standard library: it runs without site-packages.
"""
import ctypes
import json
import os
import resource
import struct
import sys

_LIBC = ctypes.CDLL(None, use_errno=True)


def _fail(msg):
    sys.stderr.write(f"sandbox setup failed: {msg}\n")
    os._exit(70)


def _check(ret, what):
    if ret != 0:
        _fail(f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(src, target, fstype, flags, data=None):
    enc = (lambda s: None if s is None else s.encode())
    _check(_LIBC.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 0x1, 0x2, 0x4, 0x1000, 0x4000
MNT_DETACH, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = 2, -100, 0x8000, 0x1, 442


def _mount_setattr(path, recursive, set_ro):
    # struct mount_attr {u64 attr_set, attr_clr, propagation, userns_fd}; 442 on every arch (Linux >= 5.12)
    attr = struct.pack("QQQQ", MOUNT_ATTR_RDONLY if set_ro else 0, 0 if set_ro else MOUNT_ATTR_RDONLY, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ret = _LIBC.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(),
                        ctypes.c_uint(AT_RECURSIVE if recursive else 0), buf, ctypes.c_size_t(len(attr)))
    _check(ret, f"mount_setattr {path}")


def private_mounts(tmpfs_mb):
    """The file system view of the sandbox (we are root of a fresh user + mount namespace)."""
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(tmpfs_mb)}m,mode=1777")
    # A minimal /dev: host device nodes stay reachable through a mount of /dev even when it is read-only
    # (device writes ignore the read-only flag), so only null, zero, random and urandom are kept.
    os.mkdir("/tmp/.hostdev")
    _mount("/dev", "/tmp/.hostdev", None, MS_BIND | MS_REC)
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "size=64k,mode=755")
    for name in ("null", "zero", "random", "urandom"):
        open(f"/dev/{name}", "w").close()
        _mount(f"/tmp/.hostdev/{name}", f"/dev/{name}", None, MS_BIND)
    _check(_LIBC.umount2(b"/tmp/.hostdev", MNT_DETACH), "umount /tmp/.hostdev")
    os.rmdir("/tmp/.hostdev")
    # Unix sockets on the host (docker, dbus, a Ray session's) live under /run; hide them.
    for path in ("/run", "/var/run"):
        if os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k")
    _mount_setattr("/", recursive=True, set_ro=True)
    _mount_setattr("/tmp", recursive=False, set_ro=False)
    os.mkdir("/tmp/work")
    return "/tmp/work"


def _reap(child):
    """pid 1 of the namespace: reap everything, exit with the candidate's status (128 + signal)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
        if pid == child:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _drop_capabilities():
    """No capability in the namespace: the candidate cannot remount /, mount over /tmp, or regain them."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _check(_LIBC.prctl(24, cap, 0, 0, 0), "PR_CAPBSET_DROP")  # bounding set: execve cannot regain
    _check(_LIBC.prctl(28, 0x3, 0, 0, 0), "PR_SET_SECUREBITS")  # SECBIT_NOROOT, locked
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = ctypes.create_string_buffer(24)  # two {effective, permitted, inheritable} words, all zero
    _check(_LIBC.capset(ctypes.create_string_buffer(header, 8), data), "capset")
    status = open("/proc/self/status").read()
    if "CapEff:\t0000000000000000" not in status or "CapPrm:\t0000000000000000" not in status:
        _fail("capabilities still held after capset")


# seccomp: syscall numbers per audit arch.
_ARCHES = {
    "x86_64": dict(audit=0xC000003E, clone=56, fork=57, vfork=58, kill=62, tkill=200, tgkill=234, ptrace=101,
                   clone3=435, pidfd_send_signal=424, process_vm_writev=311),
    "aarch64": dict(audit=0xC00000B7, clone=220, kill=129, tkill=130, tgkill=131, ptrace=117, clone3=435,
                    pidfd_send_signal=424, process_vm_writev=271),
}


def _seccomp(own_group):
    """No new process (threads are allowed), signals only to itself, no ptrace; other arches: none."""
    arch = _ARCHES.get(os.uname().machine)
    if arch is None:
        return False
    ALLOW, KILL = 0x7FFF0000, 0x80000000
    errno = lambda e: 0x00050000 | e  # noqa: E731
    EPERM, EAGAIN, ENOSYS = 1, 11, 38
    pid = os.getpid()
    prog = []
    ins = lambda code, jt, jf, k: prog.append(struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF))  # noqa: E731
    LD, JEQ, JSET, JGE, RET = 0x20, 0x15, 0x45, 0x35, 0x06
    ins(LD, 0, 0, 4)  # seccomp_data.arch
    ins(JEQ, 1, 0, arch["audit"])
    ins(RET, 0, 0, KILL)  # another ABI (i386 on x86_64): refuse outright
    ins(LD, 0, 0, 0)  # seccomp_data.nr
    ins(JGE, 0, 1, 0x40000000)  # x32 numbers
    ins(RET, 0, 0, KILL)
    rules = []  # (nr, [instructions after the match, ending in RET])
    for name in ("fork", "vfork"):
        if name in arch:
            rules.append((arch[name], [(RET, 0, 0, errno(EAGAIN))]))
    rules.append((arch["clone3"], [(RET, 0, 0, errno(ENOSYS))]))  # glibc then falls back to clone
    # clone: a thread (CLONE_THREAD in the flags, args[0]) is fine, a process is not.
    rules.append((arch["clone"], [(LD, 0, 0, 16), (JSET, 0, 1, 0x10000), (RET, 0, 0, ALLOW), (RET, 0, 0, errno(EAGAIN))]))
    # kill(pid, sig): only to itself (its own pid, or 0 when its process group is a session of one).
    rules.append((arch["kill"], [(LD, 0, 0, 16), (JEQ, 2, 0, pid), (JEQ, 1, 0, 0 if own_group else pid),
                                 (RET, 0, 0, errno(EPERM)),
                                 (RET, 0, 0, ALLOW)]))
    rules.append((arch["tgkill"], [(LD, 0, 0, 16), (JEQ, 0, 1, pid), (RET, 0, 0, ALLOW), (RET, 0, 0, errno(EPERM))]))
    for name in ("tkill", "pidfd_send_signal", "ptrace", "process_vm_writev"):
        rules.append((arch[name], [(RET, 0, 0, errno(EPERM))]))
    for nr, body in rules:  # every body ends in RET: a syscall that is not nr jumps past it, A still nr
        ins(JEQ, 0, len(body), nr)
        for code, jt, jf, k in body:
            ins(code, jt, jf, k)
    ins(RET, 0, 0, ALLOW)
    filt = b"".join(prog)
    buf = ctypes.create_string_buffer(filt, len(filt))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
    _check(_LIBC.prctl(38, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    _check(_LIBC.prctl(22, 2, ctypes.create_string_buffer(fprog, len(fprog)), 0, 0), "PR_SET_SECCOMP")
    return True


def _weaken_python():
    """Without namespaces: make the obvious escapes fail in Python (a courtesy, not a boundary: ctypes
    or a C extension gets past it). Sockets, shell-outs and writes outside the work directory."""
    import builtins
    import socket

    def refuse(*_args, **_kwargs):
        raise PermissionError("not allowed in the sandbox")

    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            refuse()

    socket.socket = NoSocket
    for name in ("create_connection", "socketpair", "fromfd", "getaddrinfo"):
        setattr(socket, name, refuse)
    for name in ("system", "popen", "kill", "killpg", "fork", "forkpty", "execv", "execve", "execvp", "execvpe",
                 "spawnv", "spawnve", "spawnvp", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, refuse)
    sys.modules["subprocess"] = None  # import subprocess -> ImportError
    real_open, real_os_open, root = builtins.open, os.open, os.getcwd()

    def inside(path):
        path = os.path.realpath(os.fsdecode(path) if isinstance(path, (str, bytes)) else str(path))
        return path == root or path.startswith(root + os.sep)

    def only_inside(fn):  # file changes (tempfile deletes its files) are fine within the work directory
        def guarded(*paths, **kwargs):
            if all(inside(p) for p in paths if not isinstance(p, int)):
                return fn(*paths, **kwargs)
            refuse()
        return guarded

    for name in ("remove", "unlink", "rmdir", "rename", "replace", "chmod", "chown", "symlink", "link", "truncate",
                 "mkdir", "makedirs"):
        if hasattr(os, name):
            setattr(os, name, only_inside(getattr(os, name)))

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(file, int) or not any(c in mode for c in "wax+") or inside(file):
            return real_open(file, mode, *args, **kwargs)
        refuse()

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND) and not inside(path):
            refuse()
        return real_os_open(path, flags, *args, **kwargs)

    builtins.open, os.open = guarded_open, guarded_os_open
    import io
    io.open = guarded_open


def _confine(orders, workdir, isolated):
    if isolated:  # its own session: kill(0, ...) reaches only itself (weak mode: the harness kills its group)
        os.setsid()
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(HOME=workdir, TMPDIR=workdir, PATH="/usr/bin:/bin", LANG="C.UTF-8", PYTHONHASHSEED="0")
    mb = 1 << 20
    cpu = int(orders["cpu_s"])
    for limit, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),  # soft: SIGXCPU, then SIGKILL
                         (resource.RLIMIT_AS, (orders["memory_mb"] * mb,) * 2),
                         (resource.RLIMIT_NPROC, (orders["max_procs"],) * 2),  # not enforced for uid 0 outside
                         (resource.RLIMIT_FSIZE, (orders["file_mb"] * mb,) * 2),
                         (resource.RLIMIT_NOFILE, (256, 256)),
                         (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(limit, value)
    if isolated:
        _drop_capabilities()
    if not _seccomp(own_group=isolated):
        sys.stderr.write(f"sandbox: no seccomp filter for {os.uname().machine}: new processes are not blocked\n")
    if not isolated:
        _weaken_python()


def _run(code, tests, report):
    import builtins
    run, build = exec, compile  # captured before the candidate can replace builtins.exec / compile
    report("start", str(os.getpid()))
    try:
        compiled = build(code, "<candidate>", "exec")
    except BaseException:  # SyntaxError, ValueError (NUL bytes), MemoryError on absurd nesting
        report("code", "syntax")
        report("done")
        return
    env = {"__name__": "__candidate__", "__builtins__": builtins}  # __main__ blocks do not run
    try:
        run(compiled, env)
        status = "ok"
    except MemoryError:
        status = "memory"
    except BaseException:  # SystemExit, KeyboardInterrupt included: the tests still run
        status = "crash"
    report("code", status)
    for i, test in enumerate(tests):
        try:
            run(build(test, f"<test {i}>", "exec"), env)
            outcome = "1"
        except MemoryError:
            outcome = "m"
        except BaseException:
            outcome = "0"
        report("test", str(i), outcome)
    report("done")


def main():
    orders = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # The result pipe moves to a high, random descriptor; its lines carry the nonce.
    fd = orders["fd"]
    if orders["hide_fd"] != fd:
        fd = os.dup2(fd, orders["hide_fd"])
        os.close(orders["fd"])
    nonce, write = orders["nonce"], os.write
    del orders["nonce"]

    def report(*parts, _write=write, _fd=fd, _tag=nonce):
        _write(_fd, (" ".join((_tag,) + parts) + "\n").encode())

    isolated = orders["isolated"]
    workdir = private_mounts(orders["tmpfs_mb"]) if isolated else orders["workdir"]
    child = os.fork()
    if child:
        os.close(fd)
        _reap(child)
    _confine(orders, workdir, isolated)
    _run(orders.pop("code"), orders.pop("tests"), report)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


main()
