"""Shared memory between a rollout worker and an inference actor on the same node.

A Ray call costs ~1 ms of round trip plus pickling on both sides; a request of 16 rows needs a few
kilobytes moved. Per worker the inference actor holds a **slab**: one ``multiprocessing.shared_memory``
segment cut into ``depth`` slots (a small ring), each with the observation arrays of ``rows`` rows
(written by the worker) and the answer arrays (written by the inference actor), laid out from the
wire format the two already speak (``experience.to_wire``: keys, per-row shapes, declared dtypes).
"Ready" travels as a few bytes over a Unix stream socket in the abstract namespace (no file to leak):
it wakes each side's asyncio loop without polling, and the kernel closes it when a process dies, so the
survivor sees end-of-file at once instead of waiting for a timeout.

Ray keeps control: the worker asks for a slab with a normal Ray call (``InferenceActor.open_slab``),
which answers with a ``SlabOffer`` (segment name, socket address, a token). The inference actor creates
the segment: it holds one per worker and outlives them, so creating, counting and dropping them stays
in one process. Once the worker has mapped it and presented the token, the inference actor unlinks the
name: both mappings stay valid, and no exit path, SIGKILL included, can leave a segment in /dev/shm.
"""
from __future__ import annotations

import asyncio
import functools
import socket
import struct
import sys
import uuid
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Awaitable, Callable, Optional

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from async_rl.errors import ActorTimeoutError
from async_rl.experience import Wire, from_wire

# (key path, per-row shape, numpy dtype name) of every array of a wire dict, in its order.
Layout = tuple[tuple[tuple[str, ...], tuple[int, ...], str], ...]
ALIGN = 64  # bytes; every array starts on a cache line
REQUEST = struct.Struct("<IIB")  # worker -> inference: slot, rows, deterministic
REPLY = struct.Struct("<IBI")  # inference -> worker: slot, status, length of the error text that follows
TOKEN_BYTES = 16
_CREATED_HERE: set[str] = set()  # shared-memory names this process created (its resource tracker keeps them)
OK, ERROR, MISFIT = 0, 1, 2  # MISFIT: the answer does not fit the slab's layout; the worker asks over Ray


class PeerGone(ConnectionError):
    """The other side of a slab closed its socket (it exited or died)."""


class AnswerMisfit(RuntimeError):
    """The inference actor's answer has other shapes than the slab's layout (e.g. a response of another
    length); the request was served but not written back, and is to be asked over Ray."""


def wire_layout(wire: Wire) -> Layout:
    """The layout of a batched wire dict (the first dimension is the rows)."""
    return tuple((path, tuple(a.shape[1:]), a.dtype.str) for path, a in _leaves(wire))


def _leaves(d: dict, prefix: tuple[str, ...] = ()):
    for key, value in d.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def _nest(pairs) -> Wire:
    out: Wire = {}
    for path, value in pairs:
        d = out
        for key in path[:-1]:
            d = d.setdefault(key, {})
        d[path[-1]] = value
    return out


