"""InferenceServer (InferenceActor is its Ray face): batched forward passes of the policy, serving many rollout workers.

Requests wait in a queue as asyncio futures; a background loop runs one forward pass when
``batch_size`` requests wait or ``timeout_s`` has passed since the oldest one arrived. New
weights are staged and swapped in between two batches, so a batch never sees a half-updated
model, and every answer carries the policy version that produced it.
"""
from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional, cast

import ray
import torch
from tensordict import TensorDict

from async_rl.actors.shared_slab import SlabOffer, SlabServer, SlabSpec
from async_rl.errors import ActorTimeoutError
from async_rl.experience import Wire, from_wire, inference_keys, split_wire, to_wire
from async_rl.policies.base import ActorCritic
from async_rl.policies.nets import cast_parameters
from async_rl.policies.reference import sampler_reference_logp
from async_rl.process_setup import configure_torch, pin_gpu, precision_dtype, resolve_device
from async_rl.weights.group import WeightSyncGroup
from async_rl.weights.rendezvous import is_loopback
from async_rl.weights.signature import tensor_signature

ForwardFn = Callable[[TensorDict, torch.Tensor], TensorDict]
# Auto mode runs the forward on the event loop for CPU models up to this size (the MetaWorld MLP
# has 0.15 M parameters, the tiny VLA 0.2 M); bigger ones, and any GPU model, get a thread.
INLINE_FORWARD_MAX_PARAMETERS = 20_000_000
# A batch that raises fails only its callers; this many in a row end the batching loop (and with
# it the inference actor, so that Ray starts a fresh process).
MAX_FAILED_BATCHES = 3
# Waiting for more rows pays only when another caller's request comes within the timeout. After this
# many waits in a row that brought no other request (e.g. a single worker whose K rows are fewer than
# batch_size: measured 3.6 ms instead of 0.8 ms per 8-row request at a 2 ms timeout), batches are
# served at once for SKIP_BATCHES batches, then waiting is tried again.
LONELY_WAITS = 8
SKIP_BATCHES = 64


