"""ActorGroup: named actors of one role, fan-out / fan-in that names the member that failed,
and restarts with back-off.

Two kinds of restart: a member created with Ray's ``max_restarts`` keeps its handle (Ray re-runs
its constructor; the group kills a stuck process and waits for the new one), while a member the
group was given a ``factory`` for is replaced by a new actor.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Mapping, Optional

import ray
from rich.console import Console

from async_rl.errors import ActorFailedError, ActorTimeoutError

console = Console(stderr=True)
# An actor that raised may only be reporting a peer's death (a collective fails once the peer's
# socket closes, often before Ray reports the peer dead): wait this long for the root cause.
DEAD_PEER_GRACE_S = 5.0
# What a rank's collective raises when its peer closed the connection: the peer (dead, or alive with
# its own error that made it close) is the root cause, not the rank that reports it.
PEER_CLOSED = ("closed by peer", "reset by peer", "broken pipe")
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 4.0, 8.0)  # before the 1st, 2nd, ... restart of one member


def get_named(refs: Mapping[str, ray.ObjectRef], timeout_s: float, what: str,
              waited_s: Optional[float] = None) -> dict[str, Any]:
    """ray.get of several refs. The first one that fails raises ActorFailedError naming its actor
    (or, when it raised, a dead one among the others: the likelier cause) without waiting out the
    others' timeout; on timeout the error names every actor that did not answer, and how long they
    were given: ``waited_s`` where the caller already waited (this call then has only the rest)."""
    by_ref = {ref: name for name, ref in refs.items()}
    pending, deadline = list(by_ref), time.monotonic() + timeout_s
    results: dict[str, Any] = {}
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0))
        if not ready:
            names = ", ".join(by_ref[r] for r in pending)
            raise ActorTimeoutError(f"{names} did not answer {what} within {waited_s or timeout_s:g} s")
        for ref in ready:
            try:
                results[by_ref[ref]] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                dead = None if isinstance(exc, ray.exceptions.RayActorError) else _dead_actor(pending, by_ref, _peer_closed(exc))
                if dead is not None:
                    raise ActorFailedError(dead[0], what, dead[1]) from exc
                raise ActorFailedError(by_ref[ref], what, exc) from exc
    return {name: results[name] for name in refs}


def _peer_closed(exc: BaseException) -> bool:
    return any(s in str(exc).lower() for s in PEER_CLOSED)


def _dead_actor(refs: list[ray.ObjectRef], names: Mapping[ray.ObjectRef, str],
                raised_counts: bool = False) -> Optional[tuple[str, BaseException]]:
    """(name, error) of an actor among ``refs`` that died, if Ray says so within DEAD_PEER_GRACE_S;
    with ``raised_counts`` (the first error only said its peer closed the connection), also one that
    raised an error of its own meanwhile (it closed the connection when its own collective failed)."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=DEAD_PEER_GRACE_S) if refs else ([], [])
    raised = None
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return names[ref], exc
        except ray.exceptions.RayError as exc:
            if raised is None and raised_counts and not _peer_closed(exc):
                raised = names[ref], exc
    return raised


def failure_reason(ref: ray.ObjectRef) -> str:
    """Why a finished call ended: returned, its process died, or what it raised (one line)."""
    try:
        ray.get(ref, timeout=0)
        return "its call returned before the run ended"
    except ray.exceptions.RayActorError as exc:
        return f"its process died ({type(exc).__name__})"
    except ray.exceptions.RayTaskError as exc:
        first = str(exc.cause).splitlines()[0] if str(exc.cause) else ""
        return f"it raised {type(exc.cause).__name__}: {first}"