@dataclass(frozen=True)
class SlabSpec:
    """What a slab holds per slot: observations in, answers out, up to ``rows`` rows each."""

    obs: Layout
    answer: Layout
    rows: int
    depth: int = 2

    def slot_arrays(self) -> tuple[list[tuple[tuple[Any, ...], tuple[int, ...], np.dtype, int]], int]:
        """(slot, side + path, full shape, dtype, byte offset) of every array of every slot, and the size."""
        arrays: list[tuple[tuple[Any, ...], tuple[int, ...], np.dtype, int]] = []
        offset = 0
        for slot in range(self.depth):
            for side, layout in (("obs", self.obs), ("answer", self.answer)):
                for path, shape, dtype in layout:
                    full, dt = (self.rows, *shape), np.dtype(dtype)
                    arrays.append(((slot, side, *path), full, dt, offset))
                    offset += -(-int(np.prod(full)) * dt.itemsize // ALIGN) * ALIGN
        return arrays, max(offset, ALIGN)


@dataclass(frozen=True)
class SlabOffer:
    """The inference actor's answer to ``open_slab``: where the slab and its socket are."""

    segment: str
    address: str  # an abstract Unix socket address ("\\0...")
    token: bytes
    spec: SlabSpec


class Slab:
    """Numpy views over one shared-memory segment, per slot and side. The views never leave this
    class (reads copy out), so closing the mapping never races a caller still holding one."""

    def __init__(self, shm: SharedMemory, spec: SlabSpec, owner: bool) -> None:
        self.shm, self.spec, self.owner = shm, spec, owner
        arrays, _ = spec.slot_arrays()
        self._views: Optional[dict] = {key: np.ndarray(full, dt, buffer=shm.buf, offset=off)
                                       for key, full, dt, off in arrays}

    @classmethod
    def create(cls, spec: SlabSpec) -> "Slab":
        shm = SharedMemory(create=True, size=spec.slot_arrays()[1])
        _CREATED_HERE.add(shm._name)  # type: ignore[attr-defined]  # private: the name the resource tracker holds
        return cls(shm, spec, owner=True)

    @classmethod
    def attach(cls, name: str, spec: SlabSpec) -> "Slab":
        shm = SharedMemory(name=name)
        # Python < 3.13 registers attached segments with this process's resource tracker too, which
        # would unlink the owner's segment when this process exits: only the owner tracks it. A segment
        # this process created itself (both sides in one process) stays registered for its owner.
        if shm._name not in _CREATED_HERE:  # type: ignore[attr-defined]  # private: the name the tracker holds
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]  # (as above)
        return cls(shm, spec, owner=False)

    def fits(self, td: TensorDictBase) -> bool:
        """Whether a batch of observations has the slab's keys, per-row shapes and at most its rows."""
        if td.batch_size[0] > self.spec.rows:
            return False
        leaves = {_as_path(k): v for k, v in td.items(True, True)}
        return len(leaves) == len(self.spec.obs) and all(
            path in leaves and tuple(leaves[path].shape[1:]) == shape for path, shape, _ in self.spec.obs)

    def write_obs(self, slot: int, td: TensorDictBase) -> None:
        """Copy a batch ``[k]`` into the slot (cast to the layout's dtypes, as to_wire would)."""
        n = td.batch_size[0]
        for path, _, _ in self.spec.obs:
            torch.from_numpy(self._views[(slot, "obs", *path)][:n]).copy_(td.get(path))

    def read_obs(self, slot: int, rows: int) -> TensorDict:
        return self._read(slot, "obs", self.spec.obs, rows)

    def write_answer(self, slot: int, answer: Wire) -> bool:
        """Copy an answer's rows into the slot; False (nothing written) if it does not fit the layout."""
        leaves = dict(_leaves(answer))
        if len(leaves) != len(self.spec.answer) or any(
                path not in leaves or leaves[path].shape[1:] != shape or leaves[path].shape[0] > self.spec.rows
                for path, shape, _ in self.spec.answer):
            return False
        for path, _, _ in self.spec.answer:
            value = leaves[path]
            self._views[(slot, "answer", *path)][:len(value)] = value
        return True

    def read_answer(self, slot: int, rows: int) -> TensorDict:
        return self._read(slot, "answer", self.spec.answer, rows)

    def _read(self, slot: int, side: str, layout: Layout, rows: int) -> TensorDict:
        return from_wire(_nest((path, self._views[(slot, side, *path)][:rows].copy()) for path, _, _ in layout))

    def unlink(self) -> None:
        """Remove the segment's name (the mappings stay valid); only the owner tracks it."""
        if self.owner:
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass
            _CREATED_HERE.discard(self.shm._name)  # type: ignore[attr-defined]  # private: the tracker's name
            self.owner = False

    def close(self) -> None:
        self.unlink()
        if self._views is not None:
            self._views = None
            self.shm.close()


