"""After a root caller's candidate run: remove what its uid may still hold on the machine.

Kernel objects the mount, PID and network namespaces do not isolate outlive a process: System V shared
memory, semaphores and message queues, POSIX message queues, and keys (a uid's user and user-session
keyrings live as long as the user namespace, the machine's for a root caller's candidates, whose uid is
reused by a later candidate). The candidate cannot make any of them: the seccomp filter refuses the calls
(``sandbox/seccomp.py``) and its IPC namespace is its own, destroyed with every object in it when its last
process ends. ``sweep`` is the check behind both, run by the caller after every run of the ``root``
variant, before the uid goes to another candidate: System V objects of that uid in the caller's IPC
namespace are removed, and where the kernel counts keys for it (``/proc/key-users``) the keys of that uid
linked into the caller's session keyring (which every candidate inherits) are unlinked, and its user and
user-session keyrings cleared and invalidated by a thread running as that uid (only their owner may). What it found is
returned and said on stderr: on a sound kernel it finds nothing, and costs four small /proc reads.

Not swept: POSIX message queues of the caller's IPC namespace (listing them needs the mqueue filesystem
mounted); they cannot be made by a candidate that has its own IPC namespace and the filter. The userns
variant runs candidates as the caller's own uid: its objects are the caller's, and the candidate's user
namespace holds its keyrings and dies with it.
"""
from __future__ import annotations

import ctypes
import os
import struct
import sys
import threading

from async_rl.sandbox.seccomp import SYSCALLS

_IPC_RMID = 0
_KINDS = {"shm": "shmid", "msg": "msqid", "sem": "semid"}  # /proc/sysvipc file: its id column
_COLUMN = 0 if os.uname().machine == "x86_64" else 1
_KEYCTL = SYSCALLS["keyctl"][_COLUMN]
_SETRESUID = {"x86_64": 117, "aarch64": 147}.get(os.uname().machine)
_KEYCTL_GET_KEYRING_ID, _KEYCTL_DESCRIBE, _KEYCTL_CLEAR, _KEYCTL_UNLINK = 0, 6, 7, 9
_KEYCTL_READ, _KEYCTL_INVALIDATE = 11, 21
_SESSION, _USER, _USER_SESSION = -3, -4, -5  # KEY_SPEC_* keyrings


def sysv_objects(uid: int) -> list[tuple[str, int]]:
    """(kind, id) of every System V IPC object of this IPC namespace that ``uid`` owns or created."""
    found = []
    for kind, id_column in _KINDS.items():
        try:
            header, *rows = open(f"/proc/sysvipc/{kind}").read().splitlines()
        except (OSError, ValueError):  # no System V IPC in this kernel
            continue
        columns = header.split()
        for row in rows:
            fields = dict(zip(columns, row.split()))
            if str(uid) in (fields.get("uid"), fields.get("cuid")) and fields.get(id_column, "").isdigit():
                found.append((kind, int(fields[id_column])))
    return found


def key_count(uid: int) -> int:
    """The keys the kernel counts for ``uid`` (0 when it holds none)."""
    try:
        lines = open("/proc/key-users").read().splitlines()
    except OSError:
        return 0
    for line in lines:
        who, _, rest = line.partition(":")
        if who.strip() == str(uid):  # "uid: usage nkeys/nikeys qnkeys/maxkeys qnbytes/maxbytes"
            count = rest.split()[1].split("/")[0] if len(rest.split()) > 1 else "1"
            return int(count) if count.isdigit() else 1
    return 0


def _remove_sysv(kind: str, ident: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if kind == "shm":
        libc.shmctl(ident, _IPC_RMID, None)
    elif kind == "msg":
        libc.msgctl(ident, _IPC_RMID, None)
    else:
        libc.semctl(ident, 0, _IPC_RMID)


def _unlink_from_our_session_keyring(libc: ctypes.CDLL, uid: int) -> None:
    """Keys of ``uid`` linked into this process's session keyring, which every candidate inherits."""
    ids = ctypes.create_string_buffer(4 * 4096)
    size = libc.syscall(_KEYCTL, _KEYCTL_READ, _SESSION, ids, len(ids))  # the serials it links
    for (serial,) in struct.iter_unpack("i", ids.raw[:max(0, min(size, len(ids)))]):
        about = ctypes.create_string_buffer(4096)  # "type;uid;gid;perm;description"
        if libc.syscall(_KEYCTL, _KEYCTL_DESCRIBE, serial, about, len(about)) > 0 \
                and about.value.split(b";")[1:2] == [str(uid).encode()]:
            libc.syscall(_KEYCTL, _KEYCTL_UNLINK, serial, _SESSION)


def _clear_user_keyrings(libc: ctypes.CDLL, uid: int, outcome: list[str]) -> None:
    """As ``uid``: clear and invalidate its user and user-session keyrings (both ids first: looking one up
    recreates the other). Run on a thread of its own, which ends right after: the raw setresuid changes
    that thread's credentials only (glibc's wrapper would change every thread's), and the saved uid 0
    lets it become root again."""
    if libc.syscall(_SETRESUID, uid, uid, 0) != 0:
        outcome.append(f"setresuid: {os.strerror(ctypes.get_errno())}")
        return
    try:
        for ring in [libc.syscall(_KEYCTL, _KEYCTL_GET_KEYRING_ID, spec, 0) for spec in (_USER, _USER_SESSION)]:
            if ring > 0:
                libc.syscall(_KEYCTL, _KEYCTL_CLEAR, ring)
                libc.syscall(_KEYCTL, _KEYCTL_INVALIDATE, ring)
    finally:
        libc.syscall(_SETRESUID, 0, 0, 0)


def _clear_keys(uid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    _unlink_from_our_session_keyring(libc, uid)
    if _SETRESUID is None or os.geteuid() != 0:
        return
    outcome: list[str] = []
    worker = threading.Thread(target=_clear_user_keyrings, args=(libc, uid, outcome), name="sandbox-keys")
    worker.start()
    worker.join()
    if outcome:
        print(f"[sandbox] cannot clear the keys of uid {uid}: {outcome[0]}", file=sys.stderr)


def sweep(uid: int) -> list[str]:
    """Remove what ``uid`` left: System V IPC objects, the keys of its keyrings. What was found, as
    ``kind:id`` (``keys:N``), normally nothing."""
    objects = sysv_objects(uid)
    for kind, ident in objects:
        _remove_sysv(kind, ident)
    found = [f"{kind}:{ident}" for kind, ident in objects]
    keys = key_count(uid)
    if keys:
        found.append(f"keys:{keys}")
        _clear_keys(uid)
    if found:
        print(f"[sandbox] a candidate of uid {uid} left {', '.join(found)} despite its filter and namespaces: "
              "removed", file=sys.stderr)
    return found
