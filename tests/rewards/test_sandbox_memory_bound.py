"""A hoarder of memory that a candidate's address-space limit does not count (memfd, System V shared
memory, /dev/shm, its /tmp, pipe and socket buffers, a mapping that reserves nothing): what it holds
stays within its limit, as it measures itself and as a memory cgroup around the command line measures
the whole run; after the run nothing of it remains. And the sweep behind the seccomp filter and the IPC
namespace (``async_rl/sandbox/leftovers.py``) removes System V objects and keys that a candidate uid
holds, made here by a thread of the test that takes that uid, as no candidate can.
"""
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from sandbox_host_state import assert_nothing_left, fresh_marker, leftovers, own_uids

from async_rl.sandbox import isolation_mode, run_tests
from async_rl.sandbox.run import candidate_uids
from async_rl.sandbox.seccomp import SYSCALLS

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 4.0
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert not add(2, -2)"]
COLUMN = 0 if os.uname().machine == "x86_64" else 1
SETRESUID = {"x86_64": 117, "aarch64": 147}.get(os.uname().machine)


@pytest.fixture
def learner_marker():
    yield from fresh_marker()


HOARDER = r'''
import ctypes, fcntl, json, mmap, os, socket
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
MiB, TARGET = 1 << 20, 1536 << 20  # past its 1 GiB limit in every form
held, _keep = {{}}, []

def _hoard(name, step):
    held[name] = 0
    try:
        while held[name] < TARGET:
            got = step()
            if not got:
                break
            held[name] += got
    except BaseException:
        pass

def _anon():  # a mapping that reserves nothing: RLIMIT_AS counts it all the same
    _keep.append(mmap.mmap(-1, TARGET, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)))
    return TARGET

def _memfd():
    fd = os.memfd_create("hoard")
    _keep.append(fd)
    for _ in range(16):
        os.write(fd, b"x" * MiB)
    return 16 * MiB

def _sysv():
    shmid = _libc.shmget(0, 64 * MiB, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    addr = _libc.shmat(shmid, None, 0) if shmid >= 0 else None
    if addr in (None, ctypes.c_void_p(-1).value):
        return 0
    ctypes.memset(addr, 1, 64 * MiB)  # touched, then detached: the segment keeps it
    _libc.shmdt(ctypes.c_void_p(addr))
    return 64 * MiB

def _file(folder):
    def step():
        with open(os.path.join(folder, f"hoard{{len(_keep)}}"), "wb") as f:
            _keep.append(f.name)
            f.write(b"x" * (16 * MiB))
        return 16 * MiB
    return step

def _pipe():
    r, w = os.pipe()
    fcntl.fcntl(w, 1031, MiB)  # F_SETPIPE_SZ
    os.set_blocking(w, False)
    got = 0
    try:
        while True:
            got += os.write(w, b"x" * 65536)
    except BlockingIOError:
        return got

def _socket():
    a, b = socket.socketpair()
    _keep.extend((a, b))
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * MiB)
    a.setblocking(False)
    got = 0
    try:
        while True:
            got += a.send(b"x" * 65536)
    except BlockingIOError:
        return got

for _name, _step in (("anon_beyond_limit", _anon), ("memfd", _memfd), ("sysv_shm", _sysv),
                     ("dev_shm", _file("/dev/shm")), ("tmp", _file("/tmp")), ("pipes", _pipe), ("sockets", _socket)):
    _hoard(_name, _step)
print(json.dumps(held), flush=True)
print(json.dumps([os.readlink(f"/proc/self/ns/{{ns}}") for ns in ("ipc", "mnt", "net", "pid", "uts", "cgroup")]),
      flush=True)  # its tmpfs lives as long as its mount namespace, its IPC objects as its IPC namespace
def add(a, b):
    return None
'''


