"""A process group that broadcasts trained weights from trainer rank 0 to the inference actors.

The group is separate from the training group: DeepSpeed owns the global ``torch.distributed``
world of the trainers, so this module never calls ``init_process_group`` or ``new_group`` and
touches no global ``torch.distributed`` state. It is built by hand from a ``TCPStore`` (hosted by
rank 0, the sender) and a backend object: ``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU.

Ranks: 0 is the sender (trainer rank 0); 1..N are the inference actors (receivers).

Typical use in an async Ray actor (a blocking collective would freeze the actor's event loop,
hence the ``*_async`` variants that run in a worker thread)::

    group = await WeightSyncGroup.create_async(rank, world, addr, port, member_names=names)
    await group.verify_signature_async(model.named_parameters())   # once, at start-up
    await group.broadcast_async([p for _, p in model.named_parameters()])

Every member must call ``broadcast`` with tensors of the same signature, in the same order, and
the calls on all members must be in flight together (submit all of them before any ``ray.get``).
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Iterable

import torch
import torch.distributed as dist

from async_rl.errors import ActorTimeoutError, ConfigError
from async_rl.weights.rendezvous import POLL_S, connect_store, host_store, is_loopback, timedelta_s
from async_rl.weights.signature import check_signature, normalise_signature, tensor_signature
from async_rl.weights.transport import (
    bound_nccl_group,
    choose_transport,
    device_report,
    member_device,
    nccl_options,
    on_device,
)

__all__ = ["WeightSyncGroup"]

_MiB = 1 << 20


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class WeightSyncGroup:
    """Sender (rank 0) + receivers (ranks 1..N), on a TCPStore hosted by rank 0.

    ``backend``: "gloo", "nccl" or "auto". Every member reports its ``device`` (where its tensors
    live; default: the current GPU if NCCL is usable, else CPU). With "auto", rank 0 picks nccl
    only when every member is on a GPU of its own, else gloo over host memory (two members on one
    GPU, a CPU member beside GPU ones), and publishes the choice with its reason (``transport``,
    for the log); receivers adopt it. An explicit backend that cannot work or differs from rank
    0's raises ConfigError.

    ``store``: optional existing store to share (for several groups); keys are prefixed with
    ``group_name``, so group names must be unique per store. Without it, rank 0 hosts a new
    ``TCPStore`` on ``master_addr:master_port``.

    ``bucket_mb``: tensors are packed into one flat buffer per dtype, split into buckets of at
    most this size (a larger single tensor is sent alone), with at most two buckets in flight.
    The group keeps two staging buffers of this size on its device (CPU for gloo, GPU for nccl)
    between broadcasts; a single contiguous tensor already on that device is sent in place.

    ``local_addr``: the address this member's gloo pairs listen on (its node's IP on a cluster);
    default 127.0.0.1 when ``master_addr`` is loopback, else gloo's default (GLOO_SOCKET_IFNAME).
    Rank 0's store listens on ``master_addr`` only, never on every interface.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        *,
        backend: str = "auto",
        timeout_s: float = 60.0,
        group_name: str = "weight_sync",
        member_names: list[str] | None = None,
        store: dist.Store | None = None,
        bucket_mb: float = 64.0,
        local_addr: str | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if world_size < 1:
            raise ConfigError(f"weight-sync group '{group_name}': world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"weight-sync group '{group_name}': rank {rank} is outside 0..{world_size - 1}")
        if timeout_s <= 0:
            raise ConfigError(f"weight-sync group '{group_name}': timeout_s must be > 0, got {timeout_s}")
        if backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"weight-sync group '{group_name}': unknown backend '{backend}'; "
                              "valid: auto, gloo, nccl")
        if member_names is None:
            member_names = ["rank 0 (sender)"] + [f"rank {i}" for i in range(1, world_size)]
        if len(member_names) != world_size:
            raise ConfigError(f"weight-sync group '{group_name}': {len(member_names)} member_names "
                              f"for world_size {world_size}")
        if bucket_mb <= 0:
            raise ConfigError(f"weight-sync group '{group_name}': bucket_mb must be > 0, got {bucket_mb}")

        self.rank = rank
        self.world_size = world_size
        self.master_addr = master_addr
        self.master_port = int(master_port)
        self.local_addr = local_addr
        self.timeout_s = float(timeout_s)
        self.group_name = group_name
        self.member_names = list(member_names)
        self.bucket_bytes = int(bucket_mb * _MiB)
        self._lock = threading.Lock()
        self._seq = 0          # broadcasts done by this member
        self._sig_epoch = 0    # verify_signature calls done by this member
        self._broken: str | None = None
        self._closed = False
        self._pg: Any = None
        self._staging_bufs: list[torch.Tensor | None] = [None, None]
        self._base_store: dist.Store | None = None

        deadline = time.monotonic() + self.timeout_s
        self._owns_store = store is None
        self._base_store = store if store is not None else self._open_store(deadline)
        self._store = dist.PrefixStore(group_name, self._base_store)
        self.backend, self.transport = self._agree_on_backend(backend, device, deadline)
        # gloo moves host memory: a GPU member's tensors are staged through CPU buffers.
        self.device = member_device(device) if self.backend == "nccl" else torch.device("cpu")
        self._store.set(f"seq/{rank}", "0")
        self._store.set(f"joined/{rank}", self.member_names[rank])
        self._wait_for_members(deadline)
        self._pg = self._make_backend(deadline)

    # ------------------------------------------------------------------ construction
    @property
    def _who(self) -> str:
        return f"weight-sync group '{self.group_name}' ({self.member_names[self.rank]}, rank {self.rank})"

    def _members_str(self) -> str:
        return ", ".join(f"{i}={n}" for i, n in enumerate(self.member_names))

    def _open_store(self, deadline: float) -> dist.Store:
        addr, port = self.master_addr, self.master_port
        if self.rank == 0:
            try:
                return host_store(addr, port, None, timedelta_s(self.timeout_s))
            except (RuntimeError, OSError) as e:
                raise ConfigError(f"{self._who}: cannot host the store on {addr}:{port} ({e}); "
                                  "pick a port free on this node, e.g. rendezvous.find_free_port(addr)") from e
        return connect_store(addr, port, None, max(deadline - time.monotonic(), 0.05), self._who,
                             f"{self.member_names[0]} (rank 0; members: {self._members_str()})")

    def _agree_on_backend(self, requested: str, device: torch.device | str | None, deadline: float) -> tuple[str, str]:
        """Every member reports its device; rank 0 picks the transport (``choose_transport``) and
        publishes it with the reason. Returns (backend, reason)."""
        self._store.set(f"device/{self.rank}", json.dumps(device_report(device)))
        if self.rank == 0:
            self._wait_keys([f"device/{r}" for r in range(self.world_size)], deadline, what="join")
            reports = [json.loads(self._store.get(f"device/{r}")) for r in range(self.world_size)]
            try:
                chosen, why = choose_transport(reports, self.member_names, requested)
            except ConfigError as e:
                raise ConfigError(f"{self._who}: {e}") from None
            self._store.set("backend", json.dumps([chosen, why]))
            return chosen, why
        self._wait_keys(["backend"], deadline, what="publish the backend")
        chosen, why = json.loads(self._store.get("backend"))
        if requested != "auto" and requested != chosen:
            raise ConfigError(f"{self._who}: backend '{requested}' here but {self.member_names[0]} "
                              f"chose '{chosen}' ({why}); use the same backend (or 'auto') on every member")
        return chosen, why

    def _missing(self, keys: list[str]) -> list[str]:
        return [k for k in keys if not self._store.check([k])]

    def _wait_keys(self, keys: list[str], deadline: float, what: str) -> None:
        """Poll the store until all keys exist; on timeout name the members whose keys are missing.

        Keys must end in '/<rank>' or be 'backend' (set by rank 0)."""
        while True:
            if self._store.check(keys):
                return
            if time.monotonic() >= deadline:
                missing = self._missing(keys)
                ranks = [int(k.rsplit("/", 1)[1]) if "/" in k else 0 for k in missing]
                names = ", ".join(f"{self.member_names[r]} (rank {r})" for r in ranks)
                raise ActorTimeoutError(
                    f"{self._who}: {names} did not {what} within {self.timeout_s:g}s; "
                    f"members: {self._members_str()}; store {self.master_addr}:{self.master_port}"
                )
            time.sleep(POLL_S)

    def _wait_for_members(self, deadline: float) -> None:
        self._wait_keys([f"joined/{r}" for r in range(self.world_size)], deadline, what="join")

    def _make_backend(self, deadline: float) -> Any:
        if self.world_size == 1:
            return None
        pg_store = dist.PrefixStore("pg", self._store)
        timeout = timedelta_s(self.timeout_s)
        try:
            if self.backend == "nccl":
                opts = nccl_options()
                opts.is_high_priority_stream = False
                opts._timeout = timeout
                return bound_nccl_group(pg_store, self.rank, self.world_size, opts, self.device)
            local = self.local_addr or ("127.0.0.1" if is_loopback(self.master_addr) else None)
            if local is not None:
                # This member's pairs listen on its own address (loopback on one host), not on
                # whatever the hostname resolves to (in a container or netns: maybe unreachable).
                opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private, not in torch's stubs: the only way to choose the pairs' device
                opts._timeout = timeout
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local)]
                return dist.ProcessGroupGloo(pg_store, self.rank, self.world_size, opts)
            # Default device (honours GLOO_SOCKET_IFNAME).
            return dist.ProcessGroupGloo(pg_store, self.rank, self.world_size, timeout)
        except RuntimeError as e:
            if time.monotonic() >= deadline:
                raise ActorTimeoutError(f"{self._who}: connecting the {self.backend} backend timed out "
                                        f"after {self.timeout_s:g}s; members: {self._members_str()}: {e}") from e
            raise

    @classmethod
    async def create_async(cls, *args: Any, **kwargs: Any) -> "WeightSyncGroup":
        """Create the group in a worker thread (waiting for members would block an event loop)."""
        return await asyncio.to_thread(cls, *args, **kwargs)

    # ------------------------------------------------------------------ signature check
    def verify_signature(self, named_tensors_or_signature: Iterable[Any]) -> None:
        """Exchange signatures through the store and compare with rank 0's.

        Receivers compare theirs with the sender's; the sender compares with every receiver's.
        Accepts (name, tensor) pairs or a signature from tensor_signature. Raises ConfigError on a
        mismatch (naming the peer), ActorTimeoutError if a member does not answer in time."""
        items = list(named_tensors_or_signature)
        if items and isinstance(items[0][1], torch.Tensor):
            sig = tensor_signature(items)
        else:
            sig = normalise_signature(items)
        self._check_usable()
        deadline = time.monotonic() + self.timeout_s
        self._sig_epoch += 1
        prefix = f"signature/{self._sig_epoch}"
        self._store.set(f"{prefix}/{self.rank}", json.dumps(sig))
        if self.rank != 0:
            self._wait_keys([f"{prefix}/0"], deadline, what="send its weight signature")
            theirs = json.loads(self._store.get(f"{prefix}/0"))
            # Acknowledge before raising: rank 0 waits for this so that it does not close the
            # store (e.g. on its own mismatch error) before every receiver has read its signature.
            self._store.set(f"{prefix}/read/{self.rank}", "1")
            check_signature(sig, theirs, f"{self.member_names[0]} (rank 0) in group '{self.group_name}'")
            return
        receivers = list(range(1, self.world_size))
        self._wait_keys([f"{prefix}/{r}" for r in receivers], deadline, what="send its weight signature")
        mismatch: ConfigError | None = None
        for r in receivers:
            try:
                theirs = json.loads(self._store.get(f"{prefix}/{r}"))
                check_signature(sig, theirs, f"{self.member_names[r]} (rank {r}) in group '{self.group_name}'")
            except ConfigError as e:
                mismatch = mismatch or e
        try:
            self._wait_keys([f"{prefix}/read/{r}" for r in receivers], deadline,
                            what="read the sender's weight signature")
        except ActorTimeoutError:
            if mismatch is None:
                raise
        if mismatch is not None:
            raise mismatch

    async def verify_signature_async(self, named_tensors_or_signature: Iterable[Any]) -> None:
        items = list(named_tensors_or_signature)
        await asyncio.to_thread(self.verify_signature, items)

    # ------------------------------------------------------------------ broadcast
    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self._who} is closed")
        if self._broken is not None:
            raise RuntimeError(f"{self._who} is unusable after an earlier failure ({self._broken}); "
                               "close it and create a new group")

    def _buckets(self, tensors: list[torch.Tensor]) -> list[list[int]]:
        """Indices grouped by dtype (first-appearance order), split at bucket_bytes."""
        by_dtype: dict[torch.dtype, list[list[int]]] = {}
        sizes: dict[torch.dtype, int] = {}
        for i, t in enumerate(tensors):
            if t.numel() == 0:
                continue
            buckets = by_dtype.setdefault(t.dtype, [[]])
            n = _nbytes(t)
            if buckets[-1] and sizes[t.dtype] + n > self.bucket_bytes:
                buckets.append([])
                sizes[t.dtype] = 0
            buckets[-1].append(i)
            sizes[t.dtype] = sizes.get(t.dtype, 0) + n
        return [b for bs in by_dtype.values() for b in bs if b]

    def broadcast(self, tensors: list[torch.Tensor], *, timeout_s: float | None = None) -> None:
        """Rank 0 sends ``tensors``; the other ranks receive into theirs in place.

        Blocks until done or ``timeout_s`` (default: the group's; the backend's own timeout, set
        to the group's timeout_s, caps it) has passed, then raises
        ActorTimeoutError naming the group, its members and those that had not reached this
        broadcast. After a timeout or error the group is unusable."""
        tensors = list(tensors)
        with self._lock:
            self._check_usable()
            if self.world_size == 1 or not tensors:
                return
            timeout = self.timeout_s if timeout_s is None else float(timeout_s)
            start = time.monotonic()
            deadline = start + timeout
            self._seq += 1
            self._store.set(f"seq/{self.rank}", str(self._seq))
            try:
                with torch.no_grad(), on_device(self.device):
                    self._broadcast_buckets(tensors, deadline)
            except _WaitTimeout as e:
                self._fail("timeout")
                raise ActorTimeoutError(self._timeout_message(tensors, time.monotonic() - start)) from e.__cause__
            except Exception as e:
                self._fail(f"{type(e).__name__}: {e}")
                raise RuntimeError(f"{self._who}: broadcast #{self._seq} failed: {e}; "
                                   f"members: {self._members_str()}") from e

    async def broadcast_async(self, tensors: list[torch.Tensor], *, timeout_s: float | None = None) -> None:
        """``broadcast`` in a worker thread, so an async actor's event loop keeps running."""
        await asyncio.to_thread(self.broadcast, list(tensors), timeout_s=timeout_s)

    def _staging(self, slot: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        """A reusable staging buffer (two slots, bucket_bytes each) viewed as ``dtype``.

        Reusing it avoids allocating and page-faulting fresh memory on every broadcast (measured:
        ~200 ms per 100 MiB on CPU). Tensors bigger than a bucket get a one-off buffer."""
        if nbytes > self.bucket_bytes:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device).view(dtype)
        buf = self._staging_bufs[slot]
        if buf is None:
            buf = self._staging_bufs[slot] = torch.empty(self.bucket_bytes, dtype=torch.uint8, device=self.device)
        return buf[:nbytes].view(dtype)

    def _broadcast_buckets(self, tensors: list[torch.Tensor], deadline: float) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        # (work, buffer, indices, in_place); at most two buckets in flight, one per staging slot
        in_flight: list[tuple[Any, torch.Tensor, list[int], bool]] = []

        def finish(work: Any, buf: torch.Tensor, idx: list[int], in_place: bool) -> None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _WaitTimeout()
            try:
                work.wait(timedelta_s(remaining))
            except RuntimeError as e:
                if time.monotonic() >= deadline - 0.01 or "timed out" in str(e).lower():
                    raise _WaitTimeout() from e
                raise
            if self.rank != 0 and not in_place:
                offset = 0
                for i in idx:
                    t = tensors[i]
                    n = t.numel()
                    t.copy_(buf[offset:offset + n].view(t.shape))
                    offset += n

        for k, idx in enumerate(self._buckets(tensors)):
            first = tensors[idx[0]]
            in_place = len(idx) == 1 and first.is_contiguous() and first.device == self.device
            if in_place:
                buf = first.detach()  # send / receive directly, no staging
            else:
                buf = self._staging(k % 2, sum(_nbytes(tensors[i]) for i in idx), first.dtype)
                if self.rank == 0:
                    offset = 0
                    for i in idx:
                        t = tensors[i]
                        n = t.numel()
                        buf[offset:offset + n].view(t.shape).copy_(t)
                        offset += n
            work = self._pg.broadcast([buf], opts)
            in_flight.append((work, buf, idx, in_place))
            if len(in_flight) >= 2:
                finish(*in_flight.pop(0))
        while in_flight:
            finish(*in_flight.pop(0))

    def _fail(self, reason: str) -> None:
        self._broken = reason
        try:
            if self._pg is not None:
                self._pg.abort()
        except Exception:  # noqa: BLE001  # pragma: no cover - best effort
            pass

    def _timeout_message(self, tensors: list[torch.Tensor], elapsed: float) -> str:
        mib = sum(_nbytes(t) for t in tensors) / _MiB
        msg = (f"{self._who}: broadcast #{self._seq} of {len(tensors)} tensors ({mib:.1f} MiB) "
               f"timed out after {elapsed:.1f}s; members: {self._members_str()}")
        try:
            if self._owns_store and self._base_store is not None:  # don't wait long on a store whose host may be gone
                self._base_store.set_timeout(timedelta_s(2.0))
            behind = []
            for r in range(self.world_size):
                if r == self.rank:
                    continue
                seq = int(self._store.get(f"seq/{r}")) if self._store.check([f"seq/{r}"]) else 0
                if seq < self._seq:
                    behind.append(f"{self.member_names[r]} (rank {r}, at broadcast #{seq})")
            if behind:
                msg += f"; not answered by: {', '.join(behind)}"
            else:
                msg += "; every member reached this broadcast (slow link or a stuck peer?)"
        except Exception as e:  # noqa: BLE001 (the store host itself may be gone)
            msg += f"; could not ask the store who is missing ({type(e).__name__}: {e})"
        return msg

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Release the backend and (on rank 0, if it owns it) the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        pg, self._pg = self._pg, None
        if pg is not None:
            try:
                if self._broken is None and self.backend == "nccl":
                    pg.shutdown()
                else:
                    pg.abort()
            except Exception:  # noqa: BLE001  # pragma: no cover - best effort
                pass
        self._staging_bufs = [None, None]
        self._store = None  # type: ignore[assignment]  # closed: no method reads it after close
        self._base_store = None

    def __enter__(self) -> "WeightSyncGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"WeightSyncGroup(name={self.group_name!r}, rank={self.rank}, world_size={self.world_size}, "
                f"backend={getattr(self, 'backend', '?')!r}, members={self.member_names})")


class _WaitTimeout(Exception):
    pass

