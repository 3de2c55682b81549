"""PolicyClient: a worker's view of its inference actor, over Ray or over a shared-memory slab.

Every request can go over Ray (``InferenceActor.request``). With ``shared_memory: auto`` a worker on
the inference actor's node (Ray's node ids) asks for a slab after its first answer (whose layout,
with its observations', sizes the slab: actors/shared_slab.py) and sends later requests through it.
Whatever goes wrong on the slab falls back to Ray for that request: the inference actor's death (its
socket closes at once; the next Ray answer, from the restarted actor once it has weights, negotiates
a new slab), a batch the slab cannot hold, an answer of another shape (then Ray for good).
"""
from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Optional

import ray
from tensordict import TensorDict

from async_rl.actors.shared_slab import AnswerMisfit, PeerGone, SlabClient, SlabSpec, wire_layout
from async_rl.experience import from_wire, to_wire
from async_rl.process_setup import wait_for

RETRY_SLAB_S = 30.0  # after a failed negotiation, ask again no sooner than this


class PolicyClient:
    """One awaited request with a timeout; the shared-memory path when co-located (``shared_memory``
    "auto"), else Ray. ``rows``: the largest batch the worker sends (its envs); ``depth``: the most
    requests it has in flight at once (the slab's slots; one more waits for a free slot)."""

    def __init__(self, inference: Any, name: str, timeout_s: float, shared_memory: str = "off",
                 worker: str = "", rows: int = 1, depth: int = 2) -> None:
        self.inference, self.name, self.timeout_s = inference, name, timeout_s
        self.worker, self.rows, self.depth = worker, rows, depth
        self._opening = False  # a slab is being negotiated (concurrent requests must not ask for another)
        self._slab: Optional[SlabClient] = None
        self.slab_answers = 0  # requests answered through shared memory (tests, logs)
        # When a slab may be asked for next (None: never; the Ray path only)
        self._next_slab: Optional[float] = 0.0 if shared_memory == "auto" else None

    async def act(self, obs: TensorDict, deterministic: bool = False) -> TensorDict:
        """Actions, log-probs, values and policy version for a batch ``[k]`` of observations.

        While the inference actor is dead or restarting the request is retried (the restarted
        actor answers once it has the current weights) until ``timeout_s`` has passed."""
        deadline = time.monotonic() + self.timeout_s
        if self._slab is not None:
            try:
                out = await self._slab.act(obs, deterministic, self.timeout_s)
                if out is not None:
                    self.slab_answers += 1
                    return out
            except PeerGone as exc:
                self._log(f"shared-memory slab lost ({exc}); requests go over Ray until {self.name} answers again")
                self.close()
                self._next_slab = 0.0
            except AnswerMisfit:  # answers vary in shape (served twice this once): Ray from now on
                self._log(f"{self.name}'s answers vary in shape: requests go over Ray")
                self.close()
                self._next_slab = None
        wire = to_wire(obs)
        answer = await self._ray_act(wire, deterministic, deadline)
        if (self._slab is None and not self._opening and self._next_slab is not None
                and time.monotonic() >= self._next_slab):
            self._opening = True
            try:
                await self._open_slab(wire, answer, deadline)
            finally:
                self._opening = False
        return from_wire(answer)

    async def _ray_act(self, wire: dict, deterministic: bool, deadline: float) -> dict:
        while True:
            try:
                return await wait_for(self.inference.request.remote(wire, deterministic),
                                      max(deadline - time.monotonic(), 0.001), self.name, "an inference request")
            except ray.exceptions.RayActorError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _open_slab(self, obs: dict, answer: dict, deadline: float) -> None:
        """Ask the inference actor for a slab laid out as this request and its answer; a worker on
        another node keeps the Ray path for good (said once)."""
        spec = SlabSpec(wire_layout(obs), wire_layout(answer), self.rows, self.depth)
        timeout = max(deadline - time.monotonic(), 0.001)
        step = "open_slab"  # which step failed, in the log line: a platform may refuse one of them
        try:
            offer = await wait_for(self.inference.open_slab.remote(self.worker, ray.get_runtime_context().get_node_id(),
                                                                   spec), timeout, self.name, "open_slab")
            if offer is None:
                self._log(f"{self.name} runs on another node: requests go over Ray")
                self._next_slab = None
                return
            step = f"mapping segment {offer.segment} and connecting to its socket"
            self._slab = await SlabClient.connect(offer, timeout)
            self._log(f"requests to {self.name} go through shared memory ({spec.rows} rows x {spec.depth} slots)")
        except Exception as exc:  # noqa: BLE001 (Ray keeps serving; try again later)
            self._log(f"no shared-memory slab from {self.name} ({step}: {exc!r}); requests go over Ray, "
                      f"asking again in {RETRY_SLAB_S:g} s")
            self._next_slab = time.monotonic() + RETRY_SLAB_S

    def _log(self, message: str) -> None:
        print(f"{self.worker or 'policy client'}: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._slab is not None:
            self._slab.close()
            self._slab = None
