"""What a sandbox run may leave on the machine, seen from the host: the checks after every run of the
hostile candidates of ``test_sandbox_kernel_surface.py`` and ``test_sandbox_memory_bound.py``, and the
fixture that removes whatever a broken sandbox let them leave. Read from /proc, independently of the
sandbox's own sweep (``async_rl/sandbox/leftovers.py``), which only the fixture's clean-up uses."""
import os
import random
import subprocess
import time
import uuid
from pathlib import Path

from async_rl.sandbox.run import _UID_BASE, _UIDS_PER_PROCESS, candidate_uids


def own_uids() -> range:
    return range(*candidate_uids())


def uids_of(pid: int) -> range:
    """The candidate uids of another caller process (the command line's)."""
    low = _UID_BASE + (pid % (1 << 22)) * _UIDS_PER_PROCESS
    return range(low, low + _UIDS_PER_PROCESS)


def sysv_rows():
    rows = []
    for kind in ("shm", "msg", "sem"):
        header, *lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        rows += [(kind, dict(zip(header.split(), line.split()))) for line in lines]
    return rows


def key_users() -> dict[int, int]:
    out = {}
    for line in Path("/proc/key-users").read_text().splitlines():
        who, _, rest = line.partition(":")
        out[int(who)] = int(rest.split()[1].split("/")[0])
    return out


def _processes() -> dict[int, tuple[int, int]]:
    """pid: (parent pid, uid) of every process of the machine."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = dict(ln.split(":", 1) for ln in Path(f"/proc/{entry}/status").read_text().splitlines())
                out[int(entry)] = (int(status["PPid"]), int(status["Uid"].split()[0]))
            except (OSError, KeyError, ValueError):
                pass
    return out


def held_namespaces(uids: range) -> set[str]:
    """The namespaces ("ipc:[4026532178]", ...) that a process of ``uids`` or of this test's tree is in or
    holds open: none else can hold a candidate's (it has no way to hand a descriptor out), and a namespace
    number freed by a run may go to another's at once."""
    processes = _processes()
    ours = {os.getpid()}
    for _ in range(16):  # descendants, level by level
        ours |= {pid for pid, (ppid, _) in processes.items() if ppid in ours}
    held = set()
    for pid in ours | {pid for pid, (_, uid) in processes.items() if uid in uids}:
        for sub in ("ns", "fd"):
            try:
                names = os.listdir(f"/proc/{pid}/{sub}")
            except OSError:
                continue
            for name in names:
                try:
                    held.add(os.readlink(f"/proc/{pid}/{sub}/{name}"))
                except OSError:
                    pass
    return held


def leftovers(uids: range, marker: str, key: int, namespaces=()) -> list[str]:
    """What of the runs of candidates of ``uids`` (and of ``marker`` / System V ``key``) is still there."""
    left = [f"process {pid} of uid {uid}" for pid, (_, uid) in _processes().items() if uid in uids]
    for kind, row in sysv_rows():
        if int(row["uid"]) in uids or int(row["cuid"]) in uids or int(row["key"]) == key:
            left.append(f"System V {kind} {row}")
    left += [f"{n} keys of uid {u}" for u, n in key_users().items() if u in uids and n]
    for folder in ("/tmp", "/dev/shm", "/var/tmp"):
        for entry in os.scandir(folder):
            try:
                owner = entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue
            if marker in entry.name or owner in uids:
                left.append(f"file {entry.path}")
    held = held_namespaces(uids)
    left += [f"namespace {ns} still held" for ns in namespaces if ns in held]
    return left


def assert_nothing_left(uids: range, marker: str, key: int, namespaces=()):
    """Polled for a few seconds: keys and namespaces are released by the kernel's workers, not at once."""
    deadline = time.monotonic() + 10.0
    while (left := leftovers(uids, marker, key, namespaces)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left on the machine after the runs: {left}"


def fresh_marker():
    """A fixture's body: a fresh name and System V key for a test's candidates; afterwards, whatever a broken
    sandbox let them leave is removed."""
    marker, key = f"arl63_{uuid.uuid4().hex[:10]}", random.randrange(1 << 24, 1 << 30)
    yield marker, key
    from async_rl.sandbox.leftovers import sweep
    for kind, row in sysv_rows():
        if int(row["key"]) == key:
            subprocess.run(["ipcrm", {"shm": "-M", "msg": "-Q", "sem": "-S"}[kind], str(key)], check=False)
    for uid in {int(row["uid"]) for _, row in sysv_rows()} | set(key_users()):
        if uid >= _UID_BASE:
            sweep(uid)
    for folder in ("/tmp", "/dev/shm", "/var/tmp"):
        Path(folder, marker).unlink(missing_ok=True)