def _as_path(key) -> tuple[str, ...]:
    return key if isinstance(key, tuple) else (key,)


ServeFn = Callable[[TensorDict, bool], Awaitable[Wire]]


@dataclass
class _Peer:
    """One worker's slab on the inference side, and its socket once the worker connected."""

    worker: str
    slab: Slab
    expiry: asyncio.TimerHandle
    writer: Optional[asyncio.StreamWriter] = None
    tasks: set = field(default_factory=set)
    closed: bool = False


class SlabServer:
    """The inference side: makes slabs on request, answers their slots with ``serve`` (the same
    batching queue as Ray requests), and drops a worker's slab when its socket closes."""

    def __init__(self, serve: ServeFn, owner: str, connect_timeout_s: float) -> None:
        self._serve, self.owner, self.connect_timeout_s = serve, owner, connect_timeout_s
        self.address = f"\0async-rl-slabs-{uuid.uuid4().hex}"
        self._server: Optional[asyncio.AbstractServer] = None
        self._offers: dict[bytes, _Peer] = {}  # made, not yet claimed by their worker's connection
        self.peers: dict[str, _Peer] = {}  # by worker name

    async def offer(self, worker: str, spec: SlabSpec) -> SlabOffer:
        if self._server is None:
            self._server = await asyncio.start_unix_server(self._connection, path=self.address)
        token, slab = uuid.uuid4().bytes, Slab.create(spec)
        # A worker that never connects (it died in between) must not leave its segment behind.
        expiry = asyncio.get_running_loop().call_later(self.connect_timeout_s, self._expire, token)
        self._offers[token] = _Peer(worker, slab, expiry)
        return SlabOffer(slab.shm.name, self.address, token, spec)

    def _expire(self, token: bytes) -> None:
        peer = self._offers.pop(token, None)
        if peer is not None:
            peer.slab.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            token = await asyncio.wait_for(reader.readexactly(TOKEN_BYTES), self.connect_timeout_s)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        peer = self._offers.pop(token, None)
        if peer is None:  # expired, or not ours
            writer.close()
            return
        peer.expiry.cancel()
        peer.slab.unlink()  # both sides have it mapped: the name is no longer needed
        if peer.worker in self.peers:  # the worker asked again (a new process, or after an error)
            self._drop(self.peers.pop(peer.worker))
        peer.writer, self.peers[peer.worker] = writer, peer
        try:
            while True:
                slot, rows, deterministic = REQUEST.unpack(await reader.readexactly(REQUEST.size))
                task = asyncio.create_task(self._answer(peer, slot, rows, bool(deterministic)))
                peer.tasks.add(task)
                task.add_done_callback(functools.partial(self._task_done, peer))
        except (asyncio.IncompleteReadError, ConnectionError):  # the worker exited or died: its socket closed
            pass
        finally:
            if self.peers.get(peer.worker) is peer:
                del self.peers[peer.worker]
                print(f"{self.owner}: {peer.worker} closed its shared-memory slab; dropped it", file=sys.stderr,
                      flush=True)
            self._drop(peer)

    async def _answer(self, peer: _Peer, slot: int, rows: int, deterministic: bool) -> None:
        try:
            answer = await self._serve(peer.slab.read_obs(slot, rows), deterministic)
            if peer.closed:
                return
            status, message = (OK, b"") if peer.slab.write_answer(slot, answer) else (MISFIT, b"")
        except Exception as exc:  # noqa: BLE001 (the caller gets the error, as a Ray call would raise it)
            if peer.closed:
                return
            status, message = ERROR, repr(exc)[:4000].encode()
        peer.writer.write(REPLY.pack(slot, status, len(message)) + message)

    def _task_done(self, peer: _Peer, task: asyncio.Task) -> None:
        peer.tasks.discard(task)
        if peer.closed and not peer.tasks:
            peer.slab.close()

    def _drop(self, peer: _Peer) -> None:
        """Close the socket; the mapping goes once no answer is being written into it."""
        peer.closed = True
        if peer.writer is not None:
            peer.writer.close()
        if not peer.tasks:
            peer.slab.close()

    def close(self) -> None:
        for peer in [*self._offers.values(), *self.peers.values()]:
            peer.expiry.cancel()
            self._drop(peer)
        self._offers.clear()
        self.peers.clear()
        if self._server is not None:
            self._server.close()


