"""ReplayStorage: the replay buffer's items, a bounded FIFO over one preallocated TensorDict, with
uniform and whole-group sampling, and its save / load (safetensors + JSON). The actor around it, its
log and its exactly-once bookkeeping are in actors/replay_buffer.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch
from tensordict import TensorDict

from async_rl.actors.groups import stratified_group_slots
from async_rl.checkpoint import load_tensordict, save_tensordict
from async_rl.experience import policy_versions


class ReplayStorage:
    """``capacity`` slots over a preallocated TensorDict.

    New items fill free slots first, then replace the oldest live items (FIFO eviction).
    ``sample`` draws distinct live items uniformly; with ``consume`` they leave the buffer, so
    each experience feeds one training epoch (otherwise it can be drawn again, as in ds_libero_ppo.py).
    """

    def __init__(self, capacity: int, seed: int = 0) -> None:
        self.capacity = capacity
        self._storage: Optional[TensorDict] = None
        self._live = torch.zeros(capacity, dtype=torch.bool)
        self._stamp = torch.zeros(capacity, dtype=torch.int64)  # insertion order, for FIFO eviction
        self._drawn = torch.zeros(capacity, dtype=torch.bool)  # drawn at least once (reuse mode keeps it live)
        self._next_stamp = 0
        self._generator = torch.Generator().manual_seed(seed)
        # evicted_untrained: evicted before any draw, i.e. generated for nothing (backpressure prevents it)
        self.counters = {"added": 0, "sampled": 0, "evicted": 0, "evicted_untrained": 0, "dropped_stale": 0}
        self.last_taken: list[int] = []

    def add_batch(self, batch: TensorDict) -> int:
        n = batch.batch_size[0]
        if n > self.capacity:  # only the newest `capacity` items can stay
            self.counters["added"] += n - self.capacity
            self.counters["evicted"] += n - self.capacity
            self.counters["evicted_untrained"] += n - self.capacity
            batch, n = batch[n - self.capacity :], self.capacity
        if self._storage is None:
            self._storage = batch[:1].expand(self.capacity).clone()
        free = (~self._live).nonzero().squeeze(-1)[:n]
        if len(free) < n:  # evict the oldest live items
            live = self._live.nonzero().squeeze(-1)
            oldest = live[torch.argsort(self._stamp[live])[: n - len(free)]]
            self.counters["evicted"] += len(oldest)
            self.counters["evicted_untrained"] += int((~self._drawn[oldest]).sum())
            free = torch.cat([free, oldest])
        self._storage[free] = batch
        self._live[free] = True
        self._drawn[free] = False
        self._stamp[free] = torch.arange(self._next_stamp, self._next_stamp + n)
        self._next_stamp += n
        self.counters["added"] += n
        return self.size()

    def sample(self, n: int, consume: bool = False) -> TensorDict:
        """``n`` distinct live items chosen uniformly (raises if fewer are stored)."""
        live = self._live.nonzero().squeeze(-1)
        if n > len(live):
            raise ValueError(f"cannot sample {n} items from a replay buffer holding {len(live)}")
        return self._take(live[torch.randperm(len(live), generator=self._generator)[:n]], consume)

    def sample_groups(self, n: int, group_size: int, consume: bool = False) -> Optional[TensorDict]:
        """``n`` live items drawn by whole groups (``stratified_group_slots``: every drawn group gives
        the same number of steps from each of its ``group_size`` members); None while the whole
        groups stored cannot supply ``n``."""
        live = self._live.nonzero().squeeze(-1)
        if self._storage is None or len(live) < n:
            return None
        picked = stratified_group_slots(self._storage["group_id"][live], self._storage["group_member"][live], n,
                                        group_size, self._generator)
        return None if picked is None else self._take(live[picked], consume)

    def _take(self, slots: torch.Tensor, consume: bool) -> TensorDict:
        if consume:
            self._live[slots] = False
            self.last_taken = self._stamp[slots].tolist()  # what the buffer's log records of this draw
        self._drawn[slots] = True
        self.counters["sampled"] += len(slots)
        return self._storage[slots].clone()

    def take_stamps(self, stamps: list[int], keep: bool = False) -> Optional[TensorDict]:
        """Consume the live items inserted with these stamps (a logged draw, replayed after a
        restart); with ``keep`` returns a copy of them in the order of ``stamps`` (the draw's order)."""
        wanted = torch.tensor(stamps, dtype=torch.int64)
        taken = self._live & torch.isin(self._stamp, wanted)
        items = None
        if keep:
            slots = taken.nonzero().squeeze(-1)
            if len(slots) != len(stamps):
                raise ValueError(f"a logged draw of {len(stamps)} items finds {len(slots)} of them stored")
            by_stamp = slots[torch.argsort(self._stamp[slots])]
            items = self._storage[by_stamp[torch.searchsorted(self._stamp[by_stamp], wanted)]].clone()
        self._live &= ~taken
        self._drawn |= taken
        self.counters["sampled"] += len(stamps)
        return items

    def nbytes(self) -> int:
        """Bytes of the preallocated storage (0 before the first item)."""
        if self._storage is None:
            return 0
        return sum(v.numel() * v.element_size()  # type: ignore[union-attr, misc]  # leaves only: Tensors
                   for v in self._storage.values(include_nested=True, leaves_only=True))

    def _live_in_order(self) -> torch.Tensor:
        """Slots of the live items, oldest first."""
        live = self._live.nonzero().squeeze(-1)
        return live[torch.argsort(self._stamp[live])]

    def snapshot(self) -> Optional[TensorDict]:
        """Every live item in insertion order without counting it as sampled; None when empty."""
        order = self._live_in_order()
        return self._storage[order].clone() if len(order) else None

    def drop_older_than(self, min_version: int) -> int:
        """Remove items produced by a policy older than ``min_version``; returns how many."""
        if self._storage is None:
            return 0
        versions = policy_versions(self._storage)
        oldest = versions.reshape(self.capacity, -1).min(dim=1).values  # a segment is as old as its oldest step
        stale = self._live & (oldest < min_version)
        self._live &= ~stale
        dropped = int(stale.sum())
        self.counters["dropped_stale"] += dropped
        return dropped

    def size(self) -> int:
        return int(self._live.sum())

    def state(self) -> tuple[TensorDict, dict[str, Any]]:
        """A copy of the live items in insertion order and the rest of the state (for ``write_state``)."""
        order = self._live_in_order()
        items = self._storage[order].clone() if self._storage is not None else TensorDict({}, batch_size=[0])
        state = {"counters": dict(self.counters), "next_stamp": self._next_stamp, "capacity": self.capacity,
                 "slots": order.tolist(), "stamps": self._stamp[order].tolist(),
                 "generator": self._generator.get_state().tolist()}
        return items, state

    def save(self, path: Path) -> None:
        """Live items in insertion order, their slots, counters and sampler state (safetensors + JSON)."""
        write_state(path, *self.state())

    def load(self, path: Path) -> None:
        """Restore what ``save`` wrote: the same items in the same slots (so sampling continues
        exactly) when the capacity is unchanged, else the newest items in insertion order."""
        state = json.loads(Path(str(path) + ".json").read_text())
        items = load_tensordict(path)
        if items.batch_size[0] and state["capacity"] == self.capacity:
            slots = torch.tensor(state["slots"], dtype=torch.int64)
            if self._storage is None:
                self._storage = items[:1].expand(self.capacity).clone()
            self._storage[slots] = items
            self._live[slots] = True
            self._stamp[slots] = torch.tensor(state["stamps"], dtype=torch.int64)
        elif items.batch_size[0]:
            self.add_batch(items)
        self.counters = {"evicted_untrained": 0, **state["counters"]}  # absent from states saved before it existed
        self._next_stamp = max(self._next_stamp, int(state["next_stamp"]))
        self._generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))


def write_state(path: Path, items: TensorDict, state: dict[str, Any]) -> None:
    save_tensordict(items, path)
    Path(str(path) + ".json").write_text(json.dumps(state))
