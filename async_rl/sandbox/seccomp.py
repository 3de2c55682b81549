"""The candidate's seccomp filter: the system calls it may not make, and why (docs/sandbox.md lists them).

The candidate's harness (``sandbox/child.py``) installs it (``install_filter``) once it has dropped its
privileges, right before the candidate's code runs; the filter holds for every thread it starts and
cannot be removed. This file's text runs as part of that harness (only the standard library, no import
of the package), and the tests import it to read its tables.

A deny list, not an allow list: Python and its C extensions make many calls a short allow list would
break, so what is refused is what a test never needs and what reaches past the candidate's own process:
other processes, namespaces, state that outlives it (System V IPC, POSIX message queues, keys), memory
that its address-space limit does not count, sockets other than AF_UNIX, the machine's administration and
the larger parts of the kernel's surface. A call of another ABI (i386 or x32 on x86_64) kills the process.
On an architecture without a table here the harness says so on stderr and runs without a filter.
"""
import ctypes
import os
import struct

EPERM, EAGAIN, ENOSYS, EAFNOSUPPORT = 1, 11, 38, 97  # the same numbers on x86_64 and aarch64
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# name: (x86_64 number, aarch64 number); None where the architecture has no such call.
SYSCALLS = {
    "fork": (57, None), "vfork": (58, None), "clone": (56, 220), "clone3": (435, 435),
    "unshare": (272, 97), "setns": (308, 268),
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131), "pidfd_send_signal": (424, 424),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438), "kcmp": (312, 272), "process_madvise": (440, 440),
    "socket": (41, 198), "socketpair": (53, 199),
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197),
    "semget": (64, 190), "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192),
    "msgget": (68, 186), "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182), "mq_timedreceive": (243, 183),
    "mq_notify": (244, 184), "mq_getsetattr": (245, 185),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "vmsplice": (278, 75),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "fanotify_init": (300, 262), "cachestat": (451, 451),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442), "open_tree_attr": (467, 467),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "reboot": (169, 142), "swapon": (167, 224),
    "swapoff": (168, 225), "syslog": (103, 116), "acct": (163, 89), "quotactl": (179, 60),
    "open_by_handle_at": (304, 265), "sethostname": (170, 161), "setdomainname": (171, 162),
    "iopl": (172, None), "ioperm": (173, None), "modify_ldt": (154, None),
}

# Refused whatever the arguments: group -> (errno, the calls).
DENIED = {
    "namespaces": (EPERM, ("unshare", "setns")),
    "other processes": (EPERM, ("tkill", "pidfd_send_signal", "ptrace", "process_vm_readv", "process_vm_writev",
                                "pidfd_getfd", "kcmp", "process_madvise")),
    "state that outlives the process": (EPERM, (
        "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd",
        "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
        "add_key", "request_key", "keyctl")),
    # (vmsplice: a pipe keeps the pages it was handed, a whole huge page per slot, after they are unmapped)
    "memory the address-space limit does not count": (EPERM, ("memfd_create", "memfd_secret", "vmsplice")),
    "kernel surface": (EPERM, ("bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
                               "io_uring_register", "fanotify_init", "cachestat")),
    "mounts": (EPERM, ("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
                       "fsmount", "fspick", "mount_setattr", "open_tree_attr")),
    "the machine": (EPERM, ("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
                            "reboot", "swapon", "swapoff", "syslog", "acct", "quotactl", "open_by_handle_at",
                            "sethostname", "setdomainname", "iopl", "ioperm", "modify_ldt")),
}

