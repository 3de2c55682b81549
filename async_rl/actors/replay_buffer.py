"""ReplayBufferActor: a bounded FIFO of experience records with uniform sampling, and its log.

Exactly once under ``replay_sampling: consume``: every change of the buffer's state is logged
(actors/replay_log.py) before the caller hears of it, consumption included, so a buffer that Ray
restarts is the one that died (same items, same counters) and never hands out again what a
trainer drew. Pushes carry a batch id that the buffer remembers (through restarts too), so a
worker pushing again a batch whose answer the dead buffer never sent adds it once. A trainer's
draw carries a request id the same way: asked again (its answer never arrived), the buffer hands
out the same items instead of consuming others (actors/replay_draws.py).
"""
from __future__ import annotations

import asyncio
import json
import os
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

import ray
from tensordict import TensorDict

from async_rl.actors.groups import GroupPool, GroupSpec
from async_rl.actors.replay_draws import HeldDraws
from async_rl.actors.replay_log import LIMIT_FLOOR, ReplayLog, pack, unpack
from async_rl.actors.replay_storage import ReplayStorage, write_state
from async_rl.checkpoint import complete_checkpoints

__all__ = ["GroupSpec", "ReplayBuffer", "ReplayBufferActor", "ReplayStorage", "reuse_allowed"]

SEEN_IDS = 65_536  # batch ids remembered (a worker pushes again only its latest batch; this bounds memory)


def extras_file(replay_path: Path) -> Path:
    """Beside a saved replay state: batch ids seen, the group ledger, and the log position it holds."""
    return Path(str(replay_path) + ".state.json")


def held_file(replay_path: Path) -> Path:
    """Beside a saved replay state: the episodes the group assembler holds (when there are any)."""
    return Path(str(replay_path) + ".groups.safetensors")


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