@dataclass
class _Request:
    obs: TensorDict
    deterministic: bool
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class BatchingServer:
    """The batching loop, independent of Ray (tested directly)."""

    def __init__(self, forward: ForwardFn, batch_size: int, timeout_s: float, forward_in_thread: bool = True,
                 max_failed_batches: int = MAX_FAILED_BATCHES,
                 on_fatal: Optional[Callable[[BaseException], None]] = None) -> None:
        """``on_fatal(error)`` runs if the loop ends (staged weights failed to apply, or
        ``max_failed_batches`` batches in a row raised); the callers waiting then get an error."""
        self._forward = forward
        self.max_failed_batches, self.on_fatal = max_failed_batches, on_fatal
        # A thread keeps the loop taking requests during a long forward; for a small model the
        # hand-off costs more than the forward itself (profiled: ~2.5x for the MetaWorld MLP).
        self.forward_in_thread = forward_in_thread
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.version = 0
        self._pending: list[_Request] = []
        self._lonely_waits, self._skip = 0, 0  # see LONELY_WAITS
        self._arrived = asyncio.Event()
        self._staged: Optional[tuple[Callable[[], None], int]] = None
        self._fatal: Optional[BaseException] = None
        self._stats = {"batches": 0, "requests": 0, "forward_seconds": 0.0}
        self._task = asyncio.get_running_loop().create_task(self._loop())
        self._task.add_done_callback(self._on_loop_done)

    async def submit(self, obs: TensorDict, deterministic: bool = False) -> Wire:
        """Queue a batch of observations (``[k]``, from one caller); returns its rows of the
        policy output, with ``policy_version``, as a wire dict of numpy arrays."""
        if self._fatal is not None:
            raise RuntimeError(f"inference loop is dead: {self._fatal!r}")
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(obs, deterministic, future))
        self._arrived.set()
        return await future

    def stage_weights(self, apply: Callable[[], None], version: int) -> None:
        """``apply`` copies new weights into the model; it runs between two batches."""
        self._staged = (apply, version)

    def apply_staged(self) -> None:
        """Swap in staged weights now (the loop calls it before every batch)."""
        if self._staged is not None:
            apply, version = self._staged
            self._staged = None
            apply()
            self.version = version

    def stats(self, reset: bool = True) -> dict[str, float]:
        s = self._stats
        out = {
            "batches": s["batches"],
            "batch_size": s["requests"] / max(s["batches"], 1),  # rows per forward pass
            "forward_ms": 1000.0 * s["forward_seconds"] / max(s["batches"], 1),
            "pending": len(self._pending),
            "policy_version": self.version,
        }
        if reset:
            self._stats = {"batches": 0, "requests": 0, "forward_seconds": 0.0}
        return out

    async def _next_batch(self) -> list[_Request]:
        while not self._pending:
            self._arrived.clear()
            await self._arrived.wait()
        if self._skip > 0:
            self._skip -= 1
        elif self._pending_rows() < self.batch_size:
            await self._wait_for_rows()
        rows, take = 0, 0
        while take < len(self._pending) and rows < self.batch_size:  # a caller's rows stay together
            rows += self._pending[take].obs.batch_size[0]
            take += 1
        batch, self._pending = self._pending[:take], self._pending[take:]
        return batch

    async def _wait_for_rows(self) -> None:
        """Until ``batch_size`` rows wait or the oldest request has waited ``timeout_s``; counts the
        waits that brought no other request (LONELY_WAITS)."""
        requests, deadline = len(self._pending), self._pending[0].arrived + self.timeout_s
        while self._pending_rows() < self.batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                break
        self._lonely_waits = self._lonely_waits + 1 if len(self._pending) == requests else 0
        if self._lonely_waits >= LONELY_WAITS:
            self._lonely_waits, self._skip = 0, SKIP_BATCHES

    def _pending_rows(self) -> int:
        return sum(r.obs.batch_size[0] for r in self._pending)

    async def _loop(self) -> None:
        failed = 0  # batches in a row that raised
        while True:
            batch = await self._next_batch()
            try:
                self.apply_staged()
            except BaseException as exc:  # half-copied weights: serving on would be wrong, so the loop ends
                self._fail(batch, exc)
                raise
            try:
                await self._serve(batch)
                failed = 0
            except Exception as exc:  # e.g. observations that do not stack, a failed forward
                traceback.print_exc()
                self._fail(batch, exc)
                failed += 1
                if failed >= self.max_failed_batches:  # e.g. a sticky device error: no batch will pass
                    raise RuntimeError(f"{failed} batches in a row failed, the last with {exc!r}") from exc

    async def _serve(self, batch: list[_Request]) -> None:
        """One forward pass for ``batch``; every caller gets its own rows."""
        version = self.version
        sizes = [r.obs.batch_size[0] for r in batch]
        obs = batch[0].obs if len(batch) == 1 else TensorDict.cat([r.obs for r in batch])  # one caller: no copy
        deterministic = torch.tensor([r.deterministic for r, n in zip(batch, sizes) for _ in range(n)])
        start = time.perf_counter()
        if self.forward_in_thread:
            out = await asyncio.to_thread(self._forward, obs, deterministic)
        else:
            out = self._forward(obs, deterministic)
        out["policy_version"] = torch.full((sum(sizes),), version, dtype=torch.int64)
        answers = split_wire(to_wire(out), sizes)
        self._stats["batches"] += 1
        self._stats["requests"] += sum(sizes)
        self._stats["forward_seconds"] += time.perf_counter() - start
        for r, rows in zip(batch, answers, strict=True):
            if not r.future.done():
                r.future.set_result(rows)

    @staticmethod
    def _fail(batch: list[_Request], exc: BaseException) -> None:
        for r in batch:
            if not r.future.done():
                r.future.set_exception(exc)

    def _on_loop_done(self, task: asyncio.Task) -> None:
        self._fatal = task.exception() if not task.cancelled() else asyncio.CancelledError()
        self._fail(self._pending, RuntimeError(f"inference loop stopped: {self._fatal!r}"))
        self._pending.clear()
        if self.on_fatal is not None and not task.cancelled():
            self.on_fatal(self._fatal)