CLONE_THREAD = 0x00010000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (CLONE_NEWTIME, 0x80, only exists for
# clone3 and unshare: in clone's flags those bits are the exit signal).
CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
AF_UNIX = 1

_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_LD, _JEQ, _JSET, _JGE, _RET = 0x20, 0x15, 0x45, 0x35, 0x06
_ARG0 = 16  # offset of the low 32 bits of seccomp_data.args[0] (little-endian): every argument checked is an int


def _errno(e: int) -> int:
    return 0x00050000 | e  # SECCOMP_RET_ERRNO


def _rules(pid: int, own_group: bool) -> list[tuple[str, list[tuple[int, int, int, int]]]]:
    """(name, instructions after the match, each body ending in RET) for the calls that depend on their
    arguments, then one RET per denied call."""
    rules: list[tuple[str, list[tuple[int, int, int, int]]]] = [
        ("fork", [(_RET, 0, 0, _errno(EAGAIN))]),  # no new process
        ("vfork", [(_RET, 0, 0, _errno(EAGAIN))]),
        # clone3: its flags sit in memory, which seccomp cannot read; on ENOSYS glibc falls back to clone.
        ("clone3", [(_RET, 0, 0, _errno(ENOSYS))]),
        # clone: a thread (CLONE_THREAD) without any CLONE_NEW* flag; a process gets EAGAIN, a namespace EPERM.
        ("clone", [(_LD, 0, 0, _ARG0), (_JSET, 3, 0, CLONE_NEW_ANY), (_JSET, 0, 1, CLONE_THREAD),
                   (_RET, 0, 0, _ALLOW), (_RET, 0, 0, _errno(EAGAIN)), (_RET, 0, 0, _errno(EPERM))]),
        # kill(pid, sig): only to itself (its own pid, or 0 when its process group is a session of one).
        ("kill", [(_LD, 0, 0, _ARG0), (_JEQ, 2, 0, pid), (_JEQ, 1, 0, 0 if own_group else pid),
                  (_RET, 0, 0, _errno(EPERM)), (_RET, 0, 0, _ALLOW)]),
        ("tgkill", [(_LD, 0, 0, _ARG0), (_JEQ, 0, 1, pid), (_RET, 0, 0, _ALLOW), (_RET, 0, 0, _errno(EPERM))]),
    ]
    for name in ("socket", "socketpair"):  # AF_UNIX only (asyncio's self-pipe is a socketpair)
        rules.append((name, [(_LD, 0, 0, _ARG0), (_JEQ, 0, 1, AF_UNIX), (_RET, 0, 0, _ALLOW),
                             (_RET, 0, 0, _errno(EAFNOSUPPORT))]))
    for errno, names in DENIED.values():
        rules.extend((name, [(_RET, 0, 0, _errno(errno))]) for name in names)
    return rules


def build_filter(machine: str, pid: int, own_group: bool) -> bytes | None:
    """The filter program for ``machine`` (``os.uname().machine``) as packed sock_filter instructions, or
    None where there is no table for it. ``pid``: the candidate's own (kill and tgkill reach only it)."""
    if machine not in AUDIT_ARCH:
        return None
    column = 0 if machine == "x86_64" else 1
    prog: list[bytes] = []

    def ins(code: int, jt: int, jf: int, k: int) -> None:
        prog.append(struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF))

    ins(_LD, 0, 0, 4)  # seccomp_data.arch
    ins(_JEQ, 1, 0, AUDIT_ARCH[machine])
    ins(_RET, 0, 0, _KILL)  # another ABI (i386 on x86_64): refuse outright
    ins(_LD, 0, 0, 0)  # seccomp_data.nr
    ins(_JGE, 0, 1, 0x40000000)  # x32 numbers
    ins(_RET, 0, 0, _KILL)
    for name, body in _rules(pid, own_group):
        nr = SYSCALLS[name][column]
        if nr is None:
            continue
        ins(_JEQ, 0, len(body), nr)  # every body ends in RET: a call that is not nr jumps past it, A still nr
        for instruction in body:
            ins(*instruction)
    ins(_RET, 0, 0, _ALLOW)
    return b"".join(prog)


def install_filter(own_group: bool) -> bool:
    """Install the filter on this process (after PR_SET_NO_NEW_PRIVS); False where there is no table for
    this architecture. Raises OSError when the kernel refuses it."""
    filt = build_filter(os.uname().machine, os.getpid(), own_group)
    if filt is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(filt, len(filt))
    fprog = struct.pack("HxxxxxxQ", len(filt) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.create_string_buffer(fprog, len(fprog)), 0, 0) != 0:
        err = ctypes.get_errno()  # PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP with SECCOMP_MODE_FILTER
        raise OSError(err, f"cannot install the seccomp filter: {os.strerror(err)}")
    return True