class ActorGroup(Mapping[str, Any]):
    """Named actors of one role (``trainer-0``, ``trainer-1``, ...): a read-only mapping, fan-out calls
    with one timeout, restarts counted per member and reported to ``on_restart(counter)``."""

    def __init__(self, role: str, members: Mapping[str, Any], timeout_s: float, max_restarts: int = 0,
                 factory: Optional[Callable[[str], Any]] = None, restart_counter: str = "",
                 on_restart: Callable[[str], None] = lambda counter: None) -> None:
        self.role, self.timeout_s, self.max_restarts = role, timeout_s, max_restarts
        self.members: dict[str, Any] = dict(members)
        self.factory, self.restart_counter, self.on_restart = factory, restart_counter or f"{role}_restarts", on_restart
        self.restarts: dict[str, int] = {}
        self.pids: dict[str, int] = {}

    @classmethod
    def create(cls, role: str, count: int, factory: Callable[[str], Any], **kwargs: Any) -> "ActorGroup":
        """``count`` members named ``<role>-<i>``, each ``factory(name)``."""
        return cls(role, {f"{role}-{i}": factory(f"{role}-{i}") for i in range(count)}, factory=factory, **kwargs)

    # ---- dict-like access ---------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        return self.members[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def names(self) -> list[str]:
        return list(self.members)

    # ---- fan-out / fan-in ---------------------------------------------------------------
    def submit(self, method: str, *args: Any, **kwargs: Any) -> dict[str, ray.ObjectRef]:
        """Call ``method`` on every member; returns the refs by member name (nothing waited for)."""
        return {name: getattr(actor, method).remote(*args, **kwargs) for name, actor in self.members.items()}

    def call(self, method: str, *args: Any, timeout_s: Optional[float] = None, what: str = "", **kwargs: Any) -> dict[str, Any]:
        """Call ``method`` on every member and wait for all (get_named: the failure names its member)."""
        return get_named(self.submit(method, *args, **kwargs), timeout_s or self.timeout_s, what or method)

    def gather(self, method: str, *args: Any, timeout_s: Optional[float] = None) -> dict[str, Any]:
        """Like ``call``, but a member that is dead, restarting or late answers None instead of
        failing the whole call (for state that is nice to have, e.g. in a checkpoint)."""
        refs = self.submit(method, *args)
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s or self.timeout_s)
        out: dict[str, Any] = {}
        for name, ref in refs.items():
            try:
                out[name] = ray.get(ref, timeout=0)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                out[name] = None
        return out

    def record_pids(self, timeout_s: Optional[float] = None) -> None:
        self.pids.update(self.call("pid", timeout_s=timeout_s, what="pid"))

    def pid(self, name: str) -> Optional[int]:
        """The member's process id; None if its process is dead. One that is alive but does not
        answer within the group's timeout stops the run with an error naming it."""
        try:
            return ray.get(self.members[name].pid.remote(), timeout=self.timeout_s)
        except ray.exceptions.RayActorError:
            return None
        except ray.exceptions.GetTimeoutError:
            raise ActorTimeoutError(f"{name} did not answer within {self.timeout_s:g} s (alive but stuck?)") from None

    def died(self, name: str) -> bool:
        """Whether the member's process is not the one recorded (dead, or restarted by Ray)."""
        return self.pid(name) != self.pids.get(name)

    # ---- restarts -----------------------------------------------------------------------
    def restart(self, name: str, reason: str) -> Any:
        """Bring ``name`` back (Ray restart, or a new actor from the factory) after a back-off and
        wait until its new process answers; past ``max_restarts`` raises ActorFailedError."""
        count = self.restarts[name] = self.restarts.get(name, 0) + 1
        if count > self.max_restarts:
            raise ActorFailedError(name, "the run", RuntimeError(f"{reason}; restarted {self.max_restarts} times "
                                                                 "already (actor_max_restarts)"))
        console.print(f"{name} failed: {reason}; restarting it ({count}/{self.max_restarts})", style="yellow",
                      markup=False)
        time.sleep(RESTART_BACKOFF_S[min(count - 1, len(RESTART_BACKOFF_S) - 1)])
        old_pid = self.pids.get(name)
        if self.factory is not None:
            ray.kill(self.members[name], no_restart=True)
            self.members[name] = self.factory(name)
        else:
            try:
                same_process = self.pid(name) == old_pid
            except ActorTimeoutError:
                same_process = True  # alive but stuck
            if same_process:  # kill the process so Ray starts a fresh one
                ray.kill(self.members[name], no_restart=False)
        self.pids[name] = self._wait_new_pid(name, old_pid)
        self.on_restart(self.restart_counter)
        return self.members[name]

    def _wait_new_pid(self, name: str, old_pid: Optional[int]) -> int:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                pid = ray.get(self.members[name].pid.remote(), timeout=max(deadline - time.monotonic(), 0.1))
                if pid != old_pid:
                    return pid
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise ActorTimeoutError(f"{name} did not come back within {self.timeout_s:g} s after "
                                            f"a restart ({type(exc).__name__})") from None
            time.sleep(0.2)

    def remove(self, name: str) -> None:
        """Give up on a member: kill it and leave it out of every later call."""
        ray.kill(self.members.pop(name))

    def kill_all(self) -> None:
        for actor in self.members.values():
            ray.kill(actor)
