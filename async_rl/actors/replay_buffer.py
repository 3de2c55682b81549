"""ReplayBufferActor: a bounded FIFO of experience records with uniform sampling."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, NamedTuple, Optional

import ray
import torch
from tensordict import TensorDict

from async_rl.checkpoint import complete_checkpoints, load_tensordict, save_tensordict
from async_rl.actors.groups import GroupAssembler, stratified_group_slots
from async_rl.experience import policy_versions


class ReplayStorage:
    """``capacity`` slots over a preallocated TensorDict.

    New items fill free slots first, then replace the oldest live items (FIFO eviction).
    ``sample`` draws distinct live items uniformly; with ``consume`` they leave the buffer, so
    each experience feeds one training epoch (otherwise it can be drawn again, as in seed 004).
    """

    def __init__(self, capacity: int, seed: int = 0) -> None:
        self.capacity = capacity
        self._storage: Optional[TensorDict] = None
        self._live = torch.zeros(capacity, dtype=torch.bool)
        self._stamp = torch.zeros(capacity, dtype=torch.int64)  # insertion order, for FIFO eviction
        self._next_stamp = 0
        self._generator = torch.Generator().manual_seed(seed)
        self.counters = {"added": 0, "sampled": 0, "evicted": 0, "dropped_stale": 0}

    def add_batch(self, batch: TensorDict) -> int:
        n = batch.batch_size[0]
        if n > self.capacity:  # only the newest `capacity` items can stay
            self.counters["added"] += n - self.capacity
            self.counters["evicted"] += n - self.capacity
            batch, n = batch[n - self.capacity :], self.capacity
        if self._storage is None:
            self._storage = batch[:1].expand(self.capacity).clone()
        free = (~self._live).nonzero().squeeze(-1)[:n]
        if len(free) < n:  # evict the oldest live items
            live = self._live.nonzero().squeeze(-1)
            oldest = live[torch.argsort(self._stamp[live])[: n - len(free)]]
            self.counters["evicted"] += len(oldest)
            free = torch.cat([free, oldest])
        self._storage[free] = batch
        self._live[free] = True
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
        self.counters["sampled"] += len(slots)
        return self._storage[slots].clone()

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

    def save(self, path: Path) -> None:
        """Live items in insertion order, their slots, counters and sampler state (safetensors + JSON)."""
        order = self._live_in_order()
        items = self._storage[order] if self._storage is not None else TensorDict({}, batch_size=[0])
        save_tensordict(items, path)
        state = {"counters": self.counters, "next_stamp": self._next_stamp, "capacity": self.capacity,
                 "slots": order.tolist(), "stamps": self._stamp[order].tolist(),
                 "generator": self._generator.get_state().tolist()}
        Path(str(path) + ".json").write_text(json.dumps(state))

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
        self.counters = dict(state["counters"])
        self._next_stamp = max(self._next_stamp, int(state["next_stamp"]))
        self._generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))


class ReplayLog:
    """Write-ahead log of accepted batches: a batch is on disk (fsynced) before ``add_batch``
    acknowledges it, so a buffer that Ray restarts reloads the newest checkpoint and then every
    batch accepted after it: nothing acknowledged is lost. A checkpoint records the last sequence
    number it holds; once it is committed, the entries up to that number are deleted."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.next_seq = max((seq for seq, _ in self.entries()), default=-1) + 1

    def entries(self, after: int = -1) -> list[tuple[int, Path]]:
        found = sorted((int(p.stem), p) for p in self.directory.glob("*.safetensors") if p.stem.isdigit())
        return [(seq, p) for seq, p in found if seq > after]

    def append(self, batch: TensorDict) -> None:
        final = self.directory / f"{self.next_seq:012d}.safetensors"
        tmp = final.with_suffix(".tmp")
        save_tensordict(batch, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)  # a torn write never carries an entry's name
        self.next_seq += 1

    def drop_through(self, seq: int) -> None:
        for entry_seq, path in self.entries():
            if entry_seq <= seq:
                path.unlink(missing_ok=True)

    def clear(self) -> None:
        self.drop_through(self.next_seq)
        for tmp in self.directory.glob("*.tmp"):
            tmp.unlink()


