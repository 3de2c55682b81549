"""A trainer rank's data intake: the super-batch each epoch trains on, asked of the replay buffer (a background
prefetch while the current epoch trains, ``prefetch_batches``), the rows that aged past ``max_policy_lag`` while
they waited replaced by fresh ones, and the super-batches a checkpoint left untrained, which come first.
"""
from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Awaitable, Optional

from tensordict import TensorDict

from async_rl.actors.groups import keep_whole_groups
from async_rl.actors.prefetch import Prefetcher, RequestIds, poll, sample_once
from async_rl.experience import policy_versions

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig


# An epoch "waited for data" when its super-batch was not ready: a prefetched one is handed over in
# microseconds, one fetched at the epoch's start (sync mode) in a few milliseconds.
DATA_WAIT_S = 0.01


class SuperBatchIntake:
    """Mixin of ``TrainerRank``: where its super-batches come from. It reads the rank's ``cfg``, ``name``,
    ``replay`` (the buffer's handle), ``whole_groups`` and ``next_version``; ``_init_intake`` makes its state."""

    cfg: RunConfig
    name: str
    replay: Any
    whole_groups: bool
    next_version: int

    def _init_intake(self) -> None:
        self._prefetch: Optional[Prefetcher] = None  # created on the actor's event loop
        # Two streams of asks that may be in flight together (the prefetch, and the refill of stale
        # rows during an epoch); each asks one at a time, so each has its own request ids.
        self._request_ids = {"prefetch": RequestIds(f"{self.name}/prefetch"), "refill": RequestIds(f"{self.name}/refill")}
        self.data_waits, self.data_wait_seconds = 0, 0.0  # epochs that waited for their super-batch, and how long
        self._restored: list[TensorDict] = []  # super-batches from a checkpoint, trained on first
        self._ready: Optional[TensorDict] = None  # the super-batch ready_batch took, trained on next

    async def ready_batch(self, policy_version: int) -> float:
        """Take this epoch's super-batch (waiting for the buffer, up to ``actor_timeout_s``) and hold it
        for ``train_epoch``; returns the seconds waited. Called on every rank before any rank trains
        (``epoch_on_every_rank``): this wait is bounded by ``actor_timeout_s``, the epoch's collectives by the
        shorter ``collective_timeout_s``."""
        self.next_version = policy_version
        asked = time.perf_counter()
        batch = await self._drop_stale(await self._next_super_batch())
        waited = time.perf_counter() - asked
        self.data_waits += waited > DATA_WAIT_S
        self.data_wait_seconds += waited
        self.next_version = policy_version + 1  # what a prefetch from now on is for
        self._ready = batch
        return waited

    def _min_version(self) -> Optional[int]:
        """Oldest behaviour version the next epoch may train on (``max_policy_lag``)."""
        lag = self.cfg.max_policy_lag
        return None if lag is None else self.next_version - lag

    def _ask(self, n: Optional[int] = None, stream: str = "prefetch") -> Awaitable[Optional[TensorDict]]:
        """One ask of the replay buffer for a super-batch (or ``n`` items): None while it holds too few."""
        cfg = self.cfg
        # max_sample_reuse counts training passes per collected item; the buffer counts draws.
        draws = None if cfg.max_sample_reuse is None or cfg.sync else cfg.max_sample_reuse / cfg.updates_per_epoch
        return sample_once(self.replay, n or cfg.super_batch_size, cfg.replay_sampling == "consume", self._min_version(),
                           cfg.actor_timeout_s, self.name, draws, self._request_ids[stream])

    async def _refill(self, n: int) -> TensorDict:
        """``n`` items in place of stale rows, polling while the buffer holds too little;
        ActorTimeoutError naming the buffer after ``actor_timeout_s``."""
        return await poll(functools.partial(self._ask, n, "refill"), n, self.cfg.actor_timeout_s, self.name)

    def _prefetcher(self) -> Prefetcher:
        if self._prefetch is None:  # needs the actor's running event loop
            depth = 0 if self.cfg.sync else self.cfg.prefetch_batches  # sync: what was collected after the broadcast
            self._prefetch = Prefetcher(self._ask, self.cfg.super_batch_size, depth, self.cfg.actor_timeout_s, self.name)
        return self._prefetch

    async def _next_super_batch(self) -> TensorDict:
        if self._restored:
            return self._restored.pop(0)
        return await self._prefetcher().next()

    async def _drop_stale(self, batch: TensorDict) -> TensorDict:
        """A prefetched batch may have aged past ``max_policy_lag`` while it waited: replace
        its too-old items by fresh ones (the dropped ones count in replay/dropped_stale)."""
        min_version = self._min_version()
        if min_version is None:
            return batch
        versions = policy_versions(batch)
        oldest = versions.reshape(batch.batch_size[0], -1).min(dim=1).values
        keep = oldest >= min_version
        if self.whole_groups and "group_id" in batch.keys():  # refill by whole groups (PACS's minibatches)
            keep = keep_whole_groups(keep, batch["group_id"])
        stale = int((~keep).sum())
        if stale == 0:
            return batch
        self.replay.count_dropped_stale.remote(stale)
        return TensorDict.cat([batch[keep], await self._refill(stale)])

    def _pending(self) -> list[TensorDict]:
        """The super-batches fetched and not yet trained on (what a checkpoint keeps)."""
        held = [self._ready] if self._ready is not None else []
        return [*held, *self._restored, *(self._prefetch.pending() if self._prefetch is not None else [])]
