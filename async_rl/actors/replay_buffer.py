"""ReplayBufferActor: a bounded FIFO of experience records with uniform sampling."""
from __future__ import annotations

from typing import Optional

import ray
import torch
from tensordict import TensorDict


class ReplayStorage:
    """Ring buffer over a preallocated TensorDict; the oldest items are evicted first."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        self.capacity = capacity
        self._storage: Optional[TensorDict] = None
        self._cursor = 0  # next write position
        self._size = 0
        self._generator = torch.Generator().manual_seed(seed)
        self.counters = {"added": 0, "sampled": 0, "evicted": 0}

    def add_batch(self, batch: TensorDict) -> int:
        n = batch.batch_size[0]
        if n > self.capacity:  # only the newest `capacity` items can stay
            self.counters["evicted"] += n - self.capacity
            self.counters["added"] += n - self.capacity
            batch, n = batch[n - self.capacity :], self.capacity
        if self._storage is None:
            self._storage = batch[:1].expand(self.capacity).clone()
        positions = (torch.arange(n) + self._cursor) % self.capacity
        self._storage[positions] = batch
        self._cursor = (self._cursor + n) % self.capacity
        evicted = max(self._size + n - self.capacity, 0)
        self._size = min(self._size + n, self.capacity)
        self.counters["added"] += n
        self.counters["evicted"] += evicted
        return self._size

    def sample(self, n: int) -> TensorDict:
        """``n`` distinct items chosen uniformly (raises if fewer are stored)."""
        if n > self._size:
            raise ValueError(f"cannot sample {n} items from a replay buffer holding {self._size}")
        idx = torch.randperm(self._size, generator=self._generator)[:n]
        # Stored items occupy positions [cursor - size, cursor) modulo capacity.
        positions = (self._cursor - self._size + idx) % self.capacity
        self.counters["sampled"] += n
        return self._storage[positions].clone()

    def size(self) -> int:
        return self._size


@ray.remote
class ReplayBufferActor:
    """Remote face of ReplayStorage; Ray runs one call at a time, so no locking is needed."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        self._store = ReplayStorage(capacity, seed)

    def add_batch(self, batch: TensorDict) -> int:
        return self._store.add_batch(batch)

    def sample(self, n: int) -> Optional[TensorDict]:
        """``n`` items, or None while fewer than ``n`` are stored."""
        return self._store.sample(n) if self._store.size() >= n else None

    def size(self) -> int:
        return self._store.size()

    def counters(self) -> dict[str, int]:
        return {**self._store.counters, "size": self._store.size()}