def _memory_cgroup(name: str):
    """A memory cgroup of this test's own (v1 ``memory`` or v2 with the controller) to measure a command's
    peak in, and its peak file; None where there is none."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, own = line.split(":", 2)
        mount = {"memory": "/sys/fs/cgroup/memory", "": "/sys/fs/cgroup/unified"}.get(controllers)
        if mount is None or not Path(mount).is_dir():
            continue
        parent = Path(mount + own)
        if controllers == "" and "memory" not in (parent / "cgroup.subtree_control").read_text():
            continue
        try:
            (parent / name).mkdir()
        except OSError:
            continue
        peak = parent / name / ("memory.max_usage_in_bytes" if controllers else "memory.peak")
        if peak.exists():
            return parent / name, peak
        (parent / name).rmdir()
    return None


@pytest.mark.skipif(isolation_mode() != "namespaces", reason="the weak mode isolates nothing")
def test_a_hoarder_holds_no_more_than_its_limit_in_any_form(learner_marker, tmp_path):
    marker, key = learner_marker
    result = run_tests(HOARDER.format(), ADD_TESTS, timeout_s=TIMEOUT_S)
    assert result.stdout, result
    lines = result.stdout.splitlines()
    held = {k: v >> 20 for k, v in json.loads(lines[0]).items()}  # MiB
    assert held["anon_beyond_limit"] == held["memfd"] == held["sysv_shm"] == held["dev_shm"] == 0, held
    assert held["tmp"] <= 64, held  # its tmpfs's size
    assert held["pipes"] + held["sockets"] <= 48, held  # kernel buffers, bounded by its 64 descriptors
    if os.geteuid() == 0:
        assert_nothing_left(own_uids(), marker, key, namespaces=json.loads(lines[1]))
    measured = _memory_cgroup(f"arl63_{uuid.uuid4().hex[:8]}")
    if measured is None:
        pytest.skip("no memory cgroup to measure the command line's peak in")
    group, peak = measured
    try:
        (tmp_path / "code.py").write_text(HOARDER.format())
        (tmp_path / "tests.txt").write_text("\n".join(ADD_TESTS) + "\n")
        procs = group / "cgroup.procs"
        done = subprocess.run(["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", sys.executable, "-m",
                               "async_rl.sandbox", str(tmp_path / "code.py"), str(tmp_path / "tests.txt"),
                               "--timeout", str(TIMEOUT_S)], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        # The caller, its judge and the candidate together, page cache included, below the candidate's own 1 GiB.
        assert int(peak.read_text()) >> 20 < 1024, f"peak {int(peak.read_text()) >> 20} MiB: {done.stdout}"
    finally:
        for _ in range(50):  # the command's processes leave the group as the kernel reaps them
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sweep is the root variant's: candidates of uids of their own")
def test_the_sweep_removes_what_a_uid_left_when_filter_and_namespace_did_not_stop_it(learner_marker):
    """The backstop behind the filter: System V objects and keys made as a candidate uid (by a thread of
    this test that takes that uid, as no candidate can), then ``sweep`` after the run."""
    from async_rl.sandbox.leftovers import sweep

    marker, key = learner_marker
    uid = candidate_uids()[1] - 1  # this process's last candidate slot, unused here
    libc = ctypes.CDLL(None, use_errno=True)
    made = []

    def as_candidate():
        assert libc.syscall(SETRESUID, uid, uid, 0) == 0  # setresuid
        try:
            made.extend([libc.shmget(key, 1 << 20, 0o1666), libc.msgget(key, 0o1666), libc.semget(key, 1, 0o1666)])
            made.extend(libc.syscall(SYSCALLS["add_key"][COLUMN], b"user", marker.encode(), b"1", 1, ring)
                        for ring in (-4, -5))  # the user and user-session keyrings
        finally:
            libc.syscall(SETRESUID, 0, 0, 0)

    worker = threading.Thread(target=as_candidate)
    worker.start()
    worker.join()
    assert len(made) == 5 and min(made) >= 0, made
    assert leftovers(range(uid, uid + 1), marker, key), "nothing to sweep: the setup did not work"
    found = sweep(uid)
    assert sorted(f.split(":")[0] for f in found) == ["keys", "msg", "sem", "shm"], found
    assert_nothing_left(range(uid, uid + 1), marker, key)
    assert sweep(uid) == []