class ReplayBuffer:
    """The buffer's state (storage, batch ids seen, group assembler) and its log; the actor's body.

    Each method changes the state and appends the command that did it in one step without an
    ``await`` (the log's order is the order of the changes), then waits until the command is
    durable before it answers. ``restarted``: rebuild the state of the process that died from the
    newest base (a checkpoint of this log, or the log's own snapshot) and the commands after it."""

    def __init__(self, capacity: int, seed: int = 0, checkpoint_root: Optional[str] = None,
                 groups: Optional[GroupSpec] = None, restarted: bool = False,
                 log_limit_bytes: Optional[int] = None) -> None:
        self._store = ReplayStorage(capacity, seed)
        self._store.counters.update(duplicate_pushes=0, redelivered_draws=0)
        # A ledger that cannot be rebuilt (no log) must not reuse the ids its predecessor handed out.
        id_base = int.from_bytes(os.urandom(3), "little") << 32 if restarted and checkpoint_root is None else 0
        self._groups = GroupPool(groups, seed, id_base) if groups is not None else None  # group rollouts only
        self._seen: "OrderedDict[str, None]" = OrderedDict()
        self._draws = HeldDraws()  # each requester's last consuming draw, for a retry of its request
        self._restored_from: Optional[str] = None
        self._room: Optional[asyncio.Event] = None  # set when items leave: wakes workers held back (wait_for_room)
        self._log: Optional[ReplayLog] = None
        self._limit = log_limit_bytes
        if checkpoint_root is not None:
            self._root = Path(checkpoint_root)
            self._log = ReplayLog(self._root / "replay-log", fresh=not restarted)
            self._log.start(self._recover() if restarted else 0)
        # What the restore brought back (the supervisor counts what it lacks as lost).
        self._restored = {"restored_items": self._store.size(), "restored_added": self._store.counters["added"]}

    # ---- recovery ------------------------------------------------------------------------
    def _recover(self) -> int:
        """Rebuild the state at the death; returns the next sequence number of the log."""
        base_seq, base = -1, None
        for found in complete_checkpoints(self._root):  # oldest first: the newest of this log wins
            marker = _read_json(extras_file(found / "replay.safetensors")).get("log", {})
            if marker.get("token") == self._log.token and marker["last_seq"] >= base_seq:
                base_seq, base = marker["last_seq"], found / "replay.safetensors"
        own = self._log.base()
        if own is not None and own[0] > base_seq:
            base_seq, base = own
        if base is not None:
            self._load_state(base, same_run=True)
        records = self._log.records(after=base_seq)
        for record in records:
            self._replay(record.header, record.payload)
        if self._groups is not None:
            self._groups.reported_all()
        self._restored_from = str(base.parent) if base is not None else "the replay log"
        return max(base_seq, records[-1].seq if records else -1) + 1

    def _replay(self, header: dict[str, Any], payload: bytes) -> None:
        """Apply one logged command as the live method did."""
        op = header["op"]
        if op == "add":
            self._remember(header["id"])
            self._store.add_batch(unpack(payload, header["sizes"])[0])
        elif op == "episodes":
            self._remember(header["id"])
            self._enter_episodes(unpack(payload, header["sizes"]))
        elif op == "take":
            request = header.get("request")
            items = self._store.take_stamps(header["stamps"], keep=request is not None)
            if request is not None:
                self._draws.hold(request, items)
        elif op == "count":
            self._store.counters[header["key"]] = self._store.counters.get(header["key"], 0) + header["n"]
        elif op == "drop":
            self._store.drop_older_than(header["min_version"])
        elif op == "tickets":
            for task in header["tasks"]:
                self._groups.assembler.ticket(header["worker"], task, header["fill_only"])
        elif op == "ticket":  # one ticket per command: logs written before tickets were batched
            self._groups.assembler.ticket(header["worker"], header["task"], header["fill_only"])
        elif op == "abandon":
            self._groups.assembler.abandon(header["group"])
        elif op == "noop":  # names the snapshot of a state no command made (a resumed checkpoint's)
            pass
        else:
            raise ValueError(f"unknown replay log command {op!r}")

    # ---- the log -------------------------------------------------------------------------
    def _append(self, header: dict[str, Any], payload: bytes = b"") -> int:
        if self._log is None:
            return -1
        seq = self._log.append(header, payload)
        if self._log.live_bytes > self.log_limit():
            self._log.compact(self._state_writer())  # trims the log without a checkpoint
        return seq

    async def _commit(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """Append and wait until durable (the caller answers only then)."""
        seq = self._append(header, payload)
        if self._log is not None:
            await self._log.durable(seq)

    def log_limit(self) -> int:
        """Log bytes beyond which it is compacted: twice the storage (a snapshot then costs at
        most half of what it frees), at least ``LIMIT_FLOOR``, unless given."""
        return self._limit if self._limit is not None else max(LIMIT_FLOOR, 2 * self._store.nbytes())

    def _remember(self, batch_id: Optional[str]) -> None:
        if batch_id is not None:
            self._seen[batch_id] = None
            while len(self._seen) > SEEN_IDS:
                self._seen.popitem(last=False)

    # ---- saved state (checkpoints and log snapshots) --------------------------------------
    def _state_writer(self):
        """A copy of the whole state now, and a function that writes it (the log's writer thread runs it)."""
        items, store_state = self._store.state()
        groups, held = self._groups.assembler.state_dict() if self._groups is not None else (None, [])
        held = [e.clone() for e in held]  # the assembler adds fields to an episode when its group completes
        draws = self._draws.state()
        extras = {"seen": list(self._seen), "groups": groups,
                  "log": {"token": self._log.token, "last_seq": self._log.next_seq - 1} if self._log else {}}

        def write(path: Path) -> None:
            write_state(path, items, store_state)
            if held:
                blob, sizes = pack(held)
                held_file(path).write_bytes(blob)
                extras["held_sizes"] = sizes
            HeldDraws.write(path, draws, extras)
            extras_file(path).write_text(json.dumps(extras))
        return write

    def _load_state(self, path: Path, same_run: bool) -> None:
        """``same_run``: a restart of this run (its group ledger and the draws held for its
        requesters come back); else a new run resuming, whose workers and trainers start afresh
        (a trainer's checkpoint holds the draws it had received)."""
        self._store.load(path)
        for key in ("duplicate_pushes", "redelivered_draws"):  # absent from states saved before they existed
            self._store.counters.setdefault(key, 0)
        extras = _read_json(extras_file(path))
        for batch_id in extras.get("seen", []):
            self._remember(batch_id)
        if same_run:
            self._draws.load(path, extras)
        if same_run and self._groups is not None and extras.get("groups") is not None:
            held = unpack(held_file(path).read_bytes(), extras["held_sizes"]) if extras.get("held_sizes") else []
            self._groups.assembler.load_state_dict(extras["groups"], held)

    # ---- what the actor serves ------------------------------------------------------------
    def restored_from(self) -> Optional[str]:
        """The checkpoint this buffer reloaded after a restart (None: first start, or none existed)."""
        return self._restored_from

    def pid(self) -> int:
        return os.getpid()

    async def status(self) -> dict[str, Any]:
        """Process id, the checkpoint reloaded after a restart, and the counters (one call)."""
        return {"pid": os.getpid(), "restored_from": self._restored_from,
                "counters": {**(await self.counters()), **(self._restored if self._restored_from else {})}}

    async def add_batch(self, batch: TensorDict, batch_id: Optional[str] = None) -> int:
        """Store ``batch``; answers once it is durable. A ``batch_id`` seen before is not stored again."""
        if await self._is_duplicate(batch_id):
            return self._store.size()
        blob, sizes = pack([batch]) if self._log is not None else (b"", None)
        self._remember(batch_id)
        size = self._store.add_batch(batch)
        await self._commit({"op": "add", "id": batch_id, "sizes": sizes}, blob)
        return size

    async def _is_duplicate(self, batch_id: Optional[str]) -> bool:
        if batch_id is None or batch_id not in self._seen:
            return False
        self._store.counters["duplicate_pushes"] += 1
        await self._commit({"op": "count", "key": "duplicate_pushes", "n": 1})  # the first push is durable too
        return True

    async def sample(self, n: int, consume: bool = False, min_version: Optional[int] = None,
                     max_draws_per_item: Optional[float] = None,
                     request: Optional[tuple[str, str]] = None) -> Optional[TensorDict]:
        """``n`` items, or None while fewer than ``n`` are stored (for a loss comparing a group's members:
        drawn by whole groups, None while the whole groups stored cannot supply them); with ``min_version`` items
        made by an older policy are dropped first (counted in ``dropped_stale``). With
        ``max_draws_per_item`` also None while drawing them would take the draws so far past that
        many per item ever added (a bounded update-to-data ratio; counted in ``reuse_refusals``).
        A consuming draw is durable before it is answered: a restarted buffer never holds it again.
        ``request`` (requester, request id; actors/replay_draws.py): a consuming draw asked for again
        with the requester's last id gets the same items (counted in ``redelivered_draws``)."""
        if consume and request is not None:
            again = self._draws.again(request, n)
            if again is not None:  # its answer never arrived: the same items, nothing new consumed
                self._store.counters["redelivered_draws"] += 1
                await self._commit({"op": "count", "key": "redelivered_draws", "n": 1})
                return again
        if min_version is not None and self._store.drop_older_than(min_version):
            self._append({"op": "drop", "min_version": min_version})
            self._wake_producers()
        if not reuse_allowed(self._store.counters, n, max_draws_per_item):
            self._store.counters["reuse_refusals"] = self._store.counters.get("reuse_refusals", 0) + 1
            self._append({"op": "count", "key": "reuse_refusals", "n": 1})
            return None
        whole = self._groups is not None and self._groups.whole_group_draws
        group_size = self._groups.assembler.group_size if whole else 1
        if whole and n % group_size == 0:  # a trainer's super-batch for PACS: whole groups, every member
            batch = self._store.sample_groups(n, group_size, consume)
        else:  # without groups, or a draw that is not a multiple of the group (no whole groups then)
            batch = self._store.sample(n, consume) if self._store.size() >= n else None
        if batch is None:
            return None
        if consume and request is not None:
            self._draws.hold(request, batch)
        if consume:
            self._wake_producers()
            # replay reads "request" with .get: None (no id) and absent are the same
            await self._commit({"op": "take", "stamps": self._store.last_taken,
                                "request": list(request) if request is not None else None})
        else:
            await self._commit({"op": "count", "key": "sampled", "n": n})
        return batch

    def snapshot(self) -> Optional[TensorDict]:
        """Everything stored, in one call (for inspection and tests: a size() then sample(size)
        pair can race with a trainer's prefetch)."""
        return self._store.snapshot()

    def count_dropped_stale(self, n: int) -> None:
        """Items a trainer dropped from an already-fetched batch for being too old."""
        self._store.counters["dropped_stale"] += n
        self._append({"op": "count", "key": "dropped_stale", "n": n})

    async def save(self, path: str) -> int:
        """Write the state into a checkpoint being staged, with the log position it holds."""
        if self._log is not None:
            await self._log.durable()  # what the checkpoint holds was answered for, or never will be
        self._state_writer()(Path(path))
        return self._store.size()

    def checkpoint_committed(self, path: str) -> None:
        """The checkpoint holding ``path`` (a replay.safetensors) is complete: forget the log up to it."""
        marker = _read_json(extras_file(Path(path))).get("log", {})
        if self._log is not None and marker.get("token") == self._log.token:
            self._log.drop_through(marker["last_seq"])

    async def load(self, path: str) -> int:
        """Resume from a checkpoint (a new run: the group ledger and its workers start afresh)."""
        self._load_state(Path(path), same_run=False)
        if self._log is not None:  # the log starts from this state: snapshot it
            self._log.compact(self._state_writer())
            await self._log.durable()
        return self._store.size()

    async def drop_older_than(self, min_version: int) -> int:
        dropped = self._store.drop_older_than(min_version)
        if dropped:
            self._wake_producers()
            await self._commit({"op": "drop", "min_version": min_version})
        return dropped

    def size(self) -> int:
        return self._store.size()

    def _wake_producers(self) -> None:
        if self._room is not None:
            self._room.set()

    async def wait_for_room(self, bound: int, timeout_s: float) -> dict[str, int]:
        """Answers once fewer than ``bound`` items are stored, or after ``timeout_s``: the size and the
        draws so far ({"size", "sampled"}; a rising ``sampled`` tells a waiting worker a trainer is alive).
        The rollout workers' backpressure (actors/backpressure.py); nothing is logged (nothing changes)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._store.size() >= bound:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            try:
                await asyncio.wait_for(self._room.wait(), left)
            except asyncio.TimeoutError:
                break
        return {"size": self._store.size(), "sampled": self._store.counters["sampled"]}

    async def counters(self) -> dict[str, int]:
        """Counters as a restart would restore them (what was counted so far is made durable first)."""
        if self._log is not None:
            await self._log.durable()
        groups = {**self._groups.assembler.counters, "group_steps_held": self._groups.assembler.held_steps()} \
            if self._groups is not None else {}
        log = {"log_bytes": self._log.live_bytes, "log_limit_bytes": self.log_limit(), **self._log.counters} \
            if self._log is not None else {}
        return {**self._store.counters, "size": self._store.size(), **groups, **log}

    # ---- group rollouts (async_rl/actors/groups.py) ----------------------------------------
    async def tickets(self, worker: str, tasks: list[int], fill_only: bool = False) -> list[Optional[tuple[int, ...]]]:
        """(group_id, task, start) for each of ``worker``'s env slots starting an episode, one per
        proposed task, in order (GroupAssembler.ticket): one call and one log command for K slots."""
        found = [self._groups.assembler.ticket(worker, task, fill_only) for task in tasks]
        await self._commit({"op": "tickets", "worker": worker, "tasks": [int(t) for t in tasks],
                            "fill_only": bool(fill_only)})
        self._groups.report()
        return [None if f is None else tuple(f) for f in found]

    async def add_episodes(self, episodes: list[TensorDict], batch_id: Optional[str] = None) -> int:
        """Finished episodes of groups, durable once this answers (held with their group until it
        completes, then in the sampling pool). Returns how many steps entered the pool."""
        if await self._is_duplicate(batch_id):
            return 0
        blob, sizes = pack(episodes) if self._log is not None else (b"", None)  # before the assembler adds fields
        self._remember(batch_id)
        entered = self._enter_episodes(episodes)
        await self._commit({"op": "episodes", "id": batch_id, "sizes": sizes}, blob)
        self._groups.report()
        return entered

    def _enter_episodes(self, episodes: list[TensorDict]) -> int:
        entered = 0
        for episode in episodes:
            for group in self._groups.assembler.add_episode(episode):
                self._store.add_batch(group)
                entered += group.batch_size[0]
        return entered

    def abandon_group(self, group_id: int) -> None:
        """A member of ``group_id`` broke off: the group cannot complete."""
        self._groups.assembler.abandon(group_id)
        self._append({"op": "abandon", "group": int(group_id)})
        self._groups.report()

    def close(self) -> None:
        """Stop the log's writer once what is queued is written."""
        if self._log is not None:
            self._log.close()


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


@ray.remote
class ReplayBufferActor(ReplayBuffer):
    """Remote face of ReplayBuffer (an async actor: calls interleave only where one awaits its log)."""

    def __init__(self, capacity: int, seed: int = 0, checkpoint_root: Optional[str] = None,
                 groups: Optional[GroupSpec] = None, log_limit_bytes: Optional[int] = None) -> None:
        super().__init__(capacity, seed, checkpoint_root, groups, _restarted(), log_limit_bytes)
