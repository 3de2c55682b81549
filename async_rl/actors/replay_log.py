"""ReplayLog: the replay buffer's write-ahead log of commands, written by a thread of its own.

The buffer (actors/replay_buffer.py) is a deterministic state machine: its state after a restart
is a *base* (a committed checkpoint's replay state, or a compaction snapshot in the log's own
directory) followed by every command logged after it, applied in order. Commands are what changes
the state: a batch added (with its batch id, so a re-push is recognised), rows consumed (by their
insertion stamps, with the request they answered: actors/replay_draws.py), a stale drop, a counter bump, a group ticket, episodes handed to the assembler,
a group abandoned. The buffer applies a command and appends it in the same uninterrupted step on
its event loop, so the log's order is the order of application; it answers a caller only once the
command is durable, so anything a caller has seen is in the log, and what a crash cuts off is a
suffix nobody was answered for.

Group commit: ``append`` only queues; the writer thread writes everything queued, fsyncs once and
then wakes every waiter up to the last sequence number written. The actor's thread never fsyncs.

Bounded: segments (``seg-<first seq>.log``) hold framed records (length, CRC, JSON header,
tensor payload); a torn tail (a crash mid-write) fails its CRC and ends the segment. Entries are
dropped when a checkpoint covering them commits, and also without one: when the live segments
exceed the buffer's limit it hands a snapshot of its state to ``compact``, the writer stores
it as ``base-<seq>/`` after the records before it and deletes the segments it covers.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import threading
import uuid
import zlib
from collections import deque
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import safetensors.torch
from tensordict import TensorDict

from async_rl.checkpoint import fsync_path

FRAME = struct.Struct("<IIQ")  # header bytes, CRC32 of header + payload, payload bytes
TOKEN = "token"  # names this log's life (a checkpoint made under another log is no base for it)
LIMIT_FLOOR = 32 * 2**20  # the automatic size limit is at least this (bytes)


class Record(NamedTuple):
    seq: int
    header: dict[str, Any]
    payload: bytes


def pack(tds: list[TensorDict]) -> tuple[bytes, list[list[int]]]:
    """TensorDicts as one safetensors blob (leaves under ``<index>/<'/'-joined key>``) and their batch sizes."""
    flat: dict[str, Any] = {}
    for i, td in enumerate(tds):
        for key, value in td.items(include_nested=True, leaves_only=True):
            flat[f"{i}/" + "/".join(key if isinstance(key, tuple) else (key,))] = value.contiguous()
    return safetensors.torch.save(flat), [list(td.batch_size) for td in tds]


def unpack(blob: bytes, sizes: list[list[int]]) -> list[TensorDict]:
    tds = [TensorDict({}, batch_size=size) for size in sizes]
    for key, value in safetensors.torch.load(blob).items():
        index, rest = key.split("/", 1)
        tds[int(index)][tuple(rest.split("/"))] = value
    return tds


def read_segment(path: Path) -> list[Record]:
    """The records of one segment up to its first torn or corrupt one."""
    data, records, at = path.read_bytes(), [], 0
    while at + FRAME.size <= len(data):
        header_len, crc, payload_len = FRAME.unpack_from(data, at)
        end = at + FRAME.size + header_len + payload_len
        body = data[at + FRAME.size:end]
        if end > len(data) or zlib.crc32(body) != crc:
            break
        header = json.loads(body[:header_len])
        records.append(Record(header.pop("seq"), header, bytes(body[header_len:])))
        at = end
    return records


class ReplayLog:
    """One buffer's log directory (see the module docstring). ``fresh``: a new run or a resume,
    whatever an earlier process logged is not ours and is deleted."""

    def __init__(self, directory: Path, fresh: bool) -> None:
        self.directory = directory
        if fresh:
            shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, exist_ok=True)
        token_file = directory / TOKEN
        if not token_file.is_file():
            token_file.write_text(uuid.uuid4().hex)
            fsync_path(token_file)
            fsync_path(directory)
        self.token = token_file.read_text().strip()
        for tmp in directory.glob("*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)
        self.next_seq = 0
        self.counters = {"log_commits": 0, "log_compactions": 0}
        self._live: deque = deque()  # (seq, bytes) of the records no base covers yet
        self.live_bytes = 0
        self._flushed = self._written = -1  # last seq on disk / last seq handed to a segment
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._paused = False  # tests: hold the writer to see what one commit gathers
        self._stop: Optional[bool] = None
        self._error: Optional[BaseException] = None
        self._segment: Optional[tuple[int, Any]] = None  # (first seq, open file) the writer appends to
        self._thread: Optional[threading.Thread] = None

    # ---- recovery --------------------------------------------------------------------------
    def base(self) -> Optional[tuple[int, Path]]:
        """The newest compaction snapshot: (last seq it holds, its replay state path)."""
        found = sorted(int(p.name[5:]) for p in self.directory.glob("base-*") if p.name[5:].isdigit())
        return (found[-1], self.directory / f"base-{found[-1]:012d}" / "replay.safetensors") if found else None

    def records(self, after: int) -> list[Record]:
        """Every intact record with a sequence number above ``after``, in order (stops at a gap)."""
        out: list[Record] = []
        for path in self._segments():
            for record in read_segment(path):
                if record.seq > after and (not out or record.seq == out[-1].seq + 1):
                    out.append(record)
        self._live = deque((r.seq, FRAME.size + len(json.dumps(r.header)) + len(r.payload)) for r in out)
        self.live_bytes = sum(size for _, size in self._live)
        return out

    def start(self, next_seq: int) -> None:
        """Number new records from ``next_seq`` on (past the base and every record read) and start the writer."""
        self.next_seq, self._flushed, self._written = next_seq, next_seq - 1, next_seq - 1
        for path in self._segments():  # a segment begun at or after next_seq holds no intact record
            if int(path.stem[4:]) >= next_seq:
                path.unlink()
        self._thread = threading.Thread(target=self._write_loop, name="replay-log-writer", daemon=True)
        self._thread.start()

    # ---- the actor's side ------------------------------------------------------------------
    def append(self, header: dict[str, Any], payload: bytes = b"") -> int:
        """Queue one command (the writer makes it durable); returns its sequence number."""
        if self._error is not None:
            raise RuntimeError(f"the replay log cannot write: {self._error}") from self._error
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        head = json.dumps({**header, "seq": seq}).encode()
        frame = FRAME.pack(len(head), zlib.crc32(head + payload), len(payload)) + head + payload
        self._put(("record", seq, frame))
        self._live.append((seq, len(frame)))
        self.live_bytes += len(frame)
        return seq

    async def durable(self, seq: Optional[int] = None) -> None:
        """Wait until record ``seq`` (default: the last appended) is on disk."""
        seq = self.next_seq - 1 if seq is None else seq
        with self._cond:
            if self._error is not None:
                raise RuntimeError(f"the replay log cannot write: {self._error}") from self._error
            if self._flushed >= seq:
                return
            future = asyncio.get_running_loop().create_future()
            self._waiters.append((seq, future))
        await future

    def compact(self, write_base: Callable[[Path], None]) -> None:
        """Replace every record so far by a snapshot: ``write_base(path)`` writes the state as of
        the last appended record (taken now by the caller, written by the writer thread)."""
        if self.next_seq == 0:  # a snapshot is named by the last record it holds: give it one
            self.append({"op": "noop"})
        self._put(("base", self.next_seq - 1, write_base))
        self.counters["log_compactions"] += 1
        self._forget_through(self.next_seq - 1)

    def drop_through(self, seq: int) -> None:
        """A committed checkpoint holds everything up to ``seq``: its records and older snapshots go."""
        self._put(("trim", seq, None))
        self._forget_through(seq)

    def _forget_through(self, seq: int) -> None:
        while self._live and self._live[0][0] <= seq:
            self.live_bytes -= self._live.popleft()[1]

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._segments() if p.exists())

    def pause(self, paused: bool) -> None:
        with self._cond:
            self._paused = paused
            self._cond.notify_all()

    def close(self, flush: bool = True) -> None:
        """Stop the writer; ``flush=False`` drops what is queued (what a killed process leaves)."""
        with self._cond:
            if not flush:
                self._queue.clear()
            self._stop, self._paused = True, False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    # ---- the writer thread -----------------------------------------------------------------
    def _put(self, job: tuple) -> None:
        with self._cond:
            self._queue.append(job)
            self._cond.notify_all()

    def _segments(self) -> list[Path]:
        return sorted(self.directory.glob("seg-*.log"))

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while (not self._queue or self._paused) and not self._stop:
                    self._cond.wait()
                if self._stop and not self._queue:
                    break
                jobs = list(self._queue)
                self._queue.clear()
            try:
                last = self._write(jobs)
            except BaseException as exc:  # noqa: BLE001 - every waiter hears of it
                with self._cond:
                    self._error = exc
                    waiters, self._waiters = self._waiters, []
                for _, future in waiters:
                    _call_in_loop(future, _fail, exc)
                return
            self._wake(last)
        if self._segment is not None:
            self._segment[1].close()

    def _write(self, jobs: list[tuple]) -> int:
        """Write a group of jobs in order, one fsync per group; returns the last seq written."""
        last, dirty = self._flushed, False
        for kind, seq, item in jobs:
            if kind == "record":
                if self._segment is None:
                    handle = open(self.directory / f"seg-{seq:012d}.log", "ab")  # closed on rotation
                    fsync_path(self.directory)
                    self._segment = (seq, handle)
                self._segment[1].write(item)
                last, dirty, self._written = seq, True, seq
                continue
            if dirty:  # a snapshot or a trim comes after the records before it are on disk
                self._sync_segment()
                dirty = False
            self._rotate()
            if kind == "base":
                self._write_base(seq, item)
            self._delete_through(seq)
        if dirty:
            self._sync_segment()
        return last

    def _sync_segment(self) -> None:
        self._segment[1].flush()
        os.fsync(self._segment[1].fileno())
        self.counters["log_commits"] += 1

    def _rotate(self) -> None:
        if self._segment is not None:
            self._segment[1].close()
            self._segment = None

    def _write_base(self, seq: int, write_base: Callable[[Path], None]) -> None:
        tmp = self.directory / f"base-{seq:012d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write_base(tmp / "replay.safetensors")
        for path in tmp.iterdir():
            fsync_path(path)
        final = self.directory / f"base-{seq:012d}"
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_path(self.directory)

    def _delete_through(self, seq: int) -> None:
        """Segments whose records all lie at or below ``seq``, and snapshots older than ``seq``
        (called after a rotation: no segment is open)."""
        segments = self._segments()
        lasts = [int(p.stem[4:]) - 1 for p in segments[1:]] + [self._written]  # a segment ends where the next begins
        for path, last in zip(segments, lasts):
            if last <= seq:
                path.unlink(missing_ok=True)
        for path in self.directory.glob("base-*"):
            if path.name[5:].isdigit() and int(path.name[5:]) < seq:
                shutil.rmtree(path, ignore_errors=True)

    def _wake(self, last: int) -> None:
        with self._cond:
            self._flushed = max(self._flushed, last)
            ready = [(s, f) for s, f in self._waiters if s <= self._flushed]
            self._waiters = [(s, f) for s, f in self._waiters if s > self._flushed]
        for _, future in ready:
            _call_in_loop(future, _resolve)


def _call_in_loop(future: asyncio.Future, fn: Callable[..., None], *args: Any) -> None:
    try:
        future.get_loop().call_soon_threadsafe(fn, future, *args)
    except RuntimeError:  # its event loop is closed: nobody waits any more
        pass


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(RuntimeError(f"the replay log cannot write: {exc}"))
