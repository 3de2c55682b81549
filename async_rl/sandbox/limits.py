"""A cgroup v2 per sandboxed candidate (``pids.max``, ``memory.max``), where the machine offers one.

``cgroup_for(slot, ...)`` returns a folder under this process's own cgroup, with the two limits written;
the candidate's harness moves itself into it before it forks the candidate (``sandbox/child.py``), so
everything the candidate starts is counted there. A machine without a cgroup v2 that delegates the
``pids`` and ``memory`` controllers to this process (a v1 or hybrid hierarchy, a container without
delegation) gets one line on stderr, once, and ``None``: the candidate's rlimits (RLIMIT_NPROC per uid,
RLIMIT_AS) are then the bound. That bound holds for memory in every form because the candidate cannot
hold memory that no mapping counts: its seccomp filter refuses memfd and System V shared memory, it has
no /dev/shm, its /tmp tmpfs has a size and an inode cap, and RLIMIT_NOFILE bounds its pipe and socket
buffers (docs/sandbox.md, "Protected: memory").
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Optional

_lock = threading.Lock()
_base: Optional[str] = None  # "" once known to be unavailable
_TMPFS_AND_MARGIN_MB = 128  # the candidate's /tmp tmpfs is charged to its cgroup too


def _own_cgroup_dirs() -> list[str]:
    """The folders that stand for this process's cgroup on every cgroup2 mount."""
    own = next((line[3:].strip() for line in open("/proc/self/cgroup") if line.startswith("0::")), None)
    if own is None:
        return []
    mounts = [line.split()[1] for line in open("/proc/self/mounts") if line.split()[2:3] == ["cgroup2"]]
    return [os.path.join(m, own.lstrip("/")) for m in mounts]


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _find_base() -> str:
    for own in _own_cgroup_dirs():
        try:
            controllers = open(os.path.join(own, "cgroup.controllers")).read().split()
        except OSError:
            continue
        if "pids" not in controllers or "memory" not in controllers:
            continue
        base = os.path.join(own, f"async_rl_sandbox_{os.getpid()}")
        os.makedirs(base, exist_ok=True)
        _write(os.path.join(own, "cgroup.subtree_control"), "+pids +memory")
        _write(os.path.join(base, "cgroup.subtree_control"), "+pids +memory")
        atexit.register(_remove_base, base)
        return base
    raise OSError("no cgroup v2 here delegates the pids and memory controllers to this process")


def _remove_base(base: str) -> None:
    for name in os.listdir(base) if os.path.isdir(base) else ():
        if name.startswith("slot"):
            release_cgroup(os.path.join(base, name))
    release_cgroup(base)


def cgroup_for(slot: int, memory_mb: int, max_procs: int) -> Optional[str]:
    """The cgroup folder of candidate slot ``slot`` with its limits set, or None where there is none."""
    global _base
    with _lock:
        if _base is None:
            try:
                _base = _find_base()
            except OSError as exc:
                _base = ""
                print(f"[sandbox] no cgroup for candidates ({exc}): their rlimits are the bound "
                      "(RLIMIT_NPROC per uid, RLIMIT_AS)", file=sys.stderr)
    if not _base:
        return None
    path = os.path.join(_base, f"slot{slot}")
    try:
        os.makedirs(path, exist_ok=True)
        _write(os.path.join(path, "pids.max"), str(max_procs + 2))  # + the namespace's reaper and the candidate
        _write(os.path.join(path, "memory.max"), str((memory_mb + _TMPFS_AND_MARGIN_MB) << 20))
        if os.path.exists(os.path.join(path, "memory.swap.max")):
            _write(os.path.join(path, "memory.swap.max"), "0")
    except OSError as exc:
        print(f"[sandbox] cannot set up the cgroup {path} ({exc}): this candidate has its rlimits only", file=sys.stderr)
        return None
    return path


def release_cgroup(path: str) -> None:
    """Remove a candidate's cgroup once its processes are gone (a busy one is left for the next run)."""
    try:
        os.rmdir(path)
    except OSError:
        pass