class SlabClient:
    """The worker side: writes a batch of observations into a free slot, signals it, and awaits the
    answer; the inference actor's death ends every wait at once (``PeerGone``)."""

    def __init__(self, slab: Slab, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.slab, self._reader, self._writer = slab, reader, writer
        self._free: asyncio.Queue = asyncio.Queue()
        for slot in range(slab.spec.depth):
            self._free.put_nowait(slot)
        self._waiting: dict[int, asyncio.Future] = {}
        self.gone: Optional[BaseException] = None
        self._reading = asyncio.create_task(self._read_replies())

    @classmethod
    async def connect(cls, offer: SlabOffer, timeout_s: float) -> "SlabClient":
        slab = Slab.attach(offer.segment, offer.spec)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Connected here, then handed to asyncio: uvloop (Ray's loop for async actors wherever it is
            # installed) fails to connect to an abstract address given as a path (EINVAL), and the
            # worker would silently fall back to Ray calls for every request.
            sock.setblocking(False)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, offer.address), timeout_s)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            writer.write(offer.token)
        except BaseException:
            sock.close()
            slab.close()
            raise
        return cls(slab, reader, writer)

    async def act(self, obs: TensorDictBase, deterministic: bool, timeout_s: float) -> Optional[TensorDict]:
        """The answer to ``obs`` (wire dtypes, as over Ray), or None if ``obs`` does not fit the slab (the
        caller asks over Ray). Raises PeerGone if the inference actor is gone, AnswerMisfit if its
        answer did not fit, ActorTimeoutError after ``timeout_s`` (the slab is then given up: a late
        answer could land in a reused slot)."""
        if not self.slab.fits(obs):
            return None
        # A free slot (else wait: others are in flight); the wait may see the socket close
        slot = self._free.get_nowait() if not self._free.empty() else await asyncio.wait_for(self._free.get(), timeout_s)
        try:
            if self.gone is not None:
                raise PeerGone(f"the inference actor's socket closed: {self.gone!r}")
            rows = obs.batch_size[0]
            self.slab.write_obs(slot, obs)
            self._waiting[slot] = future = asyncio.get_running_loop().create_future()
            self._writer.write(REQUEST.pack(slot, rows, deterministic))
            try:
                status, message = await asyncio.wait_for(future, timeout_s)
            except asyncio.TimeoutError:
                self.close()
                raise ActorTimeoutError(f"the inference actor did not answer a shared-memory request within "
                                        f"{timeout_s:g} s") from None
            if status == OK:
                return self.slab.read_answer(slot, rows)
            if status == MISFIT:
                raise AnswerMisfit("the inference actor's answer does not fit the shared-memory slab")
            raise RuntimeError(f"the inference actor failed a shared-memory request: {message}")
        finally:
            self._waiting.pop(slot, None)
            self._free.put_nowait(slot)

    async def _read_replies(self) -> None:
        try:
            while True:
                slot, status, length = REPLY.unpack(await self._reader.readexactly(REPLY.size))
                message = (await self._reader.readexactly(length)).decode(errors="replace") if length else ""
                future = self._waiting.get(slot)
                if future is not None and not future.done():
                    future.set_result((status, message))
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.gone = exc
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(PeerGone(f"the inference actor's socket closed: {exc!r}"))

    def close(self) -> None:
        if self.gone is None:
            self._fail(ConnectionAbortedError("closed by the worker"))
        self._reading.cancel()
        self._writer.close()
        self.slab.close()