def log_seq_file(replay_path: Path) -> Path:
    """Beside a checkpoint's replay.safetensors: the last log entry it contains."""
    return Path(str(replay_path) + ".log.json")


def reuse_allowed(counters: dict[str, int], n: int, max_draws_per_item: Optional[float]) -> bool:
    """Whether ``n`` more draws keep the draws (``sampled``) within ``max_draws_per_item`` per item
    ``added`` (None: no bound). A trainer passes ``max_sample_reuse / updates_per_epoch``: it trains
    ``updates_per_epoch`` passes on each item it draws."""
    return max_draws_per_item is None or counters["sampled"] + n <= max_draws_per_item * counters["added"]


def _restarted() -> bool:
    """Whether Ray restarted this actor (the property reads a deprecated attribute of Ray's own)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


@ray.remote
class ReplayBufferActor:
    """Remote face of ReplayStorage; Ray runs one call at a time, so no locking is needed."""

    def __init__(self, capacity: int, seed: int = 0, checkpoint_root: Optional[str] = None,
                 groups: Optional[GroupSpec] = None) -> None:
        self._store = ReplayStorage(capacity, seed)
        self._groups = GroupPool(groups, seed) if groups is not None else None  # group rollouts only
        self._restored_from: Optional[str] = None
        self._log = ReplayLog(Path(checkpoint_root) / "replay-log") if checkpoint_root is not None else None
        if self._log is not None and _restarted():
            self._recover(Path(checkpoint_root))
        elif self._log is not None:
            self._log.clear()  # a new run (or a resume): what an earlier process logged is not ours
        # What the restore brought back (the supervisor counts the difference as lost).
        self._restored = {"restored_items": self._store.size(), "restored_added": self._store.counters["added"]}

    def _recover(self, checkpoint_root: Path) -> None:
        """Restarted by Ray after a crash: the newest complete checkpoint's items, then every batch
        the log holds after it."""
        found = complete_checkpoints(checkpoint_root)
        last_in_checkpoint = -1
        if found:
            replay_path = found[-1] / "replay.safetensors"
            self._store.load(replay_path)
            if log_seq_file(replay_path).is_file():
                last_in_checkpoint = json.loads(log_seq_file(replay_path).read_text())["last_seq"]
        for _, path in self._log.entries(after=last_in_checkpoint):
            self._store.add_batch(load_tensordict(path))
        self._restored_from = str(found[-1]) if found else "the replay log"

    def restored_from(self) -> Optional[str]:
        """The checkpoint this buffer reloaded after a restart (None: first start, or none existed)."""
        return self._restored_from

    def pid(self) -> int:
        return os.getpid()

    def status(self) -> dict[str, Any]:
        """Process id, the checkpoint reloaded after a restart, and the counters (one call)."""
        return {"pid": os.getpid(), "restored_from": self._restored_from,
                "counters": {**self.counters(), **(self._restored if self._restored_from else {})}}

    def add_batch(self, batch: TensorDict) -> int:
        if self._log is not None:
            self._log.append(batch)  # durable before it is acknowledged
        return self._store.add_batch(batch)

    def sample(self, n: int, consume: bool = False, min_version: Optional[int] = None,
               max_draws_per_item: Optional[float] = None) -> Optional[TensorDict]:
        """``n`` items, or None while fewer than ``n`` are stored (with group rollouts: drawn by whole
        groups, None while the whole groups stored cannot supply them); with ``min_version`` items
        made by an older policy are dropped first (counted in ``dropped_stale``). With
        ``max_draws_per_item`` also None while drawing them would take the draws so far past that
        many per item ever added (a bounded update-to-data ratio; counted in ``reuse_refusals``)."""
        if min_version is not None:
            self._store.drop_older_than(min_version)
        if not reuse_allowed(self._store.counters, n, max_draws_per_item):
            self._store.counters["reuse_refusals"] = self._store.counters.get("reuse_refusals", 0) + 1
            return None
        group_size = self._groups.assembler.group_size if self._groups is not None else 1
        if group_size > 1 and n % group_size == 0:  # a trainer's super-batch: whole groups, every member
            return self._store.sample_groups(n, group_size, consume)
        # Without groups, or a trainer's refill of a few rows it dropped (not a multiple of the group).
        return self._store.sample(n, consume) if self._store.size() >= n else None

    def snapshot(self) -> Optional[TensorDict]:
        """Everything stored, in one call (for inspection and tests: a size() then sample(size)
        pair can race with a trainer's prefetch)."""
        return self._store.snapshot()

    def count_dropped_stale(self, n: int) -> None:
        """Items a trainer dropped from an already-fetched batch for being too old."""
        self._store.counters["dropped_stale"] += n

    def save(self, path: str) -> int:
        self._store.save(Path(path))
        if self._log is not None:
            log_seq_file(Path(path)).write_text(json.dumps({"last_seq": self._log.next_seq - 1}))
        return self._store.size()

    def checkpoint_committed(self, path: str) -> None:
        """The checkpoint holding ``path`` (a replay.safetensors) is complete: forget the log up to it."""
        if self._log is not None and log_seq_file(Path(path)).is_file():
            self._log.drop_through(json.loads(log_seq_file(Path(path)).read_text())["last_seq"])

    def load(self, path: str) -> int:
        self._store.load(Path(path))
        return self._store.size()

    def drop_older_than(self, min_version: int) -> int:
        return self._store.drop_older_than(min_version)

    def size(self) -> int:
        return self._store.size()

    def counters(self) -> dict[str, int]:
        groups = self._groups.assembler.counters if self._groups is not None else {}
        return {**self._store.counters, "size": self._store.size(), **groups}

    # ---- group rollouts (async_rl/actors/groups.py) ----------------------------------------
    def ticket(self, worker: str, task: int, fill_only: bool = False) -> Optional[tuple[int, int, int]]:
        """(group_id, task, start) for an env slot of ``worker`` at episode start (GroupAssembler.ticket)."""
        found = self._groups.assembler.ticket(worker, task, fill_only)
        self._groups.report()
        return None if found is None else tuple(found)

    def add_episodes(self, episodes: list[TensorDict]) -> int:
        """Finished episodes of groups; the groups they complete enter the sampling pool (logged
        like any batch). Returns how many steps entered."""
        entered = 0
        for episode in episodes:
            for group in self._groups.assembler.add_episode(episode):
                self.add_batch(group)
                entered += group.batch_size[0]
        self._groups.report()
        return entered

    def abandon_group(self, group_id: int) -> None:
        """A member of ``group_id`` broke off: the group cannot complete."""
        self._groups.assembler.abandon(group_id)
        self._groups.report()


class GroupSpec(NamedTuple):
    """What the replay buffer's group assembler needs of the run config."""

    advantage: str
    group_size: int
    max_spread: int
    num_workers: int
    stats_name: Optional[str]  # the stats actor, told groups_completed / groups_dropped (health/)
    cfg: Any  # the estimator's episode_advantages may read its options


class GroupPool:
    """The assembler of a replay buffer actor and the health counts it sends to the stats actor."""

    REPORTED = ("groups_completed", "groups_dropped")

    def __init__(self, spec: GroupSpec, seed: int) -> None:
        from async_rl.algo import advantage_estimator  # noqa: PLC0415

        estimator = advantage_estimator(spec.advantage)
        self.assembler = GroupAssembler(spec.group_size, spec.max_spread, spec.num_workers,
                                        lambda returns: estimator.episode_advantages(returns, spec.cfg), seed)
        self.stats_name, self._stats = spec.stats_name, None
        self._reported = dict.fromkeys(self.REPORTED, 0)

    def report(self) -> None:
        """Send what changed since the last report (fire and forget: a lost count is not worth a wait)."""
        if self.stats_name is None:
            return
        for key in self.REPORTED:
            delta = self.assembler.counters[key] - self._reported[key]
            if delta:
                self._stats = self._stats or ray.get_actor(self.stats_name)
                self._stats.record_health.remote(key, delta)
                self._reported[key] += delta
