"""Prefetcher: a trainer's super-batches fetched ahead from the replay buffer while it trains.

Each batch fetched ahead was drawn one epoch earlier, so it adds one policy version of lag: the
default depth is 1 (the next batch is drawn while the current one trains), 0 draws at the start
of each epoch. A batch is drawn only when there is room for it, never held waiting for room,
and a checkpoint's hold waits for at most one ask of the buffer, not for a short buffer to fill.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from typing import Any, Awaitable, Callable, Optional

import ray
from tensordict import TensorDict

from async_rl.errors import ActorTimeoutError
from async_rl.process_setup import wait_for

POLL_S = 0.2  # between two asks while the buffer holds too little
SampleOnce = Callable[[], Awaitable[Optional[TensorDict]]]  # one ask: a batch, or None while too few are stored


class RequestIds:
    """Request ids of one requester, a stream of asks made one at a time (actors/replay_draws.py):
    an ask that got no answer (the buffer died, the call timed out) is asked again with the same id,
    so the buffer hands out the draw it may have logged already instead of consuming other items."""

    def __init__(self, requester: str) -> None:
        self.requester = requester
        self._nonce = uuid.uuid4().hex[:12]  # this process's: a restarted trainer counts from 0 again
        self._count = 0

    def current(self) -> tuple[str, str]:
        """(requester, id) of the next ask, the same until ``answered``."""
        return self.requester, f"{self._nonce}/{self._count}"

    def answered(self) -> None:
        self._count += 1


async def sample_once(replay: Any, n: int, consume: bool, min_version: Optional[int], call_timeout_s: float,
                      who: str, max_draws_per_item: Optional[float] = None,
                      ids: Optional[RequestIds] = None) -> Optional[TensorDict]:
    """One ask of the replay buffer actor for ``n`` items (None while it holds fewer, or while the
    reuse bound refuses); raises ActorTimeoutError naming the buffer if it does not answer within
    ``call_timeout_s``. With ``ids`` the ask carries the requester's current request id, which
    moves on only once an answer arrived (a retry after an error asks for the same draw)."""
    request = ids.current() if ids is not None else None
    batch = await wait_for(replay.sample.remote(n, consume, min_version, max_draws_per_item, request),
                           call_timeout_s, "replay buffer", f"sample of {n} items for {who}")
    if ids is not None:
        ids.answered()
    return batch


async def poll(ask: SampleOnce, n: int, timeout_s: float, who: str) -> TensorDict:
    """``ask`` until it gives a batch; ActorTimeoutError naming the replay buffer after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            batch = await ask()
        except ray.exceptions.RayActorError:  # the buffer died; Ray restarts it from the last checkpoint
            if time.monotonic() > deadline:
                raise
            batch = None
        if batch is not None:
            return batch
        if time.monotonic() > deadline:
            raise ActorTimeoutError(f"replay buffer did not hold {n} items for {who} within {timeout_s:g} s "
                                    "(with --group-size: of whole groups; are the rollout workers producing?)")
        await asyncio.sleep(POLL_S)


class Prefetcher:
    """Up to ``depth`` batches of ``n`` items, from repeated ``ask``s, ready ahead of ``next``;
    create it on the actor's event loop."""

    def __init__(self, ask: SampleOnce, n: int, depth: int, timeout_s: float, name: str) -> None:
        self._ask, self.n, self.depth, self.timeout_s, self.name = ask, n, depth, timeout_s, name
        self._ready: deque[TensorDict] = deque()
        self._changed = asyncio.Event()  # a batch landed or was taken
        self._asking = asyncio.Lock()  # held during one ask and the hand-over of its batch (a checkpoint waits)
        self._task: Optional[asyncio.Task] = None

    async def next(self) -> TensorDict:
        """The next batch; raises ActorTimeoutError naming the replay buffer after ``timeout_s``,
        or the error that ended the background asks."""
        if self.depth == 0:
            return await poll(self._ask_and_keep, self.n, self.timeout_s, self.name)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while not self._ready:
            if self._task.done():
                raise self._task.exception() or RuntimeError(f"{self.name}: the prefetch stopped")
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise ActorTimeoutError(f"{self.name}: the replay buffer gave no super-batch within {self.timeout_s:g} s "
                                        "(it holds too little: are the rollout workers producing?)")
            self._changed.clear()
            waiter = asyncio.ensure_future(self._changed.wait())
            await asyncio.wait([waiter, self._task], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        batch = self._ready.popleft()
        self._changed.set()  # room for the next draw
        return batch

    async def _ask_and_keep(self) -> Optional[TensorDict]:
        """One ask under the lock; with depth > 0 its batch joins the ready ones before the lock goes."""
        async with self._asking:
            batch = await self._ask()
            if batch is not None and self.depth:
                self._ready.append(batch)
            return batch

    async def _loop(self) -> None:
        while True:
            while len(self._ready) >= self.depth:
                self._changed.clear()
                await self._changed.wait()
            await poll(self._ask_and_keep, self.n, float("inf"), self.name)  # next() is the wait with a timeout
            self._changed.set()

    async def hold(self) -> None:
        """Stop asking (an ask in flight lands first) until ``release``, so that the replay buffer
        and ``pending()`` can be saved as one consistent state."""
        try:
            await asyncio.wait_for(self._asking.acquire(), self.timeout_s)
        except asyncio.TimeoutError:
            raise ActorTimeoutError(f"{self.name}: an ask of the replay buffer did not return within "
                                    f"{self.timeout_s:g} s") from None

    def release(self) -> None:
        if self._asking.locked():
            self._asking.release()

    def pending(self) -> list[TensorDict]:
        """Drawn batches not handed out yet (they left the buffer: a checkpoint keeps them)."""
        return list(self._ready)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
