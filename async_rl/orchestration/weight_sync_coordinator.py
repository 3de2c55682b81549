"""WeightSyncCoordinator: the group of trainer rank 0 and the inference actors that carries
trained weights (separate from the training group): join, broadcast, rebuild when a member failed."""
from __future__ import annotations

from typing import Callable, Optional

import ray
from rich.console import Console

from async_rl.errors import ActorFailedError, ActorTimeoutError
from async_rl.orchestration.actor_group import ActorGroup, get_named
from async_rl.weights.signature import check_signature

console = Console(stderr=True)
SENDER = "trainer-0"
HEAL_PROBE_S = 1.0  # how long heal() waits for the inference actors' pids


class WeightSyncCoordinator:
    """``rendezvous()`` gives the (address, port) the group's store listens on, chosen where the
    sender runs; ``broadcast(version)`` sends rank 0's weights to every inference actor."""

    def __init__(self, trainers: ActorGroup, inference: ActorGroup, rendezvous: Callable[[], tuple[str, int]],
                 collective_timeout_s: float, actor_timeout_s: float) -> None:
        self.trainers, self.inference, self.rendezvous = trainers, inference, rendezvous
        self.collective_timeout_s, self.actor_timeout_s = collective_timeout_s, actor_timeout_s
        self.seconds: list[float] = []  # of every broadcast

    @property
    def sender(self):
        return self.trainers[SENDER]

    def join(self) -> None:
        """Check that every receiver holds tensors of the sender's shapes, then form the group."""
        ours = ray.get(self.sender.weight_signature.remote(), timeout=self.actor_timeout_s)
        for name, sig in self.inference.call("weight_signature", timeout_s=self.actor_timeout_s).items():
            check_signature(ours, sig, name)
        names = [SENDER, *self.inference]
        addr, port = self.rendezvous()
        timeout = self.collective_timeout_s
        joins = {SENDER: self.sender.join_weight_sync.remote(len(names), addr, port, timeout, names)}
        for rank, (name, actor) in enumerate(self.inference.items(), start=1):
            joins[name] = actor.join_weight_sync.remote(rank, len(names), addr, port, timeout, names)
        transport = get_named(joins, timeout + 10, "joining the weight-sync group")[SENDER]
        # Rank 0 chose it from every member's device (gloo where two share a GPU or one is on CPU).
        console.print(f"weight sync ({', '.join(names)}): {transport}", markup=False, soft_wrap=True)

    def broadcast(self, version: int) -> float:
        """Send rank 0's weights of ``version`` (both sides in flight before waiting); returns seconds.
        The driver calls it between epochs, when the sender's last completed version is ``version``.

        If an inference actor failed (killed and restarted by Ray, or not answering within
        ``collective_timeout_s``), the group is rebuilt with the live members and the weights sent
        again; a trainer's failure propagates."""
        refs = self._broadcast_refs()
        what = f"weight broadcast v{version}"
        try:
            seconds, sent = self._wait(refs, what)
        except (ActorFailedError, ActorTimeoutError) as exc:
            console.print(f"{what} failed: {exc}; rebuilding the weight-sync group", style="red", markup=False,
                          soft_wrap=True)
            self._rebuild(refs[SENDER])
            seconds, sent = self._wait(self._broadcast_refs(), what)
        if sent != version:  # the receivers are labelled with what was sent; a mismatch is a driver bug
            raise RuntimeError(f"{what}: {SENDER} holds v{sent} as its last completed version")
        self.seconds.append(seconds)
        return seconds

    def heal(self) -> bool:
        """Between broadcasts (e.g. while the trainers wait for data): if Ray restarted an inference
        actor (its process changed: it died, or its node did), re-form the group and send the
        weights again; True if it did. A member still restarting is left for a later call.
        The trainers may be mid-epoch: the sender then sends its last completed version (a copy
        taken when it completed), labelled as that version, never parameters a step is changing."""
        probes = self.inference.submit("pid")
        ready, _ = ray.wait(list(probes.values()), num_returns=len(probes), timeout=HEAL_PROBE_S)
        if len(ready) < len(probes):
            return False  # restarting (or busy): ask again later
        try:
            pids = ray.get(list(probes.values()))
        except ray.exceptions.RayActorError:
            return False
        changed = [name for name, pid in zip(probes, pids) if pid != self.inference.pids.get(name)]
        for name in changed:
            self.inference.restart(name, "Ray restarted its process (it or its node died)")
        if changed:
            self.join()
            _, sent = self._wait(self._broadcast_refs(), "weight re-send after a restart")
            console.print(f"weights v{sent} re-sent to {', '.join(changed)}", markup=False, soft_wrap=True)
        return bool(changed)

    def _wait(self, refs: dict[str, ray.ObjectRef], what: str) -> tuple[float, int]:
        """(seconds, version) the sender reports once every member's side has ended."""
        return get_named(refs, self.collective_timeout_s + 10, what)[SENDER]

    def _broadcast_refs(self) -> dict[str, ray.ObjectRef]:
        return {SENDER: self.sender.broadcast_weights.remote(), **self.inference.submit("receive_weights")}

    def _rebuild(self, sender_ref: Optional[ray.ObjectRef]) -> None:
        """Let the failed broadcast end on the sender, restart the inference actors that died, rejoin."""
        if sender_ref is not None:
            ray.wait([sender_ref], timeout=self.collective_timeout_s + 10)  # its side ends by timeout or error
            try:
                ray.get(sender_ref, timeout=0)
            except ray.exceptions.RayActorError as exc:
                raise ActorFailedError(SENDER, "the weight broadcast", exc) from exc
            except (ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError):
                pass  # expected: the collective failed on the sender's side too
        for name in self.inference:
            if self.inference.died(name):
                self.inference.restart(name, "its process died")
        self.join()