class InferenceServer:
    """One copy of the policy on its device, behind a BatchingServer."""

    def __init__(self, index: int, policy_factory: Callable[[], torch.nn.Module], batch_size: int,
                 timeout_ms: float, gpu_id: Optional[str] = None, seed: int = 0, torch_threads: int = 1,
                 precision: str = "auto", forward_in_thread: Optional[bool] = None,
                 weights_timeout_s: float = 600.0, reference_logp: bool = False) -> None:
        """``reference_logp``: every sampled answer also carries ``logp_ref``, the reference policy's log-probs
        (this model with its LoRA adapters off: ``reference_logp_on sampler``)."""
        pin_gpu(gpu_id, f"inference-{index}")  # first: CUDA reads the variable once
        configure_torch(seed + 10_000 * (index + 1), torch_threads)
        self.name = f"inference-{index}"
        # A GPU named by hand (gpu_id) or given by Ray for this actor's num_gpus.
        self.device = resolve_device("cuda" if gpu_id is not None or ray.get_gpu_ids() else "cpu")
        # Same dtypes as the trainers' module (DeepSpeed casts parameters, not buffers), so the
        # broadcast signatures match.
        dtype = precision_dtype(precision, self.device)
        self.model = cast(ActorCritic, cast_parameters(policy_factory().to(self.device), dtype).eval())  # a policy
        # Only what the experience record keeps leaves this actor (to_wire ships it as float32).
        self._shipped = inference_keys(self.model.action_key, self.model.behaviour_stats)
        self._reference_logp = reference_logp
        self._batch_size, self._timeout_s = batch_size, timeout_ms / 1000.0
        if forward_in_thread is None:
            forward_in_thread = self.device.type == "cuda" or self.num_parameters() > INLINE_FORWARD_MAX_PARAMETERS
        self.forward_in_thread = forward_in_thread
        self._server: Optional[BatchingServer] = None
        self._sync: Optional[WeightSyncGroup] = None
        self._has_weights: Optional[asyncio.Event] = None  # set once the trainers' weights are staged
        self._weights_timeout_s = weights_timeout_s
        self._slabs: Optional[SlabServer] = None  # co-located workers' shared-memory slabs (actors/shared_slab.py)
        self.model.prepare_sampling()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def _forward(self, obs: TensorDict, deterministic: torch.Tensor) -> TensorDict:
        with torch.inference_mode():
            obs, deterministic = obs.to(self.device), deterministic.to(self.device)
            out = self.model.act(obs, deterministic).select(*self._shipped)
            if self._reference_logp:
                out["logp_ref"] = sampler_reference_logp(self.model, obs, out[self.model.action_key], ~deterministic)
            out = out.to("cpu")
        if not self.model.has_critic:  # its value head is never trained nor sent: serve 0, not its random output
            out["value"] = torch.zeros_like(out["value"])
        return out

    def _server_ready(self) -> BatchingServer:
        if self._server is None:  # created lazily: it needs the actor's running event loop
            self._server = BatchingServer(self._forward, self._batch_size, self._timeout_s, self.forward_in_thread,
                                          on_fatal=self._exit)
            gc.freeze()  # the model and libraries live as long as the actor: full collections skip them
        return self._server

    def _exit(self, error: BaseException) -> None:
        """The batching loop ended: end the process rather than stay alive serving nothing; Ray
        restarts the actor (``max_restarts``) and the driver rejoins it to the weight sync."""
        print(f"{self.name}: the batching loop stopped ({error!r}); exiting so that Ray restarts this actor",
              file=sys.stderr, flush=True)
        os._exit(1)

    def _weights_event(self) -> asyncio.Event:
        if self._has_weights is None:
            self._has_weights = asyncio.Event()
        return self._has_weights

    async def request(self, obs: Wire, deterministic: bool = False) -> Wire:
        """A batch ``[k]`` of observations in, their actions/log-probs/values/version out (wire dicts)."""
        return await self._answer(from_wire(obs), deterministic)

    async def _answer(self, obs: TensorDict, deterministic: bool) -> Wire:
        """Ray requests and shared-memory slots alike: one batching queue.

        Nothing is served before the first weights arrived (a restarted actor holds random ones);
        a request that waited ``weights_timeout_s`` for them fails instead of lingering."""
        has_weights = self._weights_event()
        try:
            if not has_weights.is_set():  # wait_for wraps the wait in a task: not once per request
                await asyncio.wait_for(has_weights.wait(), self._weights_timeout_s)
        except asyncio.TimeoutError:
            raise ActorTimeoutError(
                f"{self.name}: no weights from trainer-0 within {self._weights_timeout_s:g} s (no broadcast reached "
                "this inference actor; check the trainers' log for the weight-sync error)") from None
        return await self._server_ready().submit(obs, deterministic)

    async def open_slab(self, worker: str, node_id: str, spec: SlabSpec) -> Optional[SlabOffer]:
        """A shared-memory slab for ``worker`` if it runs on this actor's node (Ray's node ids), else
        None: the worker keeps the Ray path. A worker asking again replaces its old slab."""
        if node_id != ray.get_runtime_context().get_node_id():
            return None
        if self._slabs is None:
            self._slabs = SlabServer(self._answer, self.name, self._weights_timeout_s)
        return await self._slabs.offer(worker, spec)

    async def shared_memory_peers(self) -> list[str]:
        """The workers whose slab is connected (for tests and logs)."""
        return sorted(self._slabs.peers) if self._slabs is not None else []

    async def ping(self) -> str:
        return self.name

    async def serve_built_weights(self) -> None:
        """Serve the weights the policy factory built, without waiting for a broadcast (stand-alone
        use with no trainers, e.g. the inference benchmark)."""
        self._weights_event().set()

    async def pid(self) -> int:
        return os.getpid()

    def weight_signature(self) -> list[tuple[str, tuple[int, ...], str]]:
        return tensor_signature(self.model.inference_tensors())

    async def join_weight_sync(self, rank: int, world_size: int, addr: str, port: int,
                               timeout_s: float, member_names: list[str]) -> None:
        if self._sync is not None:  # rebuilding the group after a member failed
            self._sync.close()
        self._sync = await asyncio.to_thread(
            WeightSyncGroup, rank, world_size, addr, port, timeout_s=timeout_s, member_names=member_names,
            local_addr=None if is_loopback(addr) else ray.util.get_node_ip_address(), device=self.device,
        )

    async def receive_weights(self) -> int:
        """Receive a broadcast from trainer rank 0 into staging buffers, then stage the swap; returns
        the policy version the weights are. The version travels with them (the sender's last
        completed version, which a re-send mid-epoch cannot know in advance)."""
        if self._sync is None:
            raise RuntimeError(f"{self.name} is not in a weight-sync group (restarted?); rebuild the group")
        targets = [t for _, t in self.model.inference_tensors()]
        staging = [torch.empty_like(t) for t in targets]
        label = torch.zeros(1, dtype=torch.int64, device=self.device)
        await self._sync.broadcast_async([*staging, label])
        version = int(label.item())

        def apply() -> None:
            with torch.no_grad():
                for target, new in zip(targets, staging):
                    target.copy_(new)

        self._server_ready().stage_weights(apply, version)
        self._weights_event().set()
        return version

    def stats(self) -> dict[str, float]:
        return self._server_ready().stats() if self._server else {"batches": 0, "policy_version": 0}

    async def weights(self) -> dict[str, torch.Tensor]:
        """The weights the next batch will use (staged ones applied first); for tests."""
        self._server_ready().apply_staged()
        return {k: v.detach().cpu().clone() for k, v in self.model.inference_tensors()}

    async def shutdown(self) -> None:
        if self._slabs is not None:  # on the event loop: the slabs' sockets belong to it
            self._slabs.close()
        if self._sync is not None:
            self._sync.close()
        # The vLLM engine's process and its weights' folder in /dev/shm: runs that left them to the kill that
        # follows (the engine watches its parent) left the folder behind.
        await asyncio.to_thread(self.model.close)


@ray.remote
class InferenceActor(InferenceServer):
    """The Ray face of InferenceServer (batched forward passes and generation): an actor of its methods; tests may use InferenceServer in process."""
